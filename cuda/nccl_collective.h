// NcclCollective: the NCCL implementation of Collective (common/collective.h),
// over a communicator the trainer already has, so that a restore's replicas
// share what each read from its zccd by ncclBroadcast on the trainer's
// stream. A plain C++ header (the communicator is passed as void*, an
// ncclComm_t) so that code built without nvcc can include it.
//
// Broadcast moves device memory in place, on the stream it is given; a rank
// that keeps none of the bytes (data null) receives into a device buffer
// allocated on that stream. Host memory (cudaPointerGetAttributes says so)
// goes through a device bounce buffer: copied in on the root, out on the
// others, synchronously. AllGather moves small host strings through device
// buffers on a stream of its own and returns once they are back on the host.
// NCCL and CUDA errors become Status (InvalidArgument for bad arguments,
// Unavailable for a peer or network failure NCCL reports, Internal otherwise).
//
// Thread-safety: one thread at a time, as NCCL's communicators. The
// communicator stays the caller's: it must outlive the collective.
// With --config=nocuda: Unimplemented.
#ifndef ZCC_CUDA_NCCL_COLLECTIVE_H_
#define ZCC_CUDA_NCCL_COLLECTIVE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/collective.h"

namespace zcc {

// `comm`: an initialised ncclComm_t whose device is `device`.
absl::StatusOr<std::unique_ptr<Collective>> NewNcclCollective(void* comm, int device);

}  // namespace zcc

#endif  // ZCC_CUDA_NCCL_COLLECTIVE_H_
