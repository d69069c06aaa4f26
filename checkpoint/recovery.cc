#include "checkpoint/recovery.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "common/file_util.h"
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

absl::StatusOr<Recovery> RecoverJobDir(const std::string& job_dir, absl::Duration partial_max_age,
                                       storage::Storage* fs) {
  RetentionPolicy keep_all;
  keep_all.keep_last = std::numeric_limits<uint32_t>::max();
  ZCC_ASSIGN_OR_RETURN(RetentionResult cleaned,
                       ApplyRetention(job_dir, keep_all, RetentionGuard(), partial_max_age, fs));
  Recovery recovery;
  recovery.removed = std::move(cleaned.removed_partials);
  ZCC_ASSIGN_OR_RETURN(recovery.latest_repaired, RepairLatest(job_dir, fs));
  return recovery;
}

}  // namespace zcc::checkpoint
