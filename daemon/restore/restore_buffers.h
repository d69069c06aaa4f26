// The restore and EMA buffers zccd filled for one rank and keeps until the
// client says it has copied them out (RestoreDone) or the rank goes: each a
// shared-memory segment (none for a restore from the rank's own staging
// segment) with the step it holds, and what to do when the client is done.
// A client holds at most kMax at once, so a client that never releases
// cannot exhaust memory.
//
// Thread-safety: all methods may be called concurrently.
// Ownership: owns the segments (unmapped and removed when dropped).
#ifndef ZCC_DAEMON_RESTORE_RESTORE_BUFFERS_H_
#define ZCC_DAEMON_RESTORE_RESTORE_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
  // Keeps `buffer` (holding `step`; none when the bytes are in the staging
  // segment); returns its id. `on_done` (may be null) runs when the client
  // releases it with Remove, not when the rank goes (Clear).
  uint64_t Add(std::optional<shm::Segment> buffer, int64_t step,
               std::function<void()> on_done = nullptr);
  // Drops buffer `id`; returns the step it held. NotFound for an unknown id.
  absl::StatusOr<int64_t> Remove(uint64_t id);
  // Drops them all (the rank is going).
  void Clear();

  // A buffer being filled, counted in bytes() from its creation until the
  // object goes (by then it is held: Add). Move-only.
  class Filling {
   public:
    Filling(Filling&& other) noexcept : owner_(other.owner_), bytes_(other.bytes_) {
      other.owner_ = nullptr;
    }
    Filling& operator=(Filling&&) = delete;
    ~Filling();

   private:
    friend class RestoreBuffers;
    Filling(RestoreBuffers* owner, uint64_t bytes) : owner_(owner), bytes_(bytes) {}
    RestoreBuffers* owner_;
    uint64_t bytes_;
  };
  Filling BeingFilled(uint64_t bytes);
  // The shared memory the buffers hold and those being filled hold (counted
  // in the staging budget: RankSession::budget_bytes).
  uint64_t bytes() const;

 private:
  struct Buffer {
    std::optional<shm::Segment> segment;
    int64_t step = -1;
    std::function<void()> on_done;
  };
  mutable zcc::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Buffer> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t filling_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_RESTORE_BUFFERS_H_
