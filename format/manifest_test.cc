#include "format/manifest.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "format/dtype.h"

namespace zcc::format {
namespace {

using nlohmann::json;

RankManifest SampleManifest() {
  RankManifest m;
  m.job_id = "llama-70b_run.3";
  m.step = 1000;
  m.rank = 3;
  m.world_size = 8;
  m.manifest_hash = 0xfedcba9876543210ull;
  m.files = {{ShardFileName("model", 3), 4096 + 96 + 64},
             {ShardFileName("optim", 3), 4096 + 128},
             {ExtraFileName(3), 4096 + 5}};
  ManifestTensor w;
  w.name = "model.layers.0/self_attn.q_proj.weight";
  w.dtype = DType::kBF16;
  w.shape = {4, 12};
  w.kind = "param";
  w.file = m.files[0].name;
  w.offset = 4096;
  w.nbytes = 96;
  w.xxh3 = 0x0123456789abcdefull;
  ManifestTensor b = w;
  b.name = "model.layers.0/self_attn.q_proj.bias";
  b.dtype = DType::kF32;
  b.shape = {16};
  b.offset = 4096 + 96;
  b.nbytes = 64;
  b.xxh3 = 1;
  ManifestTensor avg = w;  // same name, other kind: allowed
  avg.dtype = DType::kF32;
  avg.shape = {2, 16};
  avg.kind = "optim";
  avg.file = m.files[1].name;
  avg.offset = 4096;
  avg.nbytes = 128;
  avg.xxh3 = UINT64_MAX;
  ManifestTensor rng;
  rng.name = "rng.state";
  rng.dtype = DType::kU8;
  rng.shape = {5};
  rng.kind = "extra";
  rng.file = m.files[2].name;
  rng.offset = 4096;
  rng.nbytes = 5;
  rng.xxh3 = 0;
  ManifestTensor scalar = rng;
  scalar.name = "ema.step";
  scalar.dtype = DType::kI64;
  scalar.shape = {};
  scalar.kind = "ema";
  scalar.file = m.files[1].name;
  scalar.offset = 4096 + 120;
  scalar.nbytes = 8;
  m.tensors = {w, b, avg, rng, scalar};
  return m;
}

void CheckSame(const RankManifest& got, const RankManifest& want) {
  CHECK(got.format_version == want.format_version);
  CHECK(got.job_id == want.job_id);
  CHECK(got.step == want.step);
  CHECK(got.rank == want.rank);
  CHECK(got.world_size == want.world_size);
  CHECK(got.manifest_hash == want.manifest_hash);
  REQUIRE(got.files.size() == want.files.size());
  for (size_t i = 0; i < want.files.size(); ++i) {
    CHECK(got.files[i].name == want.files[i].name);
    CHECK(got.files[i].bytes == want.files[i].bytes);
  }
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    INFO("tensor " << want.tensors[i].name);
    CHECK(got.tensors[i].name == want.tensors[i].name);
    CHECK(got.tensors[i].dtype == want.tensors[i].dtype);
    CHECK(got.tensors[i].shape == want.tensors[i].shape);
    CHECK(got.tensors[i].kind == want.tensors[i].kind);
    CHECK(got.tensors[i].file == want.tensors[i].file);
    CHECK(got.tensors[i].offset == want.tensors[i].offset);
    CHECK(got.tensors[i].nbytes == want.tensors[i].nbytes);
    CHECK(got.tensors[i].xxh3 == want.tensors[i].xxh3);
  }
}

TEST_CASE("a rank manifest round-trips through JSON") {
  const RankManifest m = SampleManifest();
  const std::string text = EncodeRankManifest(m);
  auto decoded = DecodeRankManifest(text);
  REQUIRE_OK(decoded);
  CheckSame(*decoded, m);
  // Hashes are 16-digit lowercase hex strings; the rest plain JSON values.
  const json j = json::parse(text);
  CHECK(j["format_version"] == 1);
  CHECK(j["manifest_hash"] == "fedcba9876543210");
  CHECK(j["tensors"][0]["xxh3"] == "0123456789abcdef");
  CHECK(j["tensors"][0]["dtype"] == "BF16");
  CHECK(j["tensors"][0]["shape"] == json::array({4, 12}));
  CHECK(j["tensors"][3]["xxh3"] == "0000000000000000");
  CHECK(j["tensors"][4]["shape"] == json::array());
  CHECK(j["files"][0]["name"] == "model-r00003.safetensors");
  CHECK(absl::StrContains(text, "\n \"job_id\": \"llama-70b_run.3\""));  // dump(1)
}

TEST_CASE("a manifest names its run when the trainer gave one, and not otherwise") {
  RankManifest m = SampleManifest();
  CHECK_FALSE(json::parse(EncodeRankManifest(m)).contains("run_id"));
  m.run_id = "3f2a9c1e";
  const std::string text = EncodeRankManifest(m);
  CHECK(json::parse(text)["run_id"] == "3f2a9c1e");
  auto decoded = DecodeRankManifest(text);
  REQUIRE_OK(decoded);
  CHECK(decoded->run_id == "3f2a9c1e");
  CHECK(decoded->timeline.empty());
  CHECK_FALSE(json::parse(text).contains("timeline"));
}

TEST_CASE("a manifest names its timeline once its run went on from an older step") {
  RankManifest m = SampleManifest();
  m.run_id = "3f2a9c1e";
  m.timeline = "b71c0d9e42a35f10";
  const std::string text = EncodeRankManifest(m);
  CHECK(json::parse(text)["timeline"] == "b71c0d9e42a35f10");
  auto decoded = DecodeRankManifest(text);
  REQUIRE_OK(decoded);
  CHECK(decoded->timeline == "b71c0d9e42a35f10");
  CHECK(decoded->run_id == "3f2a9c1e");
  // A step index carries it (every rank's), not the run id.
  StepIndex index;
  index.job_id = m.job_id;
  index.step = m.step;
  index.world_size = m.world_size;
  index.timeline = m.timeline;
  const std::string index_text = EncodeStepIndex(index);
  CHECK_FALSE(json::parse(index_text).contains("run_id"));
  auto index_back = DecodeStepIndex(index_text);
  REQUIRE_OK(index_back);
  CHECK(index_back->timeline == "b71c0d9e42a35f10");
  index.timeline.clear();
  CHECK_FALSE(json::parse(EncodeStepIndex(index)).contains("timeline"));
}

TEST_CASE("a manifest and a step index say the EMA's step where it is not the step's") {
  RankManifest m = SampleManifest();
  CHECK_FALSE(json::parse(EncodeRankManifest(m)).contains("ema_step"));
  CHECK(DecodeRankManifest(EncodeRankManifest(m))->ema_step == -1);
  m.ema_step = m.step - 2;
  auto decoded = DecodeRankManifest(EncodeRankManifest(m));
  REQUIRE_OK(decoded);
  CHECK(decoded->ema_step == m.step - 2);
  // Never after the step.
  m.ema_step = m.step + 1;
  auto after = DecodeRankManifest(EncodeRankManifest(m));
  CHECK(after.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(after.status().message(), "ema_step"));
  StepIndex index;
  index.job_id = m.job_id;
  index.step = 30;
  index.world_size = 2;
  index.ema_step = 25;
  auto read = DecodeStepIndex(EncodeStepIndex(index));
  REQUIRE_OK(read);
  CHECK(read->ema_step == 25);
  index.ema_step = -1;
  CHECK(DecodeStepIndex(EncodeStepIndex(index))->ema_step == -1);
}

TEST_CASE("a manifest without tensors round-trips") {
  RankManifest m;
  m.job_id = "j";
  auto decoded = DecodeRankManifest(EncodeRankManifest(m));
  REQUIRE_OK(decoded);
  CheckSame(*decoded, m);
}

// Applies `edit` to the JSON of the sample manifest and decodes the result.
template <typename Edit>
absl::StatusOr<RankManifest> DecodeEdited(Edit edit) {
  json j = json::parse(EncodeRankManifest(SampleManifest()));
  edit(j);
  return DecodeRankManifest(j.dump());
}

struct BadManifest {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;  // must appear in the error
};

TEST_CASE("invalid manifests are refused with a message naming the field") {
  const std::vector<BadManifest> cases = {
      {"format version", [](json& j) { j["format_version"] = 3; }, "format_version"},
      {"format version string", [](json& j) { j["format_version"] = "1"; }, "format_version"},
      {"missing job id", [](json& j) { j.erase("job_id"); }, "\"job_id\" is missing"},
      {"bad job id", [](json& j) { j["job_id"] = "../etc"; }, "job_id"},
      {"negative step", [](json& j) { j["step"] = -1; }, "\"step\" must be a non-negative"},
      {"fractional step", [](json& j) { j["step"] = 1.5; }, "\"step\""},
      {"huge step", [](json& j) { j["step"] = UINT64_MAX; }, "\"step\" is"},
      {"rank >= world", [](json& j) { j["rank"] = 8; }, "\"rank\" is 8 but world_size is 8"},
      {"world size 0", [](json& j) { j["world_size"] = 0; }, "world_size"},
      {"world size > u32", [](json& j) { j["world_size"] = uint64_t{1} << 32; }, "world_size"},
      {"hash as number", [](json& j) { j["manifest_hash"] = 5; }, "manifest_hash"},
      {"hash too short", [](json& j) { j["manifest_hash"] = "abc"; }, "manifest_hash"},
      {"hash uppercase", [](json& j) { j["manifest_hash"] = "FEDCBA9876543210"; }, "manifest_hash"},
      {"hash not hex", [](json& j) { j["manifest_hash"] = "fedcba987654321g"; }, "manifest_hash"},
      {"empty run id", [](json& j) { j["run_id"] = ""; }, "\"run_id\" must be 1 to 128 printable"},
      {"run id too long", [](json& j) { j["run_id"] = std::string(129, 'r'); }, "run_id"},
      {"run id with a control character", [](json& j) { j["run_id"] = "a\x1b[2Jb"; }, "run_id"},
      {"run id with a space", [](json& j) { j["run_id"] = "a b"; }, "run_id"},
      {"run id not a string", [](json& j) { j["run_id"] = 7; }, "run_id"},
      {"empty timeline", [](json& j) { j["timeline"] = ""; },
       "\"timeline\" must be 1 to 128 printable"},
      {"timeline too long", [](json& j) { j["timeline"] = std::string(129, 't'); }, "timeline"},
      {"timeline with a quote", [](json& j) { j["timeline"] = "a\"b"; }, "timeline"},
      {"timeline not a string", [](json& j) { j["timeline"] = 7; }, "timeline"},
      {"files not an array", [](json& j) { j["files"] = json::object(); }, "\"files\""},
      {"file entry not an object", [](json& j) { j["files"][0] = "x"; }, "files[0]"},
      {"file with slash", [](json& j) { j["files"][0]["name"] = "../x.safetensors"; }, "files[0]"},
      {"file dot", [](json& j) { j["files"][0]["name"] = "."; }, "files[0]"},
      {"file dotdot", [](json& j) { j["files"][0]["name"] = ".."; }, "files[0]"},
      {"file empty", [](json& j) { j["files"][0]["name"] = ""; }, "files[0]"},
      {"file control char", [](json& j) { j["files"][0]["name"] = "a\nb"; }, "files[0]"},
      {"file name too long", [](json& j) { j["files"][0]["name"] = std::string(256, 'f'); },
       "files[0]"},
      {"file listed twice", [](json& j) { j["files"][1]["name"] = j["files"][0]["name"]; },
       "listed twice"},
      {"file bytes negative", [](json& j) { j["files"][0]["bytes"] = -1; }, "\"bytes\""},
      {"tensor entry not an object", [](json& j) { j["tensors"][1] = 3; }, "tensors[1]"},
      {"tensor name missing", [](json& j) { j["tensors"][1].erase("name"); },
       "tensors[1]: \"name\" is missing"},
      {"tensor name invalid", [](json& j) { j["tensors"][1]["name"] = "a\tb"; }, "tensors[1]"},
      {"unknown dtype", [](json& j) { j["tensors"][1]["dtype"] = "F8"; }, "unknown dtype"},
      {"negative dim", [](json& j) { j["tensors"][1]["shape"] = {-16}; }, "negative"},
      {"shape not an array", [](json& j) { j["tensors"][1]["shape"] = 16; }, "\"shape\""},
      {"nbytes mismatch", [](json& j) { j["tensors"][1]["nbytes"] = 60; },
       "\"nbytes\" is 60 but F32 x [16] is 64 bytes"},
      {"unknown kind", [](json& j) { j["tensors"][1]["kind"] = "grad"; }, "\"kind\""},
      {"unlisted file", [](json& j) { j["tensors"][1]["file"] = "other.safetensors"; },
       "not in the manifest"},
      {"past the file end", [](json& j) { j["tensors"][1]["offset"] = 4096 + 96 + 1; },
       "lies outside"},
      {"offset overflow", [](json& j) { j["tensors"][1]["offset"] = UINT64_MAX - 10; },
       "lies outside"},
      {"xxh3 missing", [](json& j) { j["tensors"][1].erase("xxh3"); }, "\"xxh3\" is missing"},
      {"xxh3 as number", [](json& j) { j["tensors"][1]["xxh3"] = 1; }, "\"xxh3\""},
      {"duplicate kind+name", [](json& j) { j["tensors"][1]["name"] = j["tensors"][0]["name"]; },
       "listed twice"},
      {"root not an object", [](json& j) { j = json::array(); }, "must be a JSON object"},
      {"too deep", [](json& j) { j["tensors"][1]["shape"] = {{16}}; }, "deeper"},
  };
  for (const BadManifest& c : cases) {
    INFO(c.what);
    auto m = DecodeEdited(c.edit);
    REQUIRE_STATUS_CODE(m, absl::StatusCode::kDataLoss);
    INFO("message: " << m.status().message());
    CHECK(absl::StrContains(m.status().message(), c.message));
  }
  // Errors about a tensor quote its name.
  auto m = DecodeEdited([](json& j) { j["tensors"][1]["kind"] = "grad"; });
  CHECK(absl::StrContains(m.status().message(), "model.layers.0/self_attn.q_proj.bias"));
}

TEST_CASE("encoding does not throw on names that are not UTF-8") {
  // Registration should have refused such a name; the encoder returns a plain
  // string, so it substitutes U+FFFD instead of throwing.
  RankManifest m = SampleManifest();
  m.tensors[0].name = "bad\xff";
  auto decoded = DecodeRankManifest(EncodeRankManifest(m));
  REQUIRE_OK(decoded);
  CHECK(decoded->tensors[0].name == "bad\xef\xbf\xbd");
}

TEST_CASE("manifest bytes that are not JSON are refused") {
  const std::string good = EncodeRankManifest(SampleManifest());
  REQUIRE_STATUS_CODE(DecodeRankManifest(""), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeRankManifest(good.substr(0, good.size() / 2)), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeRankManifest(good + "}"), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeRankManifest("{\"job_id\": \"a\xff\"}"), absl::StatusCode::kDataLoss);
  // A key written twice would otherwise silently keep the last value.
  std::string twice = good;
  twice.insert(1, "\"step\": 5,");
  REQUIRE_STATUS_CODE(DecodeRankManifest(twice), absl::StatusCode::kDataLoss);
}

TEST_CASE("commit records round-trip and are validated") {
  CommitRecord r;
  r.job_id = "job-1";
  r.step = 123456789;
  r.world_size = 64;
  r.manifest_hash = 0xabcull;
  r.total_bytes = uint64_t{1} << 41;
  r.committed_at = "2024-05-01T12:34:56.789Z";
  const std::string text = EncodeCommitRecord(r);
  const json j = json::parse(text);
  CHECK(j["manifest_hash"] == "0000000000000abc");
  CHECK(j["total_bytes"] == uint64_t{1} << 41);
  CHECK(j["committed_at"] == "2024-05-01T12:34:56.789Z");
  auto decoded = DecodeCommitRecord(text);
  REQUIRE_OK(decoded);
  CHECK(decoded->format_version == kFormatVersion);
  CHECK(decoded->job_id == r.job_id);
  CHECK(decoded->step == r.step);
  CHECK(decoded->world_size == r.world_size);
  CHECK(decoded->manifest_hash == r.manifest_hash);
  CHECK(decoded->total_bytes == r.total_bytes);
  CHECK(decoded->committed_at == r.committed_at);
  // No run or timeline: neither field is written (older readers see the
  // record they know); with them, both round-trip.
  CHECK_FALSE(j.contains("run_id"));
  CHECK_FALSE(j.contains("timeline"));
  CHECK(decoded->run_id.empty());
  CHECK(decoded->timeline.empty());
  {
    CommitRecord named = r;
    named.run_id = "run-7";
    named.timeline = "0123456789abcdef";
    auto back = DecodeCommitRecord(EncodeCommitRecord(named));
    REQUIRE_OK(back);
    CHECK(back->run_id == "run-7");
    CHECK(back->timeline == "0123456789abcdef");
  }

  const auto edited = [&](auto edit) {
    json e = j;
    edit(e);
    return DecodeCommitRecord(e.dump());
  };
  REQUIRE_OK(edited([](json& e) { e["committed_at"] = "2024-05-01T12:34:56+00:00"; }));
  REQUIRE_STATUS_CODE(edited([](json& e) { e["format_version"] = 0; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["job_id"] = ""; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["step"] = -5; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["world_size"] = 0; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["manifest_hash"] = "xyz"; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["total_bytes"] = "1"; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e.erase("committed_at"); }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["committed_at"] = "yesterday"; }),
               absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeCommitRecord("[]"), absl::StatusCode::kDataLoss);
  for (const char* field : {"run_id", "timeline"}) {
    INFO(field);
    REQUIRE_STATUS_CODE(edited([&](json& e) { e[field] = ""; }), absl::StatusCode::kDataLoss);
    REQUIRE_STATUS_CODE(edited([&](json& e) { e[field] = std::string(129, 'x'); }),
                        absl::StatusCode::kDataLoss);
    REQUIRE_STATUS_CODE(edited([&](json& e) { e[field] = "a\nb"; }), absl::StatusCode::kDataLoss);
    REQUIRE_STATUS_CODE(edited([&](json& e) { e[field] = 3; }), absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("the weight map index has the transformers layout") {
  const std::map<std::string, std::string> map = {
      {"model.embed_tokens.weight", "model-r00000.safetensors"},
      {"model.layers.0/mlp.up_proj.weight", "model-r00001.safetensors"}};
  const std::string text = EncodeWeightMapIndex(map, 12345);
  const json j = json::parse(text);
  CHECK(j == json{{"metadata", {{"total_size", 12345}}},
                  {"weight_map",
                   {{"model.embed_tokens.weight", "model-r00000.safetensors"},
                    {"model.layers.0/mlp.up_proj.weight", "model-r00001.safetensors"}}}});
  auto decoded = DecodeWeightMapIndex(text);
  REQUIRE_OK(decoded);
  CHECK(*decoded == map);

  const auto edited = [&](auto edit) {
    json e = j;
    edit(e);
    return DecodeWeightMapIndex(e.dump());
  };
  // Only weight_map is needed; extra metadata from other writers is fine.
  REQUIRE_OK(edited([](json& e) { e.erase("metadata"); }));
  REQUIRE_OK(edited([](json& e) { e["metadata"]["total_parameters"] = 7; }));
  REQUIRE_STATUS_CODE(edited([](json& e) { e.erase("weight_map"); }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"] = json::array(); }),
               absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["metadata"]["total_size"] = -1; }),
               absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["metadata"] = 3; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"]["x"] = 1; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"]["x"] = "../model.safetensors"; }),
               absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"]["x"] = ".."; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"]["a\"b"] = "f"; }), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(edited([](json& e) { e["weight_map"][""] = "f"; }), absl::StatusCode::kDataLoss);
}

TEST_CASE("step directory and file names") {
  CHECK(StepDirName(0) == "step-00000000");
  CHECK(StepDirName(1000) == "step-00001000");
  CHECK(StepDirName(123456789) == "step-123456789");
  CHECK(PartialStepDirName(1000) == "step-00001000.partial");
  CHECK(ShardFileName("model", 3) == "model-r00003.safetensors");
  CHECK(ShardFileName("optim", 0) == "optim-r00000.safetensors");
  CHECK(ShardFileName("ema", 123456) == "ema-r123456.safetensors");
  CHECK(ExtraFileName(3) == "extra-r00003.bin");
  CHECK(ManifestFileName(3) == "r00003.manifest.json");
  CHECK(ManifestFileName(100000) == "r100000.manifest.json");

  for (int64_t step : {int64_t{0}, int64_t{1000}, int64_t{123456789}, INT64_MAX}) {
    auto parsed = ParseStepDirName(StepDirName(step));
    REQUIRE_OK(parsed);
    CHECK(*parsed == step);
  }
  for (const char* bad :
       {"step-00001000.partial", "step-1000", "step-", "step-0000100a", "step--0001000",
        "step-+0001000", "step- 0001000", "step-00001000 ", "Step-00001000", "step00001000",
        "xstep-00001000", "step-99999999999999999999", "step-000001000", "", "latest"}) {
    INFO(bad);
    REQUIRE_STATUS_CODE(ParseStepDirName(bad), absl::StatusCode::kInvalidArgument);
  }
  REQUIRE_STATUS_CODE(ParseStepDirName(std::string("step-0000\0"
                                            "1000",
                                            13)),
               absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc::format

namespace zcc::format {
namespace {

using nlohmann::ordered_json;

// The manifest as one nlohmann document, the way EncodeRankManifest built it
// before it wrote tensors entry by entry: the bytes on disk must not change.
std::string DocumentDump(const RankManifest& m) {
  ordered_json root = ordered_json::object();
  root["format_version"] = m.format_version;
  root["job_id"] = m.job_id;
  root["step"] = m.step;
  root["rank"] = m.rank;
  root["world_size"] = m.world_size;
  root["manifest_hash"] = absl::StrFormat("%016x", m.manifest_hash);
  root["files"] = ordered_json::array();
  for (const ManifestFile& f : m.files) root["files"].push_back({{"name", f.name}, {"bytes", f.bytes}});
  root["tensors"] = ordered_json::array();
  for (const ManifestTensor& t : m.tensors) {
    ordered_json e = ordered_json::object();
    e["name"] = t.name;
    e["dtype"] = std::string(DTypeName(t.dtype));
    e["shape"] = t.shape;
    e["kind"] = t.kind;
    e["file"] = t.file;
    e["offset"] = t.offset;
    e["nbytes"] = t.nbytes;
    e["xxh3"] = absl::StrFormat("%016x", t.xxh3);
    root["tensors"].push_back(std::move(e));
  }
  return root.dump(1, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

TEST_CASE("EncodeRankManifest writes the bytes of the whole-document dump") {
  RankManifest m = SampleManifest();
  CHECK(EncodeRankManifest(m) == DocumentDump(m));
  m.tensors.resize(1);
  CHECK(EncodeRankManifest(m) == DocumentDump(m));
  m.tensors.clear();
  CHECK(EncodeRankManifest(m) == DocumentDump(m));
  m.files.clear();
  CHECK(EncodeRankManifest(m) == DocumentDump(m));
}

// A manifest of `n` one-element tensors, as a rank with many tiny tensors writes it.
RankManifest ManyTensors(int n) {
  RankManifest m;
  m.job_id = "many";
  m.step = 7;
  m.files = {{ShardFileName("model", 0), 4096 + 4 * uint64_t(n)}};
  m.tensors.reserve(n);
  for (int i = 0; i < n; ++i) {
    ManifestTensor t;
    t.name = absl::StrCat("layers.", i / 100, ".w", i % 100);
    t.dtype = DType::kF32;
    t.shape = {1};
    t.kind = "param";
    t.file = m.files[0].name;
    t.offset = 4096 + 4 * uint64_t(i);
    t.nbytes = 4;
    t.xxh3 = uint64_t(i) * 0x9e3779b97f4a7c15ull;
    m.tensors.push_back(std::move(t));
  }
  return m;
}

TEST_CASE("manifests and weight maps of 200k tensors round-trip") {
  // Sizes at which the quadratic encoders and parser this replaced took
  // minutes; checked by content, not by time.
  constexpr int kTensors = 200'000;
  const RankManifest m = ManyTensors(kTensors);
  const std::string text = EncodeRankManifest(m);
  auto decoded = DecodeRankManifest(text);
  REQUIRE_OK(decoded);
  REQUIRE(decoded->tensors.size() == kTensors);
  CHECK(decoded->tensors[123'456].name == "layers.1234.w56");
  CHECK(decoded->tensors[123'456].xxh3 == m.tensors[123'456].xxh3);
  CHECK(decoded->tensors.back().offset == 4096 + 4 * uint64_t(kTensors - 1));

  std::map<std::string, std::string> weight_map;
  for (const ManifestTensor& t : m.tensors) weight_map.emplace(t.name, t.file);
  const std::string index = EncodeWeightMapIndex(weight_map, 12345);
  auto map = DecodeWeightMapIndex(index);
  REQUIRE_OK(map);
  CHECK(*map == weight_map);
  // Sorted by name, after the metadata, as transformers writes it.
  CHECK(index.find("\"metadata\"") < index.find("\"weight_map\""));
  CHECK(index.find("\"layers.0.w0\"") < index.find("\"layers.0.w1\""));
  CHECK(index.find("\"layers.0.w10\"") < index.find("\"layers.0.w2\""));

}

TEST_CASE("the fast entry writer writes exactly what nlohmann writes") {
  ManifestTensor t;
  t.name = "model.layers.17.self_attn.q_proj.weight";
  t.dtype = DType::kBF16;
  t.kind = "param";
  t.file = "model-r00003.safetensors";
  t.offset = 123456789012;
  t.nbytes = 0;
  t.xxh3 = 0x0123456789abcdefULL;
  std::string fast, slow;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {0}, {7}, {4096, 4096}, {2, 3, 5, 7}}) {
    t.shape = shape;
    t.global_shape.clear();
    t.box_offset.clear();
    INFO(fast << "\n---\n" << slow);
    CHECK(internal::ManifestEntryEncodersAgree(t, &fast, &slow));
    if (!shape.empty()) {  // a sliced piece: the box is written too
      t.global_shape = shape;
      t.global_shape[0] += 9;
      t.box_offset.assign(shape.size(), 0);
      t.box_offset[0] = 9;
      CHECK(internal::ManifestEntryEncodersAgree(t, &fast, &slow));
      CHECK(absl::StrContains(fast, "box_offset"));
    }
  }
  // Strings JSON would escape take nlohmann's path (the writer declines).
  t.name = "caf\xc3\xa9";
  CHECK_FALSE(internal::ManifestEntryEncodersAgree(t, &fast, &slow));
}

}  // namespace
}  // namespace zcc::format
