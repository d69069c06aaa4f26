#include "daemon/jobs/job_uploader.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_dirs.h"
#include "checkpoint/step_upload.h"
#include "format/manifest.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/thread_priority.h"

namespace zcc::daemon {

namespace {

// Whether `dir` holds step `step` committed (its COMMITTED there).
bool HoldsCommitted(storage::Storage& fs, const std::string& dir, int64_t step) {
  return fs.Stat(JoinPath(JoinPath(dir, format::StepDirName(step)), format::kCommittedFileName))
      .ok();
}

}  // namespace

JobUploader::JobUploader(UploaderOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

JobUploader::~JobUploader() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  LeaveIdlePriority(thread_.native_handle());  // so that it sees the stop soon
  thread_.join();
}

void JobUploader::OnCommitted(int64_t step, absl::Time write_began) {
  zcc::MutexLock lock(&mu_);
  if (LeftBehindLocked(step, write_began)) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": step " << step
                  << " is not sent to the store: training went on from step " << went_back_to_;
    return;
  }
  // The latest commit is what the store should hold: a newer step, or an
  // older one committed again (a run resumed from it) supersedes the one
  // waiting.
  if (wanted_ < 0) waiting_since_ = absl::Now();
  wanted_ = step;
  wanted_write_began_ = write_began;
  retry_at_ = absl::InfinitePast();  // try at once
}

void JobUploader::NoteWentOnFrom(int64_t restored_from_disk) {
  zcc::MutexLock lock(&mu_);
  went_on_from_disk_ = restored_from_disk;
}

void JobUploader::WentBack(int64_t restored, absl::Time at) {
  zcc::MutexLock lock(&mu_);
  went_back_to_ = restored;
  went_back_at_ = at;
  if (wanted_ >= 0 && LeftBehindLocked(wanted_, wanted_write_began_)) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": step " << wanted_
                  << " is not sent to the store: training went on from step " << restored;
    wanted_ = -1;
    waiting_since_ = absl::InfiniteFuture();
  }
  for (auto it = node_queue_.begin(); it != node_queue_.end();) {
    if (!LeftBehindLocked(it->first, it->second)) {
      ++it;
      continue;
    }
    dropped_.push_back({it->first, "training went on from an older step"});
    it = node_queue_.erase(it);
  }
}

bool JobUploader::LeftBehindLocked(int64_t step, absl::Time write_began) const {
  return went_back_to_ >= 0 && step > went_back_to_ && write_began < went_back_at_;
}

void JobUploader::AfterCommitInStore(int64_t step, absl::Time write_began) {
  int64_t restored = -1;
  {
    zcc::MutexLock lock(&mu_);
    if (!LeftBehindLocked(step, write_began)) return;
    restored = went_back_to_;
  }
  // Only where `latest` names this step (not where a step of the run that
  // went on has committed there since).
  auto back =
      checkpoint::PointLatestBack(*options_.storage, options_.upload_dir, restored, step);
  if (!back.ok()) {
    Failed(absl::StrCat("pointing the store's latest back to step ", restored, " (step ", step,
                        ", of the run left behind, was committed there as the job went back)"),
           back.status());
    return;
  }
  if (back->back_to < 0) return;
  ZCC_LOG(WARNING) << "job " << options_.job_id << ": step " << step
                   << ", of the run left behind, was committed in the store as training went on "
                   << "from step " << restored << "; the store's latest names step "
                   << back->back_to
                   << (back->committed ? " again" : " (not committed there, for now)");
}

void JobUploader::OnNodeWritten(int64_t step, absl::Time write_began) {
  zcc::MutexLock lock(&mu_);
  if (LeftBehindLocked(step, write_began)) {
    dropped_.push_back({step, "training went on from an older step"});
    return;
  }
  if (node_queue_.empty() && uploading_ < 0) waiting_since_ = absl::Now();
  QueueNodeStep(step, write_began);
  retry_at_ = absl::InfinitePast();  // try at once
}

bool JobUploader::OnRankRegistered(uint32_t rank, const std::string& run_id) {
  zcc::MutexLock lock(&mu_);
  auto [it, first] = rank_runs_.try_emplace(rank, run_id);
  if (!first && !run_id.empty() && it->second == run_id) return false;
  it->second = run_id;
  const bool new_run = run_id.empty() || run_id != run_id_;
  if (new_run) {
    for (const auto& [step, began] : node_queue_) {
      dropped_.push_back({step, "a new run of the job registered"});
    }
    node_queue_.clear();
    awaiting_commit_ = -1;  // an earlier run's
    run_id_ = run_id;
  }
  forget_[run_id].push_back(rank);
  return new_run;
}

bool JobUploader::Stopping() const {
  zcc::MutexLock lock(&mu_);
  return stop_;
}

void JobUploader::QueueNodeStep(int64_t step, absl::Time write_began) {
  node_queue_.emplace(step, write_began);
  while (node_queue_.size() > kMaxNodeStepsWaiting) {
    dropped_.push_back({node_queue_.begin()->first,
                        "newer steps wait (the store is slower than the checkpoints)"});
    node_queue_.erase(node_queue_.begin());
  }
}

void JobUploader::ApplyStoreRetention(int64_t committed) {
  checkpoint::RetentionGuard guard;
  if (options_.node_local) {
    // An uncommitted step newer than the one just committed may be waiting
    // for a node cut off from the store for longer than the commit timeout:
    // only those below it are abandoned.
    guard.may_remove_partial = [committed](int64_t step) { return step < committed; };
  }
  auto retained = checkpoint::ApplyRetention(options_.upload_dir, options_.retention, guard,
                                             options_.commit_timeout, options_.storage);
  if (!retained.ok()) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": retention in " << options_.upload_dir
                     << " failed: " << retained.status();
  }
}

void JobUploader::Failed(const std::string& what, const absl::Status& status) {
  if (absl::IsCancelled(status)) return;  // zccd is stopping
  ZCC_LOG(WARNING) << "job " << options_.job_id << ": " << what << " to " << options_.upload_dir
                   << " failed: " << status;
  if (options_.metrics != nullptr) options_.metrics->errors(metrics::ErrorKind::kUpload).Increment();
}

void JobUploader::Forget(const std::string& run_id, const std::vector<uint32_t>& ranks) {
  auto forgot = checkpoint::ForgetRankParts(*options_.storage, options_.upload_dir, ranks, run_id);
  if (!forgot.ok()) {
    // Then this run's steps are not sent from here: an earlier run's part
    // could complete one of them.
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": could not remove an earlier run's parts "
                     << "of uncommitted steps in " << options_.upload_dir << ": " << forgot.status();
    zcc::MutexLock lock(&mu_);
    error_ = absl::StrCat("removing an earlier run's parts: ", forgot.status().message());
    std::vector<uint32_t>& again = forget_[run_id];
    again.insert(again.end(), ranks.begin(), ranks.end());
    retry_at_ = absl::Now() + options_.retry_after;
    return;
  }
  if (*forgot > 0) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": removed " << *forgot
                  << " manifest(s) an earlier run of this node's ranks left in uncommitted steps "
                  << "of " << options_.upload_dir;
  }
}

bool JobUploader::Busy() const {
  zcc::MutexLock lock(&mu_);
  return HasWorkLocked() && error_.empty();
}

bool JobUploader::HasWork() const {
  zcc::MutexLock lock(&mu_);
  return HasWorkLocked();
}

bool JobUploader::HasWorkLocked() const {
  if (options_.node_local) {
    return wanted_ >= 0 || !node_queue_.empty() || !forget_.empty() || uploading_ >= 0;
  }
  return wanted_ >= 0;
}

void JobUploader::FollowStore() {
  // A step sent from here waits for other nodes' files: one read of the
  // store's `latest` a round until it is committed (nothing tells us), on
  // the uploader's thread (a partition stalls the read, not the caller).
  zcc::MutexLock lock(&mu_);
  if (options_.node_local && awaiting_commit_ >= 0) follow_due_ = true;
}

void JobUploader::SawStoreLatest(int64_t step) {
  {
    zcc::MutexLock lock(&mu_);
    if (step >= awaiting_commit_) awaiting_commit_ = -1;
    if (step == store_latest_) return;
    store_latest_ = step;  // back too, when a run resumed from an older step
  }
  if (options_.on_store_latest) options_.on_store_latest(step);
}

void JobUploader::CatchUp() {
  auto here = checkpoint::ReadLatest(options_.job_dir, options_.storage);
  // (A `latest` may name a step not committed here: a run went back to a
  // step it restored from the store. Nothing to send then.)
  if (!here.ok() || !HoldsCommitted(*options_.storage, options_.job_dir, *here)) return;
  auto there = checkpoint::ReadLatest(options_.upload_dir, options_.storage);
  // (The store's `latest` at this step names it whole only with its
  // COMMITTED there: an upload cut after it was uncommitted left it so.)
  if (there.ok() && *there > *here) return;
  if (there.ok() && *there == *here &&
      HoldsCommitted(*options_.storage, options_.upload_dir, *here)) {
    return;
  }
  zcc::MutexLock lock(&mu_);
  if (wanted_ >= 0) return;  // a commit came first
  ZCC_LOG(INFO) << "job " << options_.job_id << ": " << format::StepDirName(*here)
                << " is not in " << options_.upload_dir << " yet; uploading it";
  wanted_ = *here;
  wanted_write_began_ = absl::InfiniteFuture();
  waiting_since_ = absl::Now();
}

bool JobUploader::Uploading(int64_t step) const {
  zcc::MutexLock lock(&mu_);
  return uploading_ == step ||
         (options_.node_local && (wanted_ == step || node_queue_.count(step) > 0));
}

double JobUploader::LagSeconds() const {
  zcc::MutexLock lock(&mu_);
  const bool waiting =
      wanted_ >= 0 || (options_.node_local && (!node_queue_.empty() || uploading_ >= 0));
  if (!waiting) return 0;
  return absl::ToDoubleSeconds(absl::Now() - waiting_since_);
}

void JobUploader::FillStatus(v1::JobStatus* out) const {
  const double lag = LagSeconds();
  zcc::MutexLock lock(&mu_);
  out->set_upload_dir(options_.upload_dir);
  out->set_upload_node_local(options_.node_local);
  out->set_last_uploaded_step(uploaded_);
  int64_t pending = wanted_;
  if (options_.node_local) {
    pending = !node_queue_.empty() ? node_queue_.rbegin()->first : uploading_;
  }
  out->set_upload_pending_step(pending);
  out->set_upload_lag_seconds(lag);
  out->set_upload_error(error_);
}

void JobUploader::Loop() {
  // The local step is read as the job's owner.
  ScopedFsIdentity as_owner(options_.owner);
  // Reading the local step and handing it to the store's requests runs on
  // cores nothing else wants.
  MakeThisThreadIdle();
  // (The node-local mode has no local commit to catch up with: a step left
  // half sent by a stopped zccd is the store's debris, removed once old.)
  if (!options_.node_local) CatchUp();
  zcc::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const bool waiting = wanted_ >= 0 || (options_.node_local && !node_queue_.empty());
      const bool due = absl::Now() >= retry_at_;
      return stop_ || !dropped_.empty() || follow_due_ || (!forget_.empty() && due) ||
             (waiting && due);
    };
    const absl::Time wake = retry_at_;
    if (wake > absl::Now() && wake != absl::InfiniteFuture()) {
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    } else {
      mu_.Await(absl::Condition(&ready));
    }
    if (stop_) return;
    if (!dropped_.empty()) {
      const std::vector<Dropped> dropped = std::exchange(dropped_, {});
      mu_.Unlock();
      RemoveDropped(dropped);
      mu_.Lock();
      continue;
    }
    if (follow_due_) {
      follow_due_ = false;
      mu_.Unlock();
      auto latest = checkpoint::ReadLatest(options_.upload_dir, options_.storage);
      if (latest.ok()) SawStoreLatest(*latest);
      mu_.Lock();
      // No `latest` yet is no error; anything else is said once per reason
      // (a partition would otherwise log every round) and again once healed.
      std::string why;
      if (!latest.ok() && !absl::IsNotFound(latest.status())) why = latest.status().ToString();
      if (why != follow_error_) {
        follow_error_ = why;
        mu_.Unlock();
        if (!why.empty()) {
          ZCC_LOG(WARNING) << "job " << options_.job_id << ": cannot read " << options_.upload_dir
                           << "'s latest to learn of commits there: " << why;
        } else {
          ZCC_LOG(INFO) << "job " << options_.job_id << ": " << options_.upload_dir
                        << "'s latest can be read again";
        }
        mu_.Lock();
      }
      continue;
    }
    if (!ready()) continue;
    if (!forget_.empty()) {
      // Before any step of the new run goes out: one pass per run for
      // every rank registered meanwhile.
      auto first = forget_.begin();
      const std::string run_id = first->first;
      const std::vector<uint32_t> ranks = std::move(first->second);
      forget_.erase(first);
      mu_.Unlock();
      Forget(run_id, ranks);
      mu_.Lock();
      continue;
    }
    // A whole committed step (in the node-local mode, one committed here by
    // a relayout or a peer recovery) before this node's parts.
    const bool whole = wanted_ >= 0;
    int64_t step = wanted_;
    absl::Time write_began = wanted_write_began_;
    if (!whole) {
      step = node_queue_.begin()->first;
      write_began = node_queue_.begin()->second;
      node_queue_.erase(node_queue_.begin());
    }
    uploading_ = step;
    mu_.Unlock();
    if (whole) {
      Upload(step, write_began);
    } else {
      UploadNode(step, write_began);
    }
    mu_.Lock();
    uploading_ = -1;
    if (options_.node_local && node_queue_.empty() && wanted_ < 0) {
      waiting_since_ = absl::InfiniteFuture();
    }
  }
}

void JobUploader::RemoveDropped(const std::vector<Dropped>& steps) {
  for (const Dropped& d : steps) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": step " << d.step
                     << " is not sent to the store from this node: " << d.why;
    const absl::Status removed =
        checkpoint::RemoveWritingStepDir(*options_.storage, options_.job_dir, d.step);
    if (!removed.ok()) ZCC_LOG(WARNING) << removed;
  }
}

void JobUploader::KeepSent(int64_t step) {
  storage::Storage& fs = *options_.storage;
  const std::string kept_name = format::SentStepDirName(step);
  const std::string kept = JoinPath(options_.job_dir, kept_name);
  absl::Status st = fs.RemoveTree(kept);  // (the step sent before, by an earlier run)
  if (st.ok()) st = fs.Rename(checkpoint::WritingStepDir(fs, options_.job_dir, step), kept);
  if (!st.ok()) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": step " << step
                     << " is not kept on this node after its upload: " << st;
    const absl::Status removed = checkpoint::RemoveWritingStepDir(fs, options_.job_dir, step);
    if (!removed.ok()) ZCC_LOG(WARNING) << removed;
  }
  // One step kept: the copies of the steps sent before go.
  absl::StatusOr<std::vector<std::string>> names = fs.List(options_.job_dir);
  if (!names.ok()) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": the copies kept of earlier steps stay: "
                     << names.status();
    return;
  }
  for (const std::string& name : *names) {
    if (name == kept_name || !absl::StartsWith(name, "step-") || !absl::EndsWith(name, ".sent")) {
      continue;
    }
    const absl::Status removed = fs.RemoveTree(JoinPath(options_.job_dir, name));
    if (!removed.ok()) ZCC_LOG(WARNING) << "job " << options_.job_id << ": " << removed;
  }
}

std::vector<checkpoint::LeftBehindStep> JobUploader::LeftBehindInStore() const {
  {
    // Only after a going back this zccd saw (the store's requests for the
    // listing are not spent on every upload of every node).
    zcc::MutexLock lock(&mu_);
    if (went_back_to_ < 0) return {};
  }
  auto above = checkpoint::LeftBehindSteps(options_.upload_dir, options_.storage);
  if (!above.ok()) return {};  // none removed this time; the next commit lists them again
  int64_t went_on = -1;
  {
    zcc::MutexLock lock(&mu_);
    went_on = went_on_from_disk_;
  }
  return checkpoint::WithoutTakenUp(*std::move(above), went_on);
}

void JobUploader::RemovePassedInStore(const std::vector<checkpoint::LeftBehindStep>& above) {
  // No restore pins a step in the store (as its retention): one reading a
  // step removed here fails and falls back, never reads wrong bytes.
  auto removed = checkpoint::RemovePassedSteps(options_.upload_dir, above,
                                               checkpoint::RetentionGuard(), options_.storage);
  if (!removed.ok()) {
    ZCC_LOG(WARNING) << "job " << options_.job_id << ": the steps of a run left behind in "
                     << options_.upload_dir << " that this run's commits passed could not be "
                     << "removed: " << removed.status();
  } else if (!removed->empty()) {
    ZCC_LOG(INFO) << "job " << options_.job_id << ": removed " << removed->size()
                  << " step(s) of a run left behind from " << options_.upload_dir
                  << " that this run's commits passed (the first "
                  << format::StepDirName(removed->front())
                  << "): they would be on its timeline there again";
  }
}

void JobUploader::UploadNode(int64_t step, absl::Time write_began) {
  // The steps a run left behind above the store's `latest`: the ones this
  // commit passes go after it (as on a local root: Job::TryCommit).
  const std::vector<checkpoint::LeftBehindStep> above = LeftBehindInStore();
  const std::function<bool()> cancelled = [this] { return Stopping(); };
  checkpoint::UploadOptions options;
  options.write_began = write_began;
  options.cancelled = &cancelled;
  auto sent = checkpoint::UploadNodeStep(*options_.storage, options_.job_dir, step,
                                         options_.upload_dir, options_.job_id,
                                         options_.world_size, options);
  if (sent.ok()) {
    ZCC_LOG(INFO) << "upload job=" << options_.job_id << " step=" << step
                  << " bytes=" << sent->stats.bytes << " seconds=" << sent->stats.seconds
                  << " to " << options_.upload_dir << " (this node's ranks; "
                  << (sent->committed    ? std::string("committed there")
                      : sent->mixed_runs ? absl::StrCat("every rank's part there, but not all "
                                                        "of one run and timeline (", sent->mixed,
                                                        "): waiting for the rest of it")
                                         : absl::StrCat(sent->manifests_present, " of ",
                                                        options_.world_size,
                                                        " ranks there, the last node commits"))
                  << ")";
    if (options_.metrics != nullptr) options_.metrics->upload_bytes().Increment(sent->stats.bytes);
    // In the store now: the local copy is kept as this node's copy of the
    // newest step it sent, for restores to read (kept_copies.h).
    KeepSent(step);
    {
      zcc::MutexLock lock(&mu_);
      uploaded_ = step;
      error_.clear();
      if (!sent->committed) awaiting_commit_ = step;
    }
    if (sent->committed) {
      SawStoreLatest(step);
      AfterCommitInStore(step, write_began);
      RemovePassedInStore(above);
      ApplyStoreRetention(step);
    }
    return;
  }
  Failed(absl::StrCat("upload of this node's part of step ", step), sent.status());
  // The local step is gone (a gc removed it): nothing to send. Otherwise
  // (a store that answered a conflict, also FailedPrecondition) it is sent
  // again after the backoff, before newer steps (unless they are too many
  // by then).
  const bool gone =
      absl::IsFailedPrecondition(sent.status()) &&
      !options_.storage->Stat(checkpoint::WritingStepDir(*options_.storage, options_.job_dir, step))
           .ok();
  zcc::MutexLock lock(&mu_);
  error_ = absl::StrCat("upload of step ", step, " failed: ", sent.status().message());
  if (gone || absl::IsCancelled(sent.status())) return;
  QueueNodeStep(step, write_began);
  retry_at_ = absl::Now() + options_.retry_after;
}

void JobUploader::Upload(int64_t step, absl::Time write_began) {
  const std::vector<checkpoint::LeftBehindStep> above = LeftBehindInStore();
  const std::function<bool()> cancelled = [this] { return Stopping(); };
  checkpoint::UploadOptions options;
  options.write_began = write_began;
  options.cancelled = &cancelled;
  auto uploaded = checkpoint::UploadStep(*options_.storage, options_.job_dir, step,
                                         options_.upload_dir, options);
  if (uploaded.ok()) {
    ZCC_LOG(INFO) << "upload job=" << options_.job_id << " step=" << step
                  << " bytes=" << uploaded->bytes << " seconds=" << uploaded->seconds
                  << " to " << options_.upload_dir;
    if (options_.metrics != nullptr) options_.metrics->upload_bytes().Increment(uploaded->bytes);
    {
      // In the store from now on (retention there comes after).
      zcc::MutexLock lock(&mu_);
      uploaded_ = step;
      error_.clear();
      if (wanted_ == step) {
        wanted_ = -1;
        waiting_since_ = absl::InfiniteFuture();
      }
      // The node-local mode learns what the store's `latest` names from the
      // store (a newer commit there keeps it).
      if (options_.node_local) follow_due_ = true;
    }
    AfterCommitInStore(step, write_began);
    RemovePassedInStore(above);
    ApplyStoreRetention(step);
    return;
  }
  Failed(absl::StrCat("upload of step ", step), uploaded.status());
  // (FailedPrecondition is also a store's conflict, tried again.)
  const bool gone = absl::IsFailedPrecondition(uploaded.status()) &&
                    !HoldsCommitted(*options_.storage, options_.job_dir, step);
  zcc::MutexLock lock(&mu_);
  if (gone && wanted_ == step) {
    // The local step is gone (retention removed it first): nothing to send;
    // a newer one comes with the next commit.
    wanted_ = -1;
    waiting_since_ = absl::InfiniteFuture();
  }
  error_ = absl::StrCat("upload of step ", step, " failed: ", uploaded.status().message());
  if (wanted_ == step) retry_at_ = absl::Now() + options_.retry_after;
}

}  // namespace zcc::daemon
