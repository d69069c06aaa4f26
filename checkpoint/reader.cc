#include "checkpoint/reader.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/global_index.h"
#include "checkpoint/shard_file_reader.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/safetensors.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

storage::Storage& StorageOf(const IoOptions& options) {
  return options.storage != nullptr ? *options.storage : *storage::DefaultStorage();
}

// Decodes the manifest of `rank` read from `path`.
absl::StatusOr<format::RankManifest> DecodeManifest(const std::string& path, uint32_t rank,
                                                    absl::string_view text) {
  auto m = format::DecodeRankManifest(text);
  if (!m.ok()) return absl::DataLossError(absl::StrCat(path, ": ", m.status().message()));
  if (m->rank != rank) {
    return absl::DataLossError(absl::StrCat(path, " says it is rank ", m->rank));
  }
  return m;
}

absl::StatusOr<format::RankManifest> ReadManifest(const std::string& step_dir, uint32_t rank) {
  const std::string path = JoinPath(step_dir, format::ManifestFileName(rank));
  ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
  return DecodeManifest(path, rank, text);
}

// The first `n` bytes of a file (fewer if it is shorter), read through an
// aligned buffer so that direct files work too.
absl::StatusOr<std::string> ReadHead(storage::File& file, uint64_t n) {
  const uint64_t align = file.direct() ? storage::kDirectIoAlignment : 1;
  auto buf = storage::AlignedBuffer::Uninitialized(storage::AlignUp(n, align));
  ZCC_ASSIGN_OR_RETURN(size_t got, storage::ReadAt(file, 0, buf.data(), buf.size()));
  return std::string(reinterpret_cast<const char*>(buf.data()), std::min<uint64_t>(got, n));
}

// An open shard file whose safetensors header has been checked against the
// manifest entries that point into it.
struct OpenShard {
  std::unique_ptr<storage::File> file;
  uint64_t size = 0;
};

absl::StatusOr<OpenShard> OpenAndCheckShard(
    const std::string& step_dir, const format::ManifestFile& file,
    const std::vector<const format::ManifestTensor*>& in_file, const IoOptions& options) {
  const std::string path = JoinPath(step_dir, file.name);
  storage::OpenOptions open;
  open.direct = options.direct_io;
  open.queue_depth = std::max<uint32_t>(options.queue_depth, 1);
  OpenShard shard;
  ZCC_ASSIGN_OR_RETURN(shard.file, StorageOf(options).OpenForRead(path, open));
  ZCC_ASSIGN_OR_RETURN(shard.size, shard.file->Size());
  if (shard.size != file.bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", shard.size,
                                            " bytes; the manifest says ", file.bytes));
  }
  // One read covers the header of any file zcc writes; bigger ones take two.
  ZCC_ASSIGN_OR_RETURN(std::string prefix,
                       ReadHead(*shard.file, std::min<uint64_t>(shard.size, 64 << 10)));
  auto need = format::HeaderBytesNeeded(prefix, file.bytes);
  if (!need.ok()) return absl::DataLossError(absl::StrCat(path, ": ", need.status().message()));
  if (*need > prefix.size()) {
    ZCC_ASSIGN_OR_RETURN(prefix, ReadHead(*shard.file, *need));
    if (prefix.size() < *need) {
      return absl::DataLossError(absl::StrCat(path, " ends early at byte ", prefix.size()));
    }
  }
  prefix.resize(*need);
  auto decoded = format::DecodeSafetensorsHeader(prefix, file.bytes);
  if (!decoded.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", decoded.status().message()));
  }
  absl::flat_hash_map<absl::string_view, const format::SafetensorsTensor*> by_name;
  by_name.reserve(decoded->tensors.size());
  for (const auto& t : decoded->tensors) by_name[t.name] = &t;
  if (by_name.size() != in_file.size()) {
    return absl::DataLossError(absl::StrCat(path, " holds ", by_name.size(),
                                            " tensors; the manifest lists ", in_file.size()));
  }
  for (const format::ManifestTensor* mt : in_file) {
    auto it = by_name.find(mt->name);
    if (it == by_name.end() || it->second->dtype != mt->dtype || it->second->shape != mt->shape ||
        decoded->data_start + it->second->begin != mt->offset) {
      return absl::DataLossError(absl::StrCat(path, ": header and manifest disagree on '",
                                              mt->name, "'"));
    }
  }
  return shard;
}

std::map<std::string, std::vector<const format::ManifestTensor*>> TensorsByFile(
    const std::vector<format::ManifestFile>& files,
    const std::vector<format::ManifestTensor>& tensors) {
  std::map<std::string, std::vector<const format::ManifestTensor*>> out;
  for (const auto& f : files) out[f.name];
  for (const auto& t : tensors) out[t.file].push_back(&t);
  return out;
}

std::map<std::string, std::vector<const format::ManifestTensor*>> TensorsByFile(
    const format::RankManifest& m) {
  return TensorsByFile(m.files, m.tensors);
}

// The step's index file, checked against the hash COMMITTED records for it;
// nullopt for a step committed before zcc wrote one (neither file nor hash).
absl::StatusOr<std::optional<std::string>> ReadCommittedIndexText(
    const std::string& step_dir, const format::CommitRecord& record) {
  const std::string path = JoinPath(step_dir, format::kStepIndexFileName);
  if (!PathExists(path)) {
    if (record.index_xxh3 == 0) return std::optional<std::string>();
    return absl::DataLossError(absl::StrCat(path, " is missing; COMMITTED records one"));
  }
  if (record.index_xxh3 == 0) {
    return absl::DataLossError(absl::StrCat(path, " is not recorded in COMMITTED"));
  }
  ZCC_ASSIGN_OR_RETURN(std::string text,
                       ReadFileToString(path, format::MaxStepIndexBytes(record.world_size)));
  if (format::Xxh3(text.data(), text.size()) != record.index_xxh3) {
    return absl::DataLossError(
        absl::StrCat(path, " differs from the index committed (checksum mismatch)"));
  }
  return std::optional<std::string>(std::move(text));
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(const std::string& job_dir) {
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(job_dir));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    auto step = format::ParseStepDirName(name);
    if (!step.ok()) continue;
    if (PathExists(JoinPath(JoinPath(job_dir, name), format::kCommittedFileName))) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<int64_t> ReadLatest(const std::string& job_dir) {
  const std::string path = JoinPath(job_dir, format::kLatestFileName);
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) return text.status();
  auto step = format::ParseStepDirName(absl::StripAsciiWhitespace(*text));
  if (!step.ok()) {
    return absl::DataLossError(absl::StrCat(path, " does not name a step directory"));
  }
  return *step;
}

absl::StatusOr<format::CommitRecord> ReadCommitRecord(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, format::kCommittedFileName);
  ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
  auto record = format::DecodeCommitRecord(text);
  if (!record.ok()) return absl::DataLossError(absl::StrCat(path, ": ", record.status().message()));
  return record;
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir) {
  return VerifyStep(step_dir, IoOptions());
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options) {
  return VerifyStep(step_dir, options, nullptr);
}

absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options,
                                        std::shared_ptr<const GroupedIndex>* grouped_out) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, ReadCommitRecord(step_dir));
  VerifyReport report;
  format::Xxh3Stream combined;
  uint64_t total_bytes = 0;
  std::vector<storage::AlignedBuffer> bounce;
  std::vector<format::RankManifest> manifests;
  for (uint32_t r = 0; r < record.world_size; ++r) {
    const std::string mpath = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(mpath, format::kMaxManifestBytes));
    combined.Update(text.data(), text.size());
    ZCC_ASSIGN_OR_RETURN(format::RankManifest m, DecodeManifest(mpath, r, text));
    if (m.job_id != record.job_id || m.step != record.step || m.world_size != record.world_size) {
      return absl::DataLossError(absl::StrCat(mpath, " does not belong to this commit"));
    }
    for (const auto& [file, tensors] : TensorsByFile(m)) {
      // (A structured binding is captured through an init-capture: C++17.)
      auto it = std::find_if(m.files.begin(), m.files.end(), [&name = file](const auto& f) {
        return f.name == name;
      });
      ZCC_ASSIGN_OR_RETURN(OpenShard shard, OpenAndCheckShard(step_dir, *it, tensors, options));
      total_bytes += it->bytes;
      std::vector<TensorReadRequest> requests;
      for (const format::ManifestTensor* t : tensors) {
        requests.push_back({t, nullptr});
        report.bytes_checked += t->nbytes;
        ++report.tensors;
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
  if (!grouped.ok()) return absl::DataLossError(absl::StrCat(step_dir, ": ", grouped.status().message()));
  report.global_tensors = (*grouped)->tensors.size();
  ZCC_RETURN_IF_ERROR(ReadCommittedIndexText(step_dir, record).status());
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

absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets) {
  return ReadRankTensors(step_dir, rank, targets, IoOptions());
}

absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets, const IoOptions& options) {
  ZCC_ASSIGN_OR_RETURN(format::RankManifest m, ReadManifest(step_dir, rank));
  return ReadRankTensors(step_dir, m, targets, options);
}

absl::Status ReadRankTensors(const std::string& step_dir, const format::RankManifest& m,
                             const std::vector<ReadTarget>& targets, const IoOptions& options) {
  const uint32_t rank = m.rank;
  absl::flat_hash_map<std::string, const format::ManifestTensor*> by_key;
  by_key.reserve(m.tensors.size());
  for (const auto& t : m.tensors) by_key[absl::StrCat(t.kind, "/", t.name)] = &t;
  // Check every target before reading anything, so a mismatch leaves the
  // destination untouched.
  std::map<std::string, std::vector<TensorReadRequest>> requests_by_file;
  for (const ReadTarget& target : targets) {
    auto it = by_key.find(absl::StrCat(target.kind, "/", target.name));
    if (it == by_key.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", target.name, "' (", target.kind, ") is not in rank ", rank, "'s checkpoint"));
    }
    const format::ManifestTensor& t = *it->second;
    if (t.dtype != target.dtype || t.shape != target.shape || t.nbytes != target.nbytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", target.name, "' was checkpointed as ", format::DTypeName(t.dtype),
          " with ", t.shape.size(), " dims and ", t.nbytes, " bytes; registered as ",
          format::DTypeName(target.dtype), " with ", target.shape.size(), " dims and ",
          target.nbytes, " bytes"));
    }
    requests_by_file[t.file].push_back({&t, target.dst});
  }
  const auto by_file = TensorsByFile(m);
  std::vector<storage::AlignedBuffer> bounce;
  for (auto& [file, requests] : requests_by_file) {
    auto fit = std::find_if(m.files.begin(), m.files.end(), [&name = file](const auto& f) {
      return f.name == name;
    });
    ZCC_ASSIGN_OR_RETURN(OpenShard shard,
                         OpenAndCheckShard(step_dir, *fit, by_file.at(file), options));
    ZCC_RETURN_IF_ERROR(
        ReadShardTensors(*shard.file, shard.size, std::move(requests), options, &bounce));
  }
  return absl::OkStatus();
}

PiecesByFile IndexPiecesByFile(const format::StepIndex& index) {
  return TensorsByFile(index.files, index.pieces);
}

absl::Status ReadPieces(const std::string& step_dir, const format::StepIndex& index,
                        const std::vector<PieceRead>& reads, const IoOptions& options) {
  if (reads.empty()) return absl::OkStatus();
  return ReadPieces(step_dir, index, IndexPiecesByFile(index), reads, options);
}

absl::Status ReadPieces(const std::string& step_dir, const format::StepIndex& index,
                        const PiecesByFile& by_file, const std::vector<PieceRead>& reads,
                        const IoOptions& options) {
  std::map<std::string, std::vector<TensorReadRequest>> requests_by_file;
  for (const PieceRead& read : reads) {
    requests_by_file[read.piece->file].push_back({read.piece, read.dst});
  }
  if (requests_by_file.empty()) return absl::OkStatus();
  std::vector<storage::AlignedBuffer> bounce;
  for (auto& [file, requests] : requests_by_file) {
    auto fit = std::find_if(index.files.begin(), index.files.end(),
                            [&name = file](const auto& f) { return f.name == name; });
    if (fit == index.files.end()) {
      return absl::DataLossError(absl::StrCat("'", file, "' is not in the step index's files"));
    }
    ZCC_ASSIGN_OR_RETURN(OpenShard shard,
                         OpenAndCheckShard(step_dir, *fit, by_file.at(file), options));
    ZCC_RETURN_IF_ERROR(
        ReadShardTensors(*shard.file, shard.size, std::move(requests), options, &bounce));
  }
  return absl::OkStatus();
}

absl::StatusOr<format::StepIndex> LoadStepIndex(const std::string& step_dir) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, ReadCommitRecord(step_dir));
  const std::string path = JoinPath(step_dir, format::kStepIndexFileName);
  ZCC_ASSIGN_OR_RETURN(std::optional<std::string> committed, ReadCommittedIndexText(step_dir, record));
  if (committed.has_value()) {
    const std::string& text = *committed;
    auto index = format::DecodeStepIndex(text, format::MaxStepIndexBytes(record.world_size));
    if (!index.ok()) return Annotate(index.status(), path);
    if (index->job_id != record.job_id || index->step != record.step ||
        index->world_size != record.world_size) {
      return absl::DataLossError(absl::StrCat(path, " describes job '", index->job_id, "' step ",
                                              index->step, " of ", index->world_size,
                                              " ranks; COMMITTED says job '", record.job_id,
                                              "' step ", record.step, " of ", record.world_size));
    }
    return *std::move(index);
  }
  std::vector<format::RankManifest> manifests;
  for (uint32_t r = 0; r < record.world_size; ++r) {
    const std::string manifest_path = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text,
                         ReadFileToString(manifest_path, format::kMaxManifestBytes));
    auto manifest = format::DecodeRankManifest(text);
    if (!manifest.ok()) return Annotate(manifest.status(), manifest_path);
    if (manifest->rank != r || manifest->job_id != record.job_id ||
        manifest->step != record.step || manifest->world_size != record.world_size) {
      return absl::DataLossError(absl::StrCat(manifest_path, " does not belong to this commit"));
    }
    manifests.push_back(*std::move(manifest));
  }
  return BuildStepIndex(std::move(manifests));
}

absl::StatusOr<std::shared_ptr<const GroupedIndex>> LoadGroupedIndex(const std::string& step_dir) {
  ZCC_ASSIGN_OR_RETURN(format::StepIndex index, LoadStepIndex(step_dir));
  return GroupIndex(std::move(index));
}

}  // namespace zcc::checkpoint
