// The CUDA work of the GPU benchmark (bench/gpu/gpu_bench.cc), behind a plain C++
// header: device queries, memory, streams, plain copies and the two kernels
// of the synthetic training step. Streams are void* (cudaStream_t). Every
// function acts on the calling thread's current device. Thread-compatible.
#ifndef ZCC_BENCH_GPU_GPU_BENCH_CUDA_H_
#define ZCC_BENCH_GPU_GPU_BENCH_CUDA_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zcc::gpu_bench {

struct DeviceDescription {
  std::string name;
  int driver_version = 0;  // e.g. 13000
  int runtime_version = 0;
  size_t total_memory = 0;
};

absl::StatusOr<int> DeviceCount();
absl::StatusOr<DeviceDescription> Describe(int device);
absl::Status SetDevice(int device);

absl::StatusOr<void*> DeviceAlloc(size_t bytes);
absl::Status DeviceFree(void* p);
// Page-locked host memory from cudaMallocHost.
absl::StatusOr<void*> PinnedAlloc(size_t bytes);
absl::Status PinnedFree(void* p);

// A non-blocking stream of the default priority.
absl::StatusOr<void*> NewStream();
absl::Status DestroyStream(void* stream);
absl::Status Synchronize(void* stream);

// cudaMemcpyAsync(cudaMemcpyDefault) on `stream`.
absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream);
// cudaMemsetAsync.
absl::Status Fill(void* device_ptr, int value, size_t bytes, void* stream);

// `count` products C = A * B of n x n fp32 matrices (a tiled kernel), queued
// on `stream`: the forward/backward of the synthetic step.
absl::Status Matmuls(const float* a, const float* b, float* c, int n, int count, void* stream);
// p = 0.999 p + 0.001 over `bytes` / 4 floats: the optimizer step, which
// writes every parameter the snapshot reads.
absl::Status UpdateParams(void* params, size_t bytes, void* stream);

}  // namespace zcc::gpu_bench

#endif  // ZCC_BENCH_GPU_GPU_BENCH_CUDA_H_
