#include "ema/ema_kernels.h"

namespace zcc::ema::internal {

bool IsSupportedSourceDType(format::DType dtype) {
  return dtype == format::DType::kF32 || dtype == format::DType::kBF16 ||
         dtype == format::DType::kF16;
}

Kernels GetKernels(Isa isa, format::DType dtype) {
  switch (isa) {
    case Isa::kAvx512:
      return GetAvx512Kernels(dtype);
    case Isa::kAvx2:
      return GetAvx2Kernels(dtype);
    case Isa::kAuto:
    case Isa::kScalar:
      break;
  }
  return GetScalarKernels(dtype);
}

}  // namespace zcc::ema::internal
