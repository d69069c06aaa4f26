// The DeviceCopier contract as one Catch2 test suite, written once and run
// against every backend (copy/host_copier_test.cc, cuda/cuda_copier_test.cc).
//
//   TEST_CASE("HostCopier meets the DeviceCopier contract") {
//     RunCopierConformance(HostMemoryConformanceEnv(make_copier, kChunkBytes));
//   }
//
// Every property is a Catch2 SECTION, so Catch2 reruns the enclosing TEST_CASE
// once per property, each time with a fresh copier from `make_copier`.
// Destination ("staging") memory is always an anonymous shared mapping,
// registered with the copier, as the shared-memory slots are in production.
// Source memory (the trainer's tensors) comes from the environment: host heap
// memory for HostCopier, host or device memory for the CUDA backend.
#ifndef ZCC_COPY_COPIER_CONFORMANCE_H_
#define ZCC_COPY_COPIER_CONFORMANCE_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "copy/device_copier.h"

namespace zcc::testing {

struct CopierConformanceEnv {
  // Makes a fresh copier; called once per section. Must not return null.
  std::function<std::unique_ptr<DeviceCopier>()> make_copier;
  // The chunk size the copier was made with; region sizes straddle it.
  size_t chunk_bytes = 0;
  // Passed to every copier call (nullptr = the default stream).
  void* stream = nullptr;

  // Source memory: allocates / frees `n` > 0 bytes the copier can read and write.
  std::function<void*(size_t n)> alloc_source;
  std::function<void(void* source)> free_source;
  // Writes `n` host bytes into source memory as trainer work ordered on
  // `stream`; may return before the write has happened on the device.
  std::function<void(void* source, const void* host, size_t n, void* stream)> write_source;
  // Reads `n` source bytes into host memory once the work on `stream` is done.
  std::function<void(void* host, const void* source, size_t n, void* stream)> read_source;
  // Optional (both or neither): destination ("staging") memory of at least
  // `n` bytes, page aligned, for a backend that can only copy into memory
  // another process maps (daemon-pull: the slots of a registered segment).
  // Empty: an anonymous shared mapping.
  std::function<void*(size_t n)> alloc_staging;
  std::function<void(void* staging)> free_staging;
  // Optional (may be empty): delays the work issued next on `stream`, e.g. by
  // a spin kernel, so that a copy not ordered after the trainer's work, or an
  // update not fenced behind a copy, would visibly corrupt the bytes.
  std::function<void(void* stream)> stall_stream;
};

// An environment whose source memory is host heap memory written with memcpy.
CopierConformanceEnv HostMemoryConformanceEnv(
    std::function<std::unique_ptr<DeviceCopier>()> make_copier, size_t chunk_bytes);

// Runs every property of the DeviceCopier contract as a Catch2 SECTION. Call it
// from inside a TEST_CASE.
void RunCopierConformance(const CopierConformanceEnv& env);

}  // namespace zcc::testing

#endif  // ZCC_COPY_COPIER_CONFORMANCE_H_
