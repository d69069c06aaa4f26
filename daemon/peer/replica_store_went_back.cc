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
#include "format/manifest.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer {

std::vector<int64_t> ReplicaStore::WentOnLocked(const ReplicaKey& key, int64_t from,
                                                absl::Time arrived,
                                                std::vector<std::shared_ptr<const void>>* freed) {
  std::vector<int64_t> steps = DropLeftBehindLocked(key, freed);
  NoteWentOnLocked(key, from, arrived, /*again=*/!steps.empty());
  // The run left's step of the same number: its pieces came before the
  // rank's run went on (an owner sends its run left before its first step
  // after the restore), the new run's from then on.
  auto w = went_on_.find(std::make_tuple(key.job_id, key.uid, key.rank));
  if (w != went_on_.end() && w->second.from == from) {
    std::vector<ReplicaKey> before;
    for (auto it = held_.lower_bound(ReplicaKey{key.job_id, key.uid, key.rank, key.step, ""});
         it != held_.end() && it->first.job_id == key.job_id && it->first.uid == key.uid &&
         it->first.rank == key.rank && it->first.step == key.step;
         ++it) {
      if (it->second->info.received < w->second.arrived) before.push_back(it->first);
    }
    bool manifest = false;
    for (const ReplicaKey& k : before) {
      manifest = manifest || k.piece == format::ManifestFileName(k.rank);
      DropLocked(k, freed);
    }
    pieces_dropped_ += before.size();
    if (manifest) steps.insert(steps.begin(), key.step);
  }
  if (!steps.empty()) {
    // (A pin round that listed the holdings before must not pin them.)
    ++went_back_count_[{key.job_id, key.uid}];
    auto pin = pinned_.find({key.job_id, key.uid});
    if (pin != pinned_.end() && pin->second >= key.step &&
        std::find(steps.begin(), steps.end(), pin->second) != steps.end()) {
      pinned_.erase(pin);
    }
  }
  return steps;
}

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

void ReplicaStore::NoteWentOnLocked(const ReplicaKey& key, int64_t from, absl::Time arrived,
                                    bool again) {
  // The job's pinned step, past the rank's first step after the restore,
  // is of the run it left.
  auto pin = pinned_.find({key.job_id, key.uid});
  if (pin != pinned_.end() && pin->second > key.step) {
    pinned_.erase(pin);
    ++went_back_count_[{key.job_id, key.uid}];  // (a round in flight must not pin it again)
  }
  // Late (this zccd's ranks went on from that step already), or of another
  // going back to it: cannot be told apart, and counts for nothing.
  auto here = went_on_from_here_.find({key.job_id, key.uid});
  if (here != went_on_from_here_.end() && here->second == from) return;
  // Records of jobs nothing is held for any more go (a job that left).
  for (auto it = went_on_.begin(); it != went_on_.end();) {
    const auto& [job_id, uid, rank] = it->first;
    auto held = held_.lower_bound(ReplicaKey{job_id, uid, 0, std::numeric_limits<int64_t>::min(), ""});
    const bool any = held != held_.end() && held->first.job_id == job_id && held->first.uid == uid;
    it = any || (job_id == key.job_id && uid == key.uid) ? std::next(it) : went_on_.erase(it);
  }
  WentOn& w = went_on_[std::make_tuple(key.job_id, key.uid, key.rank)];
  // Every piece of its first step after the restore tells it (and the
  // next step's, where that one did not reach every buddy): the first to
  // arrive counts.
  if (w.from == from && !again) {
    w.arrived = std::min(w.arrived, arrived);
    return;
  }
  w = WentOn{from, arrived};
  ++went_back_count_[{key.job_id, key.uid}];
}

std::map<uint32_t, std::set<int64_t>> ReplicaStore::DropLeftBehind(const std::string& job_id,
                                                                   uint32_t uid, int64_t restored,
                                                                   absl::Time at,
                                                                   const std::set<uint32_t>* told) {
  std::map<uint32_t, std::set<int64_t>> dropped;
  std::vector<std::shared_ptr<const void>> freed;  // freed after the lock
  Held held;
  bool unpinned = false;
  {
    zcc::MutexLock lock(&mu_);
    const ReplicaKey first{job_id, uid, 0, std::numeric_limits<int64_t>::min(), ""};
    auto of_job = [&](std::map<ReplicaKey, std::shared_ptr<const Replica>>::const_iterator it)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return it != held_.end() && it->first.job_id == job_id && it->first.uid == uid;
        };
    // The pieces that came before their rank's run went on go, and with
    // them their step's manifest (one that came after its data does not
    // keep the step whole); the new run's pieces of a step of the same
    // number stay, and make it whole again with its manifest, sent last.
    std::vector<ReplicaKey> gone;
    std::set<std::pair<uint32_t, int64_t>> emptied;
    for (auto it = held_.lower_bound(first); of_job(it); ++it) {
      const ReplicaKey& k = it->first;
      if (k.step <= restored) continue;
      // The rank's run from the restore on begins with its first step
      // after it, where that arrived; else nothing of it is here yet.
      // Told by another zccd: its own ranks' at their going on (a record
      // here may be of an earlier going back to the same step); another
      // rank's where its first step after the restore arrived, if before.
      absl::Time run_began = at;
      auto w = went_on_.find(std::make_tuple(job_id, uid, k.rank));
      const bool noted = w != went_on_.end() && w->second.from == restored;
      if (told == nullptr) {
        if (noted) run_began = w->second.arrived;
      } else if (noted && told->count(k.rank) == 0) {
        run_began = std::min(at, w->second.arrived);
      }
      if (it->second->info.received < run_began) {
        gone.push_back(k);
        emptied.insert({k.rank, k.step});
      }
    }
    for (const auto& [rank, step] : emptied) {
      gone.push_back(ReplicaKey{job_id, uid, rank, step, format::ManifestFileName(rank)});
    }
    for (const ReplicaKey& k : gone) {
      if (held_.count(k) == 0) continue;  // (a manifest not held, or listed twice)
      DropLocked(k, &freed);
      ++pieces_dropped_;
      dropped[k.rank].insert(k.step);
    }
    // The step pinned as the job's newest whole in the tier is of the run
    // left if it is past the one restored.
    // (Told: where its step lost pieces; a tell late, or told again, must
    // not lift the new run's pin.)
    auto pin = pinned_.find({job_id, uid});
    bool lost = told == nullptr;
    for (const auto& [rank, steps] : dropped) {
      lost = lost || (pin != pinned_.end() && steps.count(pin->second) > 0);
    }
    if (pin != pinned_.end() && pin->second > restored && lost) {
      pinned_.erase(pin);
      unpinned = true;
    }
    // This zccd's own ranks went on (not a tell): what it notes of each
    // rank's going on starts again.
    if (told == nullptr) {
      for (auto it = went_on_.lower_bound(std::make_tuple(job_id, uid, uint32_t{0}));
           it != went_on_.end() && std::get<0>(it->first) == job_id &&
           std::get<1>(it->first) == uid;) {
        it = went_on_.erase(it);
      }
      went_on_from_here_[{job_id, uid}] = restored;
    }
    if (told == nullptr || !dropped.empty()) ++went_back_count_[{job_id, uid}];
    held = HeldLocked();
  }
  if (dropped.empty() && !unpinned) return dropped;
  std::vector<std::string> what;
  for (const auto& [rank, steps] : dropped) {
    what.push_back(absl::StrCat("rank ", rank, ": step(s) ", absl::StrJoin(steps, ", ")));
  }
  ZCC_LOG(WARNING) << "job " << job_id << " went on from step " << restored
                   << ": the peer tier's pieces held here of the run it left are dropped ("
                   << (what.empty() ? std::string("none") : absl::StrJoin(what, "; ")) << ")"
                   << (unpinned ? "; its pin above that step is lifted" : "");
  if (!dropped.empty()) Changed(held);
  return dropped;
}

}  // namespace zcc::daemon::peer
