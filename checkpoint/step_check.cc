#include "checkpoint/step_check.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_file_reader.h"
#include "checkpoint/step_files.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/aligned_buffer.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

enum class Depth { kMetadata, kEveryTensor };

// The checks of CheckStepMetadata, plus every tensor's checksum at
// kEveryTensor: one routine, so that the two depths cannot drift apart.
absl::StatusOr<VerifyReport> CheckStep(const std::string& step_dir, const IoOptions& options,
                                       Depth depth,
                                       std::shared_ptr<const GroupedIndex>* grouped_out) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, ReadCommitRecord(step_dir, options.storage));
  // A header is one request: a queue (an io_uring per file) would only cost
  // its setup.
  IoOptions open_options = options;
  if (depth == Depth::kMetadata) open_options.queue_depth = 1;
  VerifyReport report;
  format::Xxh3Stream combined;
  uint64_t total_bytes = 0;
  std::vector<storage::AlignedBuffer> bounce;
  std::vector<format::RankManifest> manifests;
  for (uint32_t r = 0; r < record.world_size; ++r) {
    const std::string mpath = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text,
                         storage::ReadWholeFile(storage::StorageOrDefault(options.storage), mpath,
                                                format::kMaxManifestBytes));
    combined.Update(text.data(), text.size());
    ZCC_ASSIGN_OR_RETURN(format::RankManifest m, DecodeManifestFile(mpath, r, text));
    if (m.job_id != record.job_id || m.step != record.step || m.world_size != record.world_size) {
      return absl::DataLossError(absl::StrCat(mpath, " does not belong to this commit"));
    }
    for (const auto& [file, tensors] : TensorsByFile(m.files, m.tensors)) {
      // (A structured binding is captured through an init-capture: C++17.)
      auto it = std::find_if(m.files.begin(), m.files.end(), [&name = file](const auto& f) {
        return f.name == name;
      });
      if (it == m.files.end()) {
        return absl::DataLossError(
            absl::StrCat(mpath, ": a tensor lies in '", file, "', which it does not list"));
      }
      ZCC_ASSIGN_OR_RETURN(OpenShard shard,
                           OpenAndCheckShard(step_dir, *it, tensors, open_options));
      total_bytes += it->bytes;
      report.tensors += tensors.size();
      if (depth == Depth::kMetadata) continue;
      std::vector<TensorReadRequest> requests;
      for (const format::ManifestTensor* t : tensors) {
        requests.push_back({t, nullptr});
        report.bytes_checked += t->nbytes;
      }
      ZCC_RETURN_IF_ERROR(
          ReadShardTensors(*shard.file, shard.size, std::move(requests), options, &bounce));
    }
    ++report.ranks;
    manifests.push_back(std::move(m));
  }
  // Layout-free: the replicas agree, every global tensor's pieces tile it,
  // and the step's index is the one committed (its hash is in COMMITTED; the
  // committer made it from these manifests).
  if (absl::Status st = CheckReplicaGroups(manifests); !st.ok()) {
    return absl::DataLossError(absl::StrCat(step_dir, ": ", st.message()));
  }
  auto grouped = GroupIndex(BuildStepIndex(std::move(manifests)));
  if (!grouped.ok()) {
    return absl::DataLossError(absl::StrCat(step_dir, ": ", grouped.status().message()));
  }
  report.global_tensors = (*grouped)->tensors.size();
  ZCC_RETURN_IF_ERROR(ReadCommittedIndexText(step_dir, record, options.storage).status());
  if (combined.Digest() != record.manifest_hash) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifests differ from the ones committed"));
  }
  if (total_bytes != record.total_bytes) {
    return absl::DataLossError(absl::StrCat(step_dir, ": shard files total ", total_bytes,
                                            " bytes; COMMITTED says ", record.total_bytes));
  }
  if (grouped_out != nullptr) *grouped_out = *std::move(grouped);
  return report;
}

}  // namespace

absl::Status CheckStepMetadata(const std::string& step_dir, const IoOptions& options,
                               std::shared_ptr<const GroupedIndex>* grouped) {
  return CheckStep(step_dir, options, Depth::kMetadata, grouped).status();
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir) {
  return VerifyStep(step_dir, IoOptions());
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options) {
  return VerifyStep(step_dir, options, nullptr);
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options,
                                        std::shared_ptr<const GroupedIndex>* grouped) {
  return CheckStep(step_dir, options, Depth::kEveryTensor, grouped);
}

}  // namespace zcc::checkpoint
