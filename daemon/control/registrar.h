// The registrar: turns a trainer's RegisterRequest into a running rank
// session. It validates the request, retires a dead predecessor of the rank,
// has the job table admit the registration (budget, adoption of what the
// predecessor left in memory), then, outside every daemon-wide lock, creates
// and reserves the staging segment (posix_fallocate: about 0.1 s a GB), lays
// out the control block, attaches the daemon-pull channel, starts the session
// and installs it in its job. One large registration therefore never stalls
// another job's requests, the status service or the watchdog.
//
// Thread-safety: Register may be called concurrently (two registrations of
// one rank: the second is refused while the first is in flight).
// Ownership: borrows everything in Deps, which must outlive it.
#ifndef ZCC_DAEMON_CONTROL_REGISTRAR_H_
#define ZCC_DAEMON_CONTROL_REGISTRAR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "config/daemon_config.h"
#include "checkpoint/rank_step_bytes.h"
#include "daemon/control/caller.h"
#include "daemon/control/job_placement.h"
#include "daemon/jobs/housekeeper.h"
#include "daemon/jobs/job_table.h"
#include "daemon/pull/pull_service.h"
#include "daemon/restore/restore_service.h"
#include "common/task_pool.h"
#include "ema/worker_group.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "storage/storage.h"

namespace zcc::daemon {

class Registrar {
 public:
  struct Deps {
    const DaemonConfig* config = nullptr;
    metrics::ZccMetrics* metrics = nullptr;
    storage::Storage* shard_storage = nullptr;  // null: the default POSIX storage
    TaskPool* write_pool = nullptr;            // zccd's writer threads
    JobTable* jobs = nullptr;
    PullService* pull = nullptr;
    RestoreService* restores = nullptr;
    Housekeeper* housekeeper = nullptr;
    StagingPool* staging_pool = nullptr;  // null: none
    // Where jobs' checkpoints go (job_placement.h).
    ResolveJobDirFn resolve_job_dir;
    RouteJobFn route_job;
    // Called before a new staging segment's memory is reserved, with its
    // name and the bytes reserved at once: a hook for fault drills (a
    // reservation that stalls).
    std::function<void(const std::string& segment, uint64_t bytes)> before_reserve;
    // The peer tier (config.peer.listen set): a rank's step serialized for
    // its job's buddies, with the job's owner uid; null: no peer tier.
    std::function<void(const std::string& job_id, uint32_t uid, checkpoint::RankStepBytes)>
        replicate;
    // The peer tier's replicas in this zccd's memory, counted in the staging
    // budget (AdmitRequest): the bytes they hold, and a call that drops them
    // down to a target for a registration of the job (ReplicaStore::
    // ShrinkTo); empty: none.
    std::function<uint64_t()> replica_bytes;
    std::function<uint64_t(uint64_t target, const std::string& job_id, uint32_t uid,
                           std::vector<std::shared_ptr<const void>>* freed)>
        shrink_replicas;
    // The peer tier: a job of `uid`, whose directory is `job_dir`, went on
    // from a restore of step `restored` at `at` (JobOptions::on_went_on);
    // empty: none.
    std::function<void(const std::string& job_id, uint32_t uid, const std::string& job_dir,
                       int64_t restored, absl::Time at)>
        went_on;
  };

  explicit Registrar(Deps deps) : d_(std::move(deps)) {}
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // `wait`: how long the caller waits (see Registry::Register).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const Caller& caller, const CallerWait& wait);

 private:
  // zccd's EMA threads (ema_threads, the updating rank's ingest thread one
  // of them), shared by every rank's EMA: started with the first EMA.
  absl::StatusOr<std::shared_ptr<ema::WorkerGroup>> EmaWorkers() ABSL_LOCKS_EXCLUDED(ema_mu_);
  // Retires the rank's predecessor (and, for a job resumed in another
  // layout, every rank of the old one) whose trainer is gone, or which the
  // same client gave up (RegisterRequest.client_instance), waiting for the
  // retirement until the caller's answer is due (`wait`). Unavailable
  // (v1::kRegisterAgain) when one is still retiring then, or when a
  // retirement took more than half the caller's time: the client registers
  // again and waits on.
  absl::Status RetirePredecessors(const v1::RegisterRequest& req, const std::string& job_dir,
                                  const Caller& caller, const CallerWait& wait);
  // For a job written straight to an object store by a trainer that names
  // no run: removes the parts this rank left in the store's uncommitted
  // steps, before the trainer can write anything (see the definition).
  static void ForgetEarlierRunParts(const v1::RegisterRequest& req, const Job& job);

  // Hands the job this admission replaced with another layout of itself
  // (if any) to a writer thread, which writes the newest step its ranks
  // left in memory for the new layout (relayout.h).
  void WritePreviousLayout(Admission& admission);

  Deps d_;
  zcc::Mutex ema_mu_;
  std::shared_ptr<ema::WorkerGroup> ema_workers_ ABSL_GUARDED_BY(ema_mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_REGISTRAR_H_
