// The AVX-512 level (F + BW): 16 elements per vector. bf16 widens with a
// zero-extension and a 16-bit shift, fp16 with vcvtph2ps (F16C's 512-bit form
// in AVX-512F); both are exact. Only functions carrying ZCC_AVX512 use these
// instructions, and GetKernels hands them out only when the CPU has them.
#include <immintrin.h>

#include "ema/ema_kernels.h"

#define ZCC_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace zcc::ema::internal {
namespace {

using format::DType;

// All 16 lanes. The zero-masked intrinsics with a full mask compile to the
// plain instructions; the plain intrinsics trip GCC 12's false
// -Wmaybe-uninitialized on _mm512_undefined_epi32() (GCC PR 105593).
constexpr __mmask16 kAllLanes = 0xffff;

// Loads 16 source elements from `p` (any alignment) as fp32 bit patterns.
template <DType kDType>
ZCC_AVX512 inline __m512i LoadBits16(const unsigned char* p) {
  if constexpr (kDType == DType::kF32) {
    return _mm512_loadu_si512(p);
  } else if constexpr (kDType == DType::kBF16) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_maskz_slli_epi32(kAllLanes, _mm512_maskz_cvtepu16_epi32(kAllLanes, half), 16);
  } else {
    static_assert(kDType == DType::kF16);
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castps_si512(_mm512_maskz_cvtph_ps(kAllLanes, half));
  }
}

template <DType kDType>
constexpr size_t kSourceBytes = kDType == DType::kF32 ? 4 : 2;

ZCC_AVX512 inline __mmask16 NonFiniteLanes(__m512i bits) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
}

template <DType kDType, bool kStream>
ZCC_AVX512 bool UpdateBody(const unsigned char* src, const float* in, float* out, size_t begin,
                           size_t end, float decay, float one_minus_decay) {
  const __m512 vdecay = _mm512_set1_ps(decay);
  const __m512 vrest = _mm512_set1_ps(one_minus_decay);
  __mmask16 nonfinite = 0;
  for (size_t i = begin; i < end; i += 16) {
    const __m512i bits = LoadBits16<kDType>(src + i * kSourceBytes<kDType>);
    nonfinite |= NonFiniteLanes(bits);
    const __m512 kept = _mm512_mul_ps(vdecay, _mm512_loadu_ps(in + i));
    const __m512 added = _mm512_mul_ps(vrest, _mm512_castsi512_ps(bits));
    if constexpr (kStream) {
      _mm512_stream_ps(out + i, _mm512_add_ps(kept, added));
    } else {
      _mm512_store_ps(out + i, _mm512_add_ps(kept, added));
    }
  }
  return nonfinite != 0;
}

template <DType kDType>
ZCC_AVX512 bool Update(const void* src, const float* in, float* out, size_t n, float decay,
                       float one_minus_decay, bool stream) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const size_t head = ElementsToAlignment(out, n);
  const size_t body_end = head + (n - head) / 16 * 16;
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
ZCC_AVX512 bool Init(const void* src, float* out, size_t n, bool stream) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const size_t head = ElementsToAlignment(out, n);
  const size_t body_end = head + (n - head) / 16 * 16;
  bool nonfinite = ScalarInitRange<kDType>(src, out, 0, head);
  __mmask16 lanes = 0;
  for (size_t i = head; i < body_end; i += 16) {
    const __m512i bits = LoadBits16<kDType>(bytes + i * kSourceBytes<kDType>);
    lanes |= NonFiniteLanes(bits);
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i), bits);
    } else {
      _mm512_store_si512(out + i, bits);
    }
  }
  if (stream) _mm_sfence();
  nonfinite |= lanes != 0;
  nonfinite |= ScalarInitRange<kDType>(src, out, body_end, n);
  return nonfinite;
}

template <DType kDType>
ZCC_AVX512 bool Check(const void* src, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  constexpr size_t kBlock = 1024;  // elements between early-exit tests
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    __mmask16 lanes = 0;
    for (size_t j = i; j < i + kBlock; j += 16) {
      lanes |= NonFiniteLanes(LoadBits16<kDType>(bytes + j * kSourceBytes<kDType>));
    }
    if (lanes != 0) return true;
  }
  __mmask16 lanes = 0;
  for (; i + 16 <= n; i += 16) {
    lanes |= NonFiniteLanes(LoadBits16<kDType>(bytes + i * kSourceBytes<kDType>));
  }
  return lanes != 0 || ScalarCheckRange<kDType>(src, i, n);
}

template <DType kDType>
Kernels Table() {
  return Kernels{&Update<kDType>, &Init<kDType>, &Check<kDType>};
}

}  // namespace

Kernels GetAvx512Kernels(format::DType dtype) {
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
