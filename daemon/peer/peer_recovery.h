// Restore from the peer tier (DESIGN.md 5c): the newest step whose every
// rank's files some zccd of the job still holds (this one's replica memory,
// or a peer's). zccd reads it in place first (recovered_step.h: the restore
// pulls what each rank needs straight into its staging memory), and writes
// it into the job's directory as an ordinary committed step in the
// background (MaterializeStep); a restore reads it as it reads any step from
// disk, into any layout, every tensor checked, and falls back to an older
// step the same way. A node that lost everything (a replacement, a
// node-local disk gone with its node) thus restores the memory tier's
// newest step instead of losing the work since the last disk checkpoint.
//
// Thread-safety: stateless; the caller runs one recovery of a job at a time.
#ifndef ZCC_DAEMON_PEER_PEER_RECOVERY_H_
#define ZCC_DAEMON_PEER_PEER_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "daemon/peer/call_cancel.h"
#include "daemon/peer/memory_tier.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/replica_store.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace zcc::daemon::peer {

struct RecoverySources {
  ReplicaStore* own = nullptr;           // this zccd's replica memory
  PeerDirectory* directory = nullptr;    // connections to the peers
  std::vector<std::string> peers;        // the job's other zccds
  absl::Duration timeout = absl::Minutes(10);  // each pull
  CallCancel* cancel = nullptr;          // may be null: ends the pulls early
};

// Each holder of a rank's files, in the order they are tried (this zccd
// first), with the rank's file names there.
using RankHolders = std::vector<std::pair<std::string, std::set<std::string>>>;

// A step of the tier, whole: its holders and its ranks' manifests.
struct RecoveryPlan {
  int64_t step = -1;
  uint32_t world = 0;
  std::map<uint32_t, RankHolders> ranks;
  std::map<uint32_t, std::string> manifests;  // each rank's, as held
  std::map<uint32_t, format::RankManifest> decoded;  // the same, decoded
};

// The plans of the steps newer than `newer_than` that the tier holds whole
// (every rank's manifest served and decoded by some holder, all of one run
// and timeline), newest first, made one at a time: `next` is called with
// each until it returns true. Each rank's files are read from the holders of
// its manifest of that run and timeline only. A step held whole in two runs
// or timelines (one a going back left, held on) is passed over: which one
// the job went on in cannot be told from the manifests. Steps passed over
// are logged with the reason; a line says so when none is found.
void ForNewestSteps(const std::string& job_id, uint32_t uid, int64_t newer_than,
                    const RecoverySources& sources,
                    absl::FunctionRef<bool(const RecoveryPlan&)> next);

struct MaterializeOptions {
  // Runs the commit it is given (the directory's sync and TryCommit) once
  // the files are written; by default at once. A caller whose job commits
  // other steps runs it in turn with them, and may refuse it (Aborted: the
  // files written are removed, the step left uncommitted), as when the job
  // has committed a newer step meanwhile.
  std::function<absl::Status(const std::function<absl::Status()>& commit)> in_turn;
  // TryCommit's: when the step began to be recovered.
  absl::Time write_began = absl::InfiniteFuture();
  // Ranks written at once, a thread each (1: all on the calling thread):
  // on a cluster their holders are different nodes.
  size_t parallel_ranks = 4;
};

// Writes every file of `plan`'s step into `job_dir` through `storage`, each
// from the first holder that serves it intact, and commits it there.
// Stops between files once `sources.cancel` is cancelled.
absl::Status MaterializeStep(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                             const RecoveryPlan& plan, storage::Storage& storage,
                             const RecoverySources& sources,
                             const MaterializeOptions& options = MaterializeOptions());

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
