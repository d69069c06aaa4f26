#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace zcc {
namespace {

absl::StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInitializationError:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorNoDevice:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorCudartUnloading:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kNotFound;
    case cudaErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    case cudaErrorNotPermitted:
      return absl::StatusCode::kPermissionDenied;
    case cudaErrorTimeout:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      // Includes the sticky errors (cudaErrorIllegalAddress, cudaErrorLaunchFailure,
      // cudaErrorECCUncorrectable, ...) after which the process must restart.
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaToStatus(int cuda_error, absl::string_view context) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::Status(CodeFor(err), absl::StrCat(context, ": ", cudaGetErrorName(err), " (",
                                                 cuda_error, "): ", cudaGetErrorString(err)));
}

}  // namespace zcc
