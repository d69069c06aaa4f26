// Conversions between the floating dtypes a checkpoint is exported in: F32,
// BF16 and F16 (format::DType). Narrowing rounds to nearest, ties to even;
// overflow becomes Inf; NaN stays NaN (sign and the top payload bits kept,
// quiet bit set); Inf and signed zeros are kept. Widening is exact. BF16 <->
// F16 go through F32, which holds both exactly, so they round once too.
//
// Pure functions of their arguments: thread-safe, no state.
#ifndef ZCC_FORMAT_FLOAT_CONVERT_H_
#define ZCC_FORMAT_FLOAT_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "format/dtype.h"

namespace zcc::format {

// F32, BF16 and F16: the dtypes ConvertFloats converts between.
bool IsConvertibleFloat(DType dtype);

// Bit-level conversions (an F32 as its uint32 bits, a BF16 or F16 as its
// uint16 bits).
uint16_t Fp32BitsToBf16(uint32_t fp32_bits);
uint32_t Bf16ToFp32Bits(uint16_t bf16);
uint16_t Fp32BitsToFp16(uint32_t fp32_bits);

// IEEE binary16 to binary32, exact: subnormals are normalised, Inf stays Inf,
// and a NaN keeps its sign and payload with the quiet bit set (as F16C's
// vcvtph2ps does). Inline: the EMA's scalar kernel converts with it too, so
// that every path converts NaNs identically.
inline uint32_t Fp16ToFp32Bits(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    return sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  }
  if (exponent != 0) return sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  if (mantissa == 0) return sign;
  // Subnormal: mantissa * 2^-24. With its top set bit at position p (0..9) the
  // value is 1.f * 2^(p - 24); the bits below p become the fp32 fraction.
  const int p = 31 - __builtin_clz(mantissa);
  return sign | (static_cast<uint32_t>(p + 127 - 24) << 23) |
         ((mantissa << (23 - p)) & 0x007fffffu);
}

// Converts `n` elements of dtype `from` at `src` to dtype `to` at `dst`
// (little-endian, any alignment; the two ranges must not overlap unless
// from == to and src == dst). Precondition: IsConvertibleFloat(from) and
// IsConvertibleFloat(to).
void ConvertFloats(DType from, DType to, const uint8_t* src, uint8_t* dst, size_t n);

}  // namespace zcc::format

#endif  // ZCC_FORMAT_FLOAT_CONVERT_H_
