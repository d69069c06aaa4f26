// The CUDA DeviceCopier backend, behind a plain C++ header: nothing here needs
// CUDA headers or nvcc, so the client library and its tests build everywhere.
//
// Snapshot copies run on a dedicated non-blocking copy stream of the lowest
// priority, issued by a copy thread the copier owns. On the trainer thread,
// Enqueue() only checks and copies the region list, records one event on the
// trainer's stream and queues the list: a fixed number of runtime calls,
// however many tensors the snapshot has (issuing thousands of copies takes
// milliseconds). The copy thread makes the copy stream wait on that event, so
// the copies see the trainer's finished update, moves the bytes with chunked
// cudaMemcpyAsync, and records a done-event per ticket (blocking-sync: the
// waiting thread sleeps) on which Wait() sleeps until they have landed.
// Tickets are issued one at a time in ticket order. Events come from a pool
// that grows to the most ever in use at once: none is created or destroyed
// per snapshot once the first few snapshots have run.
//
// FenceBeforeUpdate() makes the trainer's stream wait for the copies on the
// device, without waiting for bytes to move. It does block the host in one
// case: a copy the copy thread has not issued yet has no event to wait on, so
// the fence first sleeps until every ticket enqueued so far has been issued
// (normally well under the time the copies take; longer only when the copies
// themselves are synchronous, see below). UnregisterHostMemory() and
// CopyToDevice() likewise wait for the queued tickets to be issued first.
//
// Wait() reports the first error of a ticket, whether the copy thread met it
// issuing the copies (then the chunks queued before it still land before
// Wait returns) or the device met it running them. Enqueue() itself fails
// only for invalid regions or when one of its own few runtime calls fails
// (for example after a sticky device error); then it issues no ticket.
//
// Staging mappings are pinned with cudaHostRegister; where the driver refuses
// (a range another library pinned, a pinned-memory limit), registration still
// succeeds and the copies into that mapping go through a small pinned bounce
// buffer (one warning line per copier; see cuda_copier.cu).
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
// The copier is thread-safe (see DeviceCopier); name() is "cuda". More
// lenient than the interface: Enqueue() copies the region list, so the
// caller's list need not outlive the call. Its destructor issues the tickets still
// queued, waits for the copies in flight, joins the copy thread and
// unregisters the host memory left registered.
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(const CudaCopierOptions& options);

// True when this build has CUDA, the driver loads and at least one device exists.
bool CudaDeviceAvailable();

}  // namespace zcc

#endif  // ZCC_CUDA_CUDA_COPIER_H_
