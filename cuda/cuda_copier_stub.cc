// The CPU-only stand-in for cuda_copier.cu, linked with --config=nocuda.
#include "absl/status/status.h"
#include "cuda/cuda_copier.h"

namespace zcc {

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(const CudaCopierOptions&) {
  return absl::UnimplementedError("built without CUDA (--config=nocuda)");
}

bool CudaDeviceAvailable() { return false; }

}  // namespace zcc
