#include "checkpoint/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/checksum.h"
#include "format/safetensors.h"

namespace zcc::checkpoint {
namespace {

constexpr size_t kReadChunk = 8 << 20;

absl::Status PreadAll(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const size_t len = n < kReadChunk ? static_cast<size_t>(n) : kReadChunk;
    const ssize_t r = ::pread(fd, dst, len, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (r == 0) return absl::DataLossError(absl::StrCat(path, " ends early at byte ", offset));
    dst += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<format::RankManifest> ReadManifest(const std::string& step_dir, uint32_t rank) {
  const std::string path = JoinPath(step_dir, format::ManifestFileName(rank));
  ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
  auto m = format::DecodeRankManifest(text);
  if (!m.ok()) return absl::DataLossError(absl::StrCat(path, ": ", m.status().message()));
  if (m->rank != rank) {
    return absl::DataLossError(absl::StrCat(path, " says it is rank ", m->rank));
  }
  return m;
}

// An open shard file whose safetensors header has been checked against the
// manifest entries that point into it.
struct OpenShard {
  UniqueFd fd;
  std::string path;
};

absl::StatusOr<OpenShard> OpenAndCheckShard(const std::string& step_dir,
                                            const format::ManifestFile& file,
                                            const std::vector<const format::ManifestTensor*>& in_file) {
  OpenShard shard;
  shard.path = JoinPath(step_dir, file.name);
  shard.fd = UniqueFd(::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!shard.fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", shard.path));
  struct stat st;
  if (::fstat(shard.fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", shard.path));
  if (static_cast<uint64_t>(st.st_size) != file.bytes) {
    return absl::DataLossError(absl::StrCat(shard.path, " is ", st.st_size,
                                            " bytes; the manifest says ", file.bytes));
  }
  std::string first8(8, '\0');
  ZCC_RETURN_IF_ERROR(PreadAll(shard.fd.get(), reinterpret_cast<uint8_t*>(first8.data()), 8, 0,
                               shard.path));
  auto need = format::HeaderBytesNeeded(first8, file.bytes);
  if (!need.ok()) return absl::DataLossError(absl::StrCat(shard.path, ": ", need.status().message()));
  std::string header(*need, '\0');
  ZCC_RETURN_IF_ERROR(
      PreadAll(shard.fd.get(), reinterpret_cast<uint8_t*>(header.data()), *need, 0, shard.path));
  auto decoded = format::DecodeSafetensorsHeader(header, file.bytes);
  if (!decoded.ok()) {
    return absl::DataLossError(absl::StrCat(shard.path, ": ", decoded.status().message()));
  }
  std::map<std::string, const format::SafetensorsTensor*> by_name;
  for (const auto& t : decoded->tensors) by_name[t.name] = &t;
  if (by_name.size() != in_file.size()) {
    return absl::DataLossError(absl::StrCat(shard.path, " holds ", by_name.size(),
                                            " tensors; the manifest lists ", in_file.size()));
  }
  for (const format::ManifestTensor* mt : in_file) {
    auto it = by_name.find(mt->name);
    if (it == by_name.end() || it->second->dtype != mt->dtype || it->second->shape != mt->shape ||
        decoded->data_start + it->second->begin != mt->offset) {
      return absl::DataLossError(absl::StrCat(shard.path, ": header and manifest disagree on '",
                                              mt->name, "'"));
    }
  }
  return shard;
}

// Reads one tensor into `dst` (or a scratch buffer when null) and checks it.
absl::Status ReadAndCheckTensor(const OpenShard& shard, const format::ManifestTensor& t,
                                uint8_t* dst, std::vector<uint8_t>* scratch) {
  format::Xxh3Stream hash;
  uint64_t done = 0;
  while (done < t.nbytes) {
    const uint64_t len = std::min<uint64_t>(kReadChunk, t.nbytes - done);
    uint8_t* target;
    if (dst != nullptr) {
      target = dst + done;
    } else {
      scratch->resize(len);
      target = scratch->data();
    }
    ZCC_RETURN_IF_ERROR(PreadAll(shard.fd.get(), target, len, t.offset + done, shard.path));
    hash.Update(target, len);
    done += len;
  }
  if (hash.Digest() != t.xxh3) {
    return absl::DataLossError(absl::StrCat("checksum mismatch for tensor '", t.name, "' in ",
                                            shard.path));
  }
  return absl::OkStatus();
}

std::map<std::string, std::vector<const format::ManifestTensor*>> TensorsByFile(
    const format::RankManifest& m) {
  std::map<std::string, std::vector<const format::ManifestTensor*>> out;
  for (const auto& f : m.files) out[f.name];
  for (const auto& t : m.tensors) out[t.file].push_back(&t);
  return out;
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
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, ReadCommitRecord(step_dir));
  VerifyReport report;
  format::Xxh3Stream combined;
  uint64_t total_bytes = 0;
  std::vector<uint8_t> scratch;
  for (uint32_t r = 0; r < record.world_size; ++r) {
    const std::string mpath = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(mpath, format::kMaxManifestBytes));
    combined.Update(text.data(), text.size());
    ZCC_ASSIGN_OR_RETURN(format::RankManifest m, ReadManifest(step_dir, r));
    if (m.job_id != record.job_id || m.step != record.step || m.world_size != record.world_size) {
      return absl::DataLossError(absl::StrCat(mpath, " does not belong to this commit"));
    }
    for (const auto& [file, tensors] : TensorsByFile(m)) {
      auto it = std::find_if(m.files.begin(), m.files.end(),
                             [&](const format::ManifestFile& f) { return f.name == file; });
      ZCC_ASSIGN_OR_RETURN(OpenShard shard, OpenAndCheckShard(step_dir, *it, tensors));
      total_bytes += it->bytes;
      for (const format::ManifestTensor* t : tensors) {
        ZCC_RETURN_IF_ERROR(ReadAndCheckTensor(shard, *t, nullptr, &scratch));
        report.bytes_checked += t->nbytes;
        ++report.tensors;
      }
    }
    ++report.ranks;
  }
  if (combined.Digest() != record.manifest_hash) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifests differ from the ones committed"));
  }
  if (total_bytes != record.total_bytes) {
    return absl::DataLossError(absl::StrCat(step_dir, ": shard files total ", total_bytes,
                                            " bytes; COMMITTED says ", record.total_bytes));
  }
  return report;
}

absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets) {
  ZCC_ASSIGN_OR_RETURN(format::RankManifest m, ReadManifest(step_dir, rank));
  std::map<std::string, const format::ManifestTensor*> by_key;
  for (const auto& t : m.tensors) by_key[absl::StrCat(t.kind, "/", t.name)] = &t;
  // Check every target before reading anything, so a mismatch leaves the
  // destination untouched.
  std::vector<const format::ManifestTensor*> found;
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
    found.push_back(&t);
  }
  std::map<std::string, std::unique_ptr<OpenShard>> open;
  const auto by_file = TensorsByFile(m);
  for (size_t i = 0; i < targets.size(); ++i) {
    const format::ManifestTensor& t = *found[i];
    auto& shard = open[t.file];
    if (!shard) {
      auto fit = std::find_if(m.files.begin(), m.files.end(),
                              [&](const format::ManifestFile& f) { return f.name == t.file; });
      ZCC_ASSIGN_OR_RETURN(OpenShard s, OpenAndCheckShard(step_dir, *fit, by_file.at(t.file)));
      shard = std::make_unique<OpenShard>(std::move(s));
    }
    ZCC_RETURN_IF_ERROR(ReadAndCheckTensor(*shard, t, targets[i].dst, nullptr));
  }
  return absl::OkStatus();
}

}  // namespace zcc::checkpoint
