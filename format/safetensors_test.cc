#include "format/safetensors.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "format/dtype.h"

namespace zcc::format {
namespace {

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A header prefix with the given JSON text, as a file would start.
std::string Prefix(absl::string_view json) { return Le64(json.size()) + std::string(json); }

// Decodes `json` as the header of a file whose data section is `data_size` bytes.
absl::StatusOr<SafetensorsHeader> DecodeJson(absl::string_view json, uint64_t data_size) {
  return DecodeSafetensorsHeader(Prefix(json), 8 + json.size() + data_size);
}

SafetensorsTensor Tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                         uint64_t begin) {
  SafetensorsTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.begin = begin;
  t.end = begin + TensorBytes(t.dtype, t.shape).value();
  return t;
}

// Tensors laid out back to back, in order, with names that look like paths.
std::vector<SafetensorsTensor> SampleTensors() {
  std::vector<SafetensorsTensor> tensors;
  uint64_t offset = 0;
  const auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape) {
    tensors.push_back(Tensor(std::move(name), dtype, std::move(shape), offset));
    offset = tensors.back().end;
  };
  add("model.embed_tokens.weight", DType::kBF16, {32, 16});
  add("model.layers.0/self_attn.q_proj.weight", DType::kF32, {16, 16});
  add("model.layers.0/self_attn.q_proj.bias", DType::kF16, {16});
  add("optimizer/state/0/exp_avg", DType::kF64, {3, 5});
  add("step", DType::kI64, {});
  add("empty", DType::kI32, {0, 4});
  add("mask", DType::kBool, {7});
  add("extra/rng.state", DType::kU8, {13});
  add("tiny", DType::kI8, {1});
  add("counts", DType::kI16, {2, 2});
  return tensors;
}

uint64_t DataSize(const std::vector<SafetensorsTensor>& tensors) {
  return tensors.empty() ? 0 : tensors.back().end;
}

void CheckSameTensors(const std::vector<SafetensorsTensor>& got,
                      const std::vector<SafetensorsTensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("tensor " << i << " " << want[i].name);
    CHECK(got[i].name == want[i].name);
    CHECK(got[i].dtype == want[i].dtype);
    CHECK(got[i].shape == want[i].shape);
    CHECK(got[i].begin == want[i].begin);
    CHECK(got[i].end == want[i].end);
  }
}

// What every successful decode must guarantee, whatever the input was.
void CheckInvariants(const SafetensorsHeader& h, uint64_t file_size) {
  REQUIRE(h.data_start >= 8);
  REQUIRE(h.data_start <= file_size);
  uint64_t expected = 0;
  for (const SafetensorsTensor& t : h.tensors) {
    REQUIRE(t.begin == expected);
    REQUIRE(t.end >= t.begin);
    auto bytes = TensorBytes(t.dtype, t.shape);
    REQUIRE_OK(bytes);
    REQUIRE(*bytes == t.end - t.begin);
    expected = t.end;
  }
  REQUIRE(expected == file_size - h.data_start);
}

TEST_CASE("a tiny header is byte-for-byte what the safetensors format specifies") {
  auto out = EncodeSafetensorsHeader({Tensor("t", DType::kF32, {2}, 0)}, {}, 1);
  REQUIRE_OK(out);
  const std::string json = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(*out == Le64(json.size()) + json);

  // With metadata: "__metadata__" comes first, as the reference writer does.
  out = EncodeSafetensorsHeader({Tensor("t", DType::kF32, {2}, 0)}, {{"format", "pt"}}, 1);
  REQUIRE_OK(out);
  const std::string with_meta =
      R"({"__metadata__":{"format":"pt"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(*out == Le64(with_meta.size()) + with_meta);

  // Alignment 8 pads the JSON with spaces and counts them in the length.
  out = EncodeSafetensorsHeader({Tensor("t", DType::kF32, {2}, 0)}, {}, 8);
  REQUIRE_OK(out);
  const uint64_t padded = (8 + json.size() + 7) / 8 * 8;
  REQUIRE(out->size() == padded);
  CHECK(out->substr(0, 8) == Le64(padded - 8));
  CHECK(out->substr(8, json.size()) == json);
  CHECK(out->substr(8 + json.size()) == std::string(padded - 8 - json.size(), ' '));
}

TEST_CASE("encode then decode returns the same tensors and metadata") {
  const std::vector<SafetensorsTensor> tensors = SampleTensors();
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"zcc.step", "1000"}, {"note", "ünïcode / \"quoted\""}};
  for (uint64_t align : {1, 8, 64, 4096, 1 << 20}) {
    INFO("align " << align);
    auto out = EncodeSafetensorsHeader(tensors, metadata, align);
    REQUIRE_OK(out);
    CHECK(out->size() % align == 0);
    const uint64_t file_size = out->size() + DataSize(tensors);
    auto h = DecodeSafetensorsHeader(*out, file_size);
    REQUIRE_OK(h);
    CHECK(h->data_start == out->size());
    CheckSameTensors(h->tensors, tensors);
    CHECK(h->metadata == metadata);
    CheckInvariants(*h, file_size);
  }
}

TEST_CASE("4096 alignment puts the data section on a page boundary") {
  auto out = EncodeSafetensorsHeader(SampleTensors(), {}, 4096);
  REQUIRE_OK(out);
  CHECK(out->size() == 4096);  // the sample header is under 4 KiB
  auto h = DecodeSafetensorsHeader(*out, out->size() + DataSize(SampleTensors()));
  REQUIRE_OK(h);
  CHECK(h->data_start % 4096 == 0);
  CHECK(h->data_start == 4096);
}

TEST_CASE("a file without tensors is valid") {
  auto out = EncodeSafetensorsHeader({}, {}, 1);
  REQUIRE_OK(out);
  CHECK(*out == Le64(2) + "{}");
  auto h = DecodeSafetensorsHeader(*out, out->size());
  REQUIRE_OK(h);
  CHECK(h->tensors.empty());
  CHECK(h->metadata.empty());
  // ...but then there can be no data after the header.
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(*out, out->size() + 1), absl::StatusCode::kDataLoss);
}

TEST_CASE("decoded tensors come back in offset order, not key order") {
  const std::string json = R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                           R"("c":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},)"
                           R"("z":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  auto h = DecodeJson(json, 8);
  REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 3);
  CHECK(h->tensors[0].name == "z");
  CHECK(h->tensors[1].name == "b");
  CHECK(h->tensors[2].name == "c");
}

TEST_CASE("encoding refuses tensors that do not describe a valid file") {
  const auto code = [](std::vector<SafetensorsTensor> tensors, uint64_t align = 1) {
    return EncodeSafetensorsHeader(tensors, {}, align).status().code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  const SafetensorsTensor a = Tensor("a", DType::kF32, {2}, 0);  // [0, 8)
  CHECK(code({a, Tensor("b", DType::kF32, {2}, 8)}) == absl::StatusCode::kOk);
  CHECK(code({a, Tensor("b", DType::kF32, {2}, 12)}) == kInvalid);         // gap
  CHECK(code({a, Tensor("b", DType::kF32, {2}, 4)}) == kInvalid);          // overlap
  CHECK(code({Tensor("b", DType::kF32, {2}, 8), a}) == kInvalid);          // out of order
  CHECK(code({Tensor("a", DType::kF32, {2}, 4)}) == kInvalid);             // not at 0
  CHECK(code({a, Tensor("a", DType::kF32, {2}, 8)}) == kInvalid);          // duplicate
  CHECK(code({Tensor("", DType::kF32, {2}, 0)}) == kInvalid);              // empty name
  CHECK(code({Tensor("a\nb", DType::kF32, {2}, 0)}) == kInvalid);          // control char
  CHECK(code({Tensor("__metadata__", DType::kF32, {2}, 0)}) == kInvalid);  // reserved
  CHECK(code({Tensor("bad\xff utf8", DType::kF32, {2}, 0)}) == kInvalid);
  SafetensorsTensor wrong_size = a;
  wrong_size.end = 12;
  CHECK(code({wrong_size}) == kInvalid);
  SafetensorsTensor negative = a;
  negative.shape = {-2};
  CHECK(code({negative}) == kInvalid);
  SafetensorsTensor backwards = a;
  backwards.begin = 8;
  backwards.end = 0;
  CHECK(code({backwards}) == kInvalid);
  CHECK(code({a}, 0) == kInvalid);
  CHECK(code({a}, 24) == kInvalid);
  CHECK(code({a}, uint64_t{1} << 40) == kInvalid);  // padding past the header limit
  CHECK(EncodeSafetensorsHeader({a}, {{"k", "\xc3"}}, 1).status().code() == kInvalid);
}

TEST_CASE("the announced header length is checked before anything is read") {
  const std::string valid = *EncodeSafetensorsHeader({Tensor("t", DType::kU8, {3}, 0)}, {}, 1);
  const uint64_t n = valid.size() - 8;
  auto needed = HeaderBytesNeeded(valid.substr(0, 8), valid.size() + 3);
  REQUIRE_OK(needed);
  CHECK(*needed == 8 + n);

  // Larger than the limit, even in a file large enough to hold it.
  const std::string huge = Le64(kMaxSafetensorsHeaderBytes + 1);
  REQUIRE_STATUS_CODE(HeaderBytesNeeded(huge, uint64_t{1} << 40), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(huge, uint64_t{1} << 40), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(Le64(UINT64_MAX), UINT64_MAX), absl::StatusCode::kDataLoss);
  // Larger than the file.
  REQUIRE_STATUS_CODE(HeaderBytesNeeded(valid, valid.size() - 1), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(valid, valid.size() - 1), absl::StatusCode::kDataLoss);
  // Files and prefixes shorter than the length field.
  REQUIRE_STATUS_CODE(HeaderBytesNeeded(valid.substr(0, 8), 7), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(HeaderBytesNeeded(valid.substr(0, 7), 100), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader("", 0), absl::StatusCode::kDataLoss);
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(valid.substr(0, 5), 5), absl::StatusCode::kDataLoss);
}

TEST_CASE("a prefix shorter than the header asks for the bytes it needs") {
  const std::string valid = *EncodeSafetensorsHeader(SampleTensors(), {}, 4096);
  const uint64_t file_size = valid.size() + DataSize(SampleTensors());
  for (size_t len : {size_t{0}, size_t{3}, size_t{8}, size_t{100}, valid.size() - 1}) {
    INFO("prefix of " << len);
    auto h = DecodeSafetensorsHeader(valid.substr(0, len), file_size);
    REQUIRE_STATUS_CODE(h, absl::StatusCode::kOutOfRange);
    if (len >= 8) CHECK(absl::StrContains(h.status().message(), "need 4096 bytes"));
  }
  // Extra bytes after the header (the start of the data) are fine.
  std::string longer = valid + std::string(50, '\x7f');
  REQUIRE_OK(DecodeSafetensorsHeader(longer, file_size));
}

TEST_CASE("truncated files are refused") {
  const std::vector<SafetensorsTensor> tensors = SampleTensors();
  const std::string header = *EncodeSafetensorsHeader(tensors, {}, 64);
  const uint64_t full = header.size() + DataSize(tensors);
  REQUIRE_OK(DecodeSafetensorsHeader(header, full));
  for (uint64_t size : {full - 1, full - 100, uint64_t{header.size()}, uint64_t{header.size() - 1},
                        uint64_t{9}, uint64_t{8}}) {
    INFO("file of " << size << " bytes");
    auto h = DecodeSafetensorsHeader(header, size);
    REQUIRE_STATUS_CODE(h, absl::StatusCode::kDataLoss);
  }
  // And so are files with bytes after the last tensor.
  REQUIRE_STATUS_CODE(DecodeSafetensorsHeader(header, full + 1), absl::StatusCode::kDataLoss);
}

struct BadHeader {
  const char* what;
  std::string json;
  uint64_t data_size;
  const char* message;  // must appear in the error
};

TEST_CASE("malformed headers are refused with a message naming the problem") {
  const std::string ok_entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<BadHeader> cases = {
      {"not JSON", "{nope", 8, "not valid JSON"},
      {"not an object", "[1,2]", 0, "start with '{'"},
      {"empty", "", 0, "start with '{'"},
      {"trailing garbage", R"({"t":)" + ok_entry + "} x", 8, "not valid JSON"},
      {"invalid UTF-8", "{\"t\xff\":" + ok_entry + "}", 8, "not valid JSON"},
      {"entry not an object", R"({"w":[1]})", 0, "tensor 'w'"},
      {"missing dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "missing \"dtype\""},
      {"missing shape", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8, "missing \"shape\""},
      {"missing offsets", R"({"w":{"dtype":"F32","shape":[2]}})", 8, "missing \"data_offsets\""},
      {"dtype not a string", R"({"w":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", 8,
       "\"dtype\" must be a string"},
      {"unknown dtype", R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8,
       "unknown dtype"},
      {"shape not an array", R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8,
       "\"shape\" must be an array"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "negative"},
      {"fractional dim", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
       "non-negative integer"},
      {"huge dim", R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})",
       8, "larger than"},
      {"overflowing shape",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       "tensor 'w'"},
      {"offsets not a pair", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8,
       "[begin, end]"},
      {"negative offset", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8,
       "negative"},
      {"offset too big for u64",
       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", 8,
       "non-negative integer"},
      {"size mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "12 bytes"},
      {"end before begin", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
       "end before"},
      {"past the data section", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
       "past the data section"},
      {"not reaching the end", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12,
       "cover 8 bytes"},
      {"hole at the start", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "not covered"},
      {"gap",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
       10, "gap of 2 bytes"},
      {"overlap",
       R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
       6, "overlaps"},
      {"duplicate name", R"({"w":)" + ok_entry + R"(,"w":)" + ok_entry + "}", 8, "'w' twice"},
      {"duplicate field", R"({"w":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,8]}})",
       8, "'dtype' twice"},
      {"empty name", R"({"":)" + ok_entry + "}", 8, "name is empty"},
      {"control char in name", R"({"a\u0001b":)" + ok_entry + "}", 8, "forbidden byte"},
      {"quote in name", R"({"a\"b":)" + ok_entry + "}", 8, "forbidden byte"},
      {"name too long", "{\"" + std::string(600, 'n') + "\":" + ok_entry + "}", 8, "limit"},
      {"metadata not an object", R"({"__metadata__":[],"w":)" + ok_entry + "}", 8,
       "\"__metadata__\" must be an object"},
      {"metadata value not a string", R"({"__metadata__":{"k":1},"w":)" + ok_entry + "}", 8,
       "entry 'k' must be a string"},
      {"too deep", R"({"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8, "deeper"},
      {"very deep", "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0,
       "deeper"},
  };
  for (const BadHeader& c : cases) {
    INFO(c.what << ": " << c.json.substr(0, 200));
    auto h = DecodeJson(c.json, c.data_size);
    REQUIRE_STATUS_CODE(h, absl::StatusCode::kDataLoss);
    INFO("message: " << h.status().message());
    CHECK(absl::StrContains(h.status().message(), c.message));
  }
}

TEST_CASE("headers from other writers decode: whitespace, key order, metadata") {
  const std::string json =
      "{ \"__metadata__\" : { \"format\" : \"pt\" } ,\n"
      "  \"w\" : { \"data_offsets\" : [ 0 , 8 ] , \"shape\" : [ 2 ] , \"dtype\" : \"F32\" ,"
      " \"extra\" : null } }      ";
  auto h = DecodeJson(json, 8);
  REQUIRE_OK(h);
  REQUIRE(h->tensors.size() == 1);
  CHECK(h->tensors[0].name == "w");
  CHECK(h->metadata.at("format") == "pt");
}

// Applies one random edit to `s`: byte flips, set a JSON-significant
// character, insert, erase or truncate.
void Mutate(std::mt19937_64& rng, std::string* s) {
  static const char kInteresting[] = "{}[]\",:0123456789-.eE \\u";
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits && !s->empty(); ++e) {
    const size_t pos = rng() % s->size();
    switch (rng() % 6) {
      case 0:
        (*s)[pos] = static_cast<char>((*s)[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:
        (*s)[pos] = kInteresting[rng() % (sizeof(kInteresting) - 1)];
        break;
      case 2:
        s->insert(pos, 1, kInteresting[rng() % (sizeof(kInteresting) - 1)]);
        break;
      case 3:
        s->erase(pos, 1 + rng() % 4);
        break;
      case 4:
        (*s)[pos] = static_cast<char>(rng());
        break;
      case 5:
        s->resize(pos);
        break;
    }
  }
}

TEST_CASE("random mutations of a valid header never crash and decode only to valid headers") {
  const std::vector<SafetensorsTensor> tensors = SampleTensors();
  const std::string json_only = EncodeSafetensorsHeader(tensors, {{"format", "pt"}}, 1)->substr(8);
  const uint64_t data_size = DataSize(tensors);
  std::mt19937_64 rng(20240501);
  int decoded = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string json = json_only;
    Mutate(rng, &json);
    // Mostly keep the length consistent with the (mutated) JSON so that the
    // JSON checks are exercised; sometimes mutate the whole file instead.
    std::string file = Prefix(json);
    uint64_t file_size = file.size() + data_size;
    if (rng() % 8 == 0) {
      Mutate(rng, &file);
      file_size = rng() % 2 ? file.size() + data_size : rng() % (file.size() + data_size + 16);
    }
    auto h = DecodeSafetensorsHeader(file, file_size);
    if (h.ok()) {
      ++decoded;
      CheckInvariants(*h, file_size);
    } else {
      const absl::StatusCode code = h.status().code();
      INFO(h.status().ToString());
      CHECK((code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kOutOfRange));
      CHECK(!h.status().message().empty());
    }
  }
  // Some mutations (inside a metadata value, say) leave a valid file.
  CHECK(decoded > 0);
  CHECK(decoded < 2000);
}

TEST_CASE("random bytes never crash the decoder") {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::string file(rng() % 64, '\0');
    for (char& c : file) c = static_cast<char>(rng());
    if (file.size() >= 8 && rng() % 2) {
      // A plausible length so that the JSON parser sees the garbage.
      const std::string len = Le64(file.size() - 8);
      file.replace(0, 8, len);
      if (file.size() > 8 && rng() % 2) file[8] = '{';
    }
    auto h = DecodeSafetensorsHeader(file, file.size() + rng() % 4);
    if (h.ok()) CheckInvariants(*h, file.size());
  }
}

}  // namespace
}  // namespace zcc::format

namespace zcc::format {
namespace {

// The header as one nlohmann document, the way EncodeSafetensorsHeader built
// it before it wrote entries one by one: the bytes on disk must not change.
std::string DocumentDump(const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    root["__metadata__"] = std::move(meta);
  }
  for (const SafetensorsTensor& t : tensors) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(DTypeName(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {t.begin, t.end};
    root[t.name] = std::move(e);
  }
  return root.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
}

TEST_CASE("the header is written in the bytes of the whole-document dump") {
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"a\xc3\xa9", "b"}};
  for (const auto& meta : {std::map<std::string, std::string>{}, metadata}) {
    for (const auto& tensors : {std::vector<SafetensorsTensor>{}, SampleTensors()}) {
      auto encoded = EncodeSafetensorsHeader(tensors, meta, 1);
      REQUIRE_OK(encoded);
      CHECK(encoded->substr(8) == DocumentDump(tensors, meta));
    }
  }
}

TEST_CASE("headers of 200k tensors round-trip") {
  // A size at which the quadratic encoder and parser this replaced took
  // minutes; checked by content, not by time.
  constexpr int kTensors = 200'000;
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(kTensors);
  uint64_t offset = 0;
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back(Tensor(absl::StrCat("layers.", i / 100, ".w", i % 100), DType::kF32,
                             {2, 2}, offset));
    offset = tensors.back().end;
  }
  auto encoded = EncodeSafetensorsHeader(tensors, {{"format", "pt"}}, 4096);
  REQUIRE_OK(encoded);
  CHECK(encoded->size() % 4096 == 0);
  auto decoded = DecodeSafetensorsHeader(*encoded, encoded->size() + offset);
  REQUIRE_OK(decoded);
  CHECK(decoded->metadata.at("format") == "pt");
  REQUIRE(decoded->tensors.size() == tensors.size());
  size_t differ = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& a = decoded->tensors[i];
    const SafetensorsTensor& b = tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end) {
      ++differ;
    }
  }
  CHECK(differ == 0);

  // A name repeated at the very end is found.
  std::string twice = encoded->substr(8);
  const size_t end = twice.find_last_of('}');
  twice.insert(end, R"(,"layers.0.w0":{"dtype":"U8","shape":[0],"data_offsets":[0,0]})");
  CHECK_THAT(std::string(DecodeJson(twice, offset).status().message()),
             Catch::Contains("'layers.0.w0' twice"));
}

}  // namespace
}  // namespace zcc::format
