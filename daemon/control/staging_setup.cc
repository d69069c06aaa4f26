#include "daemon/control/staging_setup.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "daemon/memory/staging_pool.h"
#include "shm/control_block.h"
#include "shm/slot_ring.h"

namespace zcc::daemon {

// Makes (and reserves) the segment, or adopts the one `inherited` holds;
// lays out its control block and marks the slots still to be reserved and
// those holding the predecessor's snapshots.
absl::StatusOr<Staging> PrepareStaging(const std::string& name, const Geometry& g,
                                       uid_t owner, uint64_t generation, uint64_t manifest_hash,
                                       std::optional<RetainedSnapshots::Entry> inherited,
                                       std::optional<shm::Segment> pooled,
                                       const std::function<void(const std::string&, uint64_t)>& before_reserve) {
  std::optional<shm::Segment> segment;
  Inheritance inheritance;
  // A large segment: the control block and slot 0 now, the other slots in
  // the background, so that registering 1 GB of state does not wait for
  // 3 GB of staging to be zeroed. A small one whole: every slot is free on
  // return.
  const uint64_t now = g.reserve_later ? shm::ControlBlockBytes() + g.slot_bytes : g.segment_bytes;
  if (inherited.has_value()) {
    segment.emplace(inherited->session->TakeSegment());
    inheritance.predecessor = std::move(inherited->session);
  } else {
    if (before_reserve) before_reserve(name, now);
    if (pooled.has_value()) {
      // Allocated and mapped already: renamed, resized, and only what lies
      // beyond it reserved now.
      const uint64_t ready = pooled->size();
      absl::StatusOr<shm::Segment> adopted =
          StagingPool::Adopt(*std::move(pooled), name, g.segment_bytes, now, owner);
      if (adopted.ok()) {
        ZCC_LOG(INFO) << name << ": " << std::min(ready, now) << " of the " << now
                      << " bytes it needs at once came from the staging pool";
        segment.emplace(*std::move(adopted));
      } else {
        ZCC_LOG(WARNING) << name << ": the staging pool's memory could not be used ("
                         << adopted.status() << "); making it anew";
      }
    }
    if (!segment.has_value()) {
      ZCC_ASSIGN_OR_RETURN(shm::Segment created,
                           shm::Segment::Create(name, g.segment_bytes, owner, now));
      segment.emplace(std::move(created));
    }
    if (g.daemon_pull && g.reserve_later) {
      ZCC_RETURN_IF_ERROR(segment->Reserve(g.pull_offset, g.pull.bytes));
    }
  }
  Staging s{std::move(*segment), std::move(inheritance), {}};
  shm::InitControlBlock(s.segment.control(), g.num_slots, g.slot_bytes, generation, manifest_hash);
  shm::SlotRing ring(s.segment.control(), g.num_slots);
  // Every slot but the first (and those adopted with a snapshot) waits for
  // its memory; an adopted segment's is reserved already, which is quick.
  if (g.reserve_later) {
    for (uint32_t slot = 1; slot < g.num_slots; ++slot) {
      bool held = false;
      if (inherited.has_value()) {
        for (const SlotSnapshot& snap : inherited->snapshots) held = held || snap.slot == slot;
      }
      if (held) continue;
      ring.HoldBack(slot);
      s.to_reserve.push_back(slot);
    }
  }
  if (inherited.has_value()) {
    // One slot stays free at least, so the trainer can snapshot before it
    // restores (which lets the held ones go).
    for (const SlotSnapshot& snap : inherited->snapshots) {
      if (s.inheritance.held.size() + 1 >= g.num_slots) break;
      ring.Hold(snap.slot, snap.step);
      s.inheritance.held.push_back(snap);
    }
  }
  return s;
}

}  // namespace zcc::daemon
