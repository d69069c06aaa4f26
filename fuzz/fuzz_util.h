// Internal to fuzz/: what every entry point of fuzz_targets.h shares.
#ifndef ZCC_FUZZ_FUZZ_UTIL_H_
#define ZCC_FUZZ_FUZZ_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zcc::fuzz::internal {

// A broken promise: report and abort, which libFuzzer and the replay test both
// count as a crash.
[[noreturn]] inline void Fail(const char* file, int line, const char* cond,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n  %s\n", file, line, cond, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

inline absl::string_view AsView(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

// Decoders of files read back from disk may only fail with these codes.
inline bool IsDecodeError(const absl::Status& st) {
  return st.code() == absl::StatusCode::kDataLoss ||
         st.code() == absl::StatusCode::kInvalidArgument;
}

// Consumes fuzz bytes as small typed values (integers big-endian); yields
// zeros once exhausted, so every input maps to exactly one structured value.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool Bool() { return (U8() & 1) != 0; }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : U8() % n; }  // n <= 256
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | U8();
    return v;
  }
  // Up to `max_len` raw bytes, the length from one byte.
  std::string Bytes(size_t max_len) {
    const size_t n = std::min<size_t>(U8(), max_len);
    std::string out;
    while (out.size() < n && !empty()) out.push_back(static_cast<char>(U8()));
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace zcc::fuzz::internal

#define FUZZ_CHECK(cond, detail)                                                 \
  do {                                                                           \
    if (!(cond)) ::zcc::fuzz::internal::Fail(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)

#endif  // ZCC_FUZZ_FUZZ_UTIL_H_
