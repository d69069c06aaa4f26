// Node-level sharing of restores from disk: the ranks of a job on this zccd
// that restore the same step at about the same time (a data-parallel job
// restarted as a whole) read each tensor box once between them. The first
// rank to ask for a box claims it and reads it, checking its checksum as
// always; the others copy the box out of that rank's restore buffer once it
// landed. A rank reads every box it claimed before it waits for any other,
// so no two ranks wait on each other. A box whose reader failed (a damaged
// piece, a cancelled restore) is read again by whoever still needs it.
//
// Keys name the step directory and the box (kind, tensor, dtype, global
// shape, offset and shape), so only identical boxes of one step are shared.
// A landed box keeps a mapping of the buffer that holds it, so the memory
// outlives the owner's release of its buffer, for `linger` after it landed.
// The ranks of a job trust each other's buffers (same job, same uid).
//
// Thread-safety: all methods may be called from any thread.
#ifndef ZCC_DAEMON_RESTORE_SHARED_READS_H_
#define ZCC_DAEMON_RESTORE_SHARED_READS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "shm/segment.h"

namespace zcc::daemon {

class SharedReads {
 public:
  explicit SharedReads(absl::Duration linger = absl::Seconds(10)) : linger_(linger) {}

  // True when the caller is to read `key` (it claimed it, or its earlier
  // reader failed); false when another rank reads or read it.
  bool Claim(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // The claimer's read of `key` landed at `data` (`bytes`), in the buffer
  // `holder` maps; or it failed.
  void Land(const std::string& key, std::shared_ptr<const shm::Segment> holder,
            const uint8_t* data, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  struct Landed {
    std::shared_ptr<const shm::Segment> holder;  // keeps `data` mapped
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  // Waits until `key` landed (its bytes) or its reader failed (nullopt; the
  // caller reads it itself), checking `cancelled` every 100 ms.
  std::optional<Landed> Await(const std::string& key, const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the boxes that landed (or failed) more than `linger` ago, and with
  // them the mappings that kept their buffers' memory: zccd calls it every
  // housekeeping round, so memory is not held after the last restore.
  void Expire() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    enum class State { kReading, kLanded, kFailed };
    State state = State::kReading;
    Landed landed;
    absl::Time at;  // claimed or landed
  };
  // Takes landed and failed entries older than linger_ out into `dropped`,
  // for the caller to let go of after the lock (the last holder of a
  // restore buffer unmaps it: gigabytes, which every rank's Claim, Await and
  // Land would wait for).
  void ExpireLocked(absl::Time now, std::map<std::string, Entry>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration linger_;
  zcc::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_SHARED_READS_H_
