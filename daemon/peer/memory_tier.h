// What the peer tier (DESIGN.md 5c) holds of a job, cluster-wide: which
// files of each rank's steps this zccd's replica memory and each of the
// job's other zccds hold (their ListReplicas), and from that the newest step
// whose every rank is held whole somewhere (its manifest, which replication
// sends last, is). Peer recovery restores from it; the replicator pins that
// step in each zccd's replica memory, so that a newer step complete for some
// ranks only never pushes it out (the job's newest whole step stays in two
// failure domains until a newer one is whole).
//
// Thread-safety: stateless functions.
#ifndef ZCC_DAEMON_PEER_MEMORY_TIER_H_
#define ZCC_DAEMON_PEER_MEMORY_TIER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/peer/call_cancel.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer {

// The holder name of this zccd's own replica memory in Holdings.
inline constexpr char kThisZccd[] = "";

// Who holds what: step -> rank -> holder (kThisZccd or a peer's address) ->
// the rank's file names there.
using Holdings =
    std::map<int64_t, std::map<uint32_t, std::map<std::string, std::set<std::string>>>>;

// Where the tier of a job is asked.
struct TierSources {
  ReplicaStore* own = nullptr;         // this zccd's replica memory
  PeerDirectory* directory = nullptr;  // connections to the peers
  std::vector<std::string> peers;      // the job's other zccds
  CallCancel* cancel = nullptr;        // may be null: ends the asking early
};

// What `sources` hold of `job_id` for `uid`. A peer that cannot be asked is
// passed over (logged); `asked` (optional) counts those that answered.
Holdings ListHoldings(const std::string& job_id, uint32_t uid, const TierSources& sources,
                      absl::Duration timeout, size_t* asked = nullptr);

// The newest step of `held` whose ranks 0..world-1 each have their manifest
// held somewhere (by name: the manifests are not read); nullopt when none.
std::optional<int64_t> NewestWholeStep(const Holdings& held, uint32_t world);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_MEMORY_TIER_H_
