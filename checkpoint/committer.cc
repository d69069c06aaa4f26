#include "checkpoint/committer.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

absl::Status CheckFileSize(const std::string& path, uint64_t expected) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (static_cast<uint64_t>(st.st_size) != expected) {
    return absl::DataLossError(absl::StrCat(path, " is ", st.st_size, " bytes; its manifest says ",
                                            expected));
  }
  return absl::OkStatus();
}


}  // namespace

absl::StatusOr<CommitResult> TryCommit(const std::string& job_dir, const std::string& job_id,
                                       int64_t step, uint32_t world_size,
                                       storage::Storage* storage) {
  // The commit's writes, renames and directory syncs go through `storage`.
  storage::Storage& fs = storage != nullptr ? *storage : *storage::DefaultStorage();
  const std::string partial = JoinPath(job_dir, format::PartialStepDirName(step));
  CommitResult result;
  for (uint32_t r = 0; r < world_size; ++r) {
    if (PathExists(JoinPath(partial, format::ManifestFileName(r)))) ++result.manifests_present;
  }
  if (result.manifests_present < world_size) return result;

  std::vector<format::RankManifest> manifests;
  absl::flat_hash_set<std::string> files;
  format::Xxh3Stream combined;
  for (uint32_t r = 0; r < world_size; ++r) {
    const std::string path = JoinPath(partial, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
    auto decoded = format::DecodeRankManifest(text);
    if (!decoded.ok()) return Annotate(decoded.status(), path);
    const format::RankManifest& m = *decoded;
    if (m.job_id != job_id || m.step != step || m.rank != r || m.world_size != world_size) {
      return absl::DataLossError(absl::StrCat(
          path, " belongs to job '", m.job_id, "' step ", m.step, " rank ", m.rank, " of ",
          m.world_size, "; expected job '", job_id, "' step ", step, " rank ", r, " of ",
          world_size));
    }
    for (const format::ManifestFile& f : m.files) {
      if (!files.insert(f.name).second) {
        return absl::DataLossError(
            absl::StrCat(path, " lists '", f.name, "', which another rank's manifest lists"));
      }
      ZCC_RETURN_IF_ERROR(CheckFileSize(JoinPath(partial, f.name), f.bytes));
      result.total_bytes += f.bytes;
    }
    combined.Update(text.data(), text.size());
    manifests.push_back(*std::move(decoded));
  }

  // Layout-free: the pieces of every global tensor must tile it exactly once
  // (a piece written twice, or by no rank, or ranks that disagree on a
  // tensor's shape or dtype, leave the step uncommitted).
  // Replicas agree: the members of each replica group registered the same
  // replicated tensors (one of them wrote each).
  ZCC_RETURN_IF_ERROR(CheckReplicaGroups(manifests));
  const format::StepIndex index = BuildStepIndex(std::move(manifests));
  std::vector<std::string> incomplete_ema;
  ZCC_ASSIGN_OR_RETURN(const std::vector<GlobalTensor> tensors,
                       GroupPieces(index, &incomplete_ema));
  for (const std::string& why : incomplete_ema) {
    ZCC_LOG(WARNING) << "job " << job_id << " step " << step
                     << ": the EMA of a tensor is incomplete and is left out of the step (" << why
                     << ")";
  }
  const std::string index_text = format::EncodeStepIndex(index);
  if (index_text.size() > format::MaxStepIndexBytes(world_size)) {  // readers would refuse it
    return absl::InternalError(absl::StrCat("the step index is ", index_text.size(),
                                            " bytes; readers accept ",
                                            format::MaxStepIndexBytes(world_size)));
  }
  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(partial, format::kStepIndexFileName), index_text));
  // The Hugging Face weight maps name whole tensors only: a piece of a
  // sliced tensor is not the tensor (zccctl export writes whole ones).
  std::map<std::string, std::string> model_map;
  std::map<std::string, std::string> ema_map;
  for (const GlobalTensor& g : tensors) {
    if (g.pieces.size() != 1 || g.pieces.front()->shape != g.global_shape) continue;
    if (g.kind == format::TensorKindName(format::TensorKind::kParam)) {
      model_map[g.name] = g.pieces.front()->file;
    }
    if (g.kind == format::kEmaKindName) ema_map[g.name] = g.pieces.front()->file;
  }

  ZCC_RETURN_IF_ERROR(
      storage::WriteFileAtomic(fs, JoinPath(partial, format::kModelIndexFileName),
                               format::EncodeWeightMapIndex(model_map, result.total_bytes)));
  if (!ema_map.empty()) {
    ZCC_RETURN_IF_ERROR(
        storage::WriteFileAtomic(fs, JoinPath(partial, format::kEmaIndexFileName),
                                 format::EncodeWeightMapIndex(ema_map, result.total_bytes)));
  }
  format::CommitRecord record;
  record.job_id = job_id;
  record.step = step;
  record.world_size = world_size;
  record.manifest_hash = combined.Digest();
  record.total_bytes = result.total_bytes;
  record.index_xxh3 = format::Xxh3(index_text.data(), index_text.size());
  record.committed_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  // WriteFileAtomic syncs the file and the partial directory.
  ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, JoinPath(partial, format::kCommittedFileName),
                                               format::EncodeCommitRecord(record)));

  const std::string final_dir = JoinPath(job_dir, format::StepDirName(step));
  if (PathExists(final_dir)) {
    // The same step number from an earlier run (training resumed from an older
    // step): the new one replaces it in one atomic exchange, so step-N always
    // exists and is committed, old or new, whatever happens. The old contents
    // end up under the partial name and are removed.
    // (The exchange is Linux's alone and the Storage interface has no word
    // for it: it goes to the file system directly.)
    if (::syscall(SYS_renameat2, AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(),
                  RENAME_EXCHANGE) == 0) {
      ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
      ZCC_RETURN_IF_ERROR(RemoveTree(partial));
    } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      // File systems without the exchange (NFS): two renames, with a short
      // window in which step-N is absent and restore falls back to older steps.
      ZCC_LOG(WARNING) << "atomic exchange unsupported under " << job_dir
                       << "; replacing " << final_dir << " with two renames";
      const std::string superseded = absl::StrCat(final_dir, ".superseded");
      ZCC_RETURN_IF_ERROR(RemoveTree(superseded));
      ZCC_RETURN_IF_ERROR(fs.Rename(final_dir, superseded));
      ZCC_RETURN_IF_ERROR(fs.Rename(partial, final_dir));
      ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
      ZCC_RETURN_IF_ERROR(RemoveTree(superseded));
    } else {
      return ErrnoToStatus(errno, absl::StrCat("exchange ", partial, " and ", final_dir));
    }
  } else {
    ZCC_RETURN_IF_ERROR(fs.Rename(partial, final_dir));
    ZCC_RETURN_IF_ERROR(fs.SyncDir(job_dir));
  }
  ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, JoinPath(job_dir, format::kLatestFileName),
                                               absl::StrCat(format::StepDirName(step), "\n")));
  result.outcome = CommitOutcome::kCommitted;
  return result;
}

absl::StatusOr<std::optional<int64_t>> RepairLatest(const std::string& job_dir) {
  const absl::StatusOr<int64_t> latest = ReadLatest(job_dir);
  if (latest.ok()) return std::nullopt;
  if (!absl::IsNotFound(latest.status()) && !absl::IsDataLoss(latest.status())) {
    return latest.status();
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string step_dir = JoinPath(job_dir, format::StepDirName(*it));
    if (!ReadCommitRecord(step_dir).ok()) continue;
    ZCC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(job_dir, format::kLatestFileName),
                                        absl::StrCat(format::StepDirName(*it), "\n")));
    return *it;
  }
  return std::nullopt;
}

}  // namespace zcc::checkpoint
