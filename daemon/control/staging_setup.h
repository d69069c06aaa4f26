// The staging segment a registration makes: its geometry, and its
// preparation (made and reserved, or adopted from the trainer before with
// the snapshots it holds), for daemon/control/registrar.
#ifndef ZCC_DAEMON_CONTROL_STAGING_SETUP_H_
#define ZCC_DAEMON_CONTROL_STAGING_SETUP_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/memory/retained_snapshots.h"
#include "daemon/rank/held_snapshots.h"
#include "shm/pull_channel.h"
#include "shm/segment.h"

namespace zcc::daemon {

// Where the segment's parts lie.
struct Geometry {
  uint32_t num_slots = 0;
  uint64_t slot_bytes = 0;
  bool daemon_pull = false;
  shm::PullGeometry pull;
  uint64_t pull_offset = 0;  // the channel follows the slots
  uint64_t segment_bytes = 0;
  bool reserve_later = false;
};

// The staging segment of a new session and what it starts with.
struct Staging {
  shm::Segment segment;
  Inheritance inheritance;
  std::vector<uint32_t> to_reserve;  // slots reserved in the background
};

// Makes (and reserves) the segment, from `pooled` memory made ready before
// when there is some, or adopts the one `inherited` holds; lays out its
// control block and marks the slots still to be reserved and those holding
// the predecessor's snapshots.
absl::StatusOr<Staging> PrepareStaging(const std::string& name, const Geometry& g,
                                       uid_t owner, uint64_t generation, uint64_t manifest_hash,
                                       std::optional<RetainedSnapshots::Entry> inherited,
                                       std::optional<shm::Segment> pooled,
                                       const std::function<void(const std::string&, uint64_t)>& before_reserve);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_STAGING_SETUP_H_
