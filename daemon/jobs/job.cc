#include "daemon/jobs/job.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

Job::Job(JobOptions options) : options_(std::move(options)) {
  if (!options_.upload_dir.empty()) {
    UploaderOptions upload;
    upload.job_id = options_.job_id;
    upload.job_dir = options_.job_dir;
    upload.upload_dir = options_.upload_dir;
    upload.retention = options_.upload_retention;
    upload.retry_after = options_.upload_retry_after;
    upload.commit_timeout = options_.commit_timeout;
    upload.owner = options_.owner;
    upload.storage = &storage::StorageOrDefault(options_.storage);
    upload.metrics = options_.metrics;
    upload.node_local = options_.node_local_root;
    upload.world_size = options_.world_size;
    upload.on_store_latest = [this](int64_t step) {
      zcc::MutexLock lock(&mu_);
      last_committed_step_ = step;  // back too, when a run resumed from an older step
    };
    uploader_ = std::make_unique<JobUploader>(std::move(upload));
  }
  {
    // The committer's first round reads `latest` (the constructor runs where
    // no disk I/O may: under the job table's lock).
    zcc::MutexLock lock(&mu_);
    tick_due_ = true;
    ++asked_;
  }
  committer_thread_ = std::thread([this] { CommitterLoop(); });
}

Job::~Job() {
  // Sessions call back into this object from their writer threads: stop them
  // before the members go. The committer finishes what they asked for.
  for (const auto& session : Ranks()) session->Stop();
  {
    zcc::MutexLock lock(&mu_);
    stop_committer_ = true;
  }
  committer_thread_.join();
}

void Job::CommitterLoop() {
  // Commits and retention write the job's directory as its owner.
  ScopedFsIdentity as_owner(options_.owner);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return commit_up_to_ >= 0 || tick_due_ || go_back_.restored >= 0 || stop_committer_;
  };
  zcc::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(&has_work));
    const int64_t up_to = std::exchange(commit_up_to_, -1);
    const bool tick = std::exchange(tick_due_, false);
    const GoingBack back = std::exchange(go_back_, GoingBack());
    if (up_to < 0 && !tick && back.restored < 0) return;  // stop_committer_, and nothing left
    const uint64_t taken = asked_;
    mu_.Unlock();
    {
      zcc::MutexLock commit_lock(&commit_mu_);
      // Before this run's commits: they may only move `latest` on from there.
      if (back.restored >= 0) GoBack(back);
      if (up_to >= 0) CommitPending(up_to);
      if (tick) TickWork();
    }
    mu_.Lock();
    done_ = taken;
  }
}

void Job::OnCommittedOutside(int64_t step, absl::Time write_began) {
  if (uploader_ != nullptr) uploader_->OnCommitted(step, write_began);
}

void Job::AwaitCommitter() {
  zcc::MutexLock lock(&mu_);
  const uint64_t target = asked_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= target; };
  mu_.Await(absl::Condition(&done));
}

absl::Status Job::Authorize(uid_t uid) const {
  if (uid == 0 || uid == options_.owner.uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("job '", options_.job_id,
                                                  "' belongs to another user"));
}

std::shared_ptr<RankSession> Job::FindRank(uint32_t rank) const {
  zcc::MutexLock lock(&mu_);
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? nullptr : it->second;
}

bool Job::AwaitRankGone(uint32_t rank, const RankSession* session, absl::Time deadline) const {
  struct Gone {
    const std::map<uint32_t, std::shared_ptr<RankSession>>* ranks;
    uint32_t rank;
    const RankSession* session;
    bool operator()() const {
      auto it = ranks->find(rank);
      return it == ranks->end() || it->second.get() != session;
    }
  };
  zcc::MutexLock lock(&mu_);
  Gone gone{&ranks_, rank, session};
  return mu_.AwaitWithDeadline(absl::Condition(&gone), deadline);
}

std::shared_ptr<RankSession> Job::PutRank(std::shared_ptr<RankSession> session) {
  zcc::MutexLock lock(&mu_);
  if (session->shards().rank == 0) {
    committer_ = true;
    // A going back told before rank 0 registered here: done now, before any
    // commit of the run that went on.
    if (unapplied_back_.restored >= 0 && go_back_.restored < 0) {
      go_back_ = std::exchange(unapplied_back_, GoingBack());
      ++asked_;
    }
  }
  if (options_.node_local_root &&
      uploader_->OnRankRegistered(session->shards().rank, session->shards().run_id)) {
    // A new run (or the job's first): what an earlier run's ranks wrote here
    // must not make a step of this run whole.
    node_steps_.clear();
  }
  auto& slot = ranks_[session->shards().rank];
  std::swap(slot, session);
  return session;
}

std::shared_ptr<RankSession> Job::RemoveRank(uint32_t rank, uint64_t generation) {
  zcc::MutexLock lock(&mu_);
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second->options().generation != generation) return nullptr;
  auto session = std::move(it->second);
  ranks_.erase(it);
  return session;
}

std::vector<std::shared_ptr<RankSession>> Job::Ranks() const {
  zcc::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<RankSession>> out;
  for (const auto& [rank, session] : ranks_) out.push_back(session);
  return out;
}

bool Job::idle() const {
  // A step still to be uploaded keeps the job (its trainers may be gone).
  if (uploader_ != nullptr && uploader_->HasWork()) return false;
  // Nor is a job whose previous layout is still being written for it
  // idle: dropped or replaced, a restore could miss that step.
  if (relayout_pending()) return false;
  zcc::MutexLock lock(&mu_);
  return ranks_.empty() && pending_.empty() && node_steps_.empty();
}

bool Job::replaceable() const {
  if (options_.node_local_root && uploader_ != nullptr && uploader_->HasWork()) return false;
  if (relayout_pending()) return false;
  zcc::MutexLock lock(&mu_);
  return ranks_.empty() && pending_.empty();
}

void Job::OnPersisted(const PersistEvent& event) {
  if (event.left_behind) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": rank " << event.rank << "'s write of step "
                     << event.step << ", of the state its trainer went back from, is not "
                     << "committed";
    return;
  }
  zcc::MutexLock lock(&mu_);
  metrics::ZccMetrics* m = options_.metrics;
  if (!event.status.ok()) {
    if (m != nullptr) m->errors(metrics::ErrorKind::kWrite).Increment();
    SetError(absl::StrCat("rank ", event.rank, " could not write step ", event.step, ": ",
                          event.status.message()));
    return;
  }
  if (m != nullptr) {
    m->bytes_written().Increment(event.stats.bytes);
    m->checkpoint_seconds().Observe(event.stats.seconds);
  }
  ZCC_LOG(DEBUG) << "job " << options_.job_id << " rank " << event.rank << " wrote step "
                 << event.step << ": " << event.stats.bytes << " bytes";
  const absl::Time started = absl::Now() - absl::Seconds(event.stats.seconds);
  if (options_.node_local_root) {
    OnNodeRankWritten(event);
    return;
  }
  if (!committer_) {
    // Another daemon commits; this one only reports what it wrote.
    last_checkpoint_ = event.stats;
    return;
  }
  // A rank whose persist report arrives after another rank's report already
  // committed the step has nothing left to do; a write begun after that
  // commit began (zccd's monotonic clock: the writer's own start) is the
  // step written again, to be committed again.
  auto done = recently_committed_.find(event.step);
  if (done != recently_committed_.end() && event.write_began < done->second) return;
  // A write of the run left behind (begun before the going back, of a step
  // after the one gone back to) that finished anyway: never a step to
  // commit (GoBack forgets what the run left behind committed).
  if (event.step > went_back_to_ && went_back_to_ >= 0 && started < going_back_at_) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": rank " << event.rank << "'s write of step "
                  << event.step << " began before training went on from step " << went_back_to_
                  << "; not committed";
    return;
  }
  if (done != recently_committed_.end()) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": rank " << event.rank << " wrote step "
                  << event.step << " again after its commit; it is committed again";
    recently_committed_.erase(done);
  }
  auto [it, inserted] = write_start_.emplace(event.step, started);
  if (!inserted && started < it->second) it->second = started;
  auto [waiting, first] = pending_.emplace(event.step, absl::Now());
  // A report of this run for a step of the number the run it left also
  // wrote: it waits from now (GoBack drops what was reported before).
  if (!first && waiting->second < going_back_at_) waiting->second = absl::Now();
  commit_up_to_ = std::max(commit_up_to_, event.step);  // the committer's next
  ++asked_;
}

void Job::OnNodeRankWritten(const PersistEvent& event) {
  const absl::Time now = absl::Now();
  const absl::Time began = now - absl::Seconds(event.stats.seconds);
  auto [it, first] = node_steps_.try_emplace(event.step);
  NodeStep& s = it->second;
  if (first) {
    s.since = now;
    s.write_began = began;
  }
  s.write_began = std::min(s.write_began, began);
  s.ranks.insert(event.rank);
  for (const auto& [rank, session] : ranks_) {
    if (s.ranks.count(rank) == 0) return;  // another rank here is still writing it
  }
  // This node's part of the step is whole: the store's now.
  last_checkpoint_ = event.stats;
  uploader_->OnNodeWritten(event.step, s.write_began);
  node_steps_.erase(it);
}

void Job::ExpireNodeSteps() {
  std::vector<int64_t> expired;
  {
    zcc::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = node_steps_.begin(); it != node_steps_.end();) {
      if (now - it->second.since <= options_.commit_timeout) {
        ++it;
        continue;
      }
      SetError(absl::StrCat("step ", it->first, " was written by ", it->second.ranks.size(),
                            " of this node's ranks only within ",
                            absl::FormatDuration(options_.commit_timeout),
                            "; it is not sent to the store"));
      expired.push_back(it->first);
      it = node_steps_.erase(it);
    }
  }
  storage::Storage& fs = storage::StorageOrDefault(options_.storage);
  for (int64_t step : expired) {
    const absl::Status removed = checkpoint::RemoveWritingStepDir(fs, options_.job_dir, step);
    if (!removed.ok()) ZCC_LOG(WARNING) << removed;
  }
}

void Job::CommitPending(int64_t up_to) {
  std::vector<int64_t> steps;
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [step, since] : pending_) {
      if (step <= up_to) steps.push_back(step);
    }
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!TryCommit(steps[i])) continue;
    for (size_t j = 0; j < i; ++j) {
      DropPending(steps[j], absl::StrCat("superseded by the commit of step ", steps[i],
                                         " before every rank wrote it"));
    }
  }
}

void Job::DropPending(int64_t step, const std::string& why) {
  {
    zcc::MutexLock lock(&mu_);
    if (pending_.erase(step) == 0) return;
    write_start_.erase(step);
    mixed_.erase(step);
  }
  ZCC_LOG(WARNING) << "job " << options_.job_id << ": step " << step << " " << why;
  storage::Storage& fs = storage::StorageOrDefault(options_.storage);
  // Where steps commit in place this is step-N/ without its COMMITTED (the
  // ranks removed an earlier commit's before writing).
  const absl::Status removed = checkpoint::RemoveWritingStepDir(fs, options_.job_dir, step);
  if (!removed.ok()) ZCC_LOG(WARNING) << removed;
}

bool Job::TryCommit(int64_t step) {
  // When this daemon's first rank began writing the step (a commit that
  // finishes after a newer one never moves `latest` back to it).
  absl::Time write_began = absl::InfiniteFuture();
  {
    zcc::MutexLock lock(&mu_);
    if (recently_committed_.count(step) > 0 || pending_.count(step) == 0) {
      pending_.erase(step);
      mixed_.erase(step);
      return false;
    }
    if (auto it = write_start_.find(step); it != write_start_.end()) write_began = it->second;
  }
  // The steps a run left behind above `latest`: the ones this commit passes
  // go after it.
  const std::vector<checkpoint::LeftBehindStep> above = StepsAboveLatest();
  // The commit's disk work runs without mu_: status, restores and other
  // ranks' reports go on meanwhile (commit_mu_ keeps commits in order).
  const absl::Time commit_start = absl::Now();
  const auto commit_began = std::chrono::steady_clock::now();
  auto result = checkpoint::TryCommit(options_.job_dir, options_.job_id, step, options_.world_size,
                                      options_.storage, write_began);
  zcc::ReleasableMutexLock lock(&mu_);
  if (!result.ok()) {
    if (options_.metrics != nullptr) options_.metrics->errors(metrics::ErrorKind::kCommit).Increment();
    SetError(absl::StrCat("commit of step ", step, " failed: ", result.status().message()));
    pending_.erase(step);
    write_start_.erase(step);
    mixed_.erase(step);
    return false;
  }
  if (result->outcome != checkpoint::CommitOutcome::kCommitted) {
    // Every rank's manifest there, of different runs or timelines: said
    // once per step (it waits for the stale ones to be written again).
    if (result->mixed_runs && mixed_.find(step) == mixed_.end()) {
      ZCC_LOG(WARNING) << "job " << options_.job_id << ": step " << step << " has every rank's "
                       << "manifest, but not all of one run and timeline (" << result->mixed
                       << "); it waits for the stale ones to be written again";
    }
    if (result->mixed_runs) mixed_[step] = result->mixed;
    return false;
  }
  mixed_.erase(step);

  const absl::Time now = absl::Now();
  const absl::Duration commit_time = now - commit_start;
  auto started = write_start_.find(step);
  checkpoint::WriteStats written;
  written.bytes = result->total_bytes;
  written.seconds =
      absl::ToDoubleSeconds(now - (started != write_start_.end() ? started->second : commit_start));
  if (options_.metrics != nullptr) {
    options_.metrics->commit_latency_seconds().ObserveDuration(commit_time);
  }
  pending_.erase(step);
  write_start_.erase(step);
  recently_committed_[step] = commit_began;  // (a write begun since is a new one)
  while (recently_committed_.size() > 64) recently_committed_.erase(recently_committed_.begin());
  last_committed_step_ = step;
  last_checkpoint_ = written;
  const double gbps = written.seconds > 0 ? written.bytes / written.seconds / 1e9 : 0;
  ZCC_LOG(INFO) << absl::StrFormat(
      "checkpoint job=%s step=%d bytes=%d seconds=%.3f GB/s=%.2f commit_ms=%.1f", options_.job_id,
      step, written.bytes, written.seconds, gbps, absl::ToDoubleMilliseconds(commit_time));
  lock.Release();
  // The tiered mode: to the store, in the background.
  if (uploader_ != nullptr) uploader_->OnCommitted(step, write_began);

  RemovePassedSteps(above);
  auto retained = ApplyRetention();
  if (!retained.ok()) {
    zcc::MutexLock relock(&mu_);
    SetError(absl::StrCat("retention failed: ", retained.status().message()));
  }
  return true;
}

checkpoint::RetentionGuard Job::MakeRetentionGuard() {
  // A step pinned by a restore stays; one taken for removal can no longer be
  // pinned (BeginRestore does not wait for it).
  checkpoint::RetentionGuard guard;
  guard.may_remove = [this](int64_t step) {
    if (uploader_ != nullptr && uploader_->Uploading(step)) return false;
    zcc::MutexLock lock(&mu_);
    for (const auto& [rank, restoring] : restoring_) {
      if (restoring == step) return false;
    }
    removing_.insert(step);
    return true;
  };
  guard.done = [this](int64_t step) {
    zcc::MutexLock lock(&mu_);
    removing_.erase(step);
  };
  // A step some rank here persisted and that waits for the others is the
  // commit timeout's to drop (DropPending), not retention's.
  guard.may_remove_partial = [this](int64_t step) {
    zcc::MutexLock lock(&mu_);
    if (pending_.count(step) > 0 || node_steps_.count(step) > 0) return false;
    // (Node-local root: a step waiting to be sent to the store is one; asked
    // under mu_, which a step's move from node_steps_ to the uploader holds.)
    return uploader_ == nullptr || !uploader_->Uploading(step);
  };
  return guard;
}

std::vector<checkpoint::LeftBehindStep> Job::StepsAboveLatest() {
  const std::vector<checkpoint::LeftBehindStep> above =
      checkpoint::LeftBehindSteps(options_.job_dir, options_.storage)
          .value_or(std::vector<checkpoint::LeftBehindStep>());
  if (above.empty()) return above;
  int64_t went_on = -1;
  {
    zcc::MutexLock lock(&mu_);
    went_on = went_on_from_disk_;
  }
  std::vector<checkpoint::LeftBehindStep> passable = checkpoint::WithoutTakenUp(above, went_on);
  bool say = false;
  if (passable.size() < above.size()) {
    zcc::MutexLock lock(&mu_);
    const std::pair<int64_t, size_t> kept(went_on, above.size() - passable.size());
    say = kept != taken_up_said_;
    taken_up_said_ = kept;
  }
  if (say) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": keeps " << above.size() - passable.size()
                  << " step(s) of a run left behind up to step " << went_on
                  << ": training went on from that step, read from disk, so they are this "
                  << "run's past (taken up)";
  }
  return passable;
}

void Job::RemovePassedSteps(const std::vector<checkpoint::LeftBehindStep>& above) {
  if (above.empty()) return;
  auto removed = checkpoint::RemovePassedSteps(options_.job_dir, above, MakeRetentionGuard(),
                                               options_.storage);
  if (!removed.ok()) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": the steps of a run left behind that this "
                     << "run's commits passed could not be removed: " << removed.status();
  } else if (!removed->empty()) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": removed " << removed->size()
                  << " step(s) of a run left behind that this run's commits passed (the "
                  << "first " << format::StepDirName(removed->front())
                  << "): they would be on its timeline again";
  }
}

absl::StatusOr<checkpoint::RetentionResult> Job::ApplyRetention() {
  const checkpoint::RetentionGuard guard = MakeRetentionGuard();
  ZCC_ASSIGN_OR_RETURN(checkpoint::RetentionResult result,
                       checkpoint::ApplyRetention(options_.job_dir, options_.retention, guard,
                                                  options_.commit_timeout, options_.storage));
  if (!result.removed_steps.empty() || !result.removed_partials.empty()) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": retention removed "
                  << result.removed_steps.size() << " step(s) and "
                  << result.removed_partials.size() << " abandoned partial(s)";
  }
  return result;
}

absl::Status Job::CommitInTurn(const std::function<absl::Status()>& commit) {
  zcc::MutexLock commit_lock(&commit_mu_);
  return commit();
}

absl::StatusOr<checkpoint::RetentionResult> Job::CollectGarbage() {
  ScopedFsIdentity as_owner(options_.owner);
  // After the commit in progress, if any (retention runs one at a time).
  zcc::MutexLock commit_lock(&commit_mu_);
  // Steps whose commit timeout has passed are abandoned now, not at the
  // committer's next round: gc removes every partial older than the timeout.
  if (IsCommitter()) ExpirePending();
  if (options_.node_local_root) ExpireNodeSteps();
  return ApplyRetention();
}

bool Job::IsCommitter() const {
  zcc::MutexLock lock(&mu_);
  return committer_;
}

void Job::Tick() {
  zcc::MutexLock lock(&mu_);
  tick_due_ = true;
  ++asked_;
}

void Job::TickWork() {
  if (options_.node_local_root) {
    // Nothing commits here; the store's `latest` is followed while a step
    // sent from here waits for the other nodes.
    ExpireNodeSteps();
    uploader_->FollowStore();
    return;
  }
  if (!IsCommitter()) {
    // Another daemon commits this job (or none has registered rank 0 here
    // yet); follow its progress through `latest`.
    auto latest = checkpoint::ReadLatest(options_.job_dir, options_.storage);
    zcc::MutexLock lock(&mu_);
    if (latest.ok()) last_committed_step_ = *latest;
    return;
  }
  bool first = false;
  {
    zcc::MutexLock lock(&mu_);
    first = !std::exchange(read_latest_, true);
  }
  if (first) {
    // A zccd started where the job committed before (a restart): until it
    // commits a step, the newest commit is what `latest` names, whether or
    // not rank 0 registered here before this round.
    auto latest = checkpoint::ReadLatest(options_.job_dir, options_.storage);
    zcc::MutexLock lock(&mu_);
    if (latest.ok()) last_committed_step_ = std::max(last_committed_step_, *latest);
  }
  ExpirePending();
  int64_t newest = -1;
  {
    zcc::MutexLock lock(&mu_);
    if (pending_.empty()) return;
    newest = pending_.rbegin()->first;
  }
  CommitPending(newest);
}

void Job::ExpirePending() {
  std::vector<int64_t> expired;
  {
    zcc::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const auto& [step, since] : pending_) {
      if (now - since > options_.commit_timeout) expired.push_back(step);
    }
    for (int64_t step : expired) {
      if (options_.metrics != nullptr) {
        options_.metrics->errors(metrics::ErrorKind::kCommitTimeout).Increment();
      }
      auto mixed = mixed_.find(step);
      SetError(absl::StrCat(
          "commit of step ", step, " timed out after ",
          absl::FormatDuration(options_.commit_timeout),
          mixed == mixed_.end()
              ? std::string(" waiting for other ranks' manifests")
              : absl::StrCat(" with every rank's manifest there, but not all of one run and "
                             "timeline (", mixed->second, ")"),
          "; it will be removed"));
    }
  }
  for (int64_t step : expired) DropPending(step, "abandoned: commit timed out");
}

bool Job::BeginRestore(uint32_t rank, int64_t step) {
  zcc::MutexLock lock(&mu_);
  if (removing_.count(step) > 0) return false;
  restoring_.insert({rank, step});
  return true;
}

void Job::EndRestore(uint32_t rank, int64_t step) {
  zcc::MutexLock lock(&mu_);
  auto it = restoring_.find({rank, step});
  if (it != restoring_.end()) restoring_.erase(it);
}

void Job::SetError(std::string error) {
  ZCC_LOG(ERROR) << "job " << options_.job_id << ": " << error;
  last_error_ = std::move(error);
}

void Job::ExpectRelayout() {
  zcc::MutexLock lock(&relayout_mu_);
  ++relayouts_pending_;
}

void Job::RelayoutDone() {
  zcc::MutexLock lock(&relayout_mu_);
  --relayouts_pending_;
}

bool Job::AwaitRelayout(const std::function<bool()>& stop) const {
  zcc::MutexLock lock(&relayout_mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(relayout_mu_) {
    return relayouts_pending_ == 0;
  };
  // Woken when the write ends; a second at a time to notice `stop` (a
  // client gone or zccd stopping has no wake-up of its own).
  while (!relayout_mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(1))) {
    if (stop && stop()) return false;
  }
  return true;
}

bool Job::relayout_pending() const {
  zcc::MutexLock lock(&relayout_mu_);
  return relayouts_pending_ > 0;
}

}  // namespace zcc::daemon
