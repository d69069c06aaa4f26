// Job: a run that went back to an older step (job.h, OnTrainedOn).
#include "daemon/jobs/job.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_dirs.h"
#include "common/log.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

void Job::OnTrainedOn(int64_t restored, int64_t step) {
  zcc::MutexLock lock(&mu_);
  // Another rank of the same going back (none of this run written since), or
  // one the committer has not taken yet.
  if (went_back_.restored == restored && !went_back_.moved_on) return;
  if (go_back_.restored == restored) return;
  go_back_ = GoingBack{restored, step, absl::Now()};
  ++asked_;
}

void Job::GoBack(const GoingBack& back) {
  storage::Storage& fs = storage::StorageOrDefault(options_.storage);
  // Where the job commits: the store, in the node-local mode.
  const std::string& commits_in = options_.node_local_root ? options_.upload_dir : options_.job_dir;
  const int64_t named = checkpoint::ReadLatest(commits_in, &fs).value_or(-1);
  std::vector<int64_t> stale;
  {
    zcc::MutexLock lock(&mu_);
    int64_t written = named;
    for (const auto& [step, since] : pending_) written = std::max(written, step);
    for (const auto& [step, node] : node_steps_) written = std::max(written, step);
    if (back.first_step > written) {
      // Past every step committed or being written: nothing of the numbers
      // this run writes was left behind (a trainer that restored an older
      // step and kept its own step count, say).
      ZCC_LOG(INFO) << "job " << options_.job_id << ": training went on from step "
                    << back.restored << " at step " << back.first_step
                    << ", past every step committed or being written: nothing is left behind";
      return;
    }
    went_back_ = WentBack{back.restored, back.at, false};
    // Commits of the steps after it were the run left behind's: this run's
    // commits of the same numbers are new ones.
    recently_committed_.erase(recently_committed_.upper_bound(back.restored),
                              recently_committed_.end());
    // Its steps not committed yet never commit (nor those whose writes
    // finish later: OnPersisted).
    for (const auto& [step, since] : pending_) {
      auto began = write_start_.find(step);
      if (LeftBehindLocked(step, began == write_start_.end() ? absl::InfinitePast() : began->second)) {
        stale.push_back(step);
      }
    }
    for (auto it = node_steps_.begin(); it != node_steps_.end();) {
      if (LeftBehindLocked(it->first, it->second.write_began)) {
        stale.push_back(it->first);
        it = node_steps_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const std::string why =
      absl::StrCat("of the run left behind is not committed: training went on from step ",
                   back.restored);
  for (int64_t step : stale) {
    DropPending(step, why);
    if (options_.node_local_root) {
      const absl::Status removed = checkpoint::RemoveWritingStepDir(fs, options_.job_dir, step);
      if (!removed.ok()) ZCC_LOG(WARNING) << removed;
    }
  }
  // Nor go to the store (the one being sent: its commit there is undone).
  if (uploader_ != nullptr) uploader_->WentBack(back.restored, back.at);
  if (!IsCommitter()) return;
  // The job's directory, and the store (tiered mode: a restore takes the
  // store first where its `latest` is newer; node-local roots commit there
  // only).
  std::vector<std::string> dirs;
  if (!options_.node_local_root) dirs.push_back(options_.job_dir);
  if (!options_.upload_dir.empty()) dirs.push_back(options_.upload_dir);
  for (const std::string& dir : dirs) {
    // This daemon's commits run on this thread, after this: what `latest`
    // names above the step is the run left behind's. In the node-local mode
    // any node commits in the store: there, not past a step committed since
    // the going back.
    const absl::Time not_after = options_.node_local_root ? back.at : absl::InfiniteFuture();
    auto moved = checkpoint::PointLatestBack(fs, dir, back.restored, std::nullopt, not_after);
    if (moved.ok() && moved->back_to < 0) continue;  // nothing newer named
    const std::string went_on = absl::StrCat("training went on from step ", back.restored);
    if (!moved.ok()) {
      zcc::MutexLock lock(&mu_);
      SetError(absl::StrCat(went_on, ", but ", dir, "/latest could not be pointed back to it: ",
                            moved.status().message()));
      continue;
    }
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": " << went_on << ", older than step "
                     << moved->named << " that " << dir << "/latest named; it now names step "
                     << moved->back_to << ". The committed steps after it, of the run left "
                     << "behind, stay but are no longer restored (this run's commits of the same "
                     << "step numbers replace them)";
    if (dir == commits_in) {
      zcc::MutexLock lock(&mu_);
      last_committed_step_ = moved->back_to;
    }
  }
}

}  // namespace zcc::daemon
