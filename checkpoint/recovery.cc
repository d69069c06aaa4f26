#include "checkpoint/recovery.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {

absl::StatusOr<std::optional<int64_t>> RepairLatest(const std::string& job_dir,
                                                    storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  const absl::StatusOr<int64_t> latest = ReadLatest(job_dir, &fs);
  if (latest.ok()) return std::nullopt;
  if (!absl::IsNotFound(latest.status()) && !absl::IsDataLoss(latest.status())) {
    return latest.status();
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir, &fs));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string step_dir = JoinPath(job_dir, format::StepDirName(*it));
    if (!ReadCommitRecord(step_dir, &fs).ok()) continue;
    ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, JoinPath(job_dir, format::kLatestFileName),
                                                 absl::StrCat(format::StepDirName(*it), "\n")));
    return *it;
  }
  return std::nullopt;
}

namespace {

// The step-N.partial/ directories holding the contents a commit of step N
// replaced (HoldsReplacedStep: the exchange done, their move away cut
// short): a write of step N must never find their manifests, at any age, so
// they go (ForgetReplacedStep; the directory is then an ordinary partial).
// A commit in progress holds a newer COMMITTED. Logged, never fatal: a
// commit attempt of step N does the same first (TryCommit).
void ForgetReplacedSteps(storage::Storage& fs, const std::string& job_dir) {
  auto names = fs.List(job_dir);
  if (!names.ok()) return;  // (ApplyRetention reports it)
  for (const std::string& name : *names) {
    absl::string_view base = name;
    if (!absl::ConsumeSuffix(&base, ".partial")) continue;
    auto step = format::ParseStepDirName(base);
    if (!step.ok() || !HoldsReplacedStep(fs, job_dir, *step)) continue;
    auto forgot = ForgetReplacedStep(fs, job_dir, *step);
    if (forgot.ok()) {
      ZCC_LOG(WARNING) << JoinPath(job_dir, name) << " held the step a commit of step " << *step
                       << " replaced: its COMMITTED and " << *forgot << " manifest(s) removed";
    } else {
      ZCC_LOG(WARNING) << JoinPath(job_dir, name) << " holds the step a commit of step " << *step
                       << " replaced, which could not be removed: " << forgot.status();
    }
  }
}

}  // namespace

absl::StatusOr<Recovery> RecoverJobDir(const std::string& job_dir, absl::Duration partial_max_age,
                                       storage::Storage* storage) {
  storage::Storage& fs = storage::StorageOrDefault(storage);
  Recovery recovery;
  ForgetReplacedSteps(fs, job_dir);
  RetentionPolicy keep_all;
  keep_all.keep_last = std::numeric_limits<uint32_t>::max();
  ZCC_ASSIGN_OR_RETURN(RetentionResult cleaned,
                       ApplyRetention(job_dir, keep_all, RetentionGuard(), partial_max_age, &fs));
  for (std::string& name : cleaned.removed_partials) recovery.removed.push_back(std::move(name));
  ZCC_ASSIGN_OR_RETURN(recovery.latest_repaired, RepairLatest(job_dir, &fs));
  return recovery;
}

}  // namespace zcc::checkpoint
