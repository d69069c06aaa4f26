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
uint32_t Fp16ToFp32Bits(uint16_t fp16);

// Converts `n` elements of dtype `from` at `src` to dtype `to` at `dst`
// (little-endian, any alignment; the two ranges must not overlap unless
// from == to and src == dst). Precondition: IsConvertibleFloat(from) and
// IsConvertibleFloat(to).
void ConvertFloats(DType from, DType to, const uint8_t* src, uint8_t* dst, size_t n);

}  // namespace zcc::format

#endif  // ZCC_FORMAT_FLOAT_CONVERT_H_
