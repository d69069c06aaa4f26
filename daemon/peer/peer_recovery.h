// Restore from the peer tier (DESIGN.md 5c): the newest step whose every
// rank's files some zccd of the job still holds (this one's replica memory,
// or a peer's), pulled, checked, and written into the job's directory as an
// ordinary committed step. The restore that follows reads it as it reads
// any step from disk, into any layout, every tensor checked again, and falls
// back to an older step the same way; a node that lost everything (a
// replacement, a node-local disk gone with its node) thus restores the
// memory tier's newest step instead of losing the work since the last disk
// checkpoint.
//
// Thread-safety: stateless; the caller runs one recovery of a job at a time.
#ifndef ZCC_DAEMON_PEER_PEER_RECOVERY_H_
#define ZCC_DAEMON_PEER_PEER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/peer/memory_tier.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/replica_store.h"
#include "storage/storage.h"

namespace zcc::daemon::peer {

struct RecoverySources {
  ReplicaStore* own = nullptr;           // this zccd's replica memory
  PeerDirectory* directory = nullptr;    // connections to the peers
  std::vector<std::string> peers;        // the job's other zccds
  absl::Duration timeout = absl::Minutes(10);  // each pull
};

// The newest complete step held in the tier that is newer than `newer_than`
// (the newest step the job's directory has), committed into `job_dir`
// through `storage`; nullopt when there is none. A step that cannot be
// pulled whole (a peer gone mid-way, damaged bytes) is passed over for the
// next older one, each reason logged. An error only when the job directory
// cannot be written.
absl::StatusOr<std::optional<int64_t>> RecoverNewestStep(const std::string& job_id, uint32_t uid,
                                                         const std::string& job_dir,
                                                         int64_t newer_than,
                                                         storage::Storage& storage,
                                                         const RecoverySources& sources);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_RECOVERY_H_
