// The daemon-pull copier, zccd's half: serves the pull channel of each rank
// registered with `copy_backend = cuda_ipc` (shm/pull_channel.h has the
// protocol; cuda/ipc_pull_copier.h is the trainer's half).
//
//   auto engine = NewPullEngine();                 // once per zccd, lazily
//   auto puller = (*engine)->Attach(attachment);   // per rank session
//   ...                                            // puller serves on its thread
//   puller.reset();                                // unregister / trainer death
//
// Each RankPuller has a thread of its own that sleeps on the channel's
// doorbell. Per request it makes its copy stream (non-blocking, lowest
// priority, on zccd's context for the device) wait on the trainer's ready
// event, copies device -> staging slot in chunks out of the allocations it
// opened from the trainer's IPC handles (once, on first use), records the
// trainer's "copied" event, tells the trainer it is issued, then waits for the
// copies and reports the outcome. The staging slots are pinned
// (cudaHostRegister) in zccd on the first pull.
//
// Nothing a trainer writes into the channel is trusted: every record, index,
// offset and size is checked against zccd's own geometry, and a request that
// fails the check fails only that snapshot. A source handle whose allocation
// zccd already maps for another job, rank or uid is refused
// (PermissionDenied): the legacy CUDA IPC handle names no owner that zccd
// could check, so this guards against a job handing zccd a handle of memory
// that another registered job exported (a leaked handle of a process not
// registered with zccd cannot be told apart; see README).
//
// A trainer that dies while zccd copies out of its memory (or while zccd
// waits on its ready event) makes the copy fail; CUDA leaves zccd's context
// unusable after such a fault, so the engine resets the device (every other
// rank on it re-opens its handles on its next pull, and only the pulls in
// flight at that moment fail). zccd itself keeps running.
//
// Cost: one CUDA context per device that serves a rank (created on the
// first Attach for that device), plus the pinned staging slots.
//
// Thread-safety: all methods may be called from any thread. A RankPuller
// must be destroyed before its segment is unmapped and before the engine.
#ifndef ZCC_CUDA_IPC_PULLER_H_
#define ZCC_CUDA_IPC_PULLER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/pull_channel.h"

namespace zcc {

struct PullAttachment {
  // Who the channel belongs to, for logs, errors and the duplicate-handle
  // check: "job <id> rank <r>" and the trainer's uid.
  std::string owner;
  uid_t uid = static_cast<uid_t>(-1);
  // The CUDA device the trainer's tensors live on.
  int device = 0;
  // zccd's mapping of the rank's segment and channel; destinations must lie
  // in the staging range (the slots).
  shm::PullMapping mapping;
  // Bytes per cudaMemcpyAsync.
  size_t chunk_bytes = size_t{64} << 20;
  // Called on the puller's thread after a pull failed (its ticket and why),
  // for the session's log and counters.
  std::function<void(uint64_t ticket, const absl::Status& why)> on_failure;
};

struct PullerStats {
  uint64_t pulls = 0;   // finished successfully
  uint64_t failed = 0;  // failed (bad request, trainer gone, CUDA error)
  uint64_t bytes = 0;   // copied by successful pulls
};

class RankPuller {
 public:
  // Stops.
  virtual ~RankPuller() = default;
  // Stops serving (after the pull in flight, if any) and closes the handles;
  // Stats() stays readable. Idempotent.
  virtual void Stop() = 0;
  virtual PullerStats Stats() const = 0;
};

// One device on which zccd holds a CUDA context for daemon-pull.
struct PullDeviceStatus {
  int device = 0;
  uint32_t rank_pullers = 0;  // attached now
  uint64_t resets = 0;        // context resets after a fault
  // zccd's own device memory on it as NVML reports it (its context and
  // streams); 0 when NVML is not available.
  uint64_t gpu_memory_bytes = 0;
};

class PullEngine {
 public:
  virtual ~PullEngine() = default;
  // Starts serving `attachment.channel` (whose geometry zccd wrote).
  // InvalidArgument: bad attachment; FailedPrecondition: no such device.
  virtual absl::StatusOr<std::unique_ptr<RankPuller>> Attach(PullAttachment attachment) = 0;
  virtual std::vector<PullDeviceStatus> Devices() const = 0;
};

// The engine, or FailedPrecondition when CUDA is not usable in zccd (no
// device, a stub or too old a driver; the message says which), Unimplemented
// when built with --config=nocuda.
absl::StatusOr<std::unique_ptr<PullEngine>> NewPullEngine();

}  // namespace zcc

#endif  // ZCC_CUDA_IPC_PULLER_H_
