// The portable level: plain loops over the shared scalar building blocks.
#include "ema/ema_kernels.h"

namespace zcc::ema::internal {
namespace {

template <format::DType kDType>
bool Update(const void* src, const float* in, float* out, size_t n, float decay,
            float one_minus_decay, bool /*stream*/) {
  return ScalarUpdateRange<kDType>(src, in, out, 0, n, decay, one_minus_decay);
}

template <format::DType kDType>
bool Init(const void* src, float* out, size_t n, bool /*stream*/) {
  return ScalarInitRange<kDType>(src, out, 0, n);
}

template <format::DType kDType>
bool Check(const void* src, size_t n) {
  return ScalarCheckRange<kDType>(src, 0, n);
}

template <format::DType kDType>
Kernels Table() {
  return Kernels{&Update<kDType>, &Init<kDType>, &Check<kDType>};
}

}  // namespace

Kernels GetScalarKernels(format::DType dtype) {
  switch (dtype) {
    case format::DType::kBF16:
      return Table<format::DType::kBF16>();
    case format::DType::kF16:
      return Table<format::DType::kF16>();
    default:
      return Table<format::DType::kF32>();
  }
}

}  // namespace zcc::ema::internal
