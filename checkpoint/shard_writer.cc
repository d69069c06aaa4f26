#include "checkpoint/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/safetensors.h"

namespace zcc::checkpoint {
namespace {

constexpr uint64_t kHeaderAlign = 4096;
constexpr size_t kWriteChunk = 8 << 20;

absl::Status PwriteAll(int fd, const uint8_t* data, size_t n, uint64_t offset,
                       const std::string& path) {
  while (n > 0) {
    const size_t len = n < kWriteChunk ? n : kWriteChunk;
    const ssize_t w = ::pwrite(fd, data, len, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    if (w == 0) return absl::InternalError(absl::StrCat("write ", path, ": no progress"));
    data += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Writes one group's safetensors file; appends its tensors to `manifest`.
absl::StatusOr<uint64_t> WriteGroupFile(const std::string& dir, shm::FileGroup group,
                                        const RankShards& shards, const uint8_t* slot,
                                        format::RankManifest* manifest) {
  const shm::GroupRange range = shards.layout.groups[static_cast<uint32_t>(group)];
  std::vector<format::SafetensorsTensor> entries;
  std::vector<const RankTensor*> members;
  for (const RankTensor& t : shards.tensors) {
    if (t.group != group) continue;
    format::SafetensorsTensor e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.begin = t.slot_offset - range.begin;
    e.end = e.begin + t.nbytes;
    entries.push_back(std::move(e));
    members.push_back(&t);
  }
  if (members.empty()) return uint64_t{0};

  const std::string file = FileForGroup(group, shards.rank);
  const std::string path = JoinPath(dir, file);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"zcc.job", shards.job_id},
      {"zcc.step", absl::StrCat(manifest->step)},
      {"zcc.rank", absl::StrCat(shards.rank)},
  };
  ZCC_ASSIGN_OR_RETURN(std::string header,
                       format::EncodeSafetensorsHeader(entries, metadata, kHeaderAlign));

  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  ZCC_RETURN_IF_ERROR(PwriteAll(fd.get(), reinterpret_cast<const uint8_t*>(header.data()),
                                header.size(), 0, path));
  // Tensor by tensor, so each checksum is taken from the bytes just handed to
  // the kernel while they are still in cache.
  uint64_t file_offset = header.size();
  for (const RankTensor* t : members) {
    const uint8_t* src = slot + t->slot_offset;
    ZCC_RETURN_IF_ERROR(PwriteAll(fd.get(), src, t->nbytes, file_offset, path));
    format::ManifestTensor mt;
    mt.name = t->name;
    mt.dtype = t->dtype;
    mt.shape = t->shape;
    mt.kind = KindForGroup(group);
    mt.file = file;
    mt.offset = file_offset;
    mt.nbytes = t->nbytes;
    mt.xxh3 = format::Xxh3(src, t->nbytes);
    manifest->tensors.push_back(std::move(mt));
    file_offset += t->nbytes;
  }
  if (::fdatasync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync ", path));
  manifest->files.push_back(format::ManifestFile{file, file_offset});
  return file_offset;
}

}  // namespace

absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot) {
  const absl::Time start = absl::Now();
  const std::string dir = JoinPath(job_dir, format::PartialStepDirName(step));
  ZCC_RETURN_IF_ERROR(MakeDirs(dir));

  format::RankManifest manifest;
  manifest.job_id = shards.job_id;
  manifest.step = step;
  manifest.rank = shards.rank;
  manifest.world_size = shards.world_size;
  manifest.manifest_hash = shards.manifest_hash;

  WriteStats stats;
  for (uint32_t g = 0; g < shm::kNumFileGroups; ++g) {
    ZCC_ASSIGN_OR_RETURN(uint64_t bytes, WriteGroupFile(dir, static_cast<shm::FileGroup>(g),
                                                        shards, slot, &manifest));
    stats.bytes += bytes;
  }
  // The shard files' directory entries must be durable before the manifest
  // announces them.
  ZCC_RETURN_IF_ERROR(FsyncDir(dir));
  const std::string text = format::EncodeRankManifest(manifest);
  ZCC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, format::ManifestFileName(shards.rank)), text));
  stats.bytes += text.size();
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace zcc::checkpoint
