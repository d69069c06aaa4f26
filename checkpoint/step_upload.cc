#include "checkpoint/step_upload.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/step_dirs.h"
#include "checkpoint/step_files.h"
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
  UploadStats stats;
  // Committed in the store already as it is here (an upload tried again, or
  // caught up after the store could not be read): only `latest` may be left
  // to move. Uncommitted to be copied again, the store would lack that step
  // for the whole copy, and for good where the copy is cut.
  auto there = storage::ReadWholeFile(fs, JoinPath(remote, format::kCommittedFileName),
                                      format::kMaxManifestBytes);
  if (there.ok() && *there == *committed) {
    ZCC_RETURN_IF_ERROR(PointLatest(fs, store_job_dir, step, options.write_began));
    stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return stats;
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.List(local));
  // Uncommitted in the store from here until COMMITTED is copied last.
  const absl::Status uncommitted = fs.Remove(JoinPath(remote, format::kCommittedFileName));
  if (!uncommitted.ok() && !absl::IsNotFound(uncommitted)) return uncommitted;
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(remote));
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

absl::StatusOr<NodeUploadResult> UploadNodeStep(storage::Storage& fs, const std::string& job_dir,
                                                int64_t step, const std::string& store_job_dir,
                                                const std::string& job_id, uint32_t world_size,
                                                const UploadOptions& options) {
  const absl::Time start = absl::Now();
  const std::string local = WritingStepDir(fs, job_dir, step);
  const std::string remote = JoinPath(store_job_dir, format::StepDirName(step));
  auto listed = fs.List(local);
  if (!listed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        local, " holds no step this node wrote: ", listed.status().message()));
  }
  // Each rank's manifest vouches for its files: it goes after all of them.
  std::vector<std::string> files;
  std::vector<std::string> manifests;
  for (const std::string& name : *listed) {
    if (name == format::kCommittedFileName || absl::StrContains(name, ".pull.")) continue;
    (absl::EndsWith(name, ".manifest.json") ? manifests : files).push_back(name);
  }
  if (manifests.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(local, " holds no rank manifest: no rank of this node finished the step"));
  }
  NodeUploadResult result;
  // Committed already with this node's part as it is here (an attempt cut
  // after its commit): only `latest` may be left to move.
  if (fs.Stat(JoinPath(remote, format::kCommittedFileName)).ok()) {
    bool ours = true;
    for (const std::string& name : manifests) {
      auto here = storage::ReadWholeFile(fs, JoinPath(local, name), format::kMaxManifestBytes);
      auto there = storage::ReadWholeFile(fs, JoinPath(remote, name), format::kMaxManifestBytes);
      if (!here.ok()) return here.status();
      ours = ours && there.ok() && *there == *here;
    }
    if (ours) {
      ZCC_RETURN_IF_ERROR(PointLatest(fs, store_job_dir, step, options.write_began));
      result.committed = true;
      result.stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
      return result;
    }
  }
  // Otherwise a committed step written again (a run resumed from an older
  // one): it is uncommitted from here, and none of its ranks' manifests may
  // vouch for the new step (only this node's part is new yet).
  const absl::Status uncommitted = fs.Remove(JoinPath(remote, format::kCommittedFileName));
  if (uncommitted.ok()) {
    auto old = fs.List(remote);
    if (!old.ok()) return old.status();
    for (const std::string& name : *old) {
      if (!absl::EndsWith(name, ".manifest.json")) continue;
      const absl::Status removed = fs.Remove(JoinPath(remote, name));
      if (!removed.ok() && !absl::IsNotFound(removed)) return removed;
    }
  } else if (!absl::IsNotFound(uncommitted)) {
    return uncommitted;
  }
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(remote));
  storage::CopyOptions copy;
  copy.cancelled = options.cancelled;
  copy.background = true;  // the store's requests never compete with training
  files.insert(files.end(), manifests.begin(), manifests.end());
  for (const std::string& name : files) {
    ZCC_ASSIGN_OR_RETURN(const uint64_t bytes,
                         storage::CopyFile(fs, JoinPath(local, name), fs, JoinPath(remote, name),
                                           copy));
    result.stats.bytes += bytes;
    ++result.stats.files;
  }
  ZCC_ASSIGN_OR_RETURN(CommitResult commit,
                       TryCommit(store_job_dir, job_id, step, world_size, &fs, options.write_began));
  result.committed = commit.outcome == CommitOutcome::kCommitted;
  result.manifests_present = commit.manifests_present;
  result.mixed_runs = commit.mixed_runs;
  result.mixed = commit.mixed;
  result.stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

absl::StatusOr<uint32_t> ForgetRankParts(storage::Storage& fs, const std::string& store_job_dir,
                                         const std::vector<uint32_t>& ranks,
                                         const std::string& keep_run) {
  auto listed = fs.List(store_job_dir);
  if (absl::IsNotFound(listed.status())) return 0;
  if (!listed.ok()) return listed.status();
  uint32_t removed = 0;
  for (const std::string& name : *listed) {
    if (!format::ParseStepDirName(name).ok()) continue;
    const std::string dir = JoinPath(store_job_dir, name);
    auto committed = fs.Stat(JoinPath(dir, format::kCommittedFileName));
    if (committed.ok()) continue;
    if (!absl::IsNotFound(committed.status())) return committed.status();
    for (uint32_t rank : ranks) {
      const std::string path = JoinPath(dir, format::ManifestFileName(rank));
      auto text = storage::ReadWholeFile(fs, path, format::kMaxManifestBytes);
      if (absl::IsNotFound(text.status())) continue;
      if (!text.ok()) return text.status();  // (kept: it may be whole)
      if (!keep_run.empty()) {
        auto manifest = DecodeManifestFile(path, rank, *text);
        // (One that cannot be decoded is no run's part: removed.)
        if (manifest.ok() && manifest->run_id == keep_run) continue;
      }
      const absl::Status st = fs.Remove(path);
      if (absl::IsNotFound(st)) continue;
      if (!st.ok()) return st;
      // Another node's upload may have committed the step between the check
      // above and the removal (the earlier run's last part arriving late):
      // then the manifest belongs to a committed step, whole without it no
      // more, and goes back as it was. (A reader in between finds the step
      // incomplete and passes over it, as it would a damaged one.)
      // (A step that cannot be checked counts as committed.)
      auto now_committed = fs.Stat(JoinPath(dir, format::kCommittedFileName));
      if (!absl::IsNotFound(now_committed.status())) {
        ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, path, *text));
        if (!now_committed.ok()) return now_committed.status();
        continue;
      }
      ++removed;
    }
  }
  return removed;
}

}  // namespace zcc::checkpoint
