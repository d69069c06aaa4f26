// ReplicaStore: the pieces of a run that went back to an older step
// (replica_store.h, Put's went_on_from and DropLeftBehind).
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer {

std::vector<int64_t> ReplicaStore::DropLeftBehindLocked(
    const ReplicaKey& key, std::vector<std::shared_ptr<const void>>* freed) {
  std::vector<int64_t> steps;
  auto w = whole_.find(std::make_tuple(key.job_id, key.uid, key.rank));
  if (w == whole_.end()) return steps;
  for (auto it = w->second.upper_bound(key.step); it != w->second.end(); ++it) {
    steps.push_back(*it);
  }
  for (int64_t step : steps) {
    std::vector<ReplicaKey> pieces;
    for (auto it = held_.lower_bound(ReplicaKey{key.job_id, key.uid, key.rank, step, ""});
         it != held_.end() && it->first.job_id == key.job_id && it->first.uid == key.uid &&
         it->first.rank == key.rank && it->first.step == step;
         ++it) {
      pieces.push_back(it->first);
    }
    for (const ReplicaKey& k : pieces) DropLocked(k, freed);
    pieces_dropped_ += pieces.size();
  }
  return steps;
}

void ReplicaStore::NoteWentOnLocked(const ReplicaKey& key, int64_t from, absl::Time arrived) {
  WentOn& w = went_on_[std::make_tuple(key.job_id, key.uid, key.rank)];
  // Each piece of that first step tells it: the first to arrive counts.
  if (w.from == from && w.first_step == key.step) {
    w.arrived = std::min(w.arrived, arrived);
    return;
  }
  w = WentOn{from, key.step, arrived};
}

std::map<uint32_t, std::set<int64_t>> ReplicaStore::DropLeftBehind(const std::string& job_id,
                                                                   uint32_t uid, int64_t restored,
                                                                   absl::Time at) {
  std::map<uint32_t, std::set<int64_t>> dropped;
  std::vector<std::shared_ptr<const void>> freed;  // freed after the lock
  Held held;
  {
    zcc::MutexLock lock(&mu_);
    std::vector<ReplicaKey> gone;
    for (auto it = held_.lower_bound(
             ReplicaKey{job_id, uid, 0, std::numeric_limits<int64_t>::min(), ""});
         it != held_.end() && it->first.job_id == job_id && it->first.uid == uid; ++it) {
      const ReplicaKey& k = it->first;
      if (k.step <= restored) continue;
      // The rank's run from the restore on begins with its first step
      // after it, where that arrived; else nothing of it is here yet.
      absl::Time run_began = at;
      auto w = went_on_.find(std::make_tuple(job_id, uid, k.rank));
      if (w != went_on_.end() && w->second.from == restored) run_began = w->second.arrived;
      if (it->second->info.received < run_began) gone.push_back(k);
    }
    for (const ReplicaKey& k : gone) {
      DropLocked(k, &freed);
      dropped[k.rank].insert(k.step);
    }
    pieces_dropped_ += gone.size();
    // Taken: a later going back to the same step waits for its own first steps.
    for (auto it = went_on_.lower_bound(std::make_tuple(job_id, uid, uint32_t{0}));
         it != went_on_.end() && std::get<0>(it->first) == job_id &&
         std::get<1>(it->first) == uid;) {
      it = it->second.from == restored ? went_on_.erase(it) : std::next(it);
    }
    held = HeldLocked();
  }
  if (dropped.empty()) return dropped;
  std::vector<std::string> what;
  for (const auto& [rank, steps] : dropped) {
    what.push_back(absl::StrCat("rank ", rank, ": step(s) ", absl::StrJoin(steps, ", ")));
  }
  ZCC_LOG(WARNING) << "job " << job_id << " went on from step " << restored
                   << ": the peer tier's pieces held here of the run it left are dropped ("
                   << absl::StrJoin(what, "; ") << ")";
  Changed(held);
  return dropped;
}

}  // namespace zcc::daemon::peer
