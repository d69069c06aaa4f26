// The daemon's table of jobs and the operations of the control and status
// services on it: registration (creating the staging segment), restore,
// save-now, status and listing. Background work (heartbeats, noticing dead
// trainers, commit retries, retiring dead ranks) is daemon/housekeeper's;
// restores are daemon/restore_service's.
//
// Every request field is validated here; errors carry a message meant for the
// user. Nothing committed on disk is modified by a failed request.
//
// Thread-safety: all public methods may be called concurrently.
#ifndef ZCC_DAEMON_CONTROL_REGISTRY_H_
#define ZCC_DAEMON_CONTROL_REGISTRY_H_

#include <atomic>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/instance_lock.h"
#include "common/mutex.h"
#include "config/daemon_config.h"
#include "daemon/control/caller.h"
#include "daemon/jobs/housekeeper.h"
#include "daemon/jobs/job.h"
#include "daemon/jobs/job_table.h"
#include "daemon/jobs/object_store_roots.h"
#include "daemon/pull/pull_service.h"
#include "daemon/control/registrar.h"
#include "daemon/restore/restore_service.h"
#include "common/task_pool.h"
#include "daemon/memory/staging_pool.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/recovered_steps.h"
#include "daemon/peer/replica_store.h"
#include "daemon/peer/replicator.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "storage/storage.h"

namespace zcc::daemon {

// Trust (DESIGN.md section 7): a job belongs to the uid that registered it.
// Only that uid (or root) may register more of its ranks, unregister, restore,
// save, collect garbage, list its checkpoints or see it in the status. zccd
// running as root creates each staging segment owned by the job's uid (mode
// 0600) and hands the job's checkpoint directory to that uid (mode 0750); zccd
// running as an ordinary user serves only that user.
class Registry {
 public:
  // `config` must have passed ValidateConfig. Ranks write their shards
  // through `shard_storage` (borrowed, outlives the registry; null = the
  // default POSIX storage): a fault-injecting one for drills and tests.
  // `pull_engine` makes the CUDA engine for daemon-pull registrations (null:
  // none in this build; they are refused, or get the trainer's own copier).
  // `before_reserve` (optional) runs before a registration reserves its
  // staging memory, with the bytes: a hook for fault drills.
  explicit Registry(DaemonConfig config, storage::Storage* shard_storage = nullptr,
                    PullEngineFactory pull_engine = nullptr,
                    std::function<void(const std::string&, uint64_t)> before_reserve = nullptr);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Claims the shm prefix for this zccd (FailedPrecondition, naming the
  // holder, while another zccd has it), removes the stale segments a previous
  // instance left under it, creates the default root, starts housekeeping.
  absl::Status Start();
  // New registrations and restores are refused, restores in progress stop
  // at their next check (between steps and between shard files), and a
  // ReadEma waiting for a step answers now.
  void BeginShutdown();
  // Stops every rank (draining READY slots and finishing in-flight writes),
  // attempts the commits that became possible, removes all segments.
  void Shutdown();

  // `wait` says how long the caller waits. While the rank's previous trainer
  // is still retiring (the reaper writes and commits its last checkpoint),
  // the registration waits for it until the answer is due, then answers
  // Unavailable (v1::kRegisterAgain): the client registers again. A
  // registration the caller gave up on (wait.Gone(): its deadline passed
  // while zccd reserved memory) is undone, its snapshots kept for the
  // trainer's next attempt, which would otherwise be refused for
  // client_timeout as a registration of a live process. One whose answer
  // was lost all the same (the deadline passed after that check) is retired
  // when the same client registers again (client_instance). (An undone
  // replacement in place had stopped the registration it replaced: the
  // trainer registers afresh, without that one's snapshots or EMA.)
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const Caller& caller,
                                                const CallerWait& wait = {});
  absl::Status Unregister(const v1::UnregisterRequest& request, const Caller& caller);
  // `wait` says when the caller stopped waiting (deadline, cancellation):
  // the restore then stops at its next check, like at shutdown.
  absl::StatusOr<v1::RestoreResponse> Restore(const v1::RestoreRequest& request, const Caller& caller,
                                              const CallerWait& wait = {});
  absl::Status RestoreDone(const v1::RestoreDoneRequest& request, const Caller& caller);
  absl::StatusOr<v1::RestoreCandidatesResponse> RestoreCandidates(
      const v1::RestoreCandidatesRequest& request, const Caller& caller);
  absl::StatusOr<v1::ReadEmaResponse> ReadEma(const v1::ReadEmaRequest& request,
                                              const Caller& caller);
  absl::StatusOr<v1::SaveNowResponse> SaveNow(const v1::SaveNowRequest& request, const Caller& caller);
  // Stores a file with the caller's job (<job dir>/metadata/<name>).
  absl::StatusOr<v1::PutJobFileResponse> PutJobFile(const v1::PutJobFileRequest& request,
                                                    const Caller& caller);
  absl::StatusOr<v1::SetJobPeersResponse> SetJobPeers(const v1::SetJobPeersRequest& request,
                                                       const Caller& caller);
  absl::StatusOr<v1::CollectGarbageResponse> CollectGarbage(
      const v1::CollectGarbageRequest& request, const Caller& caller);
  v1::StatusResponse GetStatus(const v1::StatusRequest& request, const Caller& caller) const;
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request, const Caller& caller) const;

  const DaemonConfig& config() const { return config_; }
  metrics::ZccMetrics& metrics() { return metrics_; }
  // The replicas of other nodes' snapshot pieces this zccd holds (served by
  // the peer listener when config.peer.listen is set).
  peer::ReplicaStore& replicas() { return replicas_; }
  // A PinStep call from another zccd of the job (proto/peer.proto), on a
  // gRPC thread: a pin its leader found (step >= 0), or a nudge to find it
  // again (this zccd being the leader).
  // Returns the pin held here now (-1: none).
  absl::StatusOr<int64_t> OnPeerPin(const std::string& job_id, uint32_t uid, int64_t step,
                                    bool everyone_answered) ABSL_LOCKS_EXCLUDED(peer_mu_);
  // A WentBack call from another zccd of the job (proto/peer.proto), on a
  // gRPC thread: the job's `ranks` (the caller's) went on from a restore
  // of `restored`, `ago` before. Where the job has no live ranks here (a
  // buddy by the static peer list, or one its ranks left), what the peer
  // tier holds of those ranks' run left behind, of what arrived before
  // then, goes now. Returns whether it was taken (not where ranks here
  // tell it themselves).
  absl::StatusOr<bool> OnPeerWentBack(const std::string& job_id, uint32_t uid, int64_t restored,
                                      const std::set<uint32_t>& ranks, absl::Duration ago);
  // Where the peer listener serves (`endpoint` for the status, `address`
  // for the trainers and other zccds) and the credentials of connections to
  // other zccds; set once it listens, before the control service starts.
  void SetPeerEndpoint(v1::PeerStatus endpoint, std::string address,
                       std::shared_ptr<grpc::ChannelCredentials> creds);
  // False when the housekeeping thread has not completed a round recently
  // (the systemd watchdog stops being fed, and systemd restarts zccd).
  bool Healthy() const;

 private:
  // <root>/<job_id> for `caller` (daemon::ResolveJobDir, knowing the
  // registered jobs' directories).
  absl::StatusOr<std::string> ResolveJobDir(const std::string& requested_root,
                                            const std::string& job_id, const Caller& caller,
                                            bool create, bool job_credentials = false) const;
  absl::StatusOr<std::pair<std::shared_ptr<Job>, std::shared_ptr<RankSession>>> FindSession(
      const std::string& job_id, uint32_t rank, uint64_t generation, const Caller& caller) const;
  // The registered job, if `caller` may act on it.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job_id,
                                               const Caller& caller) const;
  const DaemonConfig config_;
  // The object-store roots, over the local storage given.
  ObjectStoreRoots stores_;
  // Every checkpoint path, local or in a store (stores_.storage()).
  storage::Storage* const shard_storage_;
  // Held from Start() for the registry's life: the shm prefix is ours.
  std::optional<InstanceLock> prefix_lock_;
  const absl::Time started_;
  metrics::ZccMetrics metrics_;
  // Before the jobs: outlives every rank writer that posts to it.
  TaskPool write_pool_;

  JobTable jobs_;
  peer::ReplicaStore replicas_;
  // The storage restores read through: shard_storage_, with the steps of
  // the peer tier read in place shown under their job directories.
  // (Thread-safe; ListCheckpoints, a const method, lists through it too.)
  mutable peer::RecoveredSteps recovered_;
  // The job's buddies, from its membership and what the directory knows of
  // each node's failure domain.
  std::vector<std::string> Buddies(const Job& job, const peer::PeerDirectory& directory,
                                   const std::string& self) const;
  // The peer tier's parts as they are now (a null directory: the tier is off).
  struct PeerParts {
    std::shared_ptr<peer::PeerDirectory> directory;
    std::string self;  // this zccd's peer address
  };
  PeerParts CurrentPeerParts() const ABSL_LOCKS_EXCLUDED(peer_mu_);
  // Null when the tier is off or has stopped. Never called on the
  // replicator's own thread (its after_push, its buddies): a copy held there
  // could become the last one, and the replicator's destructor joins that
  // thread.
  std::shared_ptr<peer::Replicator> CurrentReplicator() const ABSL_LOCKS_EXCLUDED(peer_mu_);
  // The peer tier's gauges, from the replicator and the peer directory
  // (the housekeeper, each round).
  void ExportPeerMetrics() ABSL_LOCKS_EXCLUDED(peer_mu_);
  void FillPeerStatus(const Job& job, v1::JobStatus* out) const;
  // nullopt: no such job here (any more).
  std::optional<std::vector<std::string>> BuddiesOf(const std::string& job_id) const;
  // The job's nodes (its trainers' report) and the static peers, by address.
  // Pins in replicas_ the newest step of the job whole in the peer tier,
  // cluster-wide (memory_tier.h), asking each of its zccds what it holds:
  // the replicator's after_push, on its thread; `cancel` ends its calls to
  // the peers when the replicator stops.
  // Where the job's trainers reported their nodes, only the job's pin
  // leader (PinLeader) asks the others; the rest nudge it and take the pin
  // it sends them (PinStep, OnPeerPin).
  void PinMemoryTier(const std::string& job_id, uint32_t uid, peer::CallCancel* cancel)
      ABSL_LOCKS_EXCLUDED(peer_mu_);
  // The job's node with the lowest address that is up (this one counts as
  // up), among the nodes its trainers reported; "" when they reported none
  // or not this one (each zccd then finds the pin itself).
  std::string PinLeader(const Job& job, const PeerParts& peer) const;
  // Pins `whole` in replicas_ for the job unless that moves the pin back
  // while some zccd did not answer, or (with `as_of`) the job went back
  // here since `whole` was found (in one step with the checks: replicas_'
  // PinIfNewer); true when the pin changed.
  bool ApplyPin(const std::string& job_id, uint32_t uid, int64_t whole, bool everyone_answered,
                const char* found_by, std::optional<uint64_t> as_of = std::nullopt);
  std::vector<std::string> NodesOf(const Job& job) const;
  // Before `rank`'s restore chooses its step: the peer tier's newest step,
  // if it is newer than the job directory's, shown to restores in place
  // (recovered_); the zccd where rank 0 restores also writes it into the
  // job directory in the background (WriteRecoveredStep).
  void RecoverFromPeers(const std::shared_ptr<Job>& job, uint32_t rank)
      ABSL_LOCKS_EXCLUDED(peer_mu_);
  // Once the restores are done with `step` (on a thread of its own): writes
  // it into the job's directory and commits it there at idle priority where
  // rank 0 restored from it, then stops showing it in place.
  void WriteRecoveredStep(const std::shared_ptr<Job>& job,
                          const std::shared_ptr<peer::RecoveredStep>& step, absl::Time began)
      ABSL_LOCKS_EXCLUDED(peer_mu_);
  // WriteRecoveredStep's thread, until the step is written (or not).
  void WriteRecoveredStepNow(Job& job, peer::RecoveredStep& step, absl::Time began);
  // A rank's step for the peer tier, from its writer thread.
  void ReplicateStep(const std::string& job_id, uint32_t uid, checkpoint::RankStepBytes step);
  // The job's ranks here went on from a restore of step `restored` at `at`
  // (JobOptions::on_went_on): what the peer tier holds and sends of the run
  // left behind goes (ReplicaStore::DropLeftBehind, Replicator::WentOn).
  void JobWentOn(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                 int64_t restored, absl::Time at) ABSL_LOCKS_EXCLUDED(peer_mu_);

  mutable zcc::Mutex peer_mu_;
  std::optional<v1::PeerStatus> peer_endpoint_ ABSL_GUARDED_BY(peer_mu_);
  std::string peer_address_ ABSL_GUARDED_BY(peer_mu_);
  std::shared_ptr<peer::PeerDirectory> peer_directory_ ABSL_GUARDED_BY(peer_mu_);
  std::shared_ptr<peer::Replicator> replicator_ ABSL_GUARDED_BY(peer_mu_);
  // One recovery from the peer tier at a time per job (held while it finds
  // the step).
  std::map<std::string, std::shared_ptr<zcc::Mutex>> recovering_ ABSL_GUARDED_BY(peer_mu_);
  // As the job's pin leader: the pin each other node of the job has taken
  // from this zccd, and that node's run then (told again when either
  // differs: a restarted zccd has lost its pins). An entry per job this
  // zccd led, kept for zccd's life (a few bytes each).
  struct PinSent {
    int64_t step = -1;
    std::string instance;
  };
  std::map<std::pair<std::string, uint32_t>, std::map<std::string, PinSent>> pins_sent_
      ABSL_GUARDED_BY(peer_mu_);
  // Threads of WriteRecoveredStep: those done are joined when the next
  // step is found in the tier, the others at shutdown (their step's pulls
  // cancelled first).
  struct RecoveredStepWriter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    std::shared_ptr<peer::RecoveredStep> step;
  };
  std::vector<RecoveredStepWriter> writing_recovered_ ABSL_GUARDED_BY(peer_mu_);
  // Uses jobs_ (the budget left), and stops before it goes.
  StagingPool staging_pool_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> stopped_{false};

  RestoreService restores_;
  PullService pull_;

  // Its threads use everything above, and stop before it goes.
  Housekeeper housekeeper_;
  Registrar registrar_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_REGISTRY_H_
