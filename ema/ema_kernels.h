// Internal to //ema: the element kernels behind EmaUpdater, one set per
// instruction-set level and source dtype, and the scalar conversions they
// share.
//
// Every level computes each element with the same three roundings,
//   out = fl(fl(decay * ema) + fl(one_minus_decay * x)),
// and the library is built with -ffp-contract=off so that no compiler turns
// them into a fused multiply-add. The results are therefore bit-identical
// across levels, across thread counts and between a vector body and its
// scalar tail: an EMA restored on a machine with another CPU continues
// exactly as it would have.
//
// A source element counts as non-finite when, converted to fp32, its exponent
// bits are all ones (Inf or NaN). The kernels are pure functions of their
// arguments and thread-safe.
#ifndef ZCC_EMA_EMA_KERNELS_H_
#define ZCC_EMA_EMA_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ema/ema_isa.h"
#include "format/dtype.h"
#include "format/float_convert.h"

namespace zcc::ema::internal {

// out[i] = decay * in[i] + one_minus_decay * x[i] for i < n, x = src converted
// to fp32. `in` may equal `out` (in place). With `stream`, `out` is written
// with non-temporal stores (no read-for-ownership of a buffer that is not in
// cache) followed by a store fence. `src` may have any alignment. Writes all n
// outputs; returns true if any source element is non-finite.
using UpdateKernel = bool (*)(const void* src, const float* in, float* out, size_t n, float decay,
                              float one_minus_decay, bool stream);

// out[i] = x[i] (the conversion only). Writes all n outputs; returns true if
// any source element is non-finite.
using InitKernel = bool (*)(const void* src, float* out, size_t n, bool stream);

// Returns true if any of the n source elements is non-finite (may stop at the
// first one).
using CheckKernel = bool (*)(const void* src, size_t n);

struct Kernels {
  UpdateKernel update = nullptr;
  InitKernel init = nullptr;
  CheckKernel check = nullptr;
};

// Whether EmaUpdater accepts `dtype` as a source: F32, BF16 and F16.
bool IsSupportedSourceDType(format::DType dtype);

// The kernels of `isa` for sources of `dtype`. Preconditions:
// IsaSupported(isa), isa != kAuto, IsSupportedSourceDType(dtype).
Kernels GetKernels(Isa isa, format::DType dtype);

// Per-level tables, defined in ema_kernels_<level>.cc.
Kernels GetScalarKernels(format::DType dtype);
Kernels GetAvx2Kernels(format::DType dtype);
Kernels GetAvx512Kernels(format::DType dtype);

// ---- Scalar building blocks (also the reference for the vector levels) ----

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline bool IsNonFiniteBits(uint32_t fp32_bits) { return (fp32_bits & 0x7f800000u) == 0x7f800000u; }

// bfloat16 is the upper half of an fp32: exact, NaN payloads kept as they are.
inline uint32_t BFloat16ToFloatBits(uint16_t b) { return uint32_t{b} << 16; }

// IEEE binary16 to binary32, exact (format::Fp16ToFp32Bits, shared with
// export's conversions).
inline uint32_t HalfToFloatBits(uint16_t h) { return format::Fp16ToFp32Bits(h); }

// Loads source element i of a (possibly unaligned) array and returns its fp32 bits.
template <format::DType kDType>
inline uint32_t LoadSourceBits(const void* src, size_t i) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  if constexpr (kDType == format::DType::kF32) {
    uint32_t bits;
    std::memcpy(&bits, bytes + 4 * i, 4);
    return bits;
  } else {
    uint16_t half;
    std::memcpy(&half, bytes + 2 * i, 2);
    if constexpr (kDType == format::DType::kBF16) {
      return BFloat16ToFloatBits(half);
    } else {
      static_assert(kDType == format::DType::kF16);
      return HalfToFloatBits(half);
    }
  }
}

// The one EMA step every level computes (see the file comment).
inline float EmaStep(float ema, float x, float decay, float one_minus_decay) {
  const float kept = decay * ema;
  const float added = one_minus_decay * x;
  return kept + added;
}

// Scalar loops over [begin, end), used for the scalar level and for the
// unaligned heads and the tails of the vector levels.
template <format::DType kDType>
inline bool ScalarUpdateRange(const void* src, const float* in, float* out, size_t begin,
                              size_t end, float decay, float one_minus_decay) {
  uint32_t nonfinite = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint32_t bits = LoadSourceBits<kDType>(src, i);
    nonfinite |= static_cast<uint32_t>(IsNonFiniteBits(bits));
    out[i] = EmaStep(in[i], BitsToFloat(bits), decay, one_minus_decay);
  }
  return nonfinite != 0;
}

template <format::DType kDType>
inline bool ScalarInitRange(const void* src, float* out, size_t begin, size_t end) {
  uint32_t nonfinite = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint32_t bits = LoadSourceBits<kDType>(src, i);
    nonfinite |= static_cast<uint32_t>(IsNonFiniteBits(bits));
    out[i] = BitsToFloat(bits);
  }
  return nonfinite != 0;
}

template <format::DType kDType>
inline bool ScalarCheckRange(const void* src, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    if (IsNonFiniteBits(LoadSourceBits<kDType>(src, i))) return true;
  }
  return false;
}

// Elements before `out` reaches a 64-byte boundary (at most n).
inline size_t ElementsToAlignment(const float* out, size_t n) {
  const size_t misalignment = reinterpret_cast<uintptr_t>(out) & 63u;
  const size_t head = misalignment == 0 ? 0 : (64 - misalignment) / sizeof(float);
  // A float pointer that is not 4-byte aligned never reaches 64 bytes by
  // whole elements; the caller then runs everything scalar.
  if ((misalignment & 3u) != 0) return n;
  return head < n ? head : n;
}

}  // namespace zcc::ema::internal

#endif  // ZCC_EMA_EMA_KERNELS_H_
