#include "format/float_convert.h"

#include <cassert>
#include <cstring>

namespace zcc::format {
namespace {

// The scalar conversions, inline so that the array loops below compile to
// straight-line (vectorisable) code; the public functions wrap them.

inline uint16_t Bf16FromFp32(uint32_t x) {
  // Round to nearest even: adding 0x7fff plus the lowest kept bit carries
  // into the kept half exactly when the dropped half is above one half, or
  // is one half and the kept half is odd. The carry runs into the exponent,
  // so the largest finite values become Inf, as they should.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  // NaN: rounding could carry it into the sign, truncating clear every
  // payload bit (making it Inf); keep it a quiet NaN with its sign.
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? (x >> 16) | 0x0040u : rounded);
}

// Rounds `value` >> `shift` to nearest, ties to even (1 <= shift <= 31).
inline uint32_t ShiftRoundEven(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
}

inline uint16_t Fp16FromFp32(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exponent = (x >> 23) & 0xffu;
  const uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xff) {  // Inf, or NaN (kept quiet, with its top payload bits)
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa != 0 ? 0x0200u | (mantissa >> 13) : 0));
  }
  const int e = static_cast<int>(exponent) - 127 + 15;  // the binary16 biased exponent
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e >= 1) {
    // Normal: 10 of the 23 fraction bits, rounded; a carry out of the
    // fraction bumps the exponent (to Inf from the largest finite values).
    return static_cast<uint16_t>(sign |
                                 ShiftRoundEven((static_cast<uint32_t>(e) << 23) | mantissa, 13));
  }
  // Subnormal or zero in binary16: the value is m * 2^-24; with the implicit
  // bit, the fp32 significand M (24 bits) gives m = M >> (14 - e), rounded.
  // Below 2^-25 (e < -10) everything rounds to zero, fp32 subnormals included.
  if (e < -10) return static_cast<uint16_t>(sign);
  const uint32_t significand = mantissa | 0x800000u;
  return static_cast<uint16_t>(sign | ShiftRoundEven(significand, static_cast<uint32_t>(14 - e)));
}


template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

template <DType kFrom>
uint32_t LoadAsFp32Bits(const uint8_t* p) {
  if constexpr (kFrom == DType::kF32) {
    return Load<uint32_t>(p);
  } else if constexpr (kFrom == DType::kBF16) {
    return uint32_t{Load<uint16_t>(p)} << 16;
  } else {
    return Fp16ToFp32Bits(Load<uint16_t>(p));
  }
}

template <DType kTo>
void StoreFromFp32Bits(uint8_t* p, uint32_t bits) {
  if constexpr (kTo == DType::kF32) {
    Store<uint32_t>(p, bits);
  } else if constexpr (kTo == DType::kBF16) {
    Store<uint16_t>(p, Bf16FromFp32(bits));
  } else {
    Store<uint16_t>(p, Fp16FromFp32(bits));
  }
}

// One loop per (from, to) pair, so that the element conversion is inlined.
template <DType kFrom, DType kTo>
void ConvertLoop(const uint8_t* src, uint8_t* dst, size_t n) {
  constexpr size_t kIn = kFrom == DType::kF32 ? 4 : 2;
  constexpr size_t kOut = kTo == DType::kF32 ? 4 : 2;
  for (size_t i = 0; i < n; ++i) {
    StoreFromFp32Bits<kTo>(dst + i * kOut, LoadAsFp32Bits<kFrom>(src + i * kIn));
  }
}

template <DType kFrom>
void ConvertFrom(DType to, const uint8_t* src, uint8_t* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      return ConvertLoop<kFrom, DType::kF32>(src, dst, n);
    case DType::kBF16:
      return ConvertLoop<kFrom, DType::kBF16>(src, dst, n);
    default:
      return ConvertLoop<kFrom, DType::kF16>(src, dst, n);
  }
}

}  // namespace

bool IsConvertibleFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

uint16_t Fp32BitsToBf16(uint32_t fp32_bits) { return Bf16FromFp32(fp32_bits); }
uint32_t Bf16ToFp32Bits(uint16_t bf16) { return uint32_t{bf16} << 16; }
uint16_t Fp32BitsToFp16(uint32_t fp32_bits) { return Fp16FromFp32(fp32_bits); }

void ConvertFloats(DType from, DType to, const uint8_t* src, uint8_t* dst, size_t n) {
  assert(IsConvertibleFloat(from) && IsConvertibleFloat(to));
  if (from == to) {
    if (src != dst) std::memcpy(dst, src, n * DTypeSize(from));
    return;
  }
  switch (from) {
    case DType::kF32:
      return ConvertFrom<DType::kF32>(to, src, dst, n);
    case DType::kBF16:
      return ConvertFrom<DType::kBF16>(to, src, dst, n);
    default:
      return ConvertFrom<DType::kF16>(to, src, dst, n);
  }
}

}  // namespace zcc::format
