// The daemon-pull DeviceCopier (`copy_backend = cuda_ipc`), the trainer's half:
// zccd copies the trainer's device tensors into the staging slots on its own
// CUDA context and stream, through IPC handles of the tensors' allocations
// (shm/pull_channel.h has the protocol; cuda/ipc_puller.h is zccd's half).
//
// Per snapshot the trainer thread records one event on its stream and writes
// the request's region list into the channel: no copy thread, no
// cudaMemcpyAsync, no pinned memory in the trainer process. Plain C++ header.
//
//   Prepare(regions)   exports an IPC handle per device allocation the
//                      regions read (found with cuMemGetAddressRange: the
//                      caching allocator sub-allocates), once; Enqueue exports
//                      any it has not seen.
//   Enqueue            ready event on `stream`, region list, doorbell.
//   FenceBeforeUpdate  sleeps until zccd has recorded its "copied" event for
//                      every ticket so far (normally tens of microseconds),
//                      then makes `stream` wait on it on the device.
//   Wait(t)            sleeps until zccd reports ticket t done, with its error.
//   CopyToDevice       the restore: the trainer's own cudaMemcpyAsync.
//
// Regions whose source is host memory (small blobs, CPU tensors), or whose
// destination is outside the staging memory zccd maps, are copied in this
// process by a host copier, under the same ticket: zccd cannot read the
// trainer's heap. A device source into any other destination is refused.
//
// When `daemon_alive` turns false (zccd died or dropped the registration),
// waits stop: Wait returns Unavailable and FenceBeforeUpdate returns OK (zccd's
// copies died with its context, so nothing reads the tensors any more).
//
// Contract as DeviceCopier (copy/device_copier.h), plus: source allocations
// must stay allocated for the copier's life (as TensorRef requires), and the
// copier must be destroyed only after zccd stopped serving the channel or
// died (the client unregisters first).
#ifndef ZCC_CUDA_IPC_PULL_COPIER_H_
#define ZCC_CUDA_IPC_PULL_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "copy/device_copier.h"
#include "shm/pull_channel.h"

namespace zcc {

struct IpcPullCopierOptions {
  // The CUDA device holding the trainer's tensors (the channel's device).
  int device = 0;
  // The staging segment as this process maps it, the slots zccd accepts as
  // destinations, and the channel with its geometry as zccd sent it over RPC.
  shm::PullMapping mapping;
  // Chunk size of the host copier for host-memory regions.
  size_t host_chunk_bytes = size_t{64} << 20;
  // Polled while waiting for zccd; null: zccd is assumed alive.
  std::function<bool()> daemon_alive;
  // How often a wait wakes to poll `daemon_alive`.
  absl::Duration poll_interval = absl::Milliseconds(20);
};

// A daemon-pull copier over `options.channel`: creates the interprocess
// events, exports their handles into the channel and marks it attached.
//   InvalidArgument: bad options (null pointers, an empty staging range);
//   FailedPrecondition: the channel does not match its geometry, or the
//     runtime has no IPC (no device, a stub driver); the message says which;
//   Unimplemented: built with --config=nocuda.
// name() is "cuda_ipc".
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewIpcPullCopier(IpcPullCopierOptions options);

}  // namespace zcc

#endif  // ZCC_CUDA_IPC_PULL_COPIER_H_
