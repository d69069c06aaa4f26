#include "daemon/restore_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/fs_identity.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/restorer.h"
#include "format/manifest.h"

namespace zcc::daemon {

RestoreService::RestoreService(std::string shm_prefix, uint64_t max_slot_bytes,
                               metrics::ZccMetrics* metrics)
    : shm_prefix_(std::move(shm_prefix)), max_slot_bytes_(max_slot_bytes), metrics_(metrics) {}

std::string RestoreService::BufferName(const char* what, const std::string& job_id, uint32_t rank,
                                       uint64_t generation) {
  return absl::StrCat(shm_prefix_, ".", job_id, ".r", rank, ".", what, ".g", generation, ".",
                      next_buffer_seq_.fetch_add(1));
}

absl::Status RestoreService::VerifyCached(const std::string& step_dir) {
  auto record = checkpoint::ReadCommitRecord(step_dir);
  if (!record.ok()) return record.status();
  zcc::MutexLock lock(&verify_mu_);
  const auto key = std::make_pair(step_dir, record->manifest_hash);
  auto it = verified_.find(key);
  if (it != verified_.end()) return it->second;
  const absl::Time start = absl::Now();
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  const absl::Status status =
      checkpoint::VerifyStep(step_dir, checkpoint::IoOptions(), &grouped).status();
  if (status.ok()) {
    indexes_.emplace_back(key, std::move(grouped));
    while (indexes_.size() > kCachedIndexes) indexes_.pop_front();
    ZCC_LOG(INFO) << "verified " << step_dir << " in "
                  << absl::FormatDuration(absl::Now() - start);
  } else {
    metrics_->errors(metrics::ErrorKind::kVerify).Increment();
    ZCC_LOG(ERROR) << "checkpoint " << step_dir << " failed verification: " << status.message();
  }
  if (verified_.size() > 256) verified_.clear();
  verified_[key] = status;
  return status;
}

absl::StatusOr<std::shared_ptr<const checkpoint::GroupedIndex>> RestoreService::StepIndexFor(
    const std::string& step_dir) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, checkpoint::ReadCommitRecord(step_dir));
  // Under the verification lock, like a verification: the ranks of a job that
  // miss the cache together read the index once, the first for all of them.
  zcc::MutexLock lock(&verify_mu_);
  const StepKey key(step_dir, record.manifest_hash);
  for (const auto& [cached, index] : indexes_) {
    if (cached == key) return index;
  }
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GroupedIndex> index,
                       checkpoint::LoadGroupedIndex(step_dir));
  indexes_.emplace_back(key, index);
  while (indexes_.size() > kCachedIndexes) indexes_.pop_front();
  return index;
}

void RestoreService::MarkDamaged(const std::string& step_dir, const absl::Status& why) {
  auto record = checkpoint::ReadCommitRecord(step_dir);
  if (!record.ok()) return;  // unreadable now: VerifyCached rejects it anyway
  metrics_->errors(metrics::ErrorKind::kVerify).Increment();
  zcc::MutexLock lock(&verify_mu_);
  verified_[std::make_pair(step_dir, record->manifest_hash)] = why;
}

absl::StatusOr<v1::RestoreResponse> RestoreService::Restore(
    Job& job, RankSession& session, const v1::RestoreRequest& req,
    const std::function<bool()>& cancelled) {
  const std::string& job_dir = job.options().job_dir;
  // Read with the job owner's identity: nothing planted in the directory can
  // make zccd read what that user could not.
  ScopedFsIdentity as_owner(job.options().owner);
  std::vector<std::string> skipped;
  // A step found damaged while it is read (after an earlier verification was
  // cached, or damaged since) is marked bad and the choice made again, so a
  // restore of the newest step falls back to the next older one that reads
  // back intact. Each round rejects one more step, so this ends.
  for (;;) {
    if (cancelled()) return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
    ZCC_ASSIGN_OR_RETURN(
        checkpoint::RestoreChoice choice,
        checkpoint::ChooseRestoreStep(job_dir, req.step() < 0 ? -1 : req.step(),
                                      [this](const std::string& dir) { return VerifyCached(dir); }));
    for (const std::string& why : choice.rejected) {
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                       << ": restore skipped " << why;
    }
    skipped.insert(skipped.end(), choice.rejected.begin(), choice.rejected.end());
    const std::string step_dir = JoinPath(job_dir, format::StepDirName(choice.step));
    auto resp = RestoreStep(job, session, req, step_dir, choice.step, cancelled);
    if (resp.ok()) {
      for (const std::string& why : skipped) resp->add_skipped_steps(why);
      return resp;
    }
    const bool damaged = resp.status().code() == absl::StatusCode::kDataLoss ||
                         resp.status().code() == absl::StatusCode::kNotFound;
    if (!damaged || req.step() >= 0) return resp.status();
    MarkDamaged(step_dir, resp.status());
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": "
                     << resp.status().message() << "; falling back to an older step";
  }
}

absl::StatusOr<v1::RestoreResponse> RestoreService::RestoreStep(
    Job& job, RankSession& session, const v1::RestoreRequest& req, const std::string& step_dir,
    int64_t step, const std::function<bool()>& cancelled) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, checkpoint::ReadCommitRecord(step_dir));
  // Any world size and layout: the step describes global tensors.
  const std::string shm_name = BufferName("restore", req.job_id(), req.rank(), req.generation());
  job.BeginRestore(req.rank(), step);
  const absl::Time read_start = absl::Now();
  auto index = StepIndexFor(step_dir);
  if (!index.ok()) {
    metrics_->errors(metrics::ErrorKind::kRestore).Increment();
    job.EndRestore(req.rank(), step);
    return Annotate(index.status(), absl::StrCat("restore of ", format::StepDirName(step)));
  }
  auto buffer = ReadRestoreBuffer(step_dir, **index, session.registered(), shm_name,
                                  max_slot_bytes_, session.options().segment_owner,
                                  cancelled);
  metrics_->restore_seconds().ObserveDuration(absl::Now() - read_start);
  if (!buffer.ok()) {
    metrics_->errors(metrics::ErrorKind::kRestore).Increment();
    job.EndRestore(req.rank(), step);
    return Annotate(buffer.status(), absl::StrCat("restore of ", format::StepDirName(step)));
  }
  if (absl::Status st = session.RestoreEma(step_dir, **index, step); !st.ok()) {
    metrics_->errors(metrics::ErrorKind::kRestore).Increment();
    job.EndRestore(req.rank(), step);
    return Annotate(st, absl::StrCat("restore of the EMA from ", format::StepDirName(step)));
  }
  v1::RestoreResponse resp;
  resp.set_step(step);
  resp.set_shm_name(shm_name);
  resp.set_segment_bytes(buffer->segment.size());
  resp.set_data_offset(buffer->data_offset);
  const auto& registered = session.registered();
  for (size_t i = 0; i < registered.size(); ++i) {
    v1::TensorPlacement* p = resp.add_placements();
    p->set_name(registered[i].name);
    p->set_offset(buffer->offsets[i]);
    p->set_nbytes(registered[i].nbytes);
    p->set_staged(true);
  }
  resp.set_restore_id(session.restore_buffers().Add(std::move(buffer->segment), step));
  ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": restored "
                << format::StepDirName(step) << " into " << shm_name;
  return resp;
}

}  // namespace zcc::daemon
