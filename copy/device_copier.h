// The device-copy backend interface: moves tensor bytes between the trainer's
// tensors (GPU or host memory) and the pinned staging slots in shared memory.
// Implementations: HostCopier (memcpy on a copy thread; copy/host_copier.h)
// and the CUDA copier (side stream + events; cuda/cuda_copier.h).
//
// Thread-safety: Enqueue() and FenceBeforeUpdate() are called from the trainer
// thread, Wait() from the client's notifier thread, CopyToDevice() from the
// trainer thread during restore. Implementations make these safe together.
#ifndef ZCC_COPY_DEVICE_COPIER_H_
#define ZCC_COPY_DEVICE_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace zcc {

// One contiguous copy. For a snapshot `src` is the trainer's tensor and `dst`
// lies in a staging slot; for a restore the other way round.
struct CopyRegion {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t nbytes = 0;
};

// What every backend checks first: InvalidArgument naming the first region
// with a null pointer for a non-zero size.
inline absl::Status ValidateRegions(absl::Span<const CopyRegion> regions) {
  for (size_t i = 0; i < regions.size(); ++i) {
    const CopyRegion& r = regions[i];
    if (r.nbytes != 0 && (r.src == nullptr || r.dst == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("copy region ", i, " has a null ",
                                                     r.src == nullptr ? "source" : "destination",
                                                     " for ", r.nbytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// Identifies one enqueued snapshot copy; tickets increase by one per Enqueue.
using CopyTicket = uint64_t;

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // A short name for logs and status ("host", "cuda").
  virtual std::string name() const = 0;

  // Makes `bytes` at `base` (a staging mapping) usable as a fast copy target,
  // e.g. by pinning it. Called once per mapping before any Enqueue into it;
  // UnregisterHostMemory before it is unmapped.
  virtual absl::Status RegisterHostMemory(void* base, size_t bytes) = 0;
  virtual absl::Status UnregisterHostMemory(void* base) = 0;

  // Called with the regions a client will enqueue (those of one slot), once
  // after registering, before the first Enqueue: a backend that keeps state
  // per source sets it up here rather than in the first snapshot (daemon-pull
  // exports the IPC handles of the sources' allocations). The others do nothing.
  virtual absl::Status Prepare(absl::Span<const CopyRegion> regions) {
    (void)regions;
    return absl::OkStatus();
  }

  // Enqueues the copies after the work the trainer has already issued (on the
  // given stream for device backends; nullptr = the default stream) and
  // returns at once, without waiting for bytes to move. `regions` must stay
  // valid until Wait() for the returned ticket has returned.
  virtual absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion> regions,
                                             void* stream) = 0;

  // Blocks until the copies of `ticket` are complete (no busy spin). Returns the
  // first error the copy met, including errors met issuing it after Enqueue()
  // returned.
  virtual absl::Status Wait(CopyTicket ticket) = 0;

  // Makes the trainer's subsequent updates (on `stream`) wait for every copy
  // enqueued so far, so that optimizer.step() cannot overwrite a tensor still
  // being read. Device backends do this on the device without waiting for the
  // bytes to move (the CUDA backend may block briefly until its copy thread
  // has issued the copies); the host backend has to block until the copies
  // finished.
  virtual absl::Status FenceBeforeUpdate(void* stream) = 0;

  // Synchronous copies into the trainer's tensors (restore path).
  virtual absl::Status CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) = 0;
};

}  // namespace zcc

#endif  // ZCC_COPY_DEVICE_COPIER_H_
