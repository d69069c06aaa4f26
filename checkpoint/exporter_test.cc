#include "checkpoint/exporter.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/testing/sliced_step.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/box.h"
#include "format/checksum.h"
#include "format/dtype.h"
#include "format/float_convert.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "storage/fault_storage.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

using format::DType;
using testing::SlicedModel;
using testing::SlicedTensor;
using ::zcc::testing::TempDir;

// A committed step of the default sliced model (4 ranks: a column-split F32
// [8, 12] up_proj of [8, 3] pieces, a row-split BF16 [10, 12] embedding of
// 3, 3, 3 and 1 rows, a grid-split down_proj, whole norms written by one
// rank, a scalar, an I64 tensor; optim and EMA kinds).
struct Step {
  SlicedModel model;
  std::string root = TempDir();
  std::string dir;

  explicit Step(SlicedModel m = {}) : model(m) {
    const std::string job_dir = JoinPath(root, "job");
    REQUIRE_OK(testing::WriteSlicedStep(job_dir, "job", 7, model));
    dir = JoinPath(job_dir, format::StepDirName(7));
  }

  std::vector<SlicedTensor> Of(const std::string& kind) const {
    std::vector<SlicedTensor> out;
    for (const SlicedTensor& t : testing::SlicedModelTensors(model)) {
      if (t.kind == kind) out.push_back(t);
    }
    return out;
  }
};

// One tensor of an exported file, read back with zcc's safetensors decoder.
struct ReadTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::string file;
};

struct Exported {
  std::map<std::string, ReadTensor> tensors;
  std::map<std::string, std::vector<std::string>> names_by_file;  // in file order
  std::map<std::string, uint64_t> data_bytes_by_file;
};

Exported ReadExport(const std::string& out_dir, const std::vector<std::string>& files) {
  Exported e;
  for (const std::string& file : files) {
    auto content = ReadFileToString(JoinPath(out_dir, file), uint64_t{1} << 30);
    REQUIRE_OK(content);
    auto header = format::DecodeSafetensorsHeader(*content, content->size());
    REQUIRE_OK(header);
    CHECK(header->metadata == std::map<std::string, std::string>{{"format", "pt"}});
    CHECK(header->data_start % 8 == 0);
    uint64_t data = 0;
    for (const format::SafetensorsTensor& t : header->tensors) {
      REQUIRE(e.tensors.count(t.name) == 0);
      e.tensors[t.name] = {t.dtype, t.shape,
                           content->substr(header->data_start + t.begin, t.end - t.begin), file};
      e.names_by_file[file].push_back(t.name);
      data += t.end - t.begin;
    }
    e.data_bytes_by_file[file] = data;
  }
  return e;
}

std::string Expected(const SlicedTensor& t) {
  std::string bytes(format::Volume(format::WholeBox(t.global_shape)) * format::DTypeSize(t.dtype),
                    '\0');
  testing::FillBox(t, format::WholeBox(t.global_shape), reinterpret_cast<uint8_t*>(bytes.data()));
  return bytes;
}

// Reference f32 -> bf16 rounding, computed in double: the nearer of the two
// bf16 neighbours, ties to the even one; NaN to a NaN.
uint16_t ReferenceBf16(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint16_t low = static_cast<uint16_t>(bits >> 16);
  const uint16_t high = static_cast<uint16_t>(low + 1);
  auto value = [](uint16_t b) {
    float v;
    const uint32_t w = uint32_t{b} << 16;
    std::memcpy(&v, &w, 4);
    return static_cast<double>(v);
  };
  const double d_low = std::fabs(static_cast<double>(f) - value(low));
  const double d_high = std::fabs(value(high) - static_cast<double>(f));
  if (d_low != d_high) return d_low < d_high ? low : high;
  return (low & 1) == 0 ? low : high;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> Entries(const std::string& dir) {
  auto names = ListDir(dir);
  REQUIRE_OK(names);
  return Sorted(*names);
}

void FlipByte(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b ^= 0x5a;
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::close(fd);
}

// The index entry of a piece of `name` (kind `kind`) in `step_dir`.
format::ManifestTensor PieceOf(const std::string& step_dir, const std::string& kind,
                               const std::string& name, int64_t box_offset_1) {
  auto text = ReadFileToString(JoinPath(step_dir, format::kStepIndexFileName), 1 << 26);
  REQUIRE_OK(text);
  auto index = format::DecodeStepIndex(*text);
  REQUIRE_OK(index);
  for (const format::ManifestTensor& p : index->pieces) {
    if (p.kind == kind && p.name == name && p.box_offset.size() > 1 &&
        p.box_offset[1] == box_offset_1) {
      return p;
    }
  }
  FAIL("no such piece");
  return {};
}

TEST_CASE("a sliced 4-rank step exports as whole tensors in several shards") {
  Step step;
  const std::string out = JoinPath(TempDir(), "hf");  // created by the export
  ExportOptions options;
  options.max_shard_bytes = 700;
  std::vector<ExportedShard> progress;
  options.on_shard = [&](const ExportedShard& s) { progress.push_back(s); };
  auto report = ExportStep(step.dir, out, options);
  REQUIRE_OK(report);

  const std::vector<SlicedTensor> params = step.Of("param");
  REQUIRE(params.size() == 9);
  // Shards in name order, none past the limit unless it holds one tensor.
  std::vector<uint64_t> sizes;
  for (const SlicedTensor& t : params) sizes.push_back(Expected(t).size());
  const std::vector<size_t> starts = ShardStarts(sizes, 700);
  REQUIRE(starts.size() > 2);
  REQUIRE(report->shards.size() == starts.size());
  CHECK(report->indexed);
  CHECK(report->tensors == params.size());
  CHECK(progress.size() == starts.size());
  std::vector<std::string> files;
  for (size_t k = 0; k < starts.size(); ++k) {
    files.push_back(absl::StrCat("model-0000", k + 1, "-of-0000", starts.size(), ".safetensors"));
    CHECK(report->shards[k].file == files.back());
    CHECK(progress[k].file == files.back());
  }
  std::vector<std::string> want_entries = files;
  want_entries.push_back("model.safetensors.index.json");
  CHECK(Entries(out) == Sorted(want_entries));

  const Exported e = ReadExport(out, files);
  REQUIRE(e.tensors.size() == params.size());
  uint64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const SlicedTensor& t = params[i];
    INFO(t.name);
    const ReadTensor& got = e.tensors.at(t.name);
    CHECK(got.dtype == t.dtype);
    CHECK(got.shape == t.global_shape);
    CHECK(got.bytes == Expected(t));  // every element of the reassembled tensor
    const size_t shard = std::upper_bound(starts.begin(), starts.end(), i) - starts.begin() - 1;
    CHECK(got.file == files[shard]);
    total += got.bytes.size();
  }
  for (const auto& [file, bytes] : e.data_bytes_by_file) {
    CHECK((bytes <= 700 || e.names_by_file.at(file).size() == 1));
    const auto& names = e.names_by_file.at(file);
    CHECK(std::is_sorted(names.begin(), names.end()));
  }
  CHECK(report->tensor_bytes == total);

  // The index: total_size and the weight map.
  auto text = ReadFileToString(JoinPath(out, "model.safetensors.index.json"), 1 << 20);
  REQUIRE_OK(text);
  const nlohmann::json index = nlohmann::json::parse(*text);
  CHECK(index["metadata"]["total_size"].get<uint64_t>() == total);
  CHECK(index["weight_map"].size() == params.size());
  for (const SlicedTensor& t : params) {
    CHECK(index["weight_map"][t.name].get<std::string>() == e.tensors.at(t.name).file);
  }
  // Bounded memory: no read buffer beyond the batch budget or one tensor.
  CHECK(report->peak_buffer_bytes <= std::max<uint64_t>(options.read_batch_bytes, 4096));
  CHECK(report->bytes_read >= total);
}

TEST_CASE("export reads one tensor at a time when the batch budget is 0") {
  Step step;
  const std::string out = JoinPath(TempDir(), "hf");
  ExportOptions options;
  options.read_batch_bytes = 0;
  auto report = ExportStep(step.dir, out, options);
  REQUIRE_OK(report);
  CHECK(Entries(out) == std::vector<std::string>{"model.safetensors"});  // one shard: no index
  CHECK_FALSE(report->indexed);
  uint64_t largest = 0;
  const Exported e = ReadExport(out, {"model.safetensors"});
  for (const SlicedTensor& t : step.Of("param")) {
    INFO(t.name);
    CHECK(e.tensors.at(t.name).bytes == Expected(t));
    largest = std::max<uint64_t>(largest, Expected(t).size());
  }
  CHECK(report->peak_buffer_bytes == (largest + 4095) / 4096 * 4096);
}

TEST_CASE("--dtype bf16 rounds F32 and F16 tensors to nearest even and keeps integers") {
  SlicedModel model;
  model.hidden = 64;  // more elements: many ties and near-ties
  model.intermediate = 48;
  model.vocab = 37;
  Step step(model);
  const std::string out = JoinPath(TempDir(), "hf");
  ExportOptions options;
  options.dtype = DType::kBF16;
  REQUIRE_OK(ExportStep(step.dir, out, options));
  const Exported e = ReadExport(out, {"model.safetensors"});
  size_t ties = 0;
  for (const SlicedTensor& t : step.Of("param")) {
    INFO(t.name);
    const ReadTensor& got = e.tensors.at(t.name);
    const std::string want = Expected(t);
    CHECK(got.shape == t.global_shape);
    if (t.dtype == DType::kI64) {
      CHECK(got.dtype == DType::kI64);
      CHECK(got.bytes == want);
      continue;
    }
    REQUIRE(got.dtype == DType::kBF16);
    const size_t n = want.size() / format::DTypeSize(t.dtype);
    REQUIRE(got.bytes.size() == 2 * n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t f32 = 0;
      if (t.dtype == DType::kF32) {
        std::memcpy(&f32, want.data() + 4 * i, 4);
        ties += (f32 & 0xffff) == 0x8000;
      } else if (t.dtype == DType::kF16) {
        uint16_t h;
        std::memcpy(&h, want.data() + 2 * i, 2);
        f32 = format::Fp16ToFp32Bits(h);  // exact
      } else {
        uint16_t b;
        std::memcpy(&b, want.data() + 2 * i, 2);
        f32 = uint32_t{b} << 16;
      }
      uint16_t b;
      std::memcpy(&b, got.bytes.data() + 2 * i, 2);
      REQUIRE(b == ReferenceBf16(f32));
    }
  }
  CHECK(ties > 0);  // the data exercises ties-to-even
}

TEST_CASE("--what ema exports the EMA under the parameter names; optim its own kind") {
  Step step;
  const std::string ema_out = JoinPath(TempDir(), "ema");
  ExportOptions options;
  options.what = ExportWhat::kEma;
  auto report = ExportStep(step.dir, ema_out, options);
  REQUIRE_OK(report);
  CHECK(report->kind == "ema");
  const Exported ema = ReadExport(ema_out, {"model.safetensors"});
  const std::vector<SlicedTensor> ema_tensors = step.Of("ema");
  // Every EMA tensor, and the one parameter without an EMA (the I64
  // step_count) from the parameters: the model is complete.
  REQUIRE(ema.tensors.size() == ema_tensors.size() + 1);
  CHECK(report->params_without_ema == 1);
  for (const SlicedTensor& t : ema_tensors) {
    INFO(t.name);
    REQUIRE(ema.tensors.count(t.name) == 1);  // the parameter's name
    CHECK(ema.tensors.at(t.name).dtype == DType::kF32);
    CHECK(ema.tensors.at(t.name).bytes == Expected(t));
  }
  CHECK(ema.tensors.count("model.norm.weight") == 1);
  for (const SlicedTensor& t : step.Of("param")) {
    if (t.name != "model.step_count") continue;
    CHECK(ema.tensors.at(t.name).dtype == DType::kI64);
    CHECK(ema.tensors.at(t.name).bytes == Expected(t));
  }
  const auto& names = ema.names_by_file.at("model.safetensors");
  CHECK(std::is_sorted(names.begin(), names.end()));

  const std::string optim_out = JoinPath(TempDir(), "optim");
  options.what = ExportWhat::kOptim;
  REQUIRE_OK(ExportStep(step.dir, optim_out, options));
  const Exported optim = ReadExport(optim_out, {"model.safetensors"});
  for (const SlicedTensor& t : step.Of("optim")) {
    INFO(t.name);
    CHECK(optim.tensors.at(t.name).bytes == Expected(t));
  }

  SlicedModel no_ema;
  no_ema.ema = false;
  Step without(no_ema);
  options.what = ExportWhat::kEma;
  const std::string none = JoinPath(TempDir(), "none");
  auto refused = ExportStep(without.dir, none, options);
  REQUIRE_STATUS_CODE(refused, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "no ema tensors"));
}

TEST_CASE("corrupted piece bytes fail the export with a checksum error and no final file") {
  Step step;
  // A byte inside rank 2's [8, 3] piece of the column-split up_proj.
  const format::ManifestTensor piece = PieceOf(step.dir, "param", "model.layers.0.mlp.up_proj.weight", 6);
  FlipByte(JoinPath(step.dir, piece.file), static_cast<off_t>(piece.offset + piece.nbytes / 2));
  const std::string out = TempDir();  // exists, empty
  ExportOptions options;
  options.max_shard_bytes = 700;
  auto result = ExportStep(step.dir, out, options);
  REQUIRE_STATUS_CODE(result, absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(result.status().message(), "checksum"));
  CHECK(absl::StrContains(result.status().message(), "up_proj"));
  CHECK(Entries(out).empty());  // no final name, no temporary file either

  // A directory the export created is removed again.
  const std::string fresh = JoinPath(TempDir(), "fresh");
  REQUIRE_STATUS_CODE(ExportStep(step.dir, fresh, options), absl::StatusCode::kDataLoss);
  CHECK_FALSE(PathExists(fresh));
}

TEST_CASE("a damaged or hostile step is refused, naming the problem") {
  Step step;
  const std::string out = TempDir();
  ExportOptions options;

  SECTION("pieces that do not tile their tensor") {
    const std::string path = JoinPath(step.dir, format::kStepIndexFileName);
    auto text = ReadFileToString(path, 1 << 26);
    REQUIRE_OK(text);
    nlohmann::json index = nlohmann::json::parse(*text);
    bool changed = false;
    for (auto& p : index["tensors"]) {
      if (p["name"] == "model.layers.0.mlp.up_proj.weight" && p["box_offset"][1] == 6) {
        p["box_offset"][1] = 4;  // overlaps rank 1's piece; columns 7-8 uncovered
        changed = true;
      }
    }
    REQUIRE(changed);
    const std::string tampered = index.dump(2);
    REQUIRE_OK(WriteFileAtomic(path, tampered));
    // A bare edit is caught by the index checksum in COMMITTED ...
    auto caught = ExportStep(step.dir, out, options);
    REQUIRE_STATUS_CODE(caught, absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(caught.status().message(), "checksum"));
    // ... and a hostile step that updates COMMITTED too by the tiling check.
    auto record = ReadCommitRecord(step.dir);
    REQUIRE_OK(record);
    record->index_xxh3 = format::Xxh3(tampered.data(), tampered.size());
    REQUIRE_OK(WriteFileAtomic(JoinPath(step.dir, format::kCommittedFileName),
                               format::EncodeCommitRecord(*record)));
    auto result = ExportStep(step.dir, out, options);
    REQUIRE_STATUS_CODE(result, absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(result.status().message(), "do not tile"));
    CHECK(absl::StrContains(result.status().message(), "up_proj"));
  }
  SECTION("an index that is not JSON") {
    REQUIRE_OK(WriteFileAtomic(JoinPath(step.dir, format::kStepIndexFileName), "{\"tensors\": ["));
    auto result = ExportStep(step.dir, out, options);
    REQUIRE_FALSE(result.ok());
    CHECK(absl::StrContains(result.status().message(), format::kStepIndexFileName));
  }
  SECTION("a missing shard file") {
    REQUIRE(::unlink(JoinPath(step.dir, "model-r00001.safetensors").c_str()) == 0);
    auto result = ExportStep(step.dir, out, options);
    REQUIRE_FALSE(result.ok());
    CHECK(absl::StrContains(result.status().message(), "model-r00001.safetensors"));
  }
  SECTION("a shard file cut short") {
    const std::string path = JoinPath(step.dir, "model-r00003.safetensors");
    REQUIRE(::truncate(path.c_str(), 100) == 0);
    auto result = ExportStep(step.dir, out, options);
    REQUIRE_STATUS_CODE(result, absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(result.status().message(), "model-r00003.safetensors"));
  }
  SECTION("a directory that is not a committed step") {
    auto result = ExportStep(out, JoinPath(TempDir(), "x"), options);
    REQUIRE_FALSE(result.ok());
    CHECK(absl::StrContains(result.status().message(), "COMMITTED"));
  }
  CHECK(Entries(out).empty());
}

TEST_CASE("a non-empty output directory is refused without --force") {
  Step step;
  const std::string out = TempDir();
  REQUIRE_OK(WriteFileAtomic(JoinPath(out, "notes.txt"), "mine"));
  REQUIRE_OK(WriteFileAtomic(JoinPath(out, "model-00001-of-00009.safetensors"), "stale"));
  REQUIRE_OK(WriteFileAtomic(JoinPath(out, ".model.safetensors.123.zcc-partial"), "leftover"));
  ExportOptions options;
  auto refused = ExportStep(step.dir, out, options);
  REQUIRE_STATUS_CODE(refused, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "not empty"));
  CHECK(absl::StrContains(refused.status().message(), "--force"));
  CHECK(Entries(out).size() == 3);

  // --force: this export's files, the user's file kept, stale weights and
  // leftovers of an interrupted export gone.
  options.force = true;
  REQUIRE_OK(ExportStep(step.dir, out, options));
  CHECK(Entries(out) == std::vector<std::string>{"model.safetensors", "notes.txt"});
  auto notes = ReadFileToString(JoinPath(out, "notes.txt"), 100);
  REQUIRE_OK(notes);
  CHECK(*notes == "mine");

  // The output inside the step directory is refused.
  auto inside = ExportStep(step.dir, JoinPath(step.dir, "hf"), ExportOptions());
  REQUIRE_STATUS_CODE(inside, absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(PathExists(JoinPath(step.dir, "hf")));
}

TEST_CASE("extra files are copied; a name the export writes is refused") {
  Step step;
  const std::string src = TempDir();
  const std::string config = JoinPath(src, "config.json");
  REQUIRE_OK(WriteFileAtomic(config, "{\"model_type\": \"llama\"}\n"));
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const std::string tokenizer = JoinPath(src, "tokenizer.model");
  REQUIRE_OK(WriteFileAtomic(tokenizer, big));

  const std::string out = JoinPath(TempDir(), "hf");
  ExportOptions options;
  options.extra_files = {config, tokenizer};
  auto report = ExportStep(step.dir, out, options);
  REQUIRE_OK(report);
  CHECK(report->extra_files == std::vector<std::string>{"config.json", "tokenizer.model"});
  CHECK(Entries(out) ==
        std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.model"});
  CHECK(*ReadFileToString(JoinPath(out, "tokenizer.model"), 1 << 24) == big);
  CHECK(*ReadFileToString(JoinPath(out, "config.json"), 1 << 10) == "{\"model_type\": \"llama\"}\n");

  const std::string clash = JoinPath(src, "model.safetensors");
  REQUIRE_OK(WriteFileAtomic(clash, "x"));
  options.extra_files = {clash};
  const std::string out2 = JoinPath(TempDir(), "hf2");
  auto refused = ExportStep(step.dir, out2, options);
  REQUIRE_STATUS_CODE(refused, absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(), "model.safetensors"));
  CHECK_FALSE(PathExists(out2));

  options.extra_files = {config, config};
  REQUIRE_STATUS_CODE(ExportStep(step.dir, out2, options), absl::StatusCode::kInvalidArgument);
  options.extra_files = {JoinPath(src, "missing.json")};
  REQUIRE_STATUS_CODE(ExportStep(step.dir, out2, options), absl::StatusCode::kNotFound);
  options.extra_files = {src};
  REQUIRE_STATUS_CODE(ExportStep(step.dir, out2, options), absl::StatusCode::kInvalidArgument);
}

TEST_CASE("files stored with the job are exported next to the weights") {
  Step step;
  const std::string metadata = JoinPath(JoinPath(step.root, "job"), "metadata");
  REQUIRE_OK(MakeDirs(metadata));
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "config.json"), "{\"model_type\": \"job\"}"));
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "generation_config.json"), "{}"));
  REQUIRE(::symlink("/etc/passwd", JoinPath(metadata, "passwd").c_str()) == 0);  // not copied
  ExportOptions options;
  const std::string out = JoinPath(TempDir(), "hf");
  auto report = ExportStep(step.dir, out, options);
  REQUIRE_OK(report);
  CHECK(Entries(out) == std::vector<std::string>{"config.json", "generation_config.json",
                                                 "model.safetensors"});
  CHECK(*ReadFileToString(JoinPath(out, "config.json"), 1 << 10) == "{\"model_type\": \"job\"}");

  // A given file of a stored file's name is refused: it would replace it
  // silently; with --force it replaces it. --no-job-files copies none.
  const std::string given = JoinPath(TempDir(), "config.json");
  REQUIRE_OK(WriteFileAtomic(given, "{\"model_type\": \"given\"}"));
  options.extra_files = {given};
  const std::string out2 = JoinPath(TempDir(), "hf2");
  auto refused = ExportStep(step.dir, out2, options);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "--force"));
  CHECK_FALSE(PathExists(out2));
  options.force = true;
  REQUIRE_OK(ExportStep(step.dir, out2, options));
  options.force = false;
  CHECK(*ReadFileToString(JoinPath(out2, "config.json"), 1 << 10) == "{\"model_type\": \"given\"}");
  CHECK(PathExists(JoinPath(out2, "generation_config.json")));
  options.extra_files.clear();
  options.job_files = false;
  const std::string out3 = JoinPath(TempDir(), "hf3");
  REQUIRE_OK(ExportStep(step.dir, out3, options));
  CHECK(Entries(out3) == std::vector<std::string>{"model.safetensors"});
}

// The transpose of the row-major [rows, cols] tensor `bytes` of `size`-byte elements.
std::string Transposed(const std::string& bytes, int64_t rows, int64_t cols, size_t size) {
  std::string out(bytes.size(), '\0');
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(&out[(c * rows + r) * size], &bytes[(r * cols + c) * size], size);
    }
  }
  return out;
}

TEST_CASE("the job's export layout writes the 2-D tensors it names transposed") {
  Step step;
  const std::string metadata = JoinPath(JoinPath(step.root, "job"), "metadata");
  REQUIRE_OK(MakeDirs(metadata));
  // A column-split F32 tensor and a row-split BF16 one; a name the step
  // does not have is no error (another kind's export, another model).
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "zcc_export.json"),
                             R"({"transpose": ["model.layers.0.mlp.up_proj.weight",)"
                             R"( "model.embed_tokens.weight", "lm_head.weight"]})"));
  std::map<std::string, SlicedTensor> params;
  for (const SlicedTensor& t : step.Of("param")) params[t.name] = t;
  for (bool convert : {false, true}) {
    INFO(convert);
    ExportOptions options;
    options.read_batch_bytes = 0;  // one tensor at a time
    if (convert) options.dtype = DType::kF32;
    const std::string out = JoinPath(TempDir(), convert ? "f32" : "kept");
    auto report = ExportStep(step.dir, out, options);
    REQUIRE_OK(report);
    CHECK(report->transposed == 2);
    // The layout is read, not copied.
    CHECK(Entries(out) == std::vector<std::string>{"model.safetensors"});
    const Exported e = ReadExport(out, {"model.safetensors"});
    for (const auto& [name, t] : params) {
      INFO(name);
      const ReadTensor& got = e.tensors.at(name);
      std::string want = Expected(t);
      std::vector<int64_t> shape = t.global_shape;
      if (name == "model.layers.0.mlp.up_proj.weight" || name == "model.embed_tokens.weight") {
        want = Transposed(want, shape[0], shape[1], format::DTypeSize(t.dtype));
        std::swap(shape[0], shape[1]);
      }
      CHECK(got.shape == shape);
      if (convert && (t.dtype == DType::kBF16 || t.dtype == DType::kF16)) {
        std::string f32(want.size() * 2, '\0');
        format::ConvertFloats(t.dtype, DType::kF32,
                              reinterpret_cast<const uint8_t*>(want.data()),
                              reinterpret_cast<uint8_t*>(f32.data()), want.size() / 2);
        want = f32;
      }
      CHECK(got.bytes == want);
    }
  }
  // --no-job-files: as the trainer held them.
  ExportOptions plain;
  plain.job_files = false;
  const std::string out = JoinPath(TempDir(), "plain");
  auto report = ExportStep(step.dir, out, plain);
  REQUIRE_OK(report);
  CHECK(report->transposed == 0);
  const Exported e = ReadExport(out, {"model.safetensors"});
  CHECK(e.tensors.at("model.embed_tokens.weight").bytes == Expected(params["model.embed_tokens.weight"]));

  // A tensor that is not 2-D, or a layout that is not one: refused, nothing written.
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "zcc_export.json"),
                             R"({"transpose": ["model.norm.weight"]})"));
  auto refused = ExportStep(step.dir, JoinPath(TempDir(), "norm"), ExportOptions{});
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "model.norm.weight"));
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "zcc_export.json"), R"({"transpose": 3})"));
  const std::string bad_out = JoinPath(TempDir(), "bad");
  auto bad = ExportStep(step.dir, bad_out, ExportOptions{});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.status().message(), "zcc_export.json"));
  CHECK_FALSE(PathExists(bad_out));
}

TEST_CASE("--dtype sets the exported config.json's torch_dtype (and dtype)") {
  Step step;
  const std::string metadata = JoinPath(JoinPath(step.root, "job"), "metadata");
  REQUIRE_OK(MakeDirs(metadata));
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "config.json"),
                             "{\"model_type\": \"llama\", \"torch_dtype\": \"float32\", "
                             "\"dtype\": \"float32\", \"hidden_size\": 8}"));
  ExportOptions options;
  options.dtype = DType::kBF16;
  const std::string out = JoinPath(TempDir(), "bf16");
  REQUIRE_OK(ExportStep(step.dir, out, options));
  auto config = nlohmann::json::parse(*ReadFileToString(JoinPath(out, "config.json"), 1 << 10));
  CHECK(config["torch_dtype"] == "bfloat16");
  CHECK(config["dtype"] == "bfloat16");
  CHECK(config["hidden_size"] == 8);
  CHECK(config["model_type"] == "llama");
  // Without --dtype the file is copied byte for byte.
  options.dtype.reset();
  const std::string kept = JoinPath(TempDir(), "kept");
  REQUIRE_OK(ExportStep(step.dir, kept, options));
  CHECK(*ReadFileToString(JoinPath(kept, "config.json"), 1 << 10) ==
        *ReadFileToString(JoinPath(metadata, "config.json"), 1 << 10));
  // A config that is not JSON cannot be given a dtype: a clear error.
  REQUIRE_OK(WriteFileAtomic(JoinPath(metadata, "config.json"), "not json"));
  options.dtype = DType::kF16;
  auto bad = ExportStep(step.dir, JoinPath(TempDir(), "bad"), options);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a step is named by its directory, its job directory or the job's latest") {
  Step step;
  const std::string job_dir = JoinPath(step.root, "job");
  auto direct = ResolveStepDir(step.dir);
  REQUIRE_OK(direct);
  CHECK(direct->dir == step.dir);
  CHECK(direct->how.empty());
  auto by_job = ResolveStepDir(job_dir + "/");
  REQUIRE_OK(by_job);
  CHECK(by_job->dir == step.dir);
  CHECK(by_job->step == 7);
  CHECK(absl::StrContains(by_job->how, "latest"));
  auto by_latest = ResolveStepDir(JoinPath(job_dir, "latest"));
  REQUIRE_OK(by_latest);
  CHECK(by_latest->dir == step.dir);
  // Without latest: the newest committed step.
  REQUIRE(::unlink(JoinPath(job_dir, "latest").c_str()) == 0);
  auto newest = ResolveStepDir(job_dir);
  REQUIRE_OK(newest);
  CHECK(newest->dir == step.dir);
  CHECK(absl::StrContains(newest->how, "newest committed"));
  // A latest that names a step not committed here (a run went back to a step
  // another tier holds): the steps above it are the run left behind's.
  REQUIRE_OK(WriteFileAtomic(JoinPath(job_dir, "latest"), "step-00000005\n"));
  auto behind = ResolveStepDir(job_dir);
  CHECK(behind.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(behind.status().message(), "at or below the step its latest names"));
  REQUIRE(::unlink(JoinPath(job_dir, "latest").c_str()) == 0);
  // A step never committed, nothing committed, nothing there.
  REQUIRE_OK(MakeDirs(JoinPath(job_dir, "step-00000009")));
  CHECK(ResolveStepDir(JoinPath(job_dir, "step-00000009")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  const std::string empty_job = JoinPath(TempDir(), "empty-job");
  REQUIRE_OK(MakeDirs(empty_job));
  CHECK(ResolveStepDir(empty_job).status().code() == absl::StatusCode::kNotFound);
  CHECK(ResolveStepDir(JoinPath(empty_job, "nope")).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("a full disk while writing leaves no file under a final name") {
  Step step;
  const std::string out = TempDir();
  storage::FaultPlan plan;
  plan.path_filter = out;
  plan.enospc_after_bytes = 1500;
  storage::FaultInjectingStorage faulty(storage::DefaultStorage(), plan);
  ExportOptions options;
  options.max_shard_bytes = 700;
  options.io.storage = &faulty;
  auto result = ExportStep(step.dir, out, options);
  REQUIRE_STATUS_CODE(result, absl::StatusCode::kResourceExhausted);
  CHECK(faulty.faults_injected() > 0);
  CHECK(Entries(out).empty());
}

TEST_CASE("shard boundaries, file names and option parsing") {
  CHECK(ShardStarts({}, 10).empty());
  CHECK(ShardStarts({4, 4, 4}, 10) == std::vector<size_t>{0, 2});
  CHECK(ShardStarts({4, 6, 1}, 10) == std::vector<size_t>{0, 2});
  // A tensor larger than the limit has a shard of its own.
  CHECK(ShardStarts({3, 25, 3, 3}, 10) == std::vector<size_t>{0, 1, 2});
  CHECK(ShardStarts({25}, 10) == std::vector<size_t>{0});
  CHECK(ShardStarts({0, 0, 10, 0, 1}, 10) == std::vector<size_t>{0, 4});
  CHECK(ExportShardFileName(1, 1) == "model.safetensors");
  CHECK(ExportShardFileName(2, 3) == "model-00002-of-00003.safetensors");
  CHECK(ExportShardFileName(12, 123456) == "model-00012-of-123456.safetensors");

  CHECK(*ParseByteSize("5GB") == 5'000'000'000);
  CHECK(*ParseByteSize("500MB") == 500'000'000);
  CHECK(*ParseByteSize("1GiB") == uint64_t{1} << 30);
  CHECK(*ParseByteSize("3kib") == 3072);
  CHECK(*ParseByteSize("2TB") == 2'000'000'000'000);
  CHECK(*ParseByteSize("4096") == 4096);
  CHECK(*ParseByteSize("10B") == 10);
  CHECK(absl::StrContains(ParseByteSize("1.5GB").status().message(), "fractions"));
  for (const char* bad : {"", "GB", "5.5GB", "-5GB", "5 GB", "5XB", "0", "0GB", "5Gb", "5mb", "5b",
                          "99999999999999999999", "9000000000TB", "5GBs"}) {
    INFO(bad);
    auto parsed = ParseByteSize(bad);
    REQUIRE_STATUS_CODE(parsed, absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(parsed.status().message(), "e.g. 5GB"));
  }
  CHECK(*ParseExportWhat("ema") == ExportWhat::kEma);
  REQUIRE_STATUS_CODE(ParseExportWhat("extra"), absl::StatusCode::kInvalidArgument);
  CHECK(ParseExportDType("keep")->has_value() == false);
  CHECK(**ParseExportDType("BF16") == DType::kBF16);
  CHECK(**ParseExportDType("f16") == DType::kF16);
  CHECK(**ParseExportDType("float32") == DType::kF32);
  REQUIRE_STATUS_CODE(ParseExportDType("f64"), absl::StatusCode::kInvalidArgument);

  ExportOptions zero;
  zero.max_shard_bytes = 0;
  REQUIRE_STATUS_CODE(ExportStep("/nonexistent", "/nonexistent2", zero),
                      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc::checkpoint
