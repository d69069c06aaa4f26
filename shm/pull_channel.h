// The daemon-pull channel: where a trainer in `copy_backend = cuda_ipc` mode
// hands zccd the work of copying its device tensors into the staging slots.
// It lies at the end of the rank's staging segment (zccd creates it; the
// geometry travels in the RegisterResponse, never re-read from here by zccd).
//
//   trainer (cuda/ipc_pull_copier)           zccd (cuda/ipc_puller)
//   ------------------------------           ----------------------
//   once: export an IPC handle per device    open each source handle once,
//     allocation (sources[]), a "ready"        the events, on its own CUDA
//     event per request record and one         context and copy stream
//     "copied" event; attached = 1
//   per snapshot (ticket t, record t % R):
//     write regions, record ready[t % R]
//     on the trainer's stream, requested = t,
//     ring doorbell                        ─► wait on ready[t % R] on its stream,
//                                             copy source -> staging in chunks,
//                                             record "copied", issued = t, bell
//   FenceBeforeUpdate: sleep until         ◄─
//     issued >= last t, then make the
//     trainer's stream wait on "copied"
//   Wait(t): sleep until completed >= t   ◄─ copies done: status, completed = t, bell
//
// Tickets are 1, 2, 3, ... per channel; record t % R is reused only once
// `completed >= t - R` (the trainer checks before writing it), so zccd reads
// a record's regions while the trainer cannot touch them. Every index, offset
// and size zccd reads here is validated against its own geometry: a hostile
// trainer can write anything into this memory, and the worst it gets is its
// own snapshot failing.
//
// Everything here is trivially copyable or a lock-free atomic, at fixed
// offsets (no pointers): the two processes map it at different addresses.
#ifndef ZCC_SHM_PULL_CHANNEL_H_
#define ZCC_SHM_PULL_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"

namespace zcc::shm {

inline constexpr uint64_t kPullMagic = 0x316c6c75705f6363ULL;  // "cc_pull1" little-endian
inline constexpr uint32_t kPullVersion = 1;
// Request records in the ring: tickets in flight at once (the client has at
// most one per staging slot, and slots are at most 8).
inline constexpr uint32_t kPullRequests = 8;
inline constexpr size_t kIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
inline constexpr size_t kPullErrorBytes = 240;

// One device allocation of the trainer, exported once.
struct PullSource {
  unsigned char handle[kIpcHandleBytes];  // cudaIpcMemHandle_t
  uint64_t bytes;                         // the allocation's size
};

// One copy of a request: `bytes` from `source_offset` in source `source` to
// `staging_offset` from the start of the segment.
struct PullRegion {
  uint32_t source;
  uint32_t reserved;
  uint64_t source_offset;
  uint64_t staging_offset;
  uint64_t bytes;
};

struct alignas(64) PullRequest {
  uint64_t ticket;        // the ticket this record holds (trainer)
  uint32_t num_regions;   // in regions[record * regions_per_request ...] (trainer)
  int32_t status_code;    // absl::StatusCode of the pull; 0 = OK (zccd)
  char error[kPullErrorBytes];  // NUL-terminated reason when status_code != 0 (zccd)
};

struct alignas(64) PullChannel {
  // Geometry, written by zccd before the trainer maps the segment.
  uint64_t magic;
  uint32_t version;
  int32_t device;                // the CUDA device the trainer's tensors live on
  uint32_t max_sources;
  uint32_t regions_per_request;
  uint64_t sources_offset;       // from the channel's start
  uint64_t regions_offset;       // from the channel's start

  // Trainer -> zccd, written before `attached` turns 1 and never after.
  unsigned char ready_events[kPullRequests][kIpcHandleBytes];  // cudaIpcEventHandle_t
  unsigned char copied_event[kIpcHandleBytes];
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> num_sources;  // sources[0, n) are written (release)

  // Trainer -> zccd: the newest ticket whose record is written; doorbell is
  // incremented after it changes (futex word).
  alignas(64) std::atomic<uint64_t> requested;
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> puller_waiting;  // zccd sleeps on the doorbell: wake it

  // zccd -> trainer: the newest ticket whose "copied" event is recorded, the
  // newest ticket finished (successfully or not); bell is incremented after
  // either changes (futex word).
  alignas(64) std::atomic<uint64_t> issued;
  std::atomic<uint64_t> completed;
  std::atomic<uint32_t> bell;
  std::atomic<uint64_t> failed;  // pulls zccd failed (for the trainer's log)

  PullRequest requests[kPullRequests];
};

static_assert(std::is_standard_layout_v<PullChannel>);
static_assert(std::is_trivially_copyable_v<PullSource>);
static_assert(std::is_trivially_copyable_v<PullRegion>);
static_assert(sizeof(PullRegion) == 32);

// The channel's size and its parts' offsets for a registration of
// `num_tensors` tensors (page multiple).
struct PullGeometry {
  uint32_t max_sources = 0;
  uint32_t regions_per_request = 0;
  uint64_t sources_offset = 0;
  uint64_t regions_offset = 0;
  uint64_t bytes = 0;
};
PullGeometry PullGeometryFor(uint32_t num_tensors);

// A segment's pull channel as one process maps it: the segment, the byte
// range of it (offsets from segment_base) that copies may land in (the
// slots), the channel and its geometry.
struct PullMapping {
  uint8_t* segment_base = nullptr;
  uint64_t staging_begin = 0;
  uint64_t staging_end = 0;
  PullChannel* channel = nullptr;
  PullGeometry geometry;
};

// Writes the geometry and zeroes the rest; zccd, on a fresh segment.
void InitPullChannel(PullChannel* ch, const PullGeometry& g, int32_t device);

// The trainer's check of the channel it maps against what zccd said over RPC.
absl::Status ValidatePullChannel(const PullChannel& ch, const PullGeometry& g);

inline PullSource* PullSources(PullChannel* ch, const PullGeometry& g) {
  return reinterpret_cast<PullSource*>(reinterpret_cast<unsigned char*>(ch) + g.sources_offset);
}
inline PullRegion* PullRegions(PullChannel* ch, const PullGeometry& g, uint32_t record) {
  return reinterpret_cast<PullRegion*>(reinterpret_cast<unsigned char*>(ch) + g.regions_offset) +
         uint64_t{record} * g.regions_per_request;
}

}  // namespace zcc::shm

#endif  // ZCC_SHM_PULL_CHANNEL_H_
