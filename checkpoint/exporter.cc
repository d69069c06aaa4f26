#include "checkpoint/exporter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "checkpoint/export_layout.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/box.h"
#include "format/float_convert.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "format/tensor_kind.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

constexpr char kConfigFileName[] = "config.json";
constexpr uint64_t kMaxConfigBytes = 16 << 20;

constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kTempSuffix[] = ".zcc-partial";
// Converted bytes written per WriteAt.
constexpr size_t kConvertChunkBytes = size_t{4} << 20;
// Buffer offsets of tensors read in one batch are rounded up to this, so that
// a tensor lands aligned like its (page-aligned) place in the shard file and
// direct I/O can read it in place.
constexpr uint64_t kBatchAlign = storage::kDirectIoAlignment;

const char* KindOf(ExportWhat what) {
  switch (what) {
    case ExportWhat::kModel:
      return "param";
    case ExportWhat::kEma:
      return format::kEmaKindName;
    case ExportWhat::kOptim:
      return "optim";
  }
  return "param";
}

// One global tensor of the export and the shape of its bytes.
struct PlannedTensor {
  const GlobalTensor* global = nullptr;
  format::DType out_dtype = format::DType::kU8;
  uint64_t in_bytes = 0;   // in the step (global dtype)
  uint64_t out_bytes = 0;  // in the export
  bool transpose = false;  // a 2-D tensor written [cols, rows] (ExportLayout)
};

struct PlannedShard {
  std::string file;
  size_t first = 0;  // tensors [first, end) of the plan
  size_t end = 0;
  std::string header;  // 8-byte length + JSON
  uint64_t file_bytes = 0;
};

// Temporary files in out_dir, removed when the export fails: a move-only
// owner of the names, released once they are renamed into place.
class TempFiles {
 public:
  TempFiles(storage::Storage* storage, std::string dir) : storage_(storage), dir_(std::move(dir)) {}
  ~TempFiles() {
    for (const std::string& path : paths_) storage_->Remove(path).IgnoreError();
  }
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;

  // The temporary path for final name `name` (recorded for removal).
  std::string Add(const std::string& name) {
    paths_.push_back(JoinPath(dir_, absl::StrCat(".", name, ".", ::getpid(), kTempSuffix)));
    return paths_.back();
  }
  // Forgets `path` (it has been renamed).
  void Release(const std::string& path) {
    paths_.erase(std::remove(paths_.begin(), paths_.end(), path), paths_.end());
  }

 private:
  storage::Storage* const storage_;
  const std::string dir_;
  std::vector<std::string> paths_;
};

// True when the elements of `box` are one contiguous run of the row-major
// global tensor: after its first dimension longer than 1, every dimension is
// whole (a dim-0 shard, a row of a column split, a whole tensor).
bool IsContiguousRun(const format::Box& box, const std::vector<int64_t>& global_shape) {
  size_t d = 0;
  while (d < box.shape.size() && box.shape[d] == 1) ++d;
  for (++d; d < box.shape.size(); ++d) {
    if (box.shape[d] != global_shape[d]) return false;
  }
  return true;
}

// Row-major element index of the box's first element in the global tensor.
uint64_t FlatOffset(const format::Box& box, const std::vector<int64_t>& global_shape) {
  uint64_t flat = 0;
  for (size_t d = 0; d < global_shape.size(); ++d) {
    flat = flat * static_cast<uint64_t>(global_shape[d]) + static_cast<uint64_t>(box.offset[d]);
  }
  return flat;
}

// The ReadBoxes targets that fill `t` whole at `dst`. When every piece is a
// contiguous run of the tensor (whole tensors, dim-0 shards), one target per
// piece at its place: ReadBoxes reads each straight into place. Otherwise
// (column or block splits) one whole-tensor target, assembled by ReadBoxes
// through its staging buffer.
void AddTargets(const GlobalTensor& t, uint8_t* dst, std::vector<BoxTarget>* targets) {
  const size_t elem = format::DTypeSize(t.dtype);
  const bool runs = std::all_of(t.pieces.begin(), t.pieces.end(), [&](const auto* p) {
    return IsContiguousRun(format::Box{p->box_offset, p->shape}, t.global_shape);
  });
  if (!runs) {
    targets->push_back({t.kind, t.name, t.dtype, t.global_shape, format::WholeBox(t.global_shape), dst});
    return;
  }
  for (const format::ManifestTensor* p : t.pieces) {
    format::Box box{p->box_offset, p->shape};
    if (format::Volume(box) == 0) continue;
    uint8_t* at = dst + FlatOffset(box, t.global_shape) * elem;
    targets->push_back({t.kind, t.name, t.dtype, t.global_shape, std::move(box), at});
  }
}

absl::Status CheckOptions(const ExportOptions& options) {
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("the maximum shard size must be more than 0 bytes");
  }
  if (options.dtype.has_value() && !format::IsConvertibleFloat(*options.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot export as ", format::DTypeName(*options.dtype),
                                                   ": the dtype must be F32, BF16 or F16"));
  }
  return absl::OkStatus();
}

// The extra files' base names, checked: regular files, plain names that
// collide with nothing the export writes. (They are the user's local files,
// named on the command line: checked where they are, not through the
// export's storage.)
absl::StatusOr<std::vector<std::string>> CheckExtraFiles(const std::vector<std::string>& paths,
                                                         const std::set<std::string>& taken) {
  std::vector<std::string> names;
  std::set<std::string> seen = taken;
  for (const std::string& path : paths) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("extra file ", path));
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("extra file ", path, " is not a regular file"));
    }
    const size_t slash = path.find_last_of('/');
    std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (name.empty() || name == "." || name == "..") {
      return absl::InvalidArgumentError(absl::StrCat("extra file ", path, " has no file name"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extra file ", path, ": '", name, "' is ",
          taken.count(name) > 0 ? "a name the export writes itself" : "named twice"));
    }
    names.push_back(std::move(name));
  }
  return names;
}

// The regular files in the job's metadata directory (<job dir>/metadata,
// beside the step directory), by name, except those `given` replaces.
absl::StatusOr<std::vector<std::string>> JobFiles(storage::Storage& storage,
                                                  const std::string& step_dir,
                                                  const std::vector<std::string>& given,
                                                  bool given_replaces) {
  std::string trimmed = step_dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.find_last_of('/');
  const std::string job_dir = slash == std::string::npos ? "." : trimmed.substr(0, slash);
  const std::string dir = JoinPath(job_dir, kJobMetadataDirName);
  if (!storage::Exists(storage, dir)) return std::vector<std::string>();
  std::set<std::string> replaced;
  for (const std::string& path : given) {
    const size_t s = path.find_last_of('/');
    replaced.insert(s == std::string::npos ? path : path.substr(s + 1));
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(dir));
  std::vector<std::string> out;
  for (const std::string& name : names) {
    // (".tmp." names are a write zccd did not finish.)
    if (!ValidateJobFileName(name).ok() || absl::StrContains(name, ".tmp.")) continue;
    if (replaced.count(name) > 0) {
      if (given_replaces) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "--extra-file ", name, " would replace the ", name, " stored with the job (",
          JoinPath(dir, name), "); pass --force to replace it, or --no-job-files to leave the "
          "job's files out"));
    }
    const std::string path = JoinPath(dir, name);
    auto info = storage.Stat(path);
    if (!info.ok() || info->is_dir) continue;
    // Ownership, not I/O: a link planted among the job's files (which zccd
    // writes as regular files) is never followed into an export.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) continue;
    out.push_back(path);
  }
  return out;
}

// True for the weight files an export (this one or an earlier one) names:
// model.safetensors, model-NNNNN-of-NNNNN.safetensors, the index.
bool IsWeightFileName(absl::string_view name) {
  if (name == kSingleFileName || name == format::kModelIndexFileName) return true;
  auto digits = [](absl::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
  };
  if (!absl::ConsumePrefix(&name, "model-") || !absl::ConsumeSuffix(&name, ".safetensors")) {
    return false;
  }
  const size_t of = name.find("-of-");
  return of != absl::string_view::npos && digits(name.substr(0, of)) && digits(name.substr(of + 4));
}

bool IsTempFileName(const std::string& name) {
  return absl::StartsWith(name, ".") && absl::EndsWith(name, kTempSuffix);
}

// Removes directory `dir`, which this export created, when nothing is in it.
void RemoveIfEmpty(storage::Storage& storage, const std::string& dir) {
  auto names = storage.List(dir);
  if (names.ok() && names->empty()) (void)storage.RemoveTree(dir);
}

// Makes out_dir ready: created when missing (*created), refused when not empty
// without `force`, or when it lies inside the step directory.
absl::Status PrepareOutDir(storage::Storage& storage, const std::string& step_dir,
                           const std::string& out_dir, bool force, bool same_storage,
                           bool* created) {
  *created = false;
  const absl::StatusOr<storage::FileInfo> info = storage.Stat(out_dir);
  if (info.ok()) {
    if (!info->is_dir) {
      return absl::FailedPreconditionError(absl::StrCat(out_dir, " exists and is not a directory"));
    }
    ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(out_dir));
    if (!names.empty() && !force) {
      return absl::FailedPreconditionError(
          absl::StrCat(out_dir, " is not empty (", names.size(),
                       names.size() == 1 ? " entry: '" : " entries, e.g. '", names.front(),
                       "'); export into a new or empty directory, or pass --force to write into it"));
    }
  } else if (absl::IsNotFound(info.status())) {
    ZCC_RETURN_IF_ERROR(storage.MakeDirs(out_dir));
    *created = true;
  } else {
    return info.status();
  }
  // (A step in another storage, an object store, cannot contain out_dir.)
  ZCC_ASSIGN_OR_RETURN(bool inside,
                       same_storage ? IsUnderRoot(out_dir, step_dir) : absl::StatusOr<bool>(false));
  if (inside) {
    if (*created) RemoveIfEmpty(storage, out_dir);
    *created = false;
    return absl::InvalidArgumentError(
        absl::StrCat(out_dir, " lies inside the step directory ", step_dir));
  }
  return absl::OkStatus();
}

// Writes `elements` elements of `src` into `file` at *offset (advanced),
// converted from `from` to `to` through `chunk` when the dtypes differ.
absl::Status WriteConverted(storage::File& file, const uint8_t* src, uint64_t elements,
                            format::DType from, format::DType to, storage::AlignedBuffer& chunk,
                            uint64_t* offset) {
  if (elements == 0) return absl::OkStatus();
  if (from == to) {
    const uint64_t n = elements * format::DTypeSize(from);
    ZCC_RETURN_IF_ERROR(storage::WriteAt(file, *offset, src, n));
    *offset += n;
    return absl::OkStatus();
  }
  const size_t in_size = format::DTypeSize(from);
  const size_t out_size = format::DTypeSize(to);
  const uint64_t per_chunk = chunk.size() / out_size;
  for (uint64_t done = 0; done < elements;) {
    const uint64_t n = std::min<uint64_t>(per_chunk, elements - done);
    format::ConvertFloats(from, to, src + done * in_size, chunk.data(), n);
    ZCC_RETURN_IF_ERROR(storage::WriteAt(file, *offset, chunk.data(), n * out_size));
    *offset += n * out_size;
    done += n;
  }
  return absl::OkStatus();
}

// Copies the file at `from` to `to` through a 1 MiB buffer.
absl::Status CopyFile(storage::Storage& from_storage, const std::string& from,
                      storage::Storage& storage, const std::string& to) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> in,
                       from_storage.OpenForRead(from, storage::OpenOptions{}));
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> out,
                       storage.OpenForWrite(to, storage::OpenOptions{}));
  storage::AlignedBuffer buffer = storage::AlignedBuffer::Uninitialized(size_t{1} << 20);
  uint64_t offset = 0;
  while (true) {
    ZCC_ASSIGN_OR_RETURN(size_t got, storage::ReadAt(*in, offset, buffer.data(), buffer.size()));
    if (got == 0) break;
    ZCC_RETURN_IF_ERROR(storage::WriteAt(*out, offset, buffer.data(), got));
    offset += got;
  }
  ZCC_RETURN_IF_ERROR(in->Close());
  ZCC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

// Writes the index or any small file through `storage`, synced.
absl::Status WriteSmallFile(storage::Storage& storage, const std::string& path,
                            absl::string_view text) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file,
                       storage.OpenForWrite(path, storage::OpenOptions{}));
  ZCC_RETURN_IF_ERROR(storage::WriteAt(*file, 0, text.data(), text.size()));
  ZCC_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Copies a Hugging Face config.json, its "torch_dtype" (and "dtype", where
// present: transformers 5's name) set to `dtype`'s torch name.
absl::Status WriteConfigWithDType(storage::Storage& from_storage, const std::string& from,
                                  storage::Storage& storage, const std::string& to,
                                  format::DType dtype) {
  ZCC_ASSIGN_OR_RETURN(std::string text,
                       storage::ReadWholeFile(from_storage, from, kMaxConfigBytes));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(from, " is not a JSON object; cannot set its torch_dtype for --dtype"));
  }
  const char* name = dtype == format::DType::kBF16  ? "bfloat16"
                     : dtype == format::DType::kF16 ? "float16"
                                                    : "float32";
  config["torch_dtype"] = name;
  if (config.contains("dtype")) config["dtype"] = name;
  return WriteSmallFile(storage, to, config.dump(2) + "\n");
}

// Streams one planned shard into `path`.
class ShardStreamer {
 public:
  ShardStreamer(const std::string& step_dir, const format::StepIndex& index,
                const std::vector<GlobalTensor>& tensors, const ExportOptions& options,
                ExportReport* report)
      : step_dir_(step_dir), index_(index), tensors_(tensors), options_(options), report_(report) {}

  absl::Status Write(storage::Storage& storage, const PlannedShard& shard,
                     const std::vector<PlannedTensor>& plan, const std::string& path) {
    storage::OpenOptions open;  // buffered: sequential writes of any size
    ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file, storage.OpenForWrite(path, open));
    ZCC_RETURN_IF_ERROR(storage::WriteAt(*file, 0, shard.header.data(), shard.header.size()));
    uint64_t offset = shard.header.size();
    for (size_t i = shard.first; i < shard.end;) {
      // The batch [i, j): tensors whose aligned bytes fit the budget (at least one).
      size_t j = i;
      uint64_t batch_bytes = 0;
      std::vector<uint64_t> at;
      while (j < shard.end) {
        const uint64_t need = storage::AlignUp(plan[j].in_bytes, kBatchAlign);
        if (j > i && batch_bytes + need > options_.read_batch_bytes) break;
        at.push_back(batch_bytes);
        batch_bytes += need;
        ++j;
      }
      ZCC_RETURN_IF_ERROR(ReadBatch(plan, i, j, at, batch_bytes));
      for (size_t k = i; k < j; ++k) {
        const PlannedTensor& t = plan[k];
        const uint8_t* src = buffer_.data() + at[k - i];
        if (t.transpose) {
          ZCC_RETURN_IF_ERROR(WriteTransposed(*file, src, t, &offset));
          continue;
        }
        const uint64_t elements = t.in_bytes / format::DTypeSize(t.global->dtype);
        ZCC_RETURN_IF_ERROR(WriteConverted(*file, src, elements, t.global->dtype, t.out_dtype,
                                           ConvertChunk(), &offset));
      }
      i = j;
    }
    if (offset != shard.file_bytes) {
      return absl::InternalError(absl::StrCat(path, ": wrote ", offset, " bytes, planned ",
                                              shard.file_bytes));
    }
    ZCC_RETURN_IF_ERROR(file->Sync());
    return file->Close();
  }

 private:
  // Reads tensors [i, j) of the plan into buffer_ at offsets `at`.
  absl::Status ReadBatch(const std::vector<PlannedTensor>& plan, size_t i, size_t j,
                         const std::vector<uint64_t>& at, uint64_t batch_bytes) {
    if (buffer_.size() < batch_bytes) {
      buffer_ = storage::AlignedBuffer();  // free the old one first
      buffer_ = storage::AlignedBuffer::Uninitialized(batch_bytes);
      report_->peak_buffer_bytes = std::max<uint64_t>(report_->peak_buffer_bytes, batch_bytes);
    }
    std::vector<BoxTarget> targets;
    for (size_t k = i; k < j; ++k) AddTargets(*plan[k].global, buffer_.data() + at[k - i], &targets);
    if (targets.empty()) return absl::OkStatus();
    ZCC_ASSIGN_OR_RETURN(ReshardStats stats, ReadBoxes(step_dir_, index_, tensors_, targets,
                                                       options_.io, options_.staging_bytes));
    report_->bytes_read += stats.bytes_read;
    return absl::OkStatus();
  }

  // Writes the 2-D tensor `t` at `src` transposed (and converted), a
  // chunk of its output elements at a time gathered into a second buffer.
  absl::Status WriteTransposed(storage::File& file, const uint8_t* src, const PlannedTensor& t,
                               uint64_t* offset) {
    const uint64_t rows = static_cast<uint64_t>(t.global->global_shape[0]);
    const uint64_t cols = static_cast<uint64_t>(t.global->global_shape[1]);
    const size_t in_size = format::DTypeSize(t.global->dtype);
    if (gather_.size() == 0) gather_ = storage::AlignedBuffer::Uninitialized(kConvertChunkBytes);
    const uint64_t per_chunk = gather_.size() / std::max(in_size, format::DTypeSize(t.out_dtype));
    for (uint64_t done = 0; done < rows * cols;) {
      const uint64_t n = std::min<uint64_t>(per_chunk, rows * cols - done);
      TransposeRange(src, rows, cols, in_size, done, n, gather_.data());
      ZCC_RETURN_IF_ERROR(WriteConverted(file, gather_.data(), n, t.global->dtype, t.out_dtype,
                                         ConvertChunk(), offset));
      done += n;
    }
    return absl::OkStatus();
  }

  storage::AlignedBuffer& ConvertChunk() {
    if (chunk_.size() == 0) chunk_ = storage::AlignedBuffer::Uninitialized(kConvertChunkBytes);
    return chunk_;
  }

  const std::string& step_dir_;
  const format::StepIndex& index_;
  const std::vector<GlobalTensor>& tensors_;
  const ExportOptions& options_;
  ExportReport* const report_;
  storage::AlignedBuffer buffer_;  // reused across batches; grows only
  storage::AlignedBuffer chunk_;
  storage::AlignedBuffer gather_;  // a transposed tensor's elements, before conversion
};

}  // namespace

absl::StatusOr<ExportWhat> ParseExportWhat(absl::string_view text) {
  if (text == "model") return ExportWhat::kModel;
  if (text == "ema") return ExportWhat::kEma;
  if (text == "optim") return ExportWhat::kOptim;
  return absl::InvalidArgumentError(
      absl::StrCat("cannot export '", text, "': choose model, ema or optim"));
}

absl::StatusOr<std::optional<format::DType>> ParseExportDType(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "keep") return std::optional<format::DType>();
  if (t == "bf16" || t == "bfloat16") return std::optional<format::DType>(format::DType::kBF16);
  if (t == "f16" || t == "fp16" || t == "float16") {
    return std::optional<format::DType>(format::DType::kF16);
  }
  if (t == "f32" || t == "fp32" || t == "float32") {
    return std::optional<format::DType>(format::DType::kF32);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", text, "': choose bf16, f16, f32 or keep"));
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid size '", text, "': ", why,
        "; write a whole number of bytes with an optional unit, e.g. 5GB, 500MB, 1GiB "
        "(B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024)"));
  };
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0) return bad("it does not start with a number");
  if (digits < text.size() && (text[digits] == '.' || text[digits] == ',')) {
    return bad("fractions are not accepted (1.5GB: write 1500MB)");
  }
  uint64_t count = 0;
  if (!absl::SimpleAtoi(text.substr(0, digits), &count)) return bad("the number is too large");
  const absl::string_view unit = text.substr(digits);
  // transformers reads a lowercase final "b" of KB..TB as bits ("5Gb" is
  // 625 MB): refuse it rather than guess.
  if (unit.size() == 2 && unit[1] == 'b') return bad("a lowercase 'b' would mean bits");
  if (unit == "b") return bad("write bytes as B");
  struct Unit {
    const char* name;  // lowercase
    uint64_t bytes;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", uint64_t{1000} * 1000 * 1000},
      {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
      {"kib", uint64_t{1} << 10},
      {"mib", uint64_t{1} << 20},
      {"gib", uint64_t{1} << 30},
      {"tib", uint64_t{1} << 40},
  };
  const std::string lower = absl::AsciiStrToLower(unit);
  const Unit* it = std::find_if(std::begin(kUnits), std::end(kUnits),
                                [&](const Unit& u) { return lower == u.name; });
  if (it == std::end(kUnits)) return bad(absl::StrCat("unknown unit '", unit, "'"));
  if (count == 0) return bad("it must be more than 0");
  if (count > (uint64_t{1} << 63) / it->bytes) return bad("it is more than 2^63 bytes");
  return count * it->bytes;
}

std::vector<size_t> ShardStarts(const std::vector<uint64_t>& bytes, uint64_t max_shard_bytes) {
  std::vector<size_t> starts;
  uint64_t in_shard = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (starts.empty() || (i > starts.back() && in_shard + bytes[i] > max_shard_bytes)) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += bytes[i];
  }
  return starts;
}

std::string ExportShardFileName(size_t k, size_t n) {
  if (n == 1) return kSingleFileName;
  return absl::StrFormat("model-%05d-of-%05d.safetensors", k, n);
}

absl::StatusOr<ExportReport> ExportStep(const std::string& step_dir, const std::string& out_dir,
                                        const ExportOptions& options) {
  const absl::Time start = absl::Now();
  ZCC_RETURN_IF_ERROR(CheckOptions(options));
  // The step (and the job's stored files) are read through `in`; out_dir is
  // written through `storage`; --extra-file paths are local files.
  storage::Storage& in =
      options.io.storage != nullptr ? *options.io.storage : *storage::DefaultStorage();
  storage::Storage& storage = options.out_storage != nullptr ? *options.out_storage : in;
  storage::Storage& local = *storage::DefaultStorage();
  ExportReport report;
  report.kind = KindOf(options.what);

  // The step: its index, checked (every global tensor tiled exactly once).
  ZCC_ASSIGN_OR_RETURN(format::StepIndex index, LoadStepIndex(step_dir, &in));
  // An incomplete EMA tensor is left out (--what ema then writes the
  // parameter itself, as for a parameter without an EMA).
  std::vector<std::string> incomplete_ema;
  ZCC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> tensors, GroupPieces(index, &incomplete_ema));

  // The files the trainer stored with the job (PutJobFile); the export
  // layout among them is read, not copied.
  std::vector<std::string> job_paths;
  if (options.job_files) {
    ZCC_ASSIGN_OR_RETURN(job_paths, JobFiles(in, step_dir, options.extra_files, options.force));
  }
  ExportLayout layout;
  for (auto it = job_paths.begin(); it != job_paths.end(); ++it) {
    if (it->substr(it->find_last_of('/') + 1) != kExportLayoutFileName) continue;
    ZCC_ASSIGN_OR_RETURN(std::string text, storage::ReadWholeFile(in, *it, kMaxConfigBytes));
    ZCC_ASSIGN_OR_RETURN(layout, ParseExportLayout(text, *it));
    job_paths.erase(it);
    break;
  }

  // The plan: tensors in name order, shards, headers.
  std::vector<PlannedTensor> plan;
  // An EMA export is a whole model: parameters without an EMA (integer
  // buffers, parameters registered as not EMA-eligible) come from the
  // parameters, or from_pretrained would initialise them at random.
  std::set<absl::string_view> with_ema;
  if (options.what == ExportWhat::kEma) {
    for (const GlobalTensor& g : tensors) {
      if (g.kind == format::kEmaKindName) with_ema.insert(g.name);
    }
  }
  for (const GlobalTensor& g : tensors) {
    const bool param_without_ema =
        !with_ema.empty() && g.kind == "param" && with_ema.count(g.name) == 0;
    if (g.kind != report.kind && !param_without_ema) continue;
    report.params_without_ema += param_without_ema ? 1 : 0;
    PlannedTensor t;
    t.global = &g;
    t.out_dtype = options.dtype.has_value() && format::IsConvertibleFloat(g.dtype) ? *options.dtype
                                                                                   : g.dtype;
    ZCC_ASSIGN_OR_RETURN(t.in_bytes, format::TensorBytes(g.dtype, g.global_shape));
    ZCC_ASSIGN_OR_RETURN(t.out_bytes, format::TensorBytes(t.out_dtype, g.global_shape));
    t.transpose = layout.transpose.count(g.name) > 0;
    if (t.transpose && g.global_shape.size() != 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's ", kExportLayoutFileName, " asks for tensor '", g.name,
          "' transposed, but it has ", g.global_shape.size(),
          " dimensions (only 2-D tensors are transposed); export with --no-job-files to "
          "write every tensor as the trainer held it"));
    }
    report.transposed += t.transpose ? 1 : 0;
    plan.push_back(t);
  }
  if (plan.empty() || (options.what == ExportWhat::kEma && with_ema.empty())) {
    return absl::FailedPreconditionError(
        absl::StrCat(step_dir, " holds no ", report.kind, " tensors to export"));
  }
  // Name order (GroupPieces keeps the index's order).
  std::stable_sort(plan.begin(), plan.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
    return a.global->name < b.global->name;
  });
  std::vector<uint64_t> sizes;
  for (const PlannedTensor& t : plan) sizes.push_back(t.out_bytes);
  const std::vector<size_t> starts = ShardStarts(sizes, options.max_shard_bytes);
  std::vector<PlannedShard> shards(starts.size());
  std::map<std::string, std::string> weight_map;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (size_t s = 0; s < shards.size(); ++s) {
    PlannedShard& shard = shards[s];
    shard.file = ExportShardFileName(s + 1, shards.size());
    shard.first = starts[s];
    shard.end = s + 1 < starts.size() ? starts[s + 1] : plan.size();
    std::vector<format::SafetensorsTensor> entries;
    uint64_t data = 0;
    for (size_t i = shard.first; i < shard.end; ++i) {
      const PlannedTensor& t = plan[i];
      std::vector<int64_t> shape = t.global->global_shape;
      if (t.transpose) std::swap(shape[0], shape[1]);
      entries.push_back({t.global->name, t.out_dtype, std::move(shape), data, data + t.out_bytes});
      data += t.out_bytes;
      weight_map[t.global->name] = shard.file;
    }
    auto header = format::EncodeSafetensorsHeader(entries, metadata, /*align=*/8);
    if (!header.ok()) return Annotate(header.status(), shard.file);
    shard.header = *std::move(header);
    shard.file_bytes = shard.header.size() + data;
    report.tensor_bytes += data;
    report.file_bytes += shard.file_bytes;
  }
  report.tensors = plan.size();
  report.indexed = shards.size() > 1;

  std::set<std::string> written_names;
  for (const PlannedShard& shard : shards) written_names.insert(shard.file);
  written_names.insert(kSingleFileName);
  written_names.insert(format::kModelIndexFileName);
  // The files the trainer stored with the job, then the ones given; a given
  // file replaces a job file of the same name.
  std::vector<std::string> extra_paths = std::move(job_paths);
  const size_t job_file_count = extra_paths.size();  // read through `in`; the rest are local
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> given_names,
                       CheckExtraFiles(options.extra_files, written_names));
  extra_paths.insert(extra_paths.end(), options.extra_files.begin(), options.extra_files.end());
  for (size_t e = 0; e < job_file_count; ++e) {
    const std::string name = extra_paths[e].substr(extra_paths[e].find_last_of('/') + 1);
    if (written_names.count(name) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the job's file ", extra_paths[e], " is named like a file the export writes itself"));
    }
    report.extra_files.push_back(name);
  }
  report.extra_files.insert(report.extra_files.end(), given_names.begin(), given_names.end());

  bool created = false;
  ZCC_RETURN_IF_ERROR(
      PrepareOutDir(storage, step_dir, out_dir, options.force, /*same_storage=*/&in == &storage,
                    &created));
  absl::Status st = [&]() -> absl::Status {
    TempFiles temps(&storage, out_dir);
    // (temporary path, final name), renamed in this order.
    std::vector<std::pair<std::string, std::string>> renames;
    for (size_t e = 0; e < extra_paths.size(); ++e) {
      const std::string tmp = temps.Add(report.extra_files[e]);
      storage::Storage& from = e < job_file_count ? in : local;
      if (options.dtype.has_value() && report.extra_files[e] == kConfigFileName) {
        ZCC_RETURN_IF_ERROR(WriteConfigWithDType(from, extra_paths[e], storage, tmp, *options.dtype));
      } else {
        ZCC_RETURN_IF_ERROR(CopyFile(from, extra_paths[e], storage, tmp));
      }
      renames.emplace_back(tmp, report.extra_files[e]);
    }
    ShardStreamer streamer(step_dir, index, tensors, options, &report);
    for (size_t s = 0; s < shards.size(); ++s) {
      const absl::Time shard_start = absl::Now();
      const std::string tmp = temps.Add(shards[s].file);
      ZCC_RETURN_IF_ERROR(streamer.Write(storage, shards[s], plan, tmp));
      renames.emplace_back(tmp, shards[s].file);
      ExportedShard done{shards[s].file, s + 1, shards.size(), shards[s].end - shards[s].first,
                         shards[s].file_bytes, absl::ToDoubleSeconds(absl::Now() - shard_start)};
      report.shards.push_back(done);
      if (options.on_shard) options.on_shard(done);
    }
    if (report.indexed) {
      const std::string tmp = temps.Add(format::kModelIndexFileName);
      ZCC_RETURN_IF_ERROR(WriteSmallFile(
          storage, tmp, format::EncodeWeightMapIndex(weight_map, report.tensor_bytes)));
      renames.emplace_back(tmp, format::kModelIndexFileName);
    }
    // The extra files first, then the shards, then the index: a loader that
    // finds the index (or the single model.safetensors, renamed last when
    // there is no index) finds everything it names.

    // Everything is complete and durable: rename into place. Should a rename
    // fail, the final names already taken are removed again.
    std::vector<std::string> placed;
    for (const auto& [tmp, name] : renames) {
      const std::string path = JoinPath(out_dir, name);
      absl::Status renamed = storage.Rename(tmp, path);
      if (!renamed.ok()) {
        for (const std::string& p : placed) storage.Remove(p).IgnoreError();
        return renamed;
      }
      temps.Release(tmp);
      placed.push_back(path);
    }
    ZCC_RETURN_IF_ERROR(storage.SyncDir(out_dir));

    if (options.force) {
      // Weight files of an earlier export that this one replaces, and
      // temporary files an interrupted export left.
      std::set<std::string> keep;
      for (const auto& [tmp, name] : renames) keep.insert(name);
      ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(out_dir));
      bool removed = false;
      for (const std::string& name : names) {
        if (keep.count(name) > 0 || !(IsWeightFileName(name) || IsTempFileName(name))) continue;
        ZCC_RETURN_IF_ERROR(storage.Remove(JoinPath(out_dir, name)));
        removed = true;
      }
      if (removed) ZCC_RETURN_IF_ERROR(storage.SyncDir(out_dir));
    }
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    if (created) RemoveIfEmpty(storage, out_dir);
    return st;
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

}  // namespace zcc::checkpoint
