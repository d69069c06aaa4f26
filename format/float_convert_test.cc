#include "format/float_convert.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace zcc::format {
namespace {

double Fp32Value(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t Fp32Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

double Fp16Value(uint16_t h) { return Fp32Value(Fp16ToFp32Bits(h)); }

bool IsNanBf16(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }
bool IsNanFp16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// The value a finite or infinite narrow format pattern stands for when
// rounding: Inf counts as the next power of two past the largest finite
// value (what round-to-nearest-even compares against).
double Bf16RoundingValue(uint16_t b) {
  if ((b & 0x7fffu) == 0x7f80u) return std::copysign(std::ldexp(1.0, 128), (b & 0x8000u) ? -1.0 : 1.0);
  return Fp32Value(Bf16ToFp32Bits(b));
}

// Reference f32 -> bf16: the nearer of the two bf16 values around x
// (compared in double, where both differences are exact), ties to the even
// pattern.
uint16_t ReferenceBf16(uint32_t x) {
  const uint16_t low = static_cast<uint16_t>(x >> 16);  // truncation: toward zero
  const uint16_t high = static_cast<uint16_t>(low + 1);  // away from zero
  const double v = Fp32Value(x);
  const double d_low = std::fabs(v - Bf16RoundingValue(low));
  const double d_high = std::fabs(Bf16RoundingValue(high) - v);
  if (d_low < d_high) return low;
  if (d_high < d_low) return high;
  return (low & 1) == 0 ? low : high;
}

TEST_CASE("bf16 widening is exact and narrowing round-trips every bf16 value") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint32_t bits = Bf16ToFp32Bits(static_cast<uint16_t>(b));
    CHECK(bits == b << 16);
    const uint16_t back = Fp32BitsToBf16(bits);
    if (IsNanBf16(static_cast<uint16_t>(b))) {
      CHECK(IsNanBf16(back));
      CHECK((back & 0x8000u) == (b & 0x8000u));
    } else {
      CHECK(back == b);
    }
  }
}

TEST_CASE("f32 to bf16 rounds to nearest even, as a reference computed in double") {
  // Ties, just below and above them, around every binade.
  for (uint32_t hi = 0; hi < 0x7f80u; hi += 0x3f) {
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t x = sign | (hi << 16) | low;
        INFO("x = 0x" << std::hex << x);
        CHECK(Fp32BitsToBf16(x) == ReferenceBf16(x));
      }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t x = rng();
    if ((x & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: below
    INFO("x = 0x" << std::hex << x);
    REQUIRE(Fp32BitsToBf16(x) == ReferenceBf16(x));
  }
  // Specific values: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (even: 1).
  CHECK(Fp32BitsToBf16(Fp32Bits(1.0f + 0x1p-8f)) == 0x3f80);
  CHECK(Fp32BitsToBf16(Fp32Bits(1.0f + 0x1p-8f + 0x1p-20f)) == 0x3f81);
  CHECK(Fp32BitsToBf16(Fp32Bits(1.0f + 3 * 0x1p-8f)) == 0x3f82);  // tie, up to even
  CHECK(Fp32BitsToBf16(Fp32Bits(std::numeric_limits<float>::max())) == 0x7f80);  // Inf
  CHECK(Fp32BitsToBf16(Fp32Bits(-std::numeric_limits<float>::infinity())) == 0xff80);
  CHECK(Fp32BitsToBf16(Fp32Bits(-0.0f)) == 0x8000);
  CHECK(Fp32BitsToBf16(0x00000001u) == 0x0000);  // the smallest subnormal
}

TEST_CASE("f32 to bf16 keeps NaN a NaN, payloads whose top bits are clear included") {
  for (uint32_t x : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fffffffu, 0xffc00000u}) {
    const uint16_t b = Fp32BitsToBf16(x);
    INFO("x = 0x" << std::hex << x << " -> 0x" << b);
    CHECK(IsNanBf16(b));
    CHECK((b & 0x8000u) == ((x >> 16) & 0x8000u));
  }
}

TEST_CASE("f16: widening is exact and narrowing rounds to nearest even") {
  // Every finite f16 value in ascending order, as the rounding reference.
  std::vector<std::pair<double, uint16_t>> finite;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    const uint32_t bits = Fp16ToFp32Bits(v);
    const uint16_t back = Fp32BitsToFp16(bits);
    if (IsNanFp16(v)) {
      CHECK(std::isnan(Fp32Value(bits)));
      CHECK(IsNanFp16(back));
      continue;
    }
    INFO("h = 0x" << std::hex << h);
    CHECK(back == v);  // exact round trip (signed zeros and Inf included)
    if ((v & 0x7c00u) != 0x7c00u && v != 0x8000u) finite.push_back({Fp32Value(bits), v});
  }
  CHECK(Fp32Value(Fp16ToFp32Bits(0x3c00)) == 1.0);
  CHECK(Fp32Value(Fp16ToFp32Bits(0x0001)) == std::ldexp(1.0, -24));
  CHECK(Fp32Value(Fp16ToFp32Bits(0x7bff)) == 65504.0);
  std::sort(finite.begin(), finite.end());
  // Every midpoint between neighbours (exact in f32), and a hair either side.
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const auto [a, ha] = finite[i];
    const auto [b, hb] = finite[i + 1];
    const float mid = static_cast<float>((a + b) / 2);
    REQUIRE(static_cast<double>(mid) == (a + b) / 2);
    INFO("between " << a << " and " << b);
    // Compared as values: a negative value rounding to zero gives -0, which
    // the table holds as +0.
    const double even = (ha & 1) == 0 ? a : b;
    CHECK(Fp16Value(Fp32BitsToFp16(Fp32Bits(mid))) == even);
    CHECK(Fp16Value(Fp32BitsToFp16(Fp32Bits(std::nextafter(mid, -INFINITY)))) == a);
    CHECK(Fp16Value(Fp32BitsToFp16(Fp32Bits(std::nextafter(mid, INFINITY)))) == b);
  }
  // Overflow: 65520 (the tie between 65504 and 2^16) goes to Inf; below it, 65504.
  CHECK(Fp32BitsToFp16(Fp32Bits(65520.0f)) == 0x7c00);
  CHECK(Fp32BitsToFp16(Fp32Bits(std::nextafter(65520.0f, 0.0f))) == 0x7bff);
  CHECK(Fp32BitsToFp16(Fp32Bits(-1e10f)) == 0xfc00);
  // Underflow: 2^-25 is the tie between 0 and the smallest subnormal (to 0);
  // anything above it rounds up, fp32 subnormals round to signed zero.
  CHECK(Fp32BitsToFp16(Fp32Bits(0x1p-25f)) == 0x0000);
  CHECK(Fp32BitsToFp16(Fp32Bits(std::nextafter(0x1p-25f, 1.0f))) == 0x0001);
  CHECK(Fp32BitsToFp16(Fp32Bits(-0x1p-26f)) == 0x8000);
  CHECK(Fp32BitsToFp16(0x80000001u) == 0x8000);
  // NaN stays NaN with its sign.
  CHECK(Fp32BitsToFp16(0x7f800001u) == 0x7e00);
  CHECK(Fp32BitsToFp16(0xffc00000u) == 0xfe00);
}

TEST_CASE("ConvertFloats converts arrays between F32, BF16 and F16") {
  const std::vector<float> values = {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-3f,
                                     1.0f + 0x1p-8f, std::numeric_limits<float>::infinity()};
  std::vector<uint8_t> f32(values.size() * 4);
  std::memcpy(f32.data(), values.data(), f32.size());
  std::vector<uint8_t> bf16(values.size() * 2), f16(values.size() * 2), back(values.size() * 4);
  ConvertFloats(DType::kF32, DType::kBF16, f32.data(), bf16.data(), values.size());
  ConvertFloats(DType::kF32, DType::kF16, f32.data(), f16.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t b, h;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    std::memcpy(&h, f16.data() + 2 * i, 2);
    CHECK(b == Fp32BitsToBf16(Fp32Bits(values[i])));
    CHECK(h == Fp32BitsToFp16(Fp32Bits(values[i])));
  }
  // BF16 -> F16 rounds once: through the exact f32 value.
  std::vector<uint8_t> f16_from_bf16(values.size() * 2);
  ConvertFloats(DType::kBF16, DType::kF16, bf16.data(), f16_from_bf16.data(), values.size());
  ConvertFloats(DType::kBF16, DType::kF32, bf16.data(), back.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t wide;
    uint16_t h;
    std::memcpy(&wide, back.data() + 4 * i, 4);
    std::memcpy(&h, f16_from_bf16.data() + 2 * i, 2);
    CHECK(h == Fp32BitsToFp16(wide));
  }
  // Same dtype: a copy.
  std::vector<uint8_t> copy(f32.size());
  ConvertFloats(DType::kF32, DType::kF32, f32.data(), copy.data(), values.size());
  CHECK(copy == f32);
  CHECK(IsConvertibleFloat(DType::kF16));
  CHECK_FALSE(IsConvertibleFloat(DType::kF64));
  CHECK_FALSE(IsConvertibleFloat(DType::kI32));
}

}  // namespace
}  // namespace zcc::format
