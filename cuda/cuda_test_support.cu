#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/cuda_status.h"
#include "cuda/cuda_test_support.h"

namespace zcc::cuda_testing {
namespace {

absl::Status Check(cudaError_t err, absl::string_view context) {
  return CudaToStatus(static_cast<int>(err), context);
}

cudaStream_t AsStream(void* stream) {
  return stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
}

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < nanoseconds) __nanosleep(10000);
}

}  // namespace

absl::StatusOr<void*> DeviceAlloc(size_t n) {
  void* p = nullptr;
  if (absl::Status st = Check(cudaMalloc(&p, n), "cudaMalloc"); !st.ok()) return st;
  return p;
}

absl::Status DeviceFree(void* device_ptr) { return Check(cudaFree(device_ptr), "cudaFree"); }

absl::StatusOr<void*> NewStream() {
  cudaStream_t stream = nullptr;
  if (absl::Status st = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags");
      !st.ok()) {
    return st;
  }
  return static_cast<void*>(stream);
}

absl::Status DestroyStream(void* stream) {
  return Check(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}

absl::Status Download(void* host, const void* device_ptr, size_t n, void* stream) {
  if (absl::Status st = Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
      !st.ok()) {
    return st;
  }
  return Check(cudaMemcpy(host, device_ptr, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

absl::Status StallStream(void* stream, int milliseconds) {
  SpinKernel<<<1, 1, 0, AsStream(stream)>>>(static_cast<uint64_t>(milliseconds) * 1000000);
  return Check(cudaGetLastError(), "launching SpinKernel");
}

absl::Status SynchronizeStream(void* stream) {
  return Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

absl::Status HostRegister(void* base, size_t bytes) {
  return Check(cudaHostRegister(base, bytes, cudaHostRegisterPortable), "cudaHostRegister");
}

absl::Status HostUnregister(void* base) {
  return Check(cudaHostUnregister(base), "cudaHostUnregister");
}

absl::StatusOr<std::unique_ptr<PinnedUploads>> PinnedUploads::Create(size_t capacity) {
  void* arena = nullptr;
  if (absl::Status st = Check(cudaMallocHost(&arena, capacity), "cudaMallocHost"); !st.ok()) {
    return st;
  }
  return std::unique_ptr<PinnedUploads>(new PinnedUploads(arena, capacity));
}

PinnedUploads::~PinnedUploads() {
  cudaDeviceSynchronize();  // Uploads may still read the arena.
  cudaFreeHost(arena_);
}

absl::Status PinnedUploads::UploadAsync(void* device_ptr, const void* host, size_t n,
                                        void* stream) {
  constexpr size_t kAlign = 256;
  if (n > capacity_ - used_) {
    return absl::ResourceExhaustedError("PinnedUploads: arena used up; make it larger");
  }
  char* staged = static_cast<char*>(arena_) + used_;
  used_ += (n + kAlign - 1) / kAlign * kAlign;
  used_ = used_ > capacity_ ? capacity_ : used_;
  std::memcpy(staged, host, n);
  return Check(cudaMemcpyAsync(device_ptr, staged, n, cudaMemcpyHostToDevice, AsStream(stream)),
               "cudaMemcpyAsync H2D");
}

CudaErrorCodes GetCudaErrorCodes() {
  return {cudaSuccess,
          cudaErrorInvalidValue,
          cudaErrorMemoryAllocation,
          cudaErrorInsufficientDriver,
          cudaErrorNoDevice,
          cudaErrorDevicesUnavailable,
          cudaErrorHostMemoryAlreadyRegistered,
          cudaErrorHostMemoryNotRegistered,
          cudaErrorIllegalAddress,
          cudaErrorNotSupported};
}

}  // namespace zcc::cuda_testing
