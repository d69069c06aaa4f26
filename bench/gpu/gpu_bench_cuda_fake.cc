// gpu_bench_cuda.h on the fake CUDA runtime, so that the benchmark's own
// logic (ranks, barriers, slots, notifier, the report) runs in CI as a smoke
// test. "Kernels" are host work on the fake streams: a matmul sleeps, the
// parameter update runs on the CPU. The numbers it prints mean nothing.
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cuda/fake_cudart/fake_cudart.h"
#include "bench/gpu/gpu_bench_cuda.h"

namespace zcc::gpu_bench {
namespace {

absl::Status Check(int err, absl::string_view what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": fake CUDA error ", err));
}

}  // namespace

absl::StatusOr<int> DeviceCount() { return 1; }

absl::StatusOr<DeviceDescription> Describe(int device) {
  DeviceDescription d;
  d.name = absl::StrCat("zcc fake CUDA device ", device);
  d.total_memory = size_t{80} << 30;
  d.driver_version = d.runtime_version = 13000;
  return d;
}

absl::Status SetDevice(int device) {
  return device == 0 ? absl::OkStatus() : absl::InvalidArgumentError("one fake device");
}

absl::StatusOr<void*> DeviceAlloc(size_t bytes) { return fake_cudart::DeviceAlloc(bytes); }

absl::Status DeviceFree(void* p) {
  fake_cudart::DeviceFree(p);
  return absl::OkStatus();
}

// Pinned memory is not what this smoke test is about: plain heap memory.
absl::StatusOr<void*> PinnedAlloc(size_t bytes) { return ::operator new(bytes); }

absl::Status PinnedFree(void* p) {
  ::operator delete(p);
  return absl::OkStatus();
}

absl::StatusOr<void*> NewStream() {
  void* s = nullptr;
  if (absl::Status st = Check(fake_cudart::NewStream(&s), "NewStream"); !st.ok()) return st;
  return s;
}

absl::Status DestroyStream(void* stream) {
  return Check(fake_cudart::DestroyStream(stream), "DestroyStream");
}

absl::Status Synchronize(void* stream) {
  return Check(fake_cudart::SynchronizeStream(stream), "SynchronizeStream");
}

absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return Check(fake_cudart::LaunchHostWork(stream, [=] { std::memcpy(dst, src, bytes); }),
               "CopyAsync");
}

absl::Status Fill(void* device_ptr, int value, size_t bytes, void* stream) {
  return Check(fake_cudart::LaunchHostWork(stream, [=] { std::memset(device_ptr, value, bytes); }),
               "Fill");
}

absl::Status Matmuls(const float*, const float*, float*, int, int count, void* stream) {
  return Check(fake_cudart::Stall(stream, std::chrono::milliseconds(5 * count)), "Matmuls");
}

absl::Status UpdateParams(void* params, size_t bytes, void* stream) {
  return Check(fake_cudart::LaunchHostWork(stream,
                                           [=] {
                                             auto* p = static_cast<float*>(params);
                                             for (size_t i = 0; i < bytes / 4; ++i) {
                                               p[i] = 0.999f * p[i] + 0.001f;
                                             }
                                           }),
               "UpdateParams");
}

}  // namespace zcc::gpu_bench
