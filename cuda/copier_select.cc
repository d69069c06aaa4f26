#include "cuda/copier_select.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "copy/host_copier.h"
#include "cuda/cuda_copier.h"

namespace zcc {
namespace {

absl::StatusOr<std::shared_ptr<DeviceCopier>> NewHost(size_t chunk_bytes) {
  HostCopierOptions options;
  options.chunk_bytes = chunk_bytes;
  absl::StatusOr<std::unique_ptr<HostCopier>> copier = HostCopier::Create(options);
  if (!copier.ok()) return copier.status();
  return std::shared_ptr<DeviceCopier>(*std::move(copier));
}

// Errors meaning this process cannot use CUDA at all, so that the trainer's
// tensors cannot be device memory either.
bool CudaUnusableHere(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:  // No device, no or old driver.
    case absl::StatusCode::kUnavailable:         // Devices held by other processes.
    case absl::StatusCode::kUnimplemented:       // Built with --config=nocuda.
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceCopier>> SelectDeviceCopier(const CopierSelection& selection) {
  if (selection.backend == CopierSelection::Backend::kHost) {
    return NewHost(selection.chunk_bytes);
  }
  CudaCopierOptions options;
  options.device = selection.device;
  options.chunk_bytes = selection.chunk_bytes;
  absl::StatusOr<std::unique_ptr<DeviceCopier>> cuda = NewCudaCopier(options);
  if (cuda.ok()) {
    ZCC_LOG(DEBUG) << "zcc: CUDA copy backend on device " << selection.device;
    return std::shared_ptr<DeviceCopier>(*std::move(cuda));
  }
  if (selection.backend == CopierSelection::Backend::kCuda || !CudaUnusableHere(cuda.status())) {
    return cuda.status();
  }
  absl::StatusOr<std::shared_ptr<DeviceCopier>> host = NewHost(selection.chunk_bytes);
  if (!host.ok()) return host.status();
  ZCC_LOG(WARNING) << "zcc: no usable CUDA device (" << cuda.status().message()
                   << "); using the host copy backend";
  return host;
}

absl::StatusOr<CopierSelection::Backend> ParseCopierBackend(absl::string_view name) {
  if (name == "auto") return CopierSelection::Backend::kAuto;
  if (name == "host") return CopierSelection::Backend::kHost;
  if (name == "cuda") return CopierSelection::Backend::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown copy backend \"", name, "\" (expected auto, host or cuda)"));
}

}  // namespace zcc
