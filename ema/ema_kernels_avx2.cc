// The AVX2 level (the CPU must also have FMA and F16C): 8 elements per vector.
// bf16 widens with a zero-extension and a 16-bit shift, fp16 with F16C's
// vcvtph2ps; both are exact. Only functions carrying ZCC_AVX2 use these
// instructions, and GetKernels hands them out only when the CPU has them.
#include <immintrin.h>

#include "ema/ema_kernels.h"

#define ZCC_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace zcc::ema::internal {
namespace {

using format::DType;

// Loads 8 source elements from `p` (any alignment) as fp32 bit patterns.
template <DType kDType>
ZCC_AVX2 inline __m256i LoadBits8(const unsigned char* p) {
  if constexpr (kDType == DType::kF32) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else if constexpr (kDType == DType::kBF16) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16);
  } else {
    static_assert(kDType == DType::kF16);
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castps_si256(_mm256_cvtph_ps(half));
  }
}

template <DType kDType>
constexpr size_t kSourceBytes = kDType == DType::kF32 ? 4 : 2;

// All-ones lanes where the fp32 exponent bits are all ones.
ZCC_AVX2 inline __m256i NonFiniteLanes(__m256i bits) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
}

ZCC_AVX2 inline bool AnyLane(__m256i lanes) { return !_mm256_testz_si256(lanes, lanes); }

template <DType kDType, bool kStream>
ZCC_AVX2 bool UpdateBody(const unsigned char* src, const float* in, float* out, size_t begin,
                         size_t end, float decay, float one_minus_decay) {
  const __m256 vdecay = _mm256_set1_ps(decay);
  const __m256 vrest = _mm256_set1_ps(one_minus_decay);
  __m256i nonfinite = _mm256_setzero_si256();
  for (size_t i = begin; i < end; i += 8) {
    const __m256i bits = LoadBits8<kDType>(src + i * kSourceBytes<kDType>);
    nonfinite = _mm256_or_si256(nonfinite, NonFiniteLanes(bits));
    const __m256 kept = _mm256_mul_ps(vdecay, _mm256_loadu_ps(in + i));
    const __m256 added = _mm256_mul_ps(vrest, _mm256_castsi256_ps(bits));
    if constexpr (kStream) {
      _mm256_stream_ps(out + i, _mm256_add_ps(kept, added));
    } else {
      _mm256_store_ps(out + i, _mm256_add_ps(kept, added));
    }
  }
  return AnyLane(nonfinite);
}

template <DType kDType>
ZCC_AVX2 bool Update(const void* src, const float* in, float* out, size_t n, float decay,
                     float one_minus_decay, bool stream) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const size_t head = ElementsToAlignment(out, n);
  const size_t body_end = head + (n - head) / 8 * 8;
  bool nonfinite = ScalarUpdateRange<kDType>(src, in, out, 0, head, decay, one_minus_decay);
  if (stream) {
    nonfinite |= UpdateBody<kDType, true>(bytes, in, out, head, body_end, decay, one_minus_decay);
    _mm_sfence();
  } else {
    nonfinite |= UpdateBody<kDType, false>(bytes, in, out, head, body_end, decay, one_minus_decay);
  }
  nonfinite |= ScalarUpdateRange<kDType>(src, in, out, body_end, n, decay, one_minus_decay);
  return nonfinite;
}

template <DType kDType>
ZCC_AVX2 bool Init(const void* src, float* out, size_t n, bool stream) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const size_t head = ElementsToAlignment(out, n);
  const size_t body_end = head + (n - head) / 8 * 8;
  bool nonfinite = ScalarInitRange<kDType>(src, out, 0, head);
  __m256i lanes = _mm256_setzero_si256();
  for (size_t i = head; i < body_end; i += 8) {
    const __m256i bits = LoadBits8<kDType>(bytes + i * kSourceBytes<kDType>);
    lanes = _mm256_or_si256(lanes, NonFiniteLanes(bits));
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), bits);
    } else {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + i), bits);
    }
  }
  if (stream) _mm_sfence();
  nonfinite |= AnyLane(lanes);
  nonfinite |= ScalarInitRange<kDType>(src, out, body_end, n);
  return nonfinite;
}

template <DType kDType>
ZCC_AVX2 bool Check(const void* src, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  constexpr size_t kBlock = 1024;  // elements between early-exit tests
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    __m256i lanes = _mm256_setzero_si256();
    for (size_t j = i; j < i + kBlock; j += 8) {
      lanes = _mm256_or_si256(lanes,
                              NonFiniteLanes(LoadBits8<kDType>(bytes + j * kSourceBytes<kDType>)));
    }
    if (AnyLane(lanes)) return true;
  }
  __m256i lanes = _mm256_setzero_si256();
  for (; i + 8 <= n; i += 8) {
    lanes =
        _mm256_or_si256(lanes, NonFiniteLanes(LoadBits8<kDType>(bytes + i * kSourceBytes<kDType>)));
  }
  return AnyLane(lanes) || ScalarCheckRange<kDType>(src, i, n);
}

template <DType kDType>
Kernels Table() {
  return Kernels{&Update<kDType>, &Init<kDType>, &Check<kDType>};
}

}  // namespace

Kernels GetAvx2Kernels(format::DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return Table<DType::kBF16>();
    case DType::kF16:
      return Table<DType::kF16>();
    default:
      return Table<DType::kF32>();
  }
}

}  // namespace zcc::ema::internal
