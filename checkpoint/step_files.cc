#include "checkpoint/step_files.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/safetensors.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

storage::Storage& StorageOf(const IoOptions& options) {
  return options.storage != nullptr ? *options.storage : *storage::DefaultStorage();
}

// The first `n` bytes of a file (fewer if it is shorter), read through an
// aligned buffer so that direct files work too.
absl::StatusOr<std::string> ReadHead(storage::File& file, uint64_t n) {
  const uint64_t align = file.direct() ? storage::kDirectIoAlignment : 1;
  auto buf = storage::AlignedBuffer::Uninitialized(storage::AlignUp(n, align));
  ZCC_ASSIGN_OR_RETURN(size_t got, storage::ReadAt(file, 0, buf.data(), buf.size()));
  return std::string(reinterpret_cast<const char*>(buf.data()), std::min<uint64_t>(got, n));
}

}  // namespace

absl::StatusOr<format::RankManifest> DecodeManifestFile(const std::string& path, uint32_t rank,
                                                        absl::string_view text) {
  auto m = format::DecodeRankManifest(text);
  if (!m.ok()) return absl::DataLossError(absl::StrCat(path, ": ", m.status().message()));
  if (m->rank != rank) {
    return absl::DataLossError(absl::StrCat(path, " says it is rank ", m->rank));
  }
  return m;
}

absl::StatusOr<format::RankManifest> ReadRankManifest(const std::string& step_dir, uint32_t rank,
                                                      storage::Storage* fs) {
  const std::string path = JoinPath(step_dir, format::ManifestFileName(rank));
  ZCC_ASSIGN_OR_RETURN(std::string text, storage::ReadWholeFile(storage::StorageOrDefault(fs), path,
                                                                format::kMaxManifestBytes));
  return DecodeManifestFile(path, rank, text);
}

absl::StatusOr<std::optional<std::string>> ReadCommittedIndexText(
    const std::string& step_dir, const format::CommitRecord& record, storage::Storage* fs) {
  storage::Storage& s = storage::StorageOrDefault(fs);
  const std::string path = JoinPath(step_dir, format::kStepIndexFileName);
  if (!storage::Exists(s, path)) {
    if (record.index_xxh3 == 0) return std::optional<std::string>();
    return absl::DataLossError(absl::StrCat(path, " is missing; COMMITTED records one"));
  }
  if (record.index_xxh3 == 0) {
    return absl::DataLossError(absl::StrCat(path, " is not recorded in COMMITTED"));
  }
  ZCC_ASSIGN_OR_RETURN(std::string text,
                       storage::ReadWholeFile(s, path, format::MaxStepIndexBytes(record.world_size)));
  if (format::Xxh3(text.data(), text.size()) != record.index_xxh3) {
    return absl::DataLossError(
        absl::StrCat(path, " differs from the index committed (checksum mismatch)"));
  }
  return std::optional<std::string>(std::move(text));
}

std::map<std::string, std::vector<const format::ManifestTensor*>> TensorsByFile(
    const std::vector<format::ManifestFile>& files,
    const std::vector<format::ManifestTensor>& tensors) {
  std::map<std::string, std::vector<const format::ManifestTensor*>> out;
  for (const auto& f : files) out[f.name];
  for (const auto& t : tensors) out[t.file].push_back(&t);
  return out;
}

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

}  // namespace zcc::checkpoint
