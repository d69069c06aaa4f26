#include "daemon/jobs/housekeeper.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/log.h"

namespace zcc::daemon {

Housekeeper::Housekeeper(const DaemonConfig& config, metrics::ZccMetrics* metrics,
                         Registry registry)
    : config_(config), metrics_(metrics), registry_(std::move(registry)), started_(absl::Now()) {}

Housekeeper::~Housekeeper() {
  StopWork();
  StopHeartbeats();
}

void Housekeeper::Start() {
  heartbeater_ = std::thread([this] { HeartbeatLoop(); });
  reaper_ = std::thread([this] { ReaperLoop(); });
  housekeeper_ = std::thread([this] { HousekeepingLoop(); });
}

void Housekeeper::StopWork() {
  {
    zcc::MutexLock lock(&work_mu_);
    work_stop_ = true;
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  {
    // Ranks already found dead are retired first (their failure writes).
    zcc::MutexLock lock(&reap_mu_);
    reap_stop_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
}

void Housekeeper::StopHeartbeats() {
  std::shared_ptr<const std::vector<std::shared_ptr<RankSession>>> old;
  {
    zcc::MutexLock lock(&beat_mu_);
    beat_stop_ = true;
    old = std::move(sessions_);
  }
  if (heartbeater_.joinable()) heartbeater_.join();
}

bool Housekeeper::Healthy() const {
  const int64_t last = last_round_ns_.load();
  const absl::Duration since = absl::Now() - absl::FromUnixNanos(last);
  // Generous: a round may include a commit and retention on a slow file
  // system; only a thread stuck for minutes is unhealthy.
  return since < absl::Minutes(2) || absl::Now() - started_ < absl::Minutes(2);
}

void Housekeeper::PublishSessions() {
  auto list = std::make_shared<std::vector<std::shared_ptr<RankSession>>>();
  for (const auto& job : registry_.jobs()) {
    for (auto& session : job->Ranks()) list->push_back(std::move(session));
  }
  std::shared_ptr<const std::vector<std::shared_ptr<RankSession>>> old;
  {
    zcc::MutexLock lock(&beat_mu_);
    if (beat_stop_) return;
    old = std::exchange(sessions_, std::move(list));
  }
  // `old` goes here, on the publishing thread: a session dropped from the
  // registry is destroyed (segment unmapped and removed) here, never on the
  // heartbeat thread.
}

void Housekeeper::HeartbeatLoop() {
  zcc::MutexLock lock(&beat_mu_);
  while (!beat_stop_) {
    // Atomic stores only, under beat_mu_, which publishing holds just for a
    // pointer swap: this thread never owns a session, so never destroys one.
    if (sessions_ != nullptr) {
      for (const auto& session : *sessions_) session->Heartbeat();
    }
    beat_mu_.AwaitWithTimeout(absl::Condition(&beat_stop_), config_.heartbeat_interval);
  }
}

void Housekeeper::ReaperLoop() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reap_mu_) {
    return !reap_queue_.empty() || reap_stop_;
  };
  while (true) {
    Retirement next;
    {
      zcc::MutexLock lock(&reap_mu_);
      reap_mu_.Await(absl::Condition(&ready));
      if (reap_queue_.empty()) return;  // stopping, nothing left
      next = std::move(reap_queue_.front());
      reap_queue_.pop_front();
    }
    if (next.session != nullptr) Retire(next);
    // (A job handed over by LetGo, if this was its last reference, is
    // destroyed here: its committer is joined on this thread.)
  }
}

void Housekeeper::LetGo(std::shared_ptr<Job> job) {
  if (job == nullptr) return;
  zcc::MutexLock lock(&reap_mu_);
  // Once the reaper is stopping (shutdown), the reference goes here, after
  // the lock is released (`job` is destroyed last).
  if (!reap_stop_) reap_queue_.push_back({std::move(job), nullptr});
}

void Housekeeper::Retire(const Retirement& r) {
  const uint32_t rank = r.session->shards().rank;
  if (r.session->options().persist_on_failure) {
    if (auto step = r.session->PersistNewestOnFailure(); step.has_value()) {
      ZCC_LOG(WARNING) << "job " << r.job->options().job_id << " rank " << rank
                       << ": persisted its newest snapshot, step " << *step
                       << " (checkpoint-on-failure)";
    }
  }
  if (auto step = r.session->ReplicateOwed(); step.has_value()) {
    ZCC_LOG(INFO) << "job " << r.job->options().job_id << " rank " << rank
                  << ": its trainer is gone with a due replication step left out; its newest "
                  << "snapshot, step " << *step << ", goes to the peer tier in its place";
  }
  r.session->Stop();
  // What its last writes made committable is committed (where this daemon
  // commits) before the rank leaves, so a restore right after sees it.
  r.job->AwaitCommitter();
  // Kept before the rank leaves the job: a job with no rank and nothing
  // retained is dropped by the next housekeeping round, and its snapshots
  // with it.
  Retain(*r.job, r.session);
  r.job->RemoveRank(rank, r.session->options().generation);
  PublishSessions();
}

void Housekeeper::Retain(Job& job, std::shared_ptr<RankSession> stopped) {
  if (config_.retain_snapshots <= absl::ZeroDuration()) return;
  const uint32_t rank = stopped->shards().rank;
  const std::vector<int64_t> steps =
      job.retained().Keep(rank, std::move(stopped), absl::Now() + config_.retain_snapshots);
  if (steps.empty()) return;
  ZCC_LOG(INFO) << "job " << job.options().job_id << " rank " << rank << ": keeping "
                << steps.size() << " snapshot(s) in memory, newest step " << steps.front()
                << ", for " << absl::FormatDuration(config_.retain_snapshots)
                << " (a restarted trainer restores from memory)";
}

bool Housekeeper::RetireNow(const std::shared_ptr<Job>& job,
                            const std::shared_ptr<RankSession>& session, absl::Duration wait,
                            const RetireCaller* caller) {
  const uint32_t rank = session->shards().rank;
  if (session->BeginRetirement()) {
    if (caller == nullptr) {
      Retire({job, session});
      return true;
    }
    // On the reaper, so that the caller can be answered in time while the
    // checkpoint-on-failure is written.
    zcc::MutexLock lock(&reap_mu_);
    reap_queue_.push_back({job, session});
  } else if (caller == nullptr) {
    // Being retired or stopped already (the reaper, an unregistration, a
    // replacement): its checkpoint-on-failure, or the write of a due step
    // and its commit, may take a while.
    job->AwaitRankGone(rank, session.get(), absl::Now() + wait);
    return true;
  }
  const absl::Time began = session->RetiringSince();
  const absl::Time deadline = began + kMaxRetireWait;
  // The rank's removal, the answer's time and the cap each wake the wait;
  // a cancellation only the once-a-second look at it.
  const absl::Duration look_for_gone =
      caller->gone != nullptr ? absl::Seconds(1) : absl::InfiniteDuration();
  bool told = false;
  auto next_wake = [&] {
    return std::min({deadline, caller->answer_by, absl::Now() + look_for_gone});
  };
  while (!job->AwaitRankGone(rank, session.get(), next_wake())) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      ZCC_LOG(WARNING) << "job " << job->options().job_id << " rank " << rank
                       << ": the previous trainer has been retiring for "
                       << absl::FormatDuration(absl::Trunc(now - began, absl::Seconds(1)))
                       << "; a registration goes on without waiting longer (the snapshots it "
                          "keeps are not adopted)";
      return true;
    }
    if (now >= caller->answer_by || (caller->gone != nullptr && caller->gone())) return false;
    if (!told) {
      told = true;
      ZCC_LOG(INFO) << "job " << job->options().job_id << " rank " << rank
                    << ": a registration waits for the previous trainer's retirement (its "
                       "last writes and their commit), to adopt its snapshots";
    }
  }
  ZCC_LOG(INFO) << "job " << job->options().job_id << " rank " << rank
                << ": the previous trainer retired (within "
                << absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(1)))
                << " of its retirement's start); the registration goes on";
  return true;
}

void Housekeeper::HousekeepingLoop() {
  zcc::MutexLock lock(&work_mu_);
  while (!work_stop_) {
    work_mu_.AwaitWithTimeout(absl::Condition(&work_stop_), config_.heartbeat_interval);
    if (work_stop_) break;
    work_mu_.Unlock();
    metrics_->staging_bytes().Set(static_cast<double>(registry_.staging_bytes()));
    if (registry_.recheck_pool) registry_.recheck_pool();
    if (registry_.export_peer_metrics) registry_.export_peer_metrics();
    size_t ranks = 0;
    uint64_t retained_bytes = 0;
    std::vector<std::shared_ptr<Job>> jobs = registry_.jobs();
    double upload_lag = 0;
    for (const auto& job : jobs) upload_lag = std::max(upload_lag, job->UploadLagSeconds());
    metrics_->upload_lag_seconds().Set(upload_lag);
    for (const auto& job : jobs) {
      retained_bytes += job->retained().bytes();
      for (const auto& session : job->Ranks()) {
        ++ranks;
        // Skips are counted by the trainer in shared memory; export the growth.
        const uint64_t skipped = session->counters().snapshots_skipped;
        uint64_t& seen = skipped_seen_[session.get()];
        if (skipped > seen) metrics_->snapshots_skipped().Increment(skipped - seen);
        seen = skipped;
        const bool gone = session->ClientProcessGone();
        const bool cut = session->SegmentCut();
        if ((gone || cut || !session->ClientAlive(config_.client_timeout)) &&
            session->BeginRetirement()) {
          metrics_->errors(cut ? metrics::ErrorKind::kSegmentCut
                               : metrics::ErrorKind::kClientTimeout)
              .Increment();
          skipped_seen_.erase(session.get());
          ZCC_LOG(WARNING) << "job " << job->options().job_id << " rank "
                           << session->shards().rank << ": trainer pid "
                           << session->options().pid
                           << (cut    ? " cut its staging segment short (ftruncate); zccd reads "
                                        "zeros there now"
                               : gone ? " exited"
                                      : " stopped sending heartbeats")
                           << "; dropping its registration";

          zcc::MutexLock reap_lock(&reap_mu_);
          reap_queue_.push_back({job, session});
        }
      }
      job->Tick();
      if (const size_t expired = job->retained().DropExpired(absl::Now()); expired > 0) {
        ZCC_LOG(INFO) << "job " << job->options().job_id << ": dropped " << expired
                      << " rank(s)' retained snapshots (retain_snapshots_s passed)";
      }
    }
    metrics_->registered_ranks().Set(static_cast<double>(ranks));
    metrics_->retained_snapshot_bytes().Set(static_cast<double>(retained_bytes));
    last_round_ns_.store(absl::GetCurrentTimeNanos());
    PublishSessions();
    // The round's references, and the jobs forgotten now, are let go of on
    // the reaper thread: one of them may be a job's last.
    for (std::shared_ptr<Job>& dropped : registry_.drop_idle_jobs()) {
      jobs.push_back(std::move(dropped));
    }
    for (std::shared_ptr<Job>& job : jobs) LetGo(std::move(job));
    work_mu_.Lock();
  }
}

}  // namespace zcc::daemon
