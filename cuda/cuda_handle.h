// Helpers shared by the nvcc-compiled files of cuda/ (the CUDA copier, the
// daemon-pull copier and puller): a runtime call's result as a Status, RAII
// owners of streams, events and host registrations, and a current-device
// guard. Needs the CUDA headers: include it from .cu files only.
#ifndef ZCC_CUDA_CUDA_HANDLE_H_
#define ZCC_CUDA_CUDA_HANDLE_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "common/status.h"
#include "cuda/cuda_status.h"

namespace zcc::cuda_internal {

// Every runtime call's result becomes a Status here. A failed call also
// leaves its error as the thread's "last error", where the trainer's own
// checks (PyTorch calls cudaGetLastError after its kernel launches) would
// find it and blame themselves; it is consumed here. Sticky errors (a
// corrupted context) stay: the runtime reports them to every later call.
inline absl::Status Check(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaToStatus(static_cast<int>(err), context);
}

// Owns one CUDA runtime handle and releases it with `Release` on destruction.
// Move-only. Used for streams, events and registered host memory.
template <typename T, cudaError_t (*Release)(T)>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(T handle) : handle_(handle) {}
  CudaHandle(CudaHandle&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    if (this != &other) {
      LogIfError(Reset());
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { LogIfError(Reset()); }

  T get() const { return handle_; }

  // Gives the handle up without releasing it: for handles the runtime has
  // already destroyed (cudaDeviceReset destroys a context's streams and events).
  T Abandon() { return std::exchange(handle_, T{}); }

  // Releases the handle now and reports the runtime's error, if any.
  absl::Status Reset() {
    if (handle_ == T{}) return absl::OkStatus();
    return Check(Release(std::exchange(handle_, T{})),
                 "releasing a CUDA stream, event or host registration");
  }

 private:
  static void LogIfError(const absl::Status& status) {
    if (!status.ok()) ZCC_LOG(WARNING) << status;
  }

  T handle_{};
};

using CudaStream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using CudaEvent = CudaHandle<cudaEvent_t, cudaEventDestroy>;
// Host memory pinned by cudaHostRegister; the handle is the registered base.
using HostRegistration = CudaHandle<void*, cudaHostUnregister>;
// Host memory from cudaMallocHost.
using PinnedAllocation = CudaHandle<void*, cudaFreeHost>;

inline absl::StatusOr<CudaEvent> NewEvent(unsigned flags) {
  cudaEvent_t event = nullptr;
  ZCC_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags"));
  return CudaEvent(event);
}

// Makes `device` current on the calling thread for the guard's lifetime: the
// runtime's current device is per thread, and the caller may use another one.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : status_(Enter(device)) {}
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  absl::Status Enter(int device) {
    ZCC_RETURN_IF_ERROR(Check(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (previous_ == device) return absl::OkStatus();
    ZCC_RETURN_IF_ERROR(Check(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
    restore_ = true;
    return absl::OkStatus();
  }

  // Initialised before status_, which Enter() computes.
  int previous_ = 0;
  bool restore_ = false;
  absl::Status status_;
};

// nullptr names the legacy default stream, whatever this file was compiled with.
inline cudaStream_t CallerStream(void* stream) {
  return stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
}

// cuMemGetAddressRange (v2), reached through the runtime so that nothing
// here links against libcuda: the allocation that holds a device address
// (the trainer's side finds what to export; zccd's side how much an
// imported handle really maps).
using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

inline absl::StatusOr<GetAddressRangeFn> LoadGetAddressRange() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  ZCC_RETURN_IF_ERROR(Check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                             cudaEnableDefault, &found),
                            "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)"));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::FailedPreconditionError(
        "the CUDA driver has no cuMemGetAddressRange; daemon-pull needs a driver for CUDA 12 or "
        "newer");
  }
  return reinterpret_cast<GetAddressRangeFn>(fn);
}

}  // namespace zcc::cuda_internal

#endif  // ZCC_CUDA_CUDA_HANDLE_H_
