// A step of the peer tier read in place (DESIGN.md 5c): a job's newest step
// that no disk here holds, shown to restores under the job directory's own
// paths (job_dir/step-N/...) as an ordinary committed step while its shard
// files stay in the memory of the zccds that hold them. A restore reads the
// ranges it needs of each file straight into the rank's staging memory,
// each read pulled from the first holder that serves it; the restore checks
// every tensor against the checksum its manifest records, as it does for a
// step on disk, and falls back to an older step on a mismatch.
//
// The small files (the ranks' manifests, already pulled and decoded, and
// what the commit writes from them: the step index, the weight maps,
// COMMITTED, `latest`) are held here in memory; the commit (TryCommit, the
// one every step goes through) checks the manifests as for a step on disk.
// A shard file's size is its manifest's: each read checks that the holder's
// copy has that size (another run's copy of the same name does not serve).
//
// A holder's copy of a file is checked against the file's XXH3 there before
// its first range is served (PullRange's check_held): a copy damaged in a
// holder's memory sends the reads to the next holder instead of failing the
// restore. Damage on the way is found by the restore's own checks. A range
// no holder serves, for whatever reason, fails the read with DataLoss: the
// restore falls back to an older step, as for a damaged step on disk.
//
// Thread-safety: a Storage, safe from any number of threads; each File by
// one thread at a time. Ownership: made shared (Files it hands out keep it
// alive); it borrows the replica store and the peer directory, which
// outlive it.
#ifndef ZCC_DAEMON_PEER_RECOVERED_STEP_H_
#define ZCC_DAEMON_PEER_RECOVERED_STEP_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/task_pool.h"
#include "daemon/peer/call_cancel.h"
#include "daemon/peer/peer_recovery.h"
#include "storage/memory_storage.h"
#include "storage/storage.h"

namespace zcc::daemon::peer {

class RecoveredStep final : public storage::Storage,
                            public std::enable_shared_from_this<RecoveredStep> {
 public:
  // The step `plan` names, committed (in memory) under `job_dir`: DataLoss
  // when its manifests do not make a whole step (TryCommit's checks), or a
  // file has no holder.
  static absl::StatusOr<std::shared_ptr<RecoveredStep>> Make(const std::string& job_id,
                                                             uint32_t uid,
                                                             const std::string& job_dir,
                                                             const RecoveryPlan& plan,
                                                             const RecoverySources& sources);
  ~RecoveredStep() override;

  int64_t step() const { return step_; }
  // When it was recovered (made).
  absl::Time recovered_at() const { return recovered_at_; }
  // Who holds the step's files (for writing it to disk: MaterializeStep).
  const RecoveryPlan& plan() const { return plan_; }
  const std::string& job_dir() const { return job_dir_; }
  // job_dir/step-N: the paths this storage serves.
  const std::string& dir() const { return dir_; }
  // The bytes of the step's shard files (what a restore of every rank reads).
  uint64_t remote_bytes() const { return remote_bytes_; }
  // The pulls' sources, as given.
  const RecoverySources& sources() const { return sources_; }
  // Ends the pulls in flight and every later one (Cancelled): zccd stops.
  // Other pulls of the step (its write to disk) may share it: cancel().
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  CallCancel* cancel() { return &cancel_; }
  // A restore is about to read the step (its rank asked for the job's
  // steps): the quiet time (AwaitQuiet) starts again, and with `rank0` this
  // zccd writes the step into the job's directory (one zccd of the job
  // does, not every node). False when the step has been let go already:
  // the caller finds it anew.
  bool Touch(bool rank0) ABSL_LOCKS_EXCLUDED(mu_);
  // The job went on from an older step than this one: it is of the run
  // left behind, and never written to disk (its write, waiting or under
  // way, ends: its pulls are cancelled, its commit refused). True the first
  // time.
  bool LeaveBehind() ABSL_LOCKS_EXCLUDED(mu_);
  bool left_behind() const ABSL_LOCKS_EXCLUDED(mu_);
  enum class AfterQuiet { kWrite, kLetGo, kCancelled };
  // Waits until no file of the step has been open, nor the step touched,
  // for `quiet` (the restores that read it are done: the write to disk,
  // which pulls the same bytes again, comes after them), then says whether
  // this zccd writes the step; when not, lets it go (no Touch marks it any
  // more), in one step with the wait's end. kCancelled once cancelled.
  AfterQuiet AwaitQuiet(absl::Duration quiet) ABSL_LOCKS_EXCLUDED(mu_);

  // Reading: the step's files. Anything else the Storage interface has is
  // refused (PermissionDenied): restores only read.
  absl::StatusOr<std::unique_ptr<storage::File>> OpenForRead(
      const std::string& path, const storage::OpenOptions& options) override;
  absl::StatusOr<storage::FileInfo> Stat(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<storage::File>> OpenForWrite(
      const std::string& path, const storage::OpenOptions& options) override;
  absl::Status MakeDirs(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path) override;

 private:
  class PulledFile;
  // A shard file: where it is held.
  struct Remote {
    uint64_t bytes = 0;
    ReplicaKey key;
    std::vector<std::string> holders;  // in the order they are tried
  };

  RecoveredStep(std::string job_dir, const RecoveryPlan& plan, const RecoverySources& sources);
  // The shard file `path` names (in step-N/ or step-N.partial/), or null.
  const Remote* RemoteAt(const std::string& path) const;
  // Reads `n` bytes of `file` from `offset` into `dst`, from the first
  // holder that serves them.
  absl::Status ReadRange(const Remote& file, uint64_t offset, void* dst, size_t n)
      ABSL_LOCKS_EXCLUDED(mu_);
  // From one holder; `check_held`: the holder checks its copy first.
  absl::Status ReadFrom(const std::string& holder, const Remote& file, uint64_t offset, void* dst,
                        size_t n, bool check_held);
  // Writes by the commit only, before the step is shown.
  bool Sealed() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string job_dir_;
  const int64_t step_;
  const std::string dir_;
  const std::string partial_dir_;
  const RecoveryPlan plan_;
  const RecoverySources sources_;
  // The small files: manifests, index, weight maps, COMMITTED, latest.
  storage::MemoryStorage small_{/*keep_synced=*/false};
  std::map<std::string, Remote> remote_;  // by file name; set by Make, then read only
  uint64_t remote_bytes_ = 0;
  CallCancel cancel_;
  TaskPool pulls_;  // the reads in flight, of every file
  // Counts the pulls from peers: each goes on the next of kPullThreads
  // connections to its holder, so that pulls in flight do not queue on one.
  std::atomic<uint32_t> pulls_made_{0};

  // A file of the step opened, and closed.
  void Opened() ABSL_LOCKS_EXCLUDED(mu_);
  void Closed() ABSL_LOCKS_EXCLUDED(mu_);

  mutable zcc::Mutex mu_;
  bool sealed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool write_here_ ABSL_GUARDED_BY(mu_) = false;
  bool let_go_ ABSL_GUARDED_BY(mu_) = false;
  bool left_behind_ ABSL_GUARDED_BY(mu_) = false;
  const absl::Time recovered_at_ = absl::Now();
  int open_files_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_closed_ ABSL_GUARDED_BY(mu_);  // or touched (made: when made)
  // (file, holder) whose copy checked out at the holder, or did not.
  std::set<std::pair<std::string, std::string>> checked_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> damaged_ ABSL_GUARDED_BY(mu_);
  // Being checked now, by the read that asked first.
  std::set<std::pair<std::string, std::string>> checking_ ABSL_GUARDED_BY(mu_);
};

// The newest step of the tier newer than `newer_than` (the newest the job's
// directory has) that makes a whole committed step, to be read in place;
// null when there is none (each step passed over logged with the reason).
std::shared_ptr<RecoveredStep> RecoverInPlace(const std::string& job_id, uint32_t uid,
                                              const std::string& job_dir, int64_t newer_than,
                                              const RecoverySources& sources);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_RECOVERED_STEP_H_
