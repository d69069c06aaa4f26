// The restore and EMA buffers zccd filled for one rank and keeps until the
// client says it has copied them out (RestoreDone) or the rank goes: each a
// shared-memory segment with the step it holds. A client holds at most
// kMax at once, so a client that never releases cannot exhaust memory.
//
// Thread-safety: all methods may be called concurrently.
// Ownership: owns the segments (unmapped and removed when dropped).
#ifndef ZCC_DAEMON_RESTORE_BUFFERS_H_
#define ZCC_DAEMON_RESTORE_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "shm/segment.h"

namespace zcc::daemon {

class RestoreBuffers {
 public:
  static constexpr size_t kMax = 4;

  // ResourceExhausted when the client already holds kMax buffers.
  absl::Status CheckRoom() const;
  // Keeps `buffer` (holding `step`); returns its id.
  uint64_t Add(shm::Segment buffer, int64_t step);
  // Drops buffer `id`; returns the step it held. NotFound for an unknown id.
  absl::StatusOr<int64_t> Remove(uint64_t id);
  // Drops them all (the rank is going).
  void Clear();

 private:
  mutable zcc::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::pair<shm::Segment, int64_t>> buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_BUFFERS_H_
