// A restore from disk begun as a rank registers (RegisterRequest's
// prefetch_restore): zccd chooses the step that a restore of the newest would
// choose and reads the rank's staged tensors from it into a staging slot, on a
// thread of its own, so that the disk read overlaps whatever the trainer does
// before it asks: mapping and pinning its staging memory (on a GPU node the
// larger part of a registration), building its model, agreeing on a step with
// the other ranks. The restore that asks for that step takes the read over,
// waiting only for what is left of it; anything else discards it (a restore
// from memory or of another step, the trainer's first snapshot, the end of
// the session), which cancels the read within a chunk and frees the slot.
// Nothing of the read reaches the trainer before a restore hands the slot out,
// and that restore checks what the read found, as its own read would: a piece
// that does not match its checksum makes it fall back to an older step.
//
// Thread-safety: all methods may be called concurrently.
// Ownership: owns its thread; destruction cancels the read and waits for it.
#ifndef ZCC_DAEMON_RESTORE_RESTORE_PREFETCH_H_
#define ZCC_DAEMON_RESTORE_RESTORE_PREFETCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/global_index.h"
#include "common/mutex.h"

namespace zcc::daemon {

class RestorePrefetch {
 public:
  struct Chosen {
    int64_t step = -1;
    std::string step_dir;
    std::shared_ptr<const checkpoint::GroupedIndex> index;
  };
  // Picks the step (nullopt: the job has none to restore).
  using Choose = std::function<absl::StatusOr<std::optional<Chosen>>()>;
  // Reads `chosen` into the slot; the bytes read and checked. Stops at its
  // next check once `cancelled()` is true.
  using Read = std::function<absl::StatusOr<uint64_t>(const Chosen& chosen,
                                                      const std::function<bool()>& cancelled)>;
  // Runs once: when the prefetch is destroyed, with the step it chose (if
  // any) and whether a restore took the slot over (else it is to be freed);
  // or, with neither, on the prefetch's thread as soon as it finds nothing
  // to read.
  using Finish = std::function<void(const std::optional<Chosen>& chosen, bool slot_taken)>;

  // Starts choosing and reading into staging slot `slot`, which the prefetch
  // holds until a restore takes it or Finish frees it.
  RestorePrefetch(uint32_t slot, Choose choose, Read read, Finish finish);
  ~RestorePrefetch();
  RestorePrefetch(const RestorePrefetch&) = delete;
  RestorePrefetch& operator=(const RestorePrefetch&) = delete;

  uint32_t slot() const { return slot_; }

  // Waits for the choice. nullopt when there is none: nothing to restore,
  // no step that checks out, or `cancelled()` turned true first.
  std::optional<Chosen> AwaitChoice(const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for the read and takes the slot over: from then on the caller frees
  // it. Returns the bytes read and checked, or the read's error (the slot is
  // the caller's either way); nullopt, leaving the slot to the prefetch, when
  // `cancelled()` turned true first.
  std::optional<absl::StatusOr<uint64_t>> TakeRead(const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);

  // From the start of the prefetch to the end of its read (so far, while it
  // reads).
  absl::Duration ReadTime() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `ready` holds or `cancelled()`; false on the latter.
  bool AwaitUnlessCancelled(const bool* ready, const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t slot_;
  const Choose choose_;
  const Read read_;
  const Finish finish_;
  const absl::Time start_;
  std::atomic<bool> cancel_{false};

  mutable zcc::Mutex mu_;
  bool chosen_done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Chosen> chosen_ ABSL_GUARDED_BY(mu_);
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<uint64_t> outcome_ ABSL_GUARDED_BY(mu_) = uint64_t{0};
  absl::Time read_end_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool slot_taken_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: started once everything above is set
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_RESTORE_PREFETCH_H_
