#include "checkpoint/step_upload.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/copy_file.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {

absl::StatusOr<UploadStats> UploadStep(storage::Storage& fs, const std::string& job_dir,
                                       int64_t step, const std::string& store_job_dir,
                                       const UploadOptions& options) {
  const absl::Time start = absl::Now();
  const std::string local = JoinPath(job_dir, format::StepDirName(step));
  const std::string remote = JoinPath(store_job_dir, format::StepDirName(step));
  auto committed = storage::ReadWholeFile(fs, JoinPath(local, format::kCommittedFileName),
                                          format::kMaxManifestBytes);
  if (!committed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        local, " is not a committed step to upload: ", committed.status().message()));
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.List(local));
  // Uncommitted in the store from here until COMMITTED is copied last.
  const absl::Status uncommitted = fs.Remove(JoinPath(remote, format::kCommittedFileName));
  if (!uncommitted.ok() && !absl::IsNotFound(uncommitted)) return uncommitted;
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(remote));
  UploadStats stats;
  storage::CopyOptions copy;
  copy.cancelled = options.cancelled;
  copy.background = true;  // the store's requests never compete with training
  for (const std::string& name : names) {
    if (name == format::kCommittedFileName) continue;
    ZCC_ASSIGN_OR_RETURN(const uint64_t bytes,
                         storage::CopyFile(fs, JoinPath(local, name), fs, JoinPath(remote, name),
                                           copy));
    stats.bytes += bytes;
    ++stats.files;
  }
  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(remote, format::kCommittedFileName), *committed));
  stats.bytes += committed->size();
  ++stats.files;
  ZCC_RETURN_IF_ERROR(PointLatest(fs, store_job_dir, step, options.write_began));
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace zcc::checkpoint
