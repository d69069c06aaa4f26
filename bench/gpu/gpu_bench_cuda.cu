#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_status.h"
#include "bench/gpu/gpu_bench_cuda.h"

namespace zcc::gpu_bench {
namespace {

absl::Status Check(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaToStatus(static_cast<int>(err), context);
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

constexpr int kTile = 32;

// C = A * B, n x n, row-major; one kTile x kTile tile of C per block, each
// thread computing a column strip of kTile / 8 outputs.
__global__ void MatmulKernel(const float* __restrict__ a, const float* __restrict__ b,
                             float* __restrict__ c, int n) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile + 1];
  constexpr int kRows = kTile / 8;  // blockDim = (kTile, 8)
  const int col = blockIdx.x * kTile + threadIdx.x;
  const int row0 = blockIdx.y * kTile + threadIdx.y * kRows;
  float acc[kRows] = {};
  for (int k0 = 0; k0 < n; k0 += kTile) {
    for (int r = 0; r < kRows; ++r) {
      const int tr = threadIdx.y * kRows + r;
      const int ar = blockIdx.y * kTile + tr, ac = k0 + threadIdx.x;
      as[tr][threadIdx.x] = (ar < n && ac < n) ? a[static_cast<int64_t>(ar) * n + ac] : 0.f;
      const int br = k0 + tr;
      bs[tr][threadIdx.x] = (br < n && col < n) ? b[static_cast<int64_t>(br) * n + col] : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kTile; ++k) {
      const float bv = bs[k][threadIdx.x];
      for (int r = 0; r < kRows; ++r) acc[r] += as[threadIdx.y * kRows + r][k] * bv;
    }
    __syncthreads();
  }
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + r;
    if (row < n && col < n) c[static_cast<int64_t>(row) * n + col] = acc[r];
  }
}

__global__ void UpdateKernel(float* p, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = 0.999f * p[i] + 0.001f;
  }
}

}  // namespace

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  if (absl::Status st = Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) {
    return st;
  }
  return count;
}

absl::StatusOr<DeviceDescription> Describe(int device) {
  cudaDeviceProp prop;
  if (absl::Status st = Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
      !st.ok()) {
    return st;
  }
  DeviceDescription d;
  d.name = prop.name;
  d.total_memory = prop.totalGlobalMem;
  (void)cudaDriverGetVersion(&d.driver_version);
  (void)cudaRuntimeGetVersion(&d.runtime_version);
  return d;
}

absl::Status SetDevice(int device) { return Check(cudaSetDevice(device), "cudaSetDevice"); }

absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (absl::Status st = Check(cudaMalloc(&p, bytes), "cudaMalloc"); !st.ok()) return st;
  return p;
}

absl::Status DeviceFree(void* p) { return Check(cudaFree(p), "cudaFree"); }

absl::StatusOr<void*> PinnedAlloc(size_t bytes) {
  void* p = nullptr;
  if (absl::Status st = Check(cudaMallocHost(&p, bytes), "cudaMallocHost"); !st.ok()) return st;
  return p;
}

absl::Status PinnedFree(void* p) { return Check(cudaFreeHost(p), "cudaFreeHost"); }

absl::StatusOr<void*> NewStream() {
  cudaStream_t s = nullptr;
  if (absl::Status st =
          Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !st.ok()) {
    return st;
  }
  return static_cast<void*>(s);
}

absl::Status DestroyStream(void* stream) {
  return Check(cudaStreamDestroy(AsStream(stream)), "cudaStreamDestroy");
}

absl::Status Synchronize(void* stream) {
  return Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)),
               "cudaMemcpyAsync");
}

absl::Status Fill(void* device_ptr, int value, size_t bytes, void* stream) {
  return Check(cudaMemsetAsync(device_ptr, value, bytes, AsStream(stream)), "cudaMemsetAsync");
}

absl::Status Matmuls(const float* a, const float* b, float* c, int n, int count, void* stream) {
  const dim3 block(kTile, 8);
  const dim3 grid((n + kTile - 1) / kTile, (n + kTile - 1) / kTile);
  for (int i = 0; i < count; ++i) {
    MatmulKernel<<<grid, block, 0, AsStream(stream)>>>(a, b, c, n);
  }
  return Check(cudaGetLastError(), "launching MatmulKernel");
}

absl::Status UpdateParams(void* params, size_t bytes, void* stream) {
  const size_t count = bytes / sizeof(float);
  if (count == 0) return absl::OkStatus();
  UpdateKernel<<<1024, 256, 0, AsStream(stream)>>>(static_cast<float*>(params), count);
  return Check(cudaGetLastError(), "launching UpdateKernel");
}

}  // namespace zcc::gpu_bench
