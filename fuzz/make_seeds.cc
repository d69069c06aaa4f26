// Writes the seed corpora of fuzz/corpus/<target>/: valid inputs produced by
// the real encoders (so the fuzzers start from what zccd actually writes and
// reads) and a few hand-made malformed ones that exercise each rejection.
//
//   fuzz/out/make_seeds fuzz/corpus      (built by fuzz/build.sh)
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
//
// Deterministic: rerunning rewrites the same files.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "proto/zcc.pb.h"
#include "shm/control_block.h"

namespace zcc::fuzz {
namespace {

std::string g_out;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(g_out, "/", target);
  ::mkdir(g_out.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  const std::string path = absl::StrCat(dir, "/", name);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

std::string Le64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// ByteReader (fuzz_util.h) reads integers big-endian.
std::string Be64(uint64_t v) {
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A safetensors file: 8-byte length + `json` + `data_bytes` bytes of data.
std::string RawSafetensors(const std::string& json, size_t data_bytes) {
  return Le64(json.size()) + json + std::string(data_bytes, '\x5a');
}

std::string EncodedSafetensors(const std::vector<format::SafetensorsTensor>& tensors,
                               const std::map<std::string, std::string>& metadata, uint64_t align) {
  auto header = format::EncodeSafetensorsHeader(tensors, metadata, align);
  if (!header.ok()) {
    std::fprintf(stderr, "encode: %s\n", header.status().ToString().c_str());
    std::exit(1);
  }
  const uint64_t data = tensors.empty() ? 0 : tensors.back().end;
  return *header + std::string(data, '\x11');
}

void SafetensorsSeeds() {
  const std::string t = "safetensors_header";
  using format::DType;
  std::vector<format::SafetensorsTensor> two = {
      {"model.layers.0.weight", DType::kF32, {2, 2}, 0, 16},
      {"model.layers.0.bias", DType::kBF16, {3}, 16, 22},
  };
  Write(t, "valid_two_tensors", EncodedSafetensors(two, {{"format", "pt"}}, 1));
  Write(t, "valid_aligned_64", EncodedSafetensors(two, {}, 64));
  Write(t, "valid_empty", EncodedSafetensors({}, {}, 1));
  std::vector<format::SafetensorsTensor> odd = {
      {"scalar", DType::kI64, {}, 0, 8},
      {"empty", DType::kF16, {0, 7}, 8, 8},
      {"flag", DType::kBool, {1}, 8, 9},
      {"unicode/é.名前", DType::kU8, {2, 1, 1}, 9, 11},
  };
  Write(t, "valid_scalar_empty_unicode", EncodedSafetensors(odd, {{"k\n", "v\"\\"}}, 8));

  Write(t, "bad_short", std::string("\x05\x00\x00", 3));
  Write(t, "bad_length_past_file", Le64(1000) + "{}");
  Write(t, "bad_length_huge", Le64(~uint64_t{0}) + "{}");
  Write(t, "bad_not_object", RawSafetensors("[1,2]", 0));
  Write(t, "bad_not_json", RawSafetensors("{\"a\":", 0));
  Write(t, "bad_overlap",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                       6));
  Write(t, "bad_gap",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                       5));
  Write(t, "bad_duplicate_key",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       2));
  Write(t, "bad_deep", RawSafetensors(R"({"a":{"dtype":"U8","shape":[[[1]]],"data_offsets":[0,1]}})", 1));
  Write(t, "bad_negative_dim",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1));
  Write(t, "bad_dtype", RawSafetensors(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1));
  Write(t, "bad_size_mismatch",
        RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1));
  Write(t, "bad_offset_overflow",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[2],)"
                       R"("data_offsets":[18446744073709551615,1]}})",
                       1));
  Write(t, "bad_utf8_name",
        RawSafetensors("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1));
  Write(t, "bad_metadata", RawSafetensors(R"({"__metadata__":{"a":1}})", 0));
  Write(t, "bad_huge_shape",
        RawSafetensors(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],)"
                       R"("data_offsets":[0,8]}})",
                       8));
}

format::RankManifest SampleManifest() {
  format::RankManifest m;
  m.job_id = "llama-7b_run.3";
  m.step = 1000;
  m.rank = 1;
  m.world_size = 4;
  m.manifest_hash = 0x0123456789abcdefULL;
  m.files = {{"model-r00001.safetensors", 4096 + 64}, {"extra-r00001.bin", 4096 + 33}};
  m.tensors = {
      {"model.layers.0.weight", format::DType::kBF16, {4, 8}, "param", "model-r00001.safetensors",
       4096, 64, 0xfeedfacecafebeefULL},
      {"rng", format::DType::kU8, {33}, "extra", "extra-r00001.bin", 4096, 33, 42},
      {"model.layers.0.weight", format::DType::kBF16, {4, 8}, "ema", "model-r00001.safetensors",
       4096, 64, 1},
  };
  return m;
}

void ManifestSeeds() {
  const std::string t = "rank_manifest";
  const format::RankManifest m = SampleManifest();
  Write(t, "valid_rank1", format::EncodeRankManifest(m));
  format::RankManifest empty;
  empty.job_id = "j";
  Write(t, "valid_empty", format::EncodeRankManifest(empty));

  auto mutated = [&](auto mutate) {
    format::RankManifest copy = m;
    mutate(copy);
    return format::EncodeRankManifest(copy);
  };
  Write(t, "bad_rank_ge_world", mutated([](auto& x) { x.rank = 4; }));
  Write(t, "bad_file_slash", mutated([](auto& x) { x.files[0].name = "../model.safetensors"; }));
  Write(t, "bad_outside_file", mutated([](auto& x) {
          x.tensors[0].offset = ~uint64_t{0} - 10;
        }));
  Write(t, "bad_unknown_file", mutated([](auto& x) { x.tensors[1].file = "nope.bin"; }));
  Write(t, "bad_duplicate_tensor", mutated([](auto& x) { x.tensors[2].kind = "param"; }));
  Write(t, "bad_job_id", mutated([](auto& x) { x.job_id = "../etc"; }));
  Write(t, "bad_nbytes", mutated([](auto& x) { x.tensors[1].nbytes = 34; }));
  std::string text = format::EncodeRankManifest(m);
  Write(t, "bad_version", absl::StrCat("{\"format_version\": 2", text.substr(text.find(','))));
  Write(t, "bad_truncated", text.substr(0, text.size() / 2));
  Write(t, "bad_deep", R"({"tensors":[{"shape":[[1]]}]})");
}

void CommitRecordSeeds() {
  const std::string t = "commit_record";
  format::CommitRecord r;
  r.job_id = "itest";
  r.step = 20;
  r.world_size = 2;
  r.manifest_hash = 0xdeadbeef;
  r.total_bytes = 123456789;
  r.committed_at = "2024-05-01T12:34:56Z";
  Write(t, "valid", format::EncodeCommitRecord(r));
  r.committed_at = "2024-05-01T12:34:56.123456+02:00";
  Write(t, "valid_fraction_offset", format::EncodeCommitRecord(r));
  r.committed_at = "yesterday";
  Write(t, "bad_time", format::EncodeCommitRecord(r));
  r.committed_at = "2024-05-01T12:34:56Z";
  r.world_size = 0;
  Write(t, "bad_world", format::EncodeCommitRecord(r));
  Write(t, "bad_missing", R"({"format_version":1,"job_id":"a"})");
  Write(t, "bad_hash",
        R"({"format_version":1,"job_id":"a","step":1,"world_size":1,"manifest_hash":"XYZ",)"
        R"("total_bytes":0,"committed_at":"2024-05-01T12:34:56Z"})");
}

void WeightMapSeeds() {
  const std::string t = "weight_map_index";
  Write(t, "valid",
        format::EncodeWeightMapIndex({{"model.embed_tokens.weight", "model-r00000.safetensors"},
                                      {"lm_head.weight", "model-r00001.safetensors"}},
                                     1 << 20));
  Write(t, "valid_empty", format::EncodeWeightMapIndex({}, 0));
  Write(t, "valid_no_metadata", R"({"weight_map":{"a":"b.safetensors"}})");
  Write(t, "bad_slash", R"({"weight_map":{"a":"../b.safetensors"}})");
  Write(t, "bad_total", R"({"metadata":{"total_size":-1},"weight_map":{}})");
  Write(t, "bad_value", R"({"weight_map":{"a":1}})");
  Write(t, "bad_dup", R"({"weight_map":{"a":"x","a":"y"}})");
}

v1::RegisterRequest SampleRequest() {
  v1::RegisterRequest req;
  req.set_job_id("itest");
  req.set_rank(1);
  req.set_world_size(2);
  req.set_pid(1234);
  req.set_save_every(5);
  req.set_num_slots(2);
  auto add = [&](const std::string& name, v1::DType dtype, std::vector<int64_t> shape,
                 v1::TensorKind kind, v1::ReplicaGroup::Kind replica) {
    v1::TensorSpec* t = req.add_tensors();
    t->set_name(name);
    t->set_dtype(dtype);
    for (int64_t d : shape) t->add_shape(d);
    t->set_kind(kind);
    t->set_ema_eligible(kind == v1::PARAM);
    t->mutable_replica()->set_kind(replica);
    t->mutable_replica()->set_group_size(replica == v1::ReplicaGroup::NONE ? 1 : 2);
    t->mutable_replica()->set_rank_in_group(replica == v1::ReplicaGroup::NONE ? 0 : 1);
    t->mutable_replica()->set_expert_id(replica == v1::ReplicaGroup::EXPERT_DATA_PARALLEL ? 3 : -1);
  };
  add("model.layers.0.weight", v1::BF16, {16, 16}, v1::PARAM, v1::ReplicaGroup::DATA_PARALLEL);
  add("model.layers.0.mlp.experts.3.w1", v1::F32, {8, 4}, v1::PARAM,
      v1::ReplicaGroup::EXPERT_DATA_PARALLEL);
  add("optim/exp_avg", v1::F32, {64}, v1::OPTIM, v1::ReplicaGroup::NONE);
  add("rng", v1::U8, {33}, v1::EXTRA, v1::ReplicaGroup::NONE);
  add("scalar", v1::F64, {}, v1::OPTIM, v1::ReplicaGroup::NONE);
  return req;
}

void RegisterSeeds() {
  const std::string t = "register_request";
  const v1::RegisterRequest good = SampleRequest();
  Write(t, "valid", good.SerializeAsString());
  v1::RegisterRequest r = good;
  r.mutable_tensors(0)->set_shape(0, -4);
  Write(t, "bad_negative_dim", r.SerializeAsString());
  r = good;
  *r.add_tensors() = r.tensors(0);
  Write(t, "bad_duplicate", r.SerializeAsString());
  r = good;
  r.mutable_tensors(1)->set_shape(0, int64_t{1} << 40);
  r.mutable_tensors(1)->set_shape(1, int64_t{1} << 40);
  Write(t, "bad_huge", r.SerializeAsString());
  r = good;
  r.mutable_tensors(0)->mutable_replica()->set_rank_in_group(7);
  Write(t, "bad_rank_in_group", r.SerializeAsString());
  r = good;
  r.mutable_tensors(0)->mutable_replica()->set_group_size(0);
  Write(t, "bad_group_size", r.SerializeAsString());
  r = good;
  r.mutable_tensors(2)->set_name(std::string("w\0x", 3));
  Write(t, "bad_name_nul", r.SerializeAsString());
  r = good;
  r.mutable_tensors(2)->set_dtype(static_cast<v1::DType>(99));
  r.mutable_tensors(3)->set_kind(static_cast<v1::TensorKind>(42));
  Write(t, "bad_enums", r.SerializeAsString());

  // register_structured reads its bytes as a recipe (see FuzzRegisterStructured).
  const std::string s = "register_structured";
  Write(s, "dp2_three_tensors", std::string("\x01\x03\x01" "\x00\x00\x02\x08\x10\x00\x01\x01"
                                            "\x01\x01\x01\x20\x00\x01\x01"
                                            "\x02\x05\x00\x01\x02\x00\x02\x01",
                                            26));
  Write(s, "dp4_experts", std::string("\x03\x06\x02" "\x02\x03\x02\x04\x04\x00\x01\x02\x01"
                                      "\x02\x03\x02\x04\x04\x00\x01\x02\x02"
                                      "\x00\x00\x01\x09\x00\x01\x00"
                                      "\x01\x01\x00\x02\x01\x00"
                                      "\x05\x08\x01\x21\x02\x00\x00"
                                      "\x06\x09\x00\x01\x01\x01",
                                      44));
  Write(s, "corrupt_group", std::string("\x01\x02\x00" "\x00\x00\x01\x10\x00\x01\x01"
                                        "\x01\x01\x01\x08\x01\x00\x01"
                                        "\x00\x00\x04\x00",
                                        21));
}

void ControlBlockSeeds() {
  const std::string t = "control_block";
  struct alignas(shm::ControlBlock) Storage {
    unsigned char bytes[sizeof(shm::ControlBlock)];
  };
  const auto block = std::make_unique<Storage>();
  unsigned char* storage = block->bytes;
  auto* cb = reinterpret_cast<shm::ControlBlock*>(storage);
  auto bytes = [&](const std::string& tail = "") {
    // Heartbeats hold the clock: zero them so the seeds are reproducible.
    cb->daemon_heartbeat_ns.store(0);
    return std::string(reinterpret_cast<const char*>(storage), sizeof(block->bytes)) + tail;
  };
  std::memset(storage, 0, sizeof(block->bytes));
  shm::InitControlBlock(cb, 2, 1 << 20, 77, 0xabcdef);
  Write(t, "valid_free", bytes());
  cb->slots[0].state.store(static_cast<uint32_t>(shm::SlotState::kReady));
  cb->slots[0].step.store(5);
  cb->slots[0].kind.store(static_cast<uint32_t>(shm::SnapshotKind::kFull));
  cb->slots[0].seq.store(9);
  cb->slots[1].state.store(static_cast<uint32_t>(shm::SlotState::kIngesting));
  Write(t, "valid_ready", bytes());
  Write(t, "valid_ready_geometry",
        bytes(std::string("\x02", 1) + Be64(uint64_t{1} << 20) + Be64(77)));
  shm::InitControlBlock(cb, 8, 4096, 1, 0);
  for (uint32_t i = 0; i < shm::kMaxSlots; ++i) {
    cb->slots[i].state.store(static_cast<uint32_t>(shm::SlotState::kReady));
    cb->slots[i].step.store(i * 3);
    cb->slots[i].kind.store(i % 2);
  }
  Write(t, "valid_eight_ready", bytes());
  cb->slots[2].state.store(77);
  cb->slots[3].step.store(-7);
  cb->slots[4].kind.store(9);
  cb->slots[5].state.store(~0u);
  Write(t, "bad_words", bytes());
  Write(t, "bad_short", std::string("zcc_shm1", 8));
}

void StepDirSeeds() {
  const std::string t = "step_dir_latest";
  Write(t, "valid", format::StepDirName(1000));
  Write(t, "valid_newline", format::StepDirName(5) + "\n");
  Write(t, "valid_spaces", "  " + format::StepDirName(0) + " \t\n");
  Write(t, "valid_large", format::StepDirName(123456789012LL));
  Write(t, "valid_max", format::StepDirName(INT64_MAX));
  Write(t, "bad_partial", format::PartialStepDirName(1000));
  Write(t, "bad_leading_zero", "step-000001000");
  Write(t, "bad_overflow", "step-99999999999999999999");
  Write(t, "bad_short", "step-123");
  Write(t, "bad_sign", "step-+0001000");
  Write(t, "bad_empty", "");
  Write(t, "bad_nul", std::string("step-00001000\0", 14));
}

void PieceAssemblySeeds() {
  const std::string t = "piece_assembly";
  // The layout FuzzPieceAssembly reads: per piece a kind byte (< 200: a
  // 2-byte size follows, odd: a wrong XXH3; else an 8-byte size, and an
  // 8-byte XXH3 past 20000 bytes) and a peer byte; then operations, each a
  // byte (mod 5): 0 begin (piece byte, shape byte < 230: 2-byte offset and
  // length, else 8-byte ones), 1 end (part byte, written when < 200, then a
  // kept byte once a piece is whole).
  auto piece = [](uint8_t kind, uint16_t size) {
    return std::string{static_cast<char>(kind), static_cast<char>(size >> 8),
                       static_cast<char>(size & 0xff), '\0'};
  };
  auto begin = [](uint8_t w, uint16_t offset, uint16_t length) {
    return std::string{'\0', static_cast<char>(w), '\0', static_cast<char>(offset >> 8),
                       static_cast<char>(offset & 0xff), static_cast<char>(length >> 8),
                       static_cast<char>(length & 0xff)};
  };
  auto end = [](uint8_t part, bool written) {
    return std::string{'\1', static_cast<char>(part), static_cast<char>(written ? 0 : 255),
                       '\1'};
  };
  const std::string four = piece(0, 256) + piece(0, 3000) + piece(1, 100) + piece(0, 1);
  Write(t, "valid_whole", four + begin(0, 0, 256) + end(0, true));
  Write(t, "valid_two_parts",
        four + begin(1, 0, 1000) + begin(1, 1000, 2000) + end(1, true) + end(0, true));
  Write(t, "bad_xxh3", four + begin(2, 0, 100) + end(0, true));
  Write(t, "bad_overlap_and_retry", four + begin(1, 0, 1500) + begin(1, 1000, 2000) +
                                        end(0, false) + begin(1, 0, 1000) + end(0, true));
  Write(t, "bad_huge",
        std::string{static_cast<char>(254)} + Be64(~uint64_t{0}) + Be64(42) + std::string("\0") +
            piece(0, 10) + piece(0, 10) + piece(0, 10) + begin(0, 0, 100) + end(0, true) +
            std::string("\2\0\3\4\1"));
}

}  // namespace
}  // namespace zcc::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (e.g. fuzz/corpus)\n", argv[0]);
    return 2;
  }
  zcc::fuzz::g_out = argv[1];
  zcc::fuzz::SafetensorsSeeds();
  zcc::fuzz::ManifestSeeds();
  zcc::fuzz::CommitRecordSeeds();
  zcc::fuzz::WeightMapSeeds();
  zcc::fuzz::RegisterSeeds();
  zcc::fuzz::ControlBlockSeeds();
  zcc::fuzz::StepDirSeeds();
  zcc::fuzz::PieceAssemblySeeds();
  return 0;
}
