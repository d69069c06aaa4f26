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
#include "checkpoint/step_files.h"
#include "common/file_util.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {

absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(const std::string& job_dir,
                                                        storage::Storage* fs) {
  storage::Storage& s = storage::StorageOrDefault(fs);
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, s.List(job_dir));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    auto step = format::ParseStepDirName(name);
    if (!step.ok()) continue;
    if (storage::Exists(s, JoinPath(JoinPath(job_dir, name), format::kCommittedFileName))) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<int64_t> ReadLatest(const std::string& job_dir, storage::Storage* fs) {
  const std::string path = JoinPath(job_dir, format::kLatestFileName);
  auto text = storage::ReadWholeFile(storage::StorageOrDefault(fs), path, 4096);
  if (!text.ok()) return text.status();
  auto step = format::ParseStepDirName(absl::StripAsciiWhitespace(*text));
  if (!step.ok()) {
    return absl::DataLossError(absl::StrCat(path, " does not name a step directory"));
  }
  return *step;
}

absl::StatusOr<std::optional<int64_t>> TimelineEnd(const std::string& job_dir,
                                                   storage::Storage* fs, std::string* garbage) {
  absl::StatusOr<int64_t> latest = ReadLatest(job_dir, fs);
  if (latest.ok()) return *latest;
  if (absl::IsNotFound(latest.status())) return std::nullopt;
  if (absl::IsDataLoss(latest.status())) {
    if (garbage != nullptr) *garbage = std::string(latest.status().message());
    return std::nullopt;
  }
  return Annotate(latest.status(),
                  absl::StrCat("reading ", JoinPath(job_dir, format::kLatestFileName)));
}

absl::StatusOr<std::vector<int64_t>> CommittedOnTimeline(const std::string& job_dir,
                                                         storage::Storage* fs) {
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir, fs));
  ZCC_ASSIGN_OR_RETURN(const std::optional<int64_t> end, TimelineEnd(job_dir, fs));
  if (end.has_value()) {
    steps.erase(std::upper_bound(steps.begin(), steps.end(), *end), steps.end());
  }
  return steps;
}

absl::StatusOr<int64_t> NewestOnTimeline(const std::string& job_dir, storage::Storage* fs) {
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, CommittedOnTimeline(job_dir, fs));
  return steps.empty() ? -1 : steps.back();
}

absl::StatusOr<std::vector<CommittedStep>> ListCheckpoints(const std::string& job_dir,
                                                           storage::Storage* fs) {
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(job_dir, fs));
  auto latest = ReadLatest(job_dir, fs);
  std::vector<CommittedStep> out;
  for (int64_t step : steps) {
    CommittedStep s;
    s.step = step;
    s.dir = JoinPath(job_dir, format::StepDirName(step));
    s.is_latest = latest.ok() && *latest == step;
    if (auto record = ReadCommitRecord(s.dir, fs); record.ok()) s.record = *std::move(record);
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<ResolvedStep> ResolveStepDir(const std::string& path, storage::Storage* fs) {
  storage::Storage& s = storage::StorageOrDefault(fs);
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  ZCC_ASSIGN_OR_RETURN(const storage::FileInfo info, s.Stat(trimmed));
  const size_t slash = trimmed.find_last_of('/');
  const std::string base = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : trimmed.substr(0, slash));
  auto committed = [&s](const std::string& dir) {
    return storage::Exists(s, JoinPath(dir, format::kCommittedFileName));
  };
  if (!info.is_dir) {
    if (base != format::kLatestFileName) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " is a file; give a step directory, a job directory or a job's latest"));
    }
    ZCC_ASSIGN_OR_RETURN(const int64_t step, ReadLatest(parent, &s));
    const std::string dir = JoinPath(parent, format::StepDirName(step));
    if (!committed(dir)) {
      return absl::NotFoundError(absl::StrCat(path, " names ", format::StepDirName(step),
                                              ", which holds no COMMITTED"));
    }
    return ResolvedStep{dir, step, absl::StrCat("the step ", path, " names")};
  }
  if (committed(trimmed)) {
    auto step = format::ParseStepDirName(base);
    return ResolvedStep{trimmed, step.ok() ? *step : -1, ""};
  }
  if (format::ParseStepDirName(base).ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds no COMMITTED: the step was never committed"));
  }
  // A job directory.
  if (auto latest = ReadLatest(trimmed, &s); latest.ok()) {
    const std::string dir = JoinPath(trimmed, format::StepDirName(*latest));
    if (committed(dir)) {
      return ResolvedStep{dir, *latest, absl::StrCat("the step ", trimmed, "/latest names")};
    }
  }
  // Not above `latest` where it names a step not committed here (a run
  // went back to a step another tier holds): the steps above are the run
  // left behind's.
  ZCC_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, CommittedOnTimeline(trimmed, &s));
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrCat(path, " holds no committed step",
                                            ListCommittedSteps(trimmed, &s).value_or(
                                                std::vector<int64_t>()).empty()
                                                ? ""
                                                : " at or below the step its latest names"));
  }
  return ResolvedStep{JoinPath(trimmed, format::StepDirName(steps.back())), steps.back(),
                      absl::StrCat("the newest committed step of ", trimmed)};
}

absl::StatusOr<format::CommitRecord> ReadCommitRecord(const std::string& step_dir,
                                                      storage::Storage* fs) {
  const std::string path = JoinPath(step_dir, format::kCommittedFileName);
  ZCC_ASSIGN_OR_RETURN(std::string text, storage::ReadWholeFile(storage::StorageOrDefault(fs),
                                                                path, format::kMaxManifestBytes));
  auto record = format::DecodeCommitRecord(text);
  if (!record.ok()) return absl::DataLossError(absl::StrCat(path, ": ", record.status().message()));
  return record;
}

absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets) {
  return ReadRankTensors(step_dir, rank, targets, IoOptions());
}

absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets, const IoOptions& options) {
  ZCC_ASSIGN_OR_RETURN(format::RankManifest m, ReadRankManifest(step_dir, rank, options.storage));
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
  const auto by_file = TensorsByFile(m.files, m.tensors);
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

absl::StatusOr<format::StepIndex> LoadStepIndex(const std::string& step_dir, storage::Storage* fs) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, ReadCommitRecord(step_dir, fs));
  const std::string path = JoinPath(step_dir, format::kStepIndexFileName);
  ZCC_ASSIGN_OR_RETURN(std::optional<std::string> committed,
                       ReadCommittedIndexText(step_dir, record, fs));
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
                         storage::ReadWholeFile(storage::StorageOrDefault(fs), manifest_path,
                                                format::kMaxManifestBytes));
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

absl::StatusOr<std::shared_ptr<const GroupedIndex>> LoadGroupedIndex(const std::string& step_dir,
                                                                    storage::Storage* fs) {
  ZCC_ASSIGN_OR_RETURN(format::StepIndex index, LoadStepIndex(step_dir, fs));
  return GroupIndex(std::move(index));
}

}  // namespace zcc::checkpoint
