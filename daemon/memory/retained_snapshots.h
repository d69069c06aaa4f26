// Snapshots that ranks whose trainer died or exited left in zccd's memory,
// kept for a while (retain_snapshots_s) so that the rank's next trainer
// restores them from memory instead of from disk: one entry per rank, its
// stopped session (which still owns the staging segment and the EMA) and the
// FULL snapshots intact in that segment. A registration of the rank with the
// same tensors adopts the entry (daemon/control/registry.cc); otherwise it expires,
// or is dropped when a registration needs its memory.
//
// Thread-safety: all methods may be called concurrently.
// Ownership: owns the stopped sessions; one dropped is destroyed outside the
// lock (its segment unmapped and removed).
#ifndef ZCC_DAEMON_MEMORY_RETAINED_SNAPSHOTS_H_
#define ZCC_DAEMON_MEMORY_RETAINED_SNAPSHOTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "daemon/rank/rank_session.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {

class RetainedSnapshots {
 public:
  struct Entry {
    std::shared_ptr<RankSession> session;  // stopped
    std::vector<SlotSnapshot> snapshots;   // newest first, not empty
    absl::Time expires;
  };

  // Keeps the intact snapshots of `stopped` (a stopped session of `rank`)
  // until `expires`, replacing an older entry of the rank. Returns the steps
  // kept, newest first (empty: nothing intact, nothing kept).
  std::vector<int64_t> Keep(uint32_t rank, std::shared_ptr<RankSession> stopped,
                            absl::Time expires) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the rank's entry out.
  std::optional<Entry> Take(uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // How many ranks have an entry.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes every rank's entry out, by rank.
  std::map<uint32_t, Entry> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries expired at `now`; returns how many.
  size_t DropExpired(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes out the entry that expires first (for the caller to drop where
  // unmapping its segment holds no lock); nullopt when there is none.
  std::optional<Entry> TakeFirstToExpire() ABSL_LOCKS_EXCLUDED(mu_);
  // Staging memory the entries hold.
  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);
  void FillStatus(v1::JobStatus* out, absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable zcc::Mutex mu_;
  std::map<uint32_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_MEMORY_RETAINED_SNAPSHOTS_H_
