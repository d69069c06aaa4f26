// The CUDA DeviceCopier backend, behind a plain C++ header: nothing here needs
// CUDA headers or nvcc, so the client library and its tests build everywhere.
//
// Snapshot copies run on a dedicated non-blocking copy stream of the lowest
// priority. Each Enqueue() records an event on the trainer's stream and makes
// the copy stream wait on it, so the copies see the trainer's finished update;
// the bytes then move with chunked cudaMemcpyAsync, and a done-event per
// ticket (blocking-sync: the waiting thread sleeps) lets Wait() sleep until
// they have landed. FenceBeforeUpdate() makes the trainer's stream wait for
// the copies on the device, without blocking the host. Staging mappings are
// pinned with cudaHostRegister; where the driver refuses (a range another
// library pinned, a pinned-memory limit), registration still succeeds and the
// copies into that mapping go through a small pinned bounce buffer (one
// warning line per copier; see cuda_copier.cu).
//
// Every CUDA error becomes a Status through CudaToStatus (cuda_status.h),
// naming the call; the thread's CUDA "last error" is consumed so that the
// trainer's own checks do not pick it up.
//
// Not provided: a Pump() that spreads a snapshot's chunks over the next
// step's micro-batches. Copies here complete on their own, which the
// DeviceCopier contract (and the client's notifier and BLOCK backpressure)
// rely on; chunks that wait for the trainer to pump them would let Wait()
// block on the very thread that must pump. The copy stream's lowest priority
// already keeps the copies out of the trainer's way.
//
// With --config=nocuda a CPU-only stand-in is linked instead
// (cuda_copier_stub.cc): NewCudaCopier() returns Unimplemented and
// CudaDeviceAvailable() false. Tests without a GPU link the same compiled
// copier against a fake CUDA runtime (cuda/fake_cudart).
#ifndef ZCC_CUDA_CUDA_COPIER_H_
#define ZCC_CUDA_CUDA_COPIER_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "copy/device_copier.h"

namespace zcc {

struct CudaCopierOptions {
  // The CUDA device whose memory the trainer's tensors live in. Every stream
  // passed to the copier belongs to it; nullptr means its legacy default stream.
  int device = 0;
  // Each cudaMemcpyAsync moves at most this many bytes.
  size_t chunk_bytes = size_t{64} << 20;
  // Create the copy stream with the lowest priority the device offers (so it
  // never delays the trainer's kernels); otherwise with the default priority.
  bool low_priority_stream = true;
};

// A copier bound to `options.device`, or:
//   FailedPrecondition: no usable device or driver (no GPU, only the stub
//     libcuda, a driver older than the runtime, no unified addressing); the
//     message says which;
//   Unavailable: the device is held by another process (exclusive mode);
//   InvalidArgument: bad options (no such device, chunk_bytes == 0);
//   Unimplemented: built with --config=nocuda.
// The copier is thread-safe (see DeviceCopier); name() is "cuda". Its
// destructor waits for the copies still in flight and unregisters the host
// memory left registered.
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(const CudaCopierOptions& options);

// True when this build has CUDA, the driver loads and at least one device exists.
bool CudaDeviceAvailable();

}  // namespace zcc

#endif  // ZCC_CUDA_CUDA_COPIER_H_
