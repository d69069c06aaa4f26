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

void Job::OnTrainedOn(uint32_t rank, int64_t restored, int64_t step, bool from_disk) {
  zcc::MutexLock lock(&mu_);
  // A step read from disk is taken up; a restore from memory of a step after
  // it (a snapshot of the run that took it up) keeps it taken up, one of an
  // older step does not. (Every rank's telling, in turn.)
  if (from_disk) {
    went_on_from_disk_ = restored;
  } else if (restored < went_on_from_disk_) {
    went_on_from_disk_ = -1;
  }
  // (Job's lock, then the uploader's: as everywhere.)
  if (uploader_ != nullptr) uploader_->NoteWentOnFrom(went_on_from_disk_);
  // The job's ranks each tell the same going back: the first to tell it
  // counts.
  if (++trained_on_[rank] <= goings_back_) return;
  goings_back_ = trained_on_[rank];
  go_back_ = GoingBack{restored, step, absl::Now()};
  going_back_at_ = go_back_.at;
  went_back_to_ = restored;
  ++asked_;
}

void Job::GoBack(const GoingBack& back) {
  // The peer tier first: it holds steps newer than everything written.
  if (options_.on_went_on) options_.on_went_on(back.restored, back.at);
  storage::Storage& fs = storage::StorageOrDefault(options_.storage);
  // Where the job commits: the store, in the node-local mode (a read there
  // once per restore that training went on from).
  const std::string& commits_in = options_.node_local_root ? options_.upload_dir : options_.job_dir;
  const int64_t named = checkpoint::ReadLatest(commits_in, &fs).value_or(-1);
  if (!options_.node_local_root && IsCommitter()) {
    // The parts of steps after it that the run left behind wrote, on any
    // node, never complete a step this run writes again: the run id is the
    // same (a going back within one registration), and its pending steps
    // below are not all there is (another node's rank, or a write of this
    // node's given up, leaves no pending step here).
    auto forgot = checkpoint::ForgetLeftBehindParts(fs, options_.job_dir, back.restored, back.at);
    if (!forgot.ok()) {
      ZCC_LOG(WARNING) << "job " << options_.job_id << ": the parts the run left behind wrote "
                       << "after step " << back.restored << " could not be removed: "
                       << forgot.status();
    } else if (*forgot > 0) {
      ZCC_LOG(INFO) << "job " << options_.job_id << ": removed " << *forgot
                    << " manifest(s) the run left behind wrote of steps after " << back.restored;
    }
  }
  std::vector<int64_t> stale;
  {
    zcc::MutexLock lock(&mu_);
    // The newest step committed or waiting for its commit.
    int64_t written = std::max(named, last_committed_step_);
    for (const auto& [step, since] : pending_) written = std::max(written, step);
    for (const auto& [step, node] : node_steps_) written = std::max(written, step);
    if (back.first_step > written) return;  // past all of them: nothing left behind
    // Commits of the steps after it were the run left behind's: this run's
    // commits of the same numbers are new ones.
    recently_committed_.erase(recently_committed_.upper_bound(back.restored),
                              recently_committed_.end());
    // Its steps waiting for their commit never commit (those still being
    // written are given up by their writers: RankWriteTarget::left_behind).
    for (const auto& [step, since] : pending_) {
      if (step > back.restored && since < back.at) stale.push_back(step);
    }
    for (auto it = node_steps_.begin(); it != node_steps_.end();) {
      if (it->first > back.restored && it->second.since < back.at) {
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
  {
    zcc::MutexLock lock(&mu_);
    if (!committer_) {
      // Rank 0 is not registered here yet (it may be on another node, whose
      // zccd is told by its own ranks): should it register here, the going
      // back is done then (PutRank). A rank that trained on before rank 0
      // registered told it first, and rank 0's telling does not count again.
      unapplied_back_ = back;
      return;
    }
  }
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
                     << moved->back_to
                     << (moved->committed ? ""
                                          : " (not committed there: none of its steps is "
                                            "restored until this run commits one)")
                     << ". The committed steps after it, of the run left "
                     << "behind, stay but are no longer restored (this run's commits of the same "
                     << "step numbers replace them)";
    if (dir == commits_in) {
      // (Nothing of this run committed there yet where `latest` names a
      // step held elsewhere.)
      zcc::MutexLock lock(&mu_);
      last_committed_step_ = moved->committed ? moved->back_to : -1;
    }
  }
}

}  // namespace zcc::daemon
