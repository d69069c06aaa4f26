// Job's report of itself (zccctl status, the Status RPC, metrics): the
// job's checkpoint state, each rank's session, its memory and its uploads.
#include <limits>
#include <map>
#include <memory>

#include "absl/time/clock.h"
#include "daemon/jobs/job.h"
#include "format/manifest.h"

namespace zcc::daemon {

void Job::FillStatus(v1::JobStatus* out) const {
  std::map<uint32_t, std::shared_ptr<RankSession>> ranks;
  zcc::ReleasableMutexLock lock(&mu_);
  ranks = ranks_;
  out->set_job_id(options_.job_id);
  out->set_world_size(options_.world_size);
  out->set_checkpoint_dir(options_.job_dir);
  out->set_last_committed_step(last_committed_step_);
  out->set_last_checkpoint_bytes(last_checkpoint_.bytes);
  out->set_last_checkpoint_seconds(last_checkpoint_.seconds);
  out->set_last_checkpoint_gbps(
      last_checkpoint_.seconds > 0 ? last_checkpoint_.bytes / last_checkpoint_.seconds / 1e9 : 0);
  for (const auto& [step, since] : pending_) out->add_pending_commits(format::StepDirName(step));
  out->set_last_error(last_error_);
  lock.Release();
  uint64_t staging = 0;
  for (const auto& [rank, session] : ranks) {
    const RankCounters c = session->counters();
    v1::RankStatus* r = out->add_ranks();
    r->set_staging_bytes(session->segment_bytes());
    r->set_ema_bytes(session->ema_bytes());
    staging += session->segment_bytes();
    r->set_rank(rank);
    r->set_pid(session->options().pid);
    r->set_client_alive(!session->ClientProcessGone());
    r->set_last_snapshot_step(c.last_snapshot_step);
    r->set_last_persisted_step(c.last_persisted_step);
    r->set_snapshots_ingested(c.snapshots_ingested);
    r->set_snapshots_skipped(c.snapshots_skipped);
    r->set_persist_failures(c.persist_failures);
    r->set_bytes_per_snapshot(session->shards().layout.slot_bytes);
    r->set_slots_in_use(c.slots_in_use);
    r->set_replications_skipped(c.replications_skipped);
    r->set_last_error(c.last_error);
    r->set_last_ema_step(c.last_ema_step);
    r->set_ema_skipped_nonfinite(c.ema_skipped_nonfinite);
    r->set_ema_out_of_order(c.ema_out_of_order);
    r->set_ema_tensors(c.ema_tensors);
    r->set_run_id(session->shards().run_id);
    r->set_timeline(session->Timeline(std::numeric_limits<int64_t>::max()));
    r->set_daemon_pull(c.daemon_pull);
    r->set_pulls(c.pulls.pulls);
    r->set_pull_failures(c.pulls.failed);
    r->set_pull_bytes(c.pulls.bytes);
  }
  out->set_staging_bytes(staging);
  out->set_retained_bytes(retained_.bytes());
  retained_.FillStatus(out, absl::Now());
  if (uploader_ != nullptr) uploader_->FillStatus(out);
}

double Job::UploadLagSeconds() const {
  return uploader_ != nullptr ? uploader_->LagSeconds() : 0;
}

}  // namespace zcc::daemon
