// Writes a small safetensors file with EncodeSafetensorsHeader (alignment
// 4096) and known data, for safetensors_python_test.py to read back with the
// reference Python implementation. Usage: write_sample_safetensors OUT_PATH
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/file_util.h"
#include "format/dtype.h"
#include "format/safetensors.h"

namespace zcc::format {
namespace {

// The file is little-endian whatever the host is.
template <typename T>
void AppendLittleEndian(T value, std::string* out) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>(bits >> (8 * i)));
}

// Keep in sync with the expectations in safetensors_python_test.py.
absl::Status WriteSample(const std::string& path) {
  std::vector<SafetensorsTensor> tensors;
  std::string data;
  const auto add = [&](const char* name, DType dtype, std::vector<int64_t> shape,
                       const std::string& bytes) {
    SafetensorsTensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.begin = data.size();
    t.end = t.begin + bytes.size();
    tensors.push_back(std::move(t));
    data += bytes;
  };

  std::string f32;
  for (float v : {0.0f, 1.5f, -2.25f, 1024.0f, 0.125f, -7.0f}) AppendLittleEndian(v, &f32);
  add("model.embed/weight", DType::kF32, {2, 3}, f32);

  std::string bf16;  // 1.0, -2.0, 0.5, 3.0 as bfloat16 bit patterns
  for (uint16_t v : {0x3f80, 0xc000, 0x3f00, 0x4040}) AppendLittleEndian(v, &bf16);
  add("model.layers.0/attn.bias", DType::kBF16, {4}, bf16);

  std::string i64;
  for (int64_t v : {int64_t{1} << 40, int64_t{-1}, int64_t{42}}) AppendLittleEndian(v, &i64);
  add("optimizer/state.0.step", DType::kI64, {3}, i64);

  std::string scalar;
  AppendLittleEndian(int64_t{1000}, &scalar);
  add("global.step", DType::kI64, {}, scalar);

  add("extra/rng.state", DType::kU8, {5}, std::string("\x00\x01\x7f\x80\xff", 5));

  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(tensors, {{"format", "pt"}, {"zcc.step", "1000"}}, 4096);
  if (!header.ok()) return header.status();
  return WriteFileAtomic(path, *header + data);
}

}  // namespace
}  // namespace zcc::format

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_PATH\n", argv[0]);
    return 2;
  }
  const absl::Status status = zcc::format::WriteSample(argv[1]);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
