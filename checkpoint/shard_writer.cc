#include "checkpoint/shard_writer.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "checkpoint/shard_file_writer.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

constexpr uint64_t kHeaderAlign = storage::kDirectIoAlignment;

// Writes the safetensors file of one tensor kind; appends its tensors to `manifest`.
// Returns the file's size (0 when the group has no tensors and no file).
absl::StatusOr<uint64_t> WriteKindFile(storage::Storage& storage, const std::string& dir,
                                        format::TensorKind kind, const RankShards& shards,
                                        const uint8_t* slot, const IoOptions& options,
                                        format::RankManifest* manifest, bool* direct) {
  const shm::GroupRange range = shards.layout.groups[static_cast<uint32_t>(kind)];
  std::vector<format::SafetensorsTensor> entries;
  std::vector<const RankTensor*> members;
  ShardFileSource source;
  for (const RankTensor& t : shards.tensors) {
    if (t.kind != kind) continue;
    format::SafetensorsTensor e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.begin = t.slot_offset - range.begin;
    e.end = e.begin + t.nbytes;
    entries.push_back(std::move(e));
    members.push_back(&t);
    source.tensor_bytes.push_back(t.nbytes);
  }
  if (members.empty()) return uint64_t{0};

  const std::string file = ShardFileForKind(kind, shards.rank);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"zcc.job", shards.job_id},
      {"zcc.step", absl::StrCat(manifest->step)},
      {"zcc.rank", absl::StrCat(shards.rank)},
  };
  // Validates the layout too: the tensors must tile the group's range.
  ZCC_ASSIGN_OR_RETURN(std::string header,
                       format::EncodeSafetensorsHeader(entries, metadata, kHeaderAlign));
  source.path = JoinPath(dir, file);
  source.header = header;
  source.data = slot + range.begin;
  source.data_bytes = range.end - range.begin;

  ZCC_ASSIGN_OR_RETURN(ShardFileWritten written, WriteShardFile(storage, source, options));
  *direct = *direct && written.direct;
  for (size_t i = 0; i < members.size(); ++i) {
    const RankTensor& t = *members[i];
    format::ManifestTensor mt;
    mt.name = t.name;
    mt.dtype = t.dtype;
    mt.shape = t.shape;
    mt.global_shape = t.global_shape;
    mt.box_offset = t.box_offset;
    mt.kind = std::string(format::TensorKindName(kind));
    mt.file = file;
    mt.offset = header.size() + entries[i].begin;
    mt.nbytes = t.nbytes;
    mt.xxh3 = written.xxh3[i];
    manifest->tensors.push_back(std::move(mt));
  }
  manifest->files.push_back(format::ManifestFile{file, written.file_bytes});
  return written.file_bytes;
}

// Writes one extra shard, packed contiguously into an aligned buffer.
absl::StatusOr<uint64_t> WriteExtraFile(storage::Storage& storage, const std::string& dir,
                                        const ExtraShard& shard, const RankShards& shards,
                                        const IoOptions& options, format::RankManifest* manifest,
                                        bool* direct) {
  if (shard.tensors.empty()) return uint64_t{0};
  std::vector<format::SafetensorsTensor> entries;
  ShardFileSource source;
  uint64_t total = 0;
  for (const ExtraTensor& t : shard.tensors) {
    format::SafetensorsTensor e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.begin = total;
    e.end = total + t.nbytes;
    total += t.nbytes;
    entries.push_back(std::move(e));
    source.tensor_bytes.push_back(t.nbytes);
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"zcc.job", shards.job_id},
      {"zcc.step", absl::StrCat(manifest->step)},
      {"zcc.rank", absl::StrCat(shards.rank)},
      {"zcc.kind", shard.kind},
  };
  ZCC_ASSIGN_OR_RETURN(std::string header,
                       format::EncodeSafetensorsHeader(entries, metadata, kHeaderAlign));
  // Tensors already laid out back to back (the daemon's EMA copy) are written
  // in place; others are packed into one buffer first.
  const uint8_t* base = shard.tensors.front().data;
  bool contiguous = base != nullptr;
  for (size_t i = 0; contiguous && i < shard.tensors.size(); ++i) {
    contiguous = shard.tensors[i].nbytes == 0 || shard.tensors[i].data == base + entries[i].begin;
  }
  storage::AlignedBuffer packed;
  if (!contiguous) {
    packed = storage::AlignedBuffer::Uninitialized(std::max<uint64_t>(total, 1));
    for (size_t i = 0; i < shard.tensors.size(); ++i) {
      if (shard.tensors[i].nbytes > 0) {
        std::memcpy(packed.data() + entries[i].begin, shard.tensors[i].data,
                    shard.tensors[i].nbytes);
      }
    }
    base = packed.data();
  }
  source.path = JoinPath(dir, shard.file);
  source.header = header;
  source.data = base;
  source.data_bytes = total;
  ZCC_ASSIGN_OR_RETURN(ShardFileWritten written, WriteShardFile(storage, source, options));
  *direct = *direct && written.direct;
  for (size_t i = 0; i < shard.tensors.size(); ++i) {
    format::ManifestTensor mt;
    mt.name = shard.tensors[i].name;
    mt.dtype = shard.tensors[i].dtype;
    mt.shape = shard.tensors[i].shape;
    mt.global_shape = shard.tensors[i].global_shape;
    mt.box_offset = shard.tensors[i].box_offset;
    mt.kind = shard.kind;
    mt.file = shard.file;
    mt.offset = header.size() + entries[i].begin;
    mt.nbytes = shard.tensors[i].nbytes;
    mt.xxh3 = written.xxh3[i];
    manifest->tensors.push_back(std::move(mt));
  }
  manifest->files.push_back(format::ManifestFile{shard.file, written.file_bytes});
  return written.file_bytes;
}

// The manifest through a temporary name: fsync'ed, renamed into place and the
// directory fsync'ed, so it is either absent or complete and durable.
absl::Status WriteManifest(storage::Storage& storage, const std::string& dir,
                           const std::string& path, absl::string_view text) {
  // An object store's write appears whole or not at all, in place.
  if (storage.atomic_file_writes(path)) return storage::WriteFileAtomic(storage, path, text);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  absl::Status st = [&]() -> absl::Status {
    ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file,
                         storage.OpenForWrite(tmp, storage::OpenOptions{}));
    ZCC_RETURN_IF_ERROR(storage::WriteAt(*file, 0, text.data(), text.size()));
    ZCC_RETURN_IF_ERROR(file->Sync());
    ZCC_RETURN_IF_ERROR(file->Close());
    return storage.Rename(tmp, path);
  }();
  if (!st.ok()) {
    storage.Remove(tmp).IgnoreError();
    return st;
  }
  return storage.SyncDir(dir);
}

absl::StatusOr<WriteStats> WriteRankFiles(storage::Storage& storage, const std::string& dir,
                                          int64_t step, const RankShards& shards,
                                          const uint8_t* slot, const IoOptions& options,
                                          const std::vector<ExtraShard>& extra,
                                          const std::string& timeline) {
  const absl::Time start = absl::Now();
  ZCC_RETURN_IF_ERROR(storage.MakeDirs(dir));
  // A manifest left by an earlier attempt at this step would vouch for the
  // files about to be overwritten: it goes first, durably.
  const std::string manifest_path = JoinPath(dir, format::ManifestFileName(shards.rank));
  const absl::Status removed = storage.Remove(manifest_path);
  if (removed.ok()) {
    ZCC_RETURN_IF_ERROR(storage.SyncDir(dir));
  } else if (removed.code() != absl::StatusCode::kNotFound) {
    return removed;
  }

  format::RankManifest manifest;
  manifest.job_id = shards.job_id;
  manifest.step = step;
  manifest.rank = shards.rank;
  manifest.world_size = shards.world_size;
  manifest.manifest_hash = shards.manifest_hash;
  manifest.run_id = shards.run_id;
  manifest.timeline = timeline;
  manifest.replica_groups = shards.replica_groups;

  WriteStats stats;
  bool direct = true;
  for (uint32_t g = 0; g < format::kNumTensorKinds; ++g) {
    ZCC_ASSIGN_OR_RETURN(uint64_t bytes,
                         WriteKindFile(storage, dir, static_cast<format::TensorKind>(g), shards, slot,
                                        options, &manifest, &direct));
    stats.bytes += bytes;
  }
  for (const ExtraShard& shard : extra) {
    ZCC_ASSIGN_OR_RETURN(uint64_t bytes,
                         WriteExtraFile(storage, dir, shard, shards, options, &manifest, &direct));
    stats.bytes += bytes;
    if (shard.kind == format::kEmaKindName && shard.step >= 0) {
      if (shard.step > step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the EMA written with step ", step, " is of a later step, ", shard.step));
      }
      manifest.ema_step = shard.step;
    }
  }
  stats.direct_io = direct && !manifest.files.empty();
  // The shard files' directory entries must be durable before the manifest
  // announces them.
  ZCC_RETURN_IF_ERROR(storage.SyncDir(dir));
  // Given up (the rank's trainer went back to an older step meanwhile): no
  // manifest, so that the step cannot commit with these files.
  if (options.cancelled != nullptr && (*options.cancelled)()) {
    return absl::CancelledError("the write was given up before its manifest");
  }
  const std::string text = format::EncodeRankManifest(manifest);
  ZCC_RETURN_IF_ERROR(WriteManifest(storage, dir, manifest_path, text));
  stats.bytes += text.size();
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace

absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot) {
  return WriteRankShards(job_dir, step, shards, slot, IoOptions());
}

absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot,
                                           const IoOptions& options) {
  return WriteRankShards(job_dir, step, shards, slot, options, {});
}

absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot,
                                           const IoOptions& options,
                                           const std::vector<ExtraShard>& extra,
                                           const std::string& timeline) {
  storage::Storage& storage =
      options.storage != nullptr ? *options.storage : *storage::DefaultStorage();
  const std::string dir = WritingStepDir(storage, job_dir, step);
  if (CommitsInPlace(storage, job_dir)) {
    // The step committed before (training resumed from an older one): its
    // files are about to be overwritten, so it is no longer committed from
    // now on. Restores fall back to older steps until this commit is done.
    const absl::Status uncommitted = storage.Remove(JoinPath(dir, format::kCommittedFileName));
    if (!uncommitted.ok() && !absl::IsNotFound(uncommitted)) {
      return Annotate(uncommitted, absl::StrCat("writing step ", step, " of rank ", shards.rank));
    }
  }
  absl::StatusOr<WriteStats> stats =
      WriteRankFiles(storage, dir, step, shards, slot, options, extra, timeline);
  if (!stats.ok()) {
    // No manifest may stay behind (a failed directory fsync comes after the
    // rename). Then give the space back (a full disk is the likeliest cause):
    // without the manifest the step cannot commit, so none of the rank's
    // files in it, from this attempt or an earlier one, is of use.
    storage.Remove(JoinPath(dir, format::ManifestFileName(shards.rank))).IgnoreError();
    for (uint32_t g = 0; g < format::kNumTensorKinds; ++g) {
      storage.Remove(JoinPath(dir, ShardFileForKind(static_cast<format::TensorKind>(g), shards.rank)))
          .IgnoreError();
    }
    for (const ExtraShard& shard : extra) storage.Remove(JoinPath(dir, shard.file)).IgnoreError();
    return Annotate(stats.status(), absl::StrCat("writing step ", step, " of rank ", shards.rank));
  }
  return stats;
}

}  // namespace zcc::checkpoint
