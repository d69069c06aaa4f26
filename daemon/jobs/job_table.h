// The daemon's registered jobs by id, the staging memory they hold, and the
// registrations in flight: the one table every control request looks jobs
// up in.
//
// A registration is admitted here (Admit: the job found, made or replaced,
// the rank checked free, the predecessor's snapshots adopted or dropped, the
// staging budget checked and the generation drawn) and then reserves its
// memory outside the table's lock: its bytes count as in flight until it is
// installed or fails (Admission's destructor), so that registrations that
// reserve at the same time cannot overrun the budget, and its job is not
// dropped as idle meanwhile.
//
// Thread-safety: thread-safe. The lock is never held across I/O or memory
// reservation; it is taken before a Job's own lock and RetainedSnapshots'.
#ifndef ZCC_DAEMON_JOBS_JOB_TABLE_H_
#define ZCC_DAEMON_JOBS_JOB_TABLE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "daemon/jobs/job.h"
#include "daemon/memory/retained_snapshots.h"
#include "daemon/memory/staging_pool.h"

namespace zcc::daemon {

class JobTable;

// What Admit needs to know of a registration.
struct AdmitRequest {
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string job_dir;
  std::string upload_dir;  // the tiered mode's; empty: none
  bool node_local_root = false;  // the tiered mode on node-local disks
  uid_t uid = 0;
  // Makes the job when there is none (or an idle one is replaced).
  std::function<std::shared_ptr<Job>()> make_job;
  // The staging segment the registration needs, and what a predecessor's
  // retained segment must match to be adopted instead.
  uint64_t segment_bytes = 0;
  uint64_t manifest_hash = 0;
  uint32_t num_slots = 0;
  uint64_t slot_bytes = 0;
  uid_t segment_owner = static_cast<uid_t>(-1);
  // Of segment_bytes, what the registration reserves at once.
  uint64_t reserve_now_bytes = 0;
  // The new session's EMA (allocated already, counted in the budget).
  uint64_t ema_bytes = 0;
  // 0 = no budget.
  uint64_t staging_budget_bytes = 0;
  // Staging memory made ready before (null: none): a new segment is taken
  // from it, and it gives way first when the registration needs the budget.
  StagingPool* pool = nullptr;
  // Whether the rank's current session, if any, is still served by a live
  // trainer (a registration then is refused).
  std::function<bool(const RankSession&)> alive;
  // The peer tier's replicas in this zccd's memory (daemon/peer/
  // replica_store.h), counted in the staging budget: the bytes they hold,
  // and a call that drops them down to a target (ReplicaStore::ShrinkTo for
  // this registration's job, whose owner is `owner_uid`: what is least
  // needed first), handing what it dropped to `freed` and returning the
  // bytes. Called under the table's lock. Both empty without a peer tier.
  std::function<uint64_t()> replica_bytes;
  std::function<uint64_t(uint64_t target, uint32_t owner_uid,
                         std::vector<std::shared_ptr<const void>>* freed)>
      shrink_replicas;
};

// What a job's previous layout left in this zccd's memory, handed to a
// registration of its new layout, which has its newest step written into the
// job's directory (daemon/control/relayout.h).
struct PreviousLayout {
  JobOptions options;  // the previous layout's (its world size)
  std::map<uint32_t, RetainedSnapshots::Entry> retained;  // by rank
  std::shared_ptr<Job> replaced;  // the job object it left, when replaced (or null)
  uint64_t counted_bytes = 0;     // in the staging budget until RelayoutWritten
  uint64_t bytes() const;
};

// An admitted registration, in flight until destroyed (then its bytes and
// its mark on the rank are released). Move-only.
class Admission {
 public:
  Admission(Admission&& other) noexcept;
  Admission& operator=(Admission&&) = delete;
  ~Admission();

  const std::shared_ptr<Job>& job() const { return job_; }
  uint64_t generation() const { return generation_; }
  // The previous trainer's retained segment and snapshots, when they match.
  std::optional<RetainedSnapshots::Entry>& inherited() { return inherited_; }
  // Memory from the staging pool for the new segment (none when a retained
  // one is adopted, or the pool had none).
  std::optional<shm::Segment>& pooled() { return pooled_; }
  // The snapshots the job's previous layout left in memory, when this
  // registration found the job resumed in another layout (another world
  // size, or other tensors on every rank): counted in the staging budget
  // until JobTable::RelayoutWritten; the job awaits one RelayoutDone.
  std::optional<PreviousLayout>& previous_layout() { return previous_layout_; }

 private:
  friend class JobTable;
  Admission(JobTable* table, std::string job_id, uint32_t rank) noexcept
      : table_(table), job_id_(std::move(job_id)), rank_(rank) {}

  JobTable* table_;
  std::string job_id_;
  uint32_t rank_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  std::optional<RetainedSnapshots::Entry> inherited_;
  std::optional<shm::Segment> pooled_;
  std::optional<PreviousLayout> previous_layout_;
};

class JobTable {
 public:
  // Generations start from `started` (unique across daemon restarts, so a
  // client holding an old one can never address a new registration).
  explicit JobTable(absl::Time started);

  std::shared_ptr<Job> Find(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Job>> All() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a registered job checkpoints into `dir`.
  bool HasJobDir(const std::string& dir) const ABSL_LOCKS_EXCLUDED(mu_);
  // Segments of the registered ranks, retained snapshots, registrations in
  // flight, and previous layouts being written.
  uint64_t StagingBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Counts the admissions begun (each may take staging room): what reads the
  // room outside the table's lock checks it did not move meanwhile
  // (ReplicaStore::Put).
  const std::atomic<uint64_t>* admissions() const { return &admissions_; }

  // Removes the droppable jobs that have no registration in flight, and
  // returns them. A job's destructor joins its committer, which may be in the
  // middle of a disk operation (a tick's read of `latest` on a hung file
  // system): the caller lets them go where such a wait holds up nobody (the
  // housekeeper's reaper thread, Housekeeper::LetGo).
  std::vector<std::shared_ptr<Job>> DropIdle() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `job` if it is still registered as `job_id` and droppable, and
  // returns it (null when it was not removed); see DropIdle.
  std::shared_ptr<Job> DropIfIdle(const std::string& job_id, const Job* job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses admissions from now on and hands every job over (shutdown).
  std::map<std::string, std::shared_ptr<Job>> Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Admits a registration (see the file comment). Refused: Unavailable
  // after Close, or for another layout of a job whose node-local steps
  // still wait for the store (Job::replaceable), PermissionDenied for
  // another uid's job, FailedPrecondition
  // for a job registered with another world size or directory, AlreadyExists
  // while a live trainer serves the rank or another registration of it is
  // in flight, ResourceExhausted over the staging budget. What the
  // admission dropped (an idle job it replaced, retained snapshots given up
  // for room or not adopted) is destroyed outside the lock, before return.
  absl::StatusOr<Admission> Admit(AdmitRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  // The previous layout an admission handed over is written (or dropped)
  // and its memory released: no longer counted in the staging budget.
  void RelayoutWritten(const std::string& job_id, uint64_t counted_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Admission;
  void Finish(const std::string& job_id, uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t StagingBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Of StagingBytesLocked, what retained snapshots hold.
  uint64_t RetainedBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool InFlightLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void LogForgotten(const std::string& job_id);
  // Takes out one rank's retained snapshots (the one that expires first in
  // the first job that has some) into `dropped`; false when none is left.
  bool DropOneRetainedLocked(std::vector<RetainedSnapshots::Entry>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable zcc::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Registrations admitted and not yet installed, by (job, rank), with the
  // bytes each will reserve.
  std::map<std::pair<std::string, uint32_t>, uint64_t> in_flight_ ABSL_GUARDED_BY(mu_);
  // Previous layouts' snapshots being written for their job's new layout.
  std::map<std::string, uint64_t> relayout_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> admissions_{0};  // bumped under mu_, read without it
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_JOB_TABLE_H_
