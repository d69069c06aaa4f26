// One training job as this daemon sees it: the ranks registered here, and,
// when global rank 0 is one of them, the commit of every step the job's ranks
// persist (DESIGN.md section 5).
//
// The job's committer is a thread of its own: rank writers report a persist
// and go on, the housekeeper's tick only asks for a round, and the commit's
// disk work (fsyncs, renames, retention's removals) runs there, so a commit
// stalled on a slow disk holds up neither this job's writers nor any other
// job, the housekeeping round or the watchdog. A restore pins its step
// (BeginRestore) without waiting for a commit: retention skips pinned steps.
//
// Thread-safety: all methods may be called concurrently (writer threads report
// persists, RPC handlers add and remove ranks, the housekeeper ticks).
#ifndef ZCC_DAEMON_JOBS_JOB_H_
#define ZCC_DAEMON_JOBS_JOB_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "checkpoint/retention.h"
#include "common/fs_identity.h"
#include "common/mutex.h"
#include "daemon/peer/job_peers.h"
#include "daemon/jobs/job_uploader.h"
#include "daemon/rank/rank_session.h"
#include "daemon/memory/retained_snapshots.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "storage/storage.h"

namespace zcc::daemon {

struct JobOptions {
  std::string job_id;
  uint32_t world_size = 1;
  std::string job_dir;
  checkpoint::RetentionPolicy retention;
  absl::Duration commit_timeout = absl::Minutes(10);
  // The uid (and primary gid) that registered the job: its checkpoints are
  // written, committed and removed with that identity (job_directory.h).
  FsOwner owner;
  metrics::ZccMetrics* metrics = nullptr;  // borrowed; outlives the job
  // Where commits write (borrowed; outlives the job); null = the default
  // POSIX storage.
  storage::Storage* storage = nullptr;
  // Held while the job lives: its own route to an object store with the
  // credentials its trainer gave (ObjectStoreRoots::RouteJob); null: none.
  std::shared_ptr<void> store_route;
  // The tiered mode: the job's directory in an object store, where each step
  // committed here is uploaded (job_uploader.h), and the store's retention.
  // Empty: no upload.
  std::string upload_dir;
  checkpoint::RetentionPolicy upload_retention;
  // After a failed upload, before it is tried again.
  absl::Duration upload_retry_after = absl::Seconds(30);
  // With upload_dir: job_dir is this node's own (no file system the nodes
  // share). Nothing commits here: once every rank registered here has
  // written a step, the uploader sends this node's part of it and the step
  // commits in the store (job_uploader.h).
  bool node_local_root = false;
  // Told, on the committer's thread, each time the job's ranks here went on
  // from a restore of step `restored` (at `at`, their first snapshot after
  // it; GoBack): the peer tier drops what it holds of the run left behind
  // (peer::ReplicaStore::DropLeftBehind). Null: nobody.
  std::function<void(int64_t restored, absl::Time at)> on_went_on;
};

class Job {
 public:
  explicit Job(JobOptions options);
  ~Job();

  const JobOptions& options() const { return options_; }
  // The job's membership in the peer tier (SetJobPeers).
  peer::JobPeers& peers() { return peers_; }
  const peer::JobPeers& peers() const { return peers_; }
  // OK when `uid` may act on this job: its owner, or root.
  absl::Status Authorize(uid_t uid) const;

  std::shared_ptr<RankSession> FindRank(uint32_t rank) const;
  // Installs `session` for its rank, returning the one it replaces (if any).
  std::shared_ptr<RankSession> PutRank(std::shared_ptr<RankSession> session);
  // Removes the rank if its generation matches; returns the removed session.
  std::shared_ptr<RankSession> RemoveRank(uint32_t rank, uint64_t generation);
  // Waits until `session` no longer serves its rank (removed or replaced),
  // at most until `deadline`; returns whether it is gone.
  bool AwaitRankGone(uint32_t rank, const RankSession* session, absl::Time deadline) const;
  std::vector<std::shared_ptr<RankSession>> Ranks() const;
  // No ranks registered, no commit pending, no step waiting for the upload
  // (also while its tries fail: they are tried again, and status says why;
  // a job dropped would leave such steps on this node's disk, unsent).
  bool idle() const;
  // What a registration of the job in another layout (world size, place)
  // may replace: no ranks, no commit pending, no previous layout being
  // written, and, with node-local roots (whose steps reach the store from
  // the nodes alone), nothing waiting for the store. With a single root an
  // upload in progress does not stop it: the new job's uploader sends what
  // the store lacks of the root when it starts.
  bool replaceable() const;
  // Steps wait for the store (tiered mode), their last try failed or not.
  bool sending_to_store() const { return uploader_ != nullptr && uploader_->HasWork(); }
  // Idle, and no snapshots retained for a restore from memory: the job can
  // be dropped.
  bool droppable() const { return idle() && retained_.empty(); }

  // Snapshots of ranks whose trainer died or exited, for a restore from
  // memory when the rank registers again.
  RetainedSnapshots& retained() { return retained_; }

  // A job resumed in another layout whose previous layout's snapshots are
  // being written into its directory (daemon/control/relayout.h): its
  // registrations wait for that before they go on to restore. Each
  // ExpectRelayout is matched by one RelayoutDone, whatever the outcome.
  void ExpectRelayout() ABSL_LOCKS_EXCLUDED(relayout_mu_);
  void RelayoutDone() ABSL_LOCKS_EXCLUDED(relayout_mu_);
  // Waits until no write is pending; false when `stop` (asked about once a
  // second; may be null) said to give up first.
  bool AwaitRelayout(const std::function<bool()>& stop = nullptr) const
      ABSL_LOCKS_EXCLUDED(relayout_mu_);
  bool relayout_pending() const ABSL_LOCKS_EXCLUDED(relayout_mu_);

  // From a rank's writer thread after each persist attempt: the committer
  // tries the step (and older pending ones) next.
  void OnPersisted(const PersistEvent& event);
  // Periodic (the housekeeper): asks the committer for a round that retries
  // commits waiting for other daemons' ranks and expires those older than the
  // commit timeout, or, where another daemon commits, follows `latest`.
  // Returns at once.
  void Tick();
  // A step committed into the job's directory by something other than the
  // committer (a relayout's write of the previous layout's memory, a
  // recovery from the peer tier): the tiered mode uploads it, whole, in
  // either mode (JobUploader::OnCommitted); nothing else changes.
  void OnCommittedOutside(int64_t step, absl::Time write_began);
  // Rank `rank`'s trainer went on from the step `restored` a restore gave it:
  // its first snapshot since is of `step` (RankSession::NoteRestored; from its
  // ingest thread). The job's ranks tell it in turn; the first of each
  // going back counts. Where a step numbered `step` or later was committed or
  // waits for its commit, the run that wrote it was left for this one (a
  // rollback, or a fallback past a damaged step): its steps waiting never
  // commit nor go to the store (nor do its writes still going:
  // RankWriteTarget::left_behind), and where this daemon commits, `latest`
  // (of the job's directory and the store) is pointed back at the newest
  // committed step up to `restored`, so that a restart before this run's
  // first commit resumes this run. The steps left behind stay, no longer
  // restored nor counted by retention, until this run commits steps of the
  // same numbers. Where the step was read from a directory (`from_disk`)
  // and is itself a step left behind (a later run restored it on purpose),
  // this run took it up: it and the left-behind steps below it stay when
  // this run's commits pass them. Returns at once (job_went_back.cc).
  void OnTrainedOn(uint32_t rank, int64_t restored, int64_t step, bool from_disk)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `commit` (of a step written by something other than the committer:
  // a recovery from the peer tier) in turn with the committer's commits and
  // retention, which then neither commit nor move `latest` meanwhile.
  absl::Status CommitInTurn(const std::function<absl::Status()>& commit)
      ABSL_LOCKS_EXCLUDED(commit_mu_, mu_);
  // Waits until the committer has done what was asked of it before the call
  // (a closing trainer's last commit; shutdown).
  void AwaitCommitter() ABSL_LOCKS_EXCLUDED(mu_);

  // A step being restored is never removed by retention, from BeginRestore
  // until the matching EndRestore. False, and nothing to end, when retention
  // is removing the step already: it goes, and the restore must not take it
  // for damaged. (One retention removed before the pin is gone: the caller
  // checks that the step is still committed once pinned.)
  [[nodiscard]] bool BeginRestore(uint32_t rank, int64_t step);
  void EndRestore(uint32_t rank, int64_t step);

  void FillStatus(v1::JobStatus* out) const;
  // The tiered mode's durability lag (job_uploader.h); 0 without uploads.
  double UploadLagSeconds() const;

  // Applies the retention policy now (zccctl gc); also runs after every commit.
  absl::StatusOr<checkpoint::RetentionResult> CollectGarbage();

 private:
  // Tries the pending steps up to and including `up_to`, oldest first, so that
  // `latest` only moves forward. Once a step commits, older pending steps
  // that still miss a rank are superseded: dropped and their partials removed.
  void CommitPending(int64_t up_to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when `step` committed.
  bool TryCommit(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void DropPending(int64_t step, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SetError(std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What retention may remove (steps pinned by restores, partials waiting
  // for their commit, steps being uploaded stay).
  checkpoint::RetentionGuard MakeRetentionGuard() ABSL_LOCKS_EXCLUDED(mu_);
  // The committed steps above `latest` that a run left behind (committed
  // before `latest` was last written), read before a commit;
  // RemovePassedSteps removes those the commit passed.
  std::vector<checkpoint::LeftBehindStep> StepsAboveLatest() ABSL_LOCKS_EXCLUDED(mu_);
  void RemovePassedSteps(const std::vector<checkpoint::LeftBehindStep>& above)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<checkpoint::RetentionResult> ApplyRetention()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The committer thread: waits for work (commit_up_to_, tick_due_), does it.
  void CommitterLoop() ABSL_LOCKS_EXCLUDED(mu_, commit_mu_);
  // A housekeeping round's work (see Tick).
  void TickWork() ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // OnTrainedOn: the restored step (-1: none), the first step snapshotted
  // since, and when.
  struct GoingBack {
    int64_t restored = -1;
    int64_t first_step = -1;
    absl::Time at;
  };
  // OnTrainedOn's work, on the committer's thread (this run commits nothing
  // before it here).
  void GoBack(const GoingBack& back) ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether this daemon commits the job (it serves global rank 0).
  bool IsCommitter() const ABSL_LOCKS_EXCLUDED(mu_);
  // Drops (and removes the partial directory of) every pending step older
  // than the commit timeout.
  void ExpirePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Node-local root: a rank here wrote `event.step`; once every rank
  // registered here has, the step goes to the uploader.
  void OnNodeRankWritten(const PersistEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Node-local root: the steps some rank here wrote longer ago than the
  // commit timeout while another never did are dropped and removed.
  void ExpireNodeSteps() ABSL_LOCKS_EXCLUDED(mu_);

  const JobOptions options_;

  // Held across a commit's and retention's disk work, so commits run one at a
  // time and in order; never needed by status or rank bookkeeping.
  zcc::Mutex commit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Guards the job's state; never held across disk I/O.
  mutable zcc::Mutex mu_;
  std::map<uint32_t, std::shared_ptr<RankSession>> ranks_ ABSL_GUARDED_BY(mu_);
  // Set once global rank 0 registers here: this daemon then commits the job's
  // steps, including those still pending after rank 0 unregistered.
  bool committer_ ABSL_GUARDED_BY(mu_) = false;
  // Steps some local rank persisted and that are not committed yet, with the
  // time the first local rank finished.
  std::map<int64_t, absl::Time> pending_ ABSL_GUARDED_BY(mu_);
  // When this daemon's first rank began writing each pending step.
  std::map<int64_t, absl::Time> write_start_ ABSL_GUARDED_BY(mu_);
  // The steps this daemon committed lately, and when: a report of a write
  // that began before is late (another rank's report committed the step), one
  // begun after is the step written again (re-saved after a restore of it:
  // where steps commit in place, its write took COMMITTED away).
  std::map<int64_t, std::chrono::steady_clock::time_point> recently_committed_
      ABSL_GUARDED_BY(mu_);
  // Node-local root: per step not yet handed to the uploader, the ranks here
  // that wrote it, when the first finished and when its write began.
  struct NodeStep {
    std::set<uint32_t> ranks;
    absl::Time since;
    absl::Time write_began;
  };
  std::map<int64_t, NodeStep> node_steps_ ABSL_GUARDED_BY(mu_);
  std::multiset<std::pair<uint32_t, int64_t>> restoring_ ABSL_GUARDED_BY(mu_);  // (rank, step)
  // Steps retention is removing now (they are no longer pinned by a restore).
  std::set<int64_t> removing_ ABSL_GUARDED_BY(mu_);
  // The committer's work: commit pending steps up to this one (-1: none),
  // a tick round; whether it is at work; stop once idle.
  int64_t commit_up_to_ ABSL_GUARDED_BY(mu_) = -1;
  bool tick_due_ ABSL_GUARDED_BY(mu_) = false;
  // OnTrainedOn's request of the committer (restored -1: none).
  GoingBack go_back_ ABSL_GUARDED_BY(mu_);
  // How many times each rank went on from a restore (OnTrainedOn), and the
  // most of them: a rank's count past it is a new going back.
  std::map<uint32_t, uint64_t> trained_on_ ABSL_GUARDED_BY(mu_);
  uint64_t goings_back_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time going_back_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the last one's
  int64_t went_back_to_ ABSL_GUARDED_BY(mu_) = -1;  // the step it went on from
  // The step the job's ranks last went on from after reading it from a
  // directory (-1: none, or a later restore from memory of an older step):
  // see checkpoint::WithoutTakenUp.
  int64_t went_on_from_disk_ ABSL_GUARDED_BY(mu_) = -1;
  // What StepsAboveLatest last said it keeps as taken up (the step, how
  // many): said again only when it changes, not at every commit.
  std::pair<int64_t, size_t> taken_up_said_ ABSL_GUARDED_BY(mu_) = {-1, 0};
  // Pending steps whose manifests are all there but of different runs or
  // timelines: which ranks name which (checkpoint::CommitResult::mixed).
  std::map<int64_t, std::string> mixed_ ABSL_GUARDED_BY(mu_);
  // A going back GoBack could not do yet: rank 0 was not registered here.
  GoingBack unapplied_back_ ABSL_GUARDED_BY(mu_);
  bool stop_committer_ ABSL_GUARDED_BY(mu_) = false;
  // Requests made of the committer, and how many of them it has done (it
  // takes all those waiting at once): AwaitCommitter waits for the ones made
  // before it was called, not for later ones.
  uint64_t asked_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_committed_step_ ABSL_GUARDED_BY(mu_) = -1;
  // The committer's first round has read `latest` (TickWork).
  bool read_latest_ ABSL_GUARDED_BY(mu_) = false;
  // The last committed step as a whole: all its shard bytes, and the time from
  // the first rank's write start here to the commit (for a non-committing
  // daemon: what its own ranks wrote and how long the slowest took).
  checkpoint::WriteStats last_checkpoint_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  RetainedSnapshots retained_;
  mutable zcc::Mutex relayout_mu_;
  int relayouts_pending_ ABSL_GUARDED_BY(relayout_mu_) = 0;
  peer::JobPeers peers_;
  // The tiered mode's uploader (null: no upload_dir); fed by commits.
  std::unique_ptr<JobUploader> uploader_;
  // Last: it uses everything above, and is joined before it goes.
  std::thread committer_thread_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_JOB_H_
