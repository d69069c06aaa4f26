// The tiered mode's uploader of one job (RegisterRequest.upload_root): each
// step the job commits on its local root is copied to its directory in an
// object store and committed there (checkpoint/step_upload.h), on a thread
// of its own, so that neither the trainer, the rank writers nor the commits
// ever wait for the network. Only the newest committed step is uploaded: one
// that commits while an older one waits supersedes it. A failed upload is
// tried again after a backoff (or when the next step commits). The store's
// retention (keep_last there) runs after each upload.
//
// The durability lag, the time the oldest step committed here has waited for
// the store, is in the job's status and zccd's metrics. At start it catches
// up: a local `latest` newer than the store's (an upload that a stopped zccd
// did not finish) is uploaded first.
//
// On node-local disks (RegisterRequest.node_local_root) no step commits
// locally: each node's uploader sends the files its own ranks wrote of each
// step (OnNodeWritten; checkpoint::UploadNodeStep) and the node that finishes
// last commits the step in the store. Superseding would let nodes pick
// different steps, none of which every node sends; instead the steps are
// sent oldest first, and when more than kMaxNodeStepsWaiting wait, the
// oldest are dropped: every node keeps the newest ones, so the nodes still
// send common steps. Once a step's part is in the store its local copy
// becomes step-N.sent/, the node's only kept copy (restores read this node's
// ranks' files there: daemon/restore/kept_copies.h). The other nodes' commits are seen by reading the store's `latest`
// at each housekeeping round while a step sent from here is not known to be
// committed (FollowStore): no node tells another.
//
// Thread-safety: all methods may be called concurrently. The destructor
// cancels an upload in progress (within a chunk) and joins the thread.
#ifndef ZCC_DAEMON_JOBS_JOB_UPLOADER_H_
#define ZCC_DAEMON_JOBS_JOB_UPLOADER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "checkpoint/retention.h"
#include "common/fs_identity.h"
#include "common/mutex.h"
#include "metrics/metrics.h"
#include "proto/zcc.pb.h"
#include "storage/storage.h"

namespace zcc::daemon {

struct UploaderOptions {
  std::string job_id;
  std::string job_dir;     // the local root's job directory
  std::string upload_dir;  // the job's directory in the store (an s3:// URL)
  checkpoint::RetentionPolicy retention;  // in the store
  absl::Duration commit_timeout = absl::Minutes(10);  // age of store debris
  absl::Duration retry_after = absl::Seconds(30);
  FsOwner owner;  // reads the local step as the job's owner
  storage::Storage* storage = nullptr;         // routed: both paths; borrowed
  metrics::ZccMetrics* metrics = nullptr;      // borrowed; may be null
  // The node-local mode (above): this node's ranks' files of each step, for
  // a job of `world_size` ranks, committed in the store by the last node.
  bool node_local = false;
  uint32_t world_size = 1;
  // Called (no lock held) with each step the store's `latest` is seen at.
  std::function<void(int64_t)> on_store_latest;
};

// Node-local mode: steps written here that wait for the store, beyond the one
// being sent, before the oldest is dropped.
inline constexpr size_t kMaxNodeStepsWaiting = 2;

class JobUploader {
 public:
  explicit JobUploader(UploaderOptions options);
  ~JobUploader();
  JobUploader(const JobUploader&) = delete;
  JobUploader& operator=(const JobUploader&) = delete;

  // `step` committed on the local root now; its first rank began writing it
  // at `write_began`. In the node-local mode, where the job's own steps do
  // not commit locally, a step committed here whole by something else (a
  // relayout's write of the previous layout's memory, a peer recovery's) is
  // uploaded whole and committed in the store, before the parts waiting.
  void OnCommitted(int64_t step, absl::Time write_began) ABSL_LOCKS_EXCLUDED(mu_);
  // Node-local mode: every rank of this node has written `step` (its first
  // began at `write_began`); it goes to the store after those waiting.
  void OnNodeWritten(int64_t step, absl::Time write_began) ABSL_LOCKS_EXCLUDED(mu_);
  // Node-local mode: `rank` registered here for run `run_id` (empty: none
  // given). A new run of the job (or its first): steps of an earlier run
  // still waiting are dropped, and the rank's manifests of other runs in
  // the store's uncommitted steps are removed (checkpoint::ForgetRankParts)
  // before anything else is sent, so that no part of an earlier run
  // completes a step this run writes again. The same run registering the
  // rank again (its registration replaced in place, a reconnect) changes
  // nothing: what it wrote and sent stands. Returns whether it is a new run.
  bool OnRankRegistered(uint32_t rank, const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A run of the job went on from step `restored` at `at` (Job::OnTrainedOn):
  // the steps after it whose writes began before, the run left behind's, are
  // no longer sent, and where one being sent commits in the store after all,
  // the store's `latest` is pointed back again (checkpoint::PointLatestBack).
  void WentBack(int64_t restored, absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  // The step the job's ranks last went on from after reading it from a
  // directory (-1: none): where it is a step left behind in the
  // store, it and the store's left-behind steps below it stay
  // (checkpoint::WithoutTakenUp).
  void NoteWentOnFrom(int64_t restored_from_disk) ABSL_LOCKS_EXCLUDED(mu_);
  // Node-local mode: has the uploader's thread read the store's `latest`
  // when a step sent from here is not known to be committed (called each
  // housekeeping round; returns at once); its outcome goes to
  // on_store_latest. Does nothing otherwise.
  void FollowStore() ABSL_LOCKS_EXCLUDED(mu_);
  // True while `step` is being uploaded, or waits to be in the node-local
  // mode (local retention keeps it).
  bool Uploading(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // True while a committed step waits for the store (and has not failed).
  bool Busy() const ABSL_LOCKS_EXCLUDED(mu_);
  // True while anything waits for the store, its last try failed or not.
  bool HasWork() const ABSL_LOCKS_EXCLUDED(mu_);
  // Seconds the oldest step committed here has waited for the store (0: none).
  double LagSeconds() const ABSL_LOCKS_EXCLUDED(mu_);
  void FillStatus(v1::JobStatus* out) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // What the store lacks of the local root at start (see above).
  void CatchUp() ABSL_LOCKS_EXCLUDED(mu_);
  void Upload(int64_t step, absl::Time write_began) ABSL_LOCKS_EXCLUDED(mu_);
  // The node-local mode, after this node's part of `step` is in the store:
  // its local copy becomes <job_dir>/step-N.sent/, the only one kept.
  void KeepSent(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  void UploadNode(int64_t step, absl::Time write_began) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes this node's local copies of steps dropped from the queue.
  // A step dropped from the queue, and why (for the log).
  struct Dropped {
    int64_t step;
    const char* why;
  };
  void RemoveDropped(const std::vector<Dropped>& steps);
  // Node-local mode: `step` waits, the oldest dropped beyond the bound.
  void QueueNodeStep(int64_t step, absl::Time write_began) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The destructor has asked the thread to stop (an upload's cancel check).
  bool Stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  // The store's retention, after `committed` committed there.
  void ApplyStoreRetention(int64_t committed);
  // The steps a run left behind above the store's `latest` (none where they
  // cannot be listed, or no going back was seen here), before a commit
  // there; after it, those it passed go.
  std::vector<checkpoint::LeftBehindStep> LeftBehindInStore() const ABSL_LOCKS_EXCLUDED(mu_);
  void RemovePassedInStore(const std::vector<checkpoint::LeftBehindStep>& above);
  // Logs and counts a failed upload (unless cancelled: zccd is stopping).
  void Failed(const std::string& what, const absl::Status& status);
  // OnRankRegistered's work in the store (on the thread).
  void Forget(const std::string& run_id, const std::vector<uint32_t>& ranks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The store's `latest` is `step` (or newer): the job's status follows it.
  void SawStoreLatest(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `step`, whose write began at `write_began`, is of a run left
  // behind (WentBack).
  bool LeftBehindLocked(int64_t step, absl::Time write_began) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After `step` committed in the store: where it is of a run left behind,
  // the store's `latest` back to the run that went on.
  void AfterCommitInStore(int64_t step, absl::Time write_began) ABSL_LOCKS_EXCLUDED(mu_);

  const UploaderOptions options_;
  mutable zcc::Mutex mu_;
  // The newest step committed here and not yet in the store (-1: none),
  // when its write began, and when the oldest step still waiting committed.
  int64_t wanted_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time wanted_write_began_ ABSL_GUARDED_BY(mu_);
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int64_t uploading_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t uploaded_ ABSL_GUARDED_BY(mu_) = -1;
  // Node-local mode: steps written here waiting to be sent (with when their
  // write began), those dropped whose local copies are still to be removed,
  // the newest step sent from here, and the newest the store's `latest` was
  // seen at.
  std::map<int64_t, absl::Time> node_queue_ ABSL_GUARDED_BY(mu_);
  // The last step sent from here whose commit is not seen yet (-1: none).
  int64_t awaiting_commit_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Dropped> dropped_ ABSL_GUARDED_BY(mu_);
  // Ranks registered since, by the run they registered for.
  std::map<std::string, std::vector<uint32_t>> forget_ ABSL_GUARDED_BY(mu_);
  // The run each rank last registered for, and the newest run.
  std::map<uint32_t, std::string> rank_runs_ ABSL_GUARDED_BY(mu_);
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  int64_t store_latest_ ABSL_GUARDED_BY(mu_) = -1;
  bool follow_due_ ABSL_GUARDED_BY(mu_) = false;  // FollowStore asked for a read
  // Why the last read of the store's `latest` failed ("" after one that did
  // not): logged when it changes, not every round of a partition.
  std::string follow_error_ ABSL_GUARDED_BY(mu_);
  // After a failure: not before this time, unless a newer step commits.
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string error_ ABSL_GUARDED_BY(mu_);
  // The last WentBack: the step the job went on from (-1: none), and when.
  int64_t went_back_to_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t went_on_from_disk_ ABSL_GUARDED_BY(mu_) = -1;  // NoteWentOnFrom
  absl::Time went_back_at_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses everything above
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_JOB_UPLOADER_H_
