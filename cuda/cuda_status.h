// cudaError_t -> absl::Status, in this one place. A plain C++ header (the error
// is passed as an int) so that code compiled without nvcc can include it.
#ifndef ZCC_CUDA_CUDA_STATUS_H_
#define ZCC_CUDA_CUDA_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zcc {

// OK for cudaSuccess; otherwise the closest absl code, with `context`, the
// error's name, number and description in the message:
//   "cudaHostRegister of 4096 bytes: cudaErrorHostMemoryAlreadyRegistered (712): ..."
// No usable driver or device (stub libcuda, too old a driver, no GPU) maps to
// FailedPrecondition, a device held by another process to Unavailable, out of
// memory to ResourceExhausted, bad arguments to InvalidArgument, and errors
// that poison the CUDA context (illegal address, ECC, launch failure) to Internal.
absl::Status CudaToStatus(int cuda_error, absl::string_view context);

}  // namespace zcc

#endif  // ZCC_CUDA_CUDA_STATUS_H_
