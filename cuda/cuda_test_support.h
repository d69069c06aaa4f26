// Device memory, streams and delays for the CUDA copier tests, behind a plain
// C++ header so that the tests compile with gcc. Test-only; CUDA builds only.
#ifndef ZCC_CUDA_CUDA_TEST_SUPPORT_H_
#define ZCC_CUDA_CUDA_TEST_SUPPORT_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zcc::cuda_testing {

// cudaMalloc / cudaFree on the current device.
absl::StatusOr<void*> DeviceAlloc(size_t n);
absl::Status DeviceFree(void* device_ptr);

// A non-blocking stream on the current device, standing in for the trainer's.
absl::StatusOr<void*> NewStream();
absl::Status DestroyStream(void* stream);

// Reads `n` bytes of device memory once every piece of work issued on
// `stream` (nullptr = legacy default stream) so far has finished.
absl::Status Download(void* host, const void* device_ptr, size_t n, void* stream);

// Occupies `stream` for about `milliseconds` with a spinning kernel, so that
// work queued behind it visibly waits.
absl::Status StallStream(void* stream, int milliseconds);

// Blocks until the work issued on `stream` so far has finished.
absl::Status SynchronizeStream(void* stream);

// cudaHostRegister / cudaHostUnregister, as another library in the trainer's
// process might pin memory behind the copier's back.
absl::Status HostRegister(void* base, size_t bytes);
absl::Status HostUnregister(void* base);

// Uploads host bytes to device memory as work on a stream, like a trainer
// kernel would write them: the call returns at once even when the stream is
// stalled, because the bytes are staged in a pinned arena allocated up front
// (allocating pinned memory mid-test could synchronise the device and hide a
// missing fence). Thread-compatible. The destructor synchronises the device,
// then frees the arena.
class PinnedUploads {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedUploads>> Create(size_t capacity);
  ~PinnedUploads();
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  // ResourceExhausted once the arena is used up.
  absl::Status UploadAsync(void* device_ptr, const void* host, size_t n, void* stream);

 private:
  PinnedUploads(void* arena, size_t capacity) : arena_(arena), capacity_(capacity) {}

  void* arena_;
  size_t capacity_;
  size_t used_ = 0;
};

// The cudaError_t values the error-mapping test needs, by name.
struct CudaErrorCodes {
  int success, invalid_value, memory_allocation, insufficient_driver, no_device,
      devices_unavailable, host_memory_already_registered, host_memory_not_registered,
      illegal_address, not_supported;
};
CudaErrorCodes GetCudaErrorCodes();

}  // namespace zcc::cuda_testing

#endif  // ZCC_CUDA_CUDA_TEST_SUPPORT_H_
