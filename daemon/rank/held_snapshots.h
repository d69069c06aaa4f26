// HeldSnapshots: what a rank's session inherits from the trainer before it
// (the memory tier, seen from the new session): the FULL snapshots left in
// the adopted staging segment, held until the trainer restores from one of
// them or goes on without, and the previous session, kept for its EMA.
//
// Thread-safety: all methods may be called from any thread.
#ifndef ZCC_DAEMON_RANK_HELD_SNAPSHOTS_H_
#define ZCC_DAEMON_RANK_HELD_SNAPSHOTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/rank/staging_slots.h"

namespace zcc::daemon {

class RankSession;

// What a session adopts from its rank's previous trainer: that trainer's
// stopped session (for its EMA) and the snapshots held in the adopted
// segment, newest first.
struct Inheritance {
  std::shared_ptr<RankSession> predecessor;
  std::vector<SlotSnapshot> held;
};

class HeldSnapshots {
 public:
  explicit HeldSnapshots(Inheritance inherited);
  ~HeldSnapshots();

  // True while anything is held: one atomic load, for the ingest loop.
  bool any() const { return any_.load(std::memory_order_relaxed); }
  // The held snapshots, newest first.
  std::vector<SlotSnapshot> List() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<int64_t> Steps() const ABSL_LOCKS_EXCLUDED(mu_);
  // The slot holding `step`, if it is held.
  std::optional<uint32_t> Slot(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The held snapshot of `step`, if any.
  std::optional<SlotSnapshot> Find(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The previous session, for its EMA, the first time only (nullptr after:
  // taking the EMA twice would give it back; also once a successor that
  // inherited these snapshots took it over). FailedPrecondition when none
  // is held any more.
  absl::StatusOr<std::shared_ptr<RankSession>> TakePredecessorForEma() ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of everything: returns the slots that were held, for the caller
  // to free; the previous session is dropped (outside the lock).
  std::vector<SlotSnapshot> Release() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<bool> any_{false};
  mutable zcc::Mutex mu_;
  std::vector<SlotSnapshot> held_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RankSession> predecessor_ ABSL_GUARDED_BY(mu_);
  bool predecessor_ema_taken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_HELD_SNAPSHOTS_H_
