// The tiered mode's second tier: a step committed on the node-local root is
// copied to the job's directory in an object store and committed there, by
// the protocol a step written straight into a store follows (step_dirs.h,
// committer.h): a COMMITTED of an earlier commit of the step is removed
// first, every file is copied (the shards streamed in multipart parts),
// COMMITTED last, then `latest` by a compare-and-swap. A failure or a crash
// leaves the store's step uncommitted, never mixed; retention and gc remove
// it once old.
//
// The node-local tiered mode (a multi-node job whose local root is each
// node's own disk, no shared file system) has no local commit: each node
// uploads the files its own ranks wrote of a step (UploadNodeStep), each
// rank's manifest after its files, and the step is committed in the store
// by whichever node finds every rank's manifest there, the last to finish
// its upload.
//
// Thread-safety: stateless; callers upload one step of a job at a time.
#ifndef ZCC_CHECKPOINT_STEP_UPLOAD_H_
#define ZCC_CHECKPOINT_STEP_UPLOAD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

struct UploadStats {
  uint64_t bytes = 0;  // every file of the step
  uint32_t files = 0;
  double seconds = 0;
};

struct UploadOptions {
  // When the step's first rank began writing it (PointLatest's rule for a
  // newer step in the store's `latest`).
  absl::Time write_began = absl::InfiniteFuture();
  // Asked between chunks; true stops the upload with Cancelled (null: never).
  const std::function<bool()>* cancelled = nullptr;
};

// Copies committed step `step` of `job_dir` to `store_job_dir` and commits
// it there; both paths of `fs` (zccd's routed storage). A step the store
// holds committed as it is here is not copied again (its `latest` is moved,
// if need be). FailedPrecondition when the local step is not committed.
absl::StatusOr<UploadStats> UploadStep(storage::Storage& fs, const std::string& job_dir,
                                       int64_t step, const std::string& store_job_dir,
                                       const UploadOptions& options = {});

struct NodeUploadResult {
  UploadStats stats;
  bool committed = false;          // this upload completed the step in the store
  uint32_t manifests_present = 0;  // in the store's step after this node's
  bool mixed_runs = false;  // every rank's is there, but of different runs or timelines
  std::string mixed;        // which ranks name which (CommitResult::mixed)
};

// Copies the files this node's ranks wrote of `step` (its step-N.partial/
// under `job_dir`: shard files and rank manifests, no COMMITTED) into
// `store_job_dir`'s step-N/, manifests last, and then commits the step
// there when every one of the job's `world_size` ranks' manifests is
// present (checkpoint::TryCommit: the same checks, index, COMMITTED last,
// `latest` by a compare-and-swap). A COMMITTED of an earlier commit of the
// step is removed before anything is copied, and with it every rank's
// manifest there: that step is dead as a whole, and another node's part of
// it must not complete the new one. FailedPrecondition when the local step
// holds no manifest.
absl::StatusOr<NodeUploadResult> UploadNodeStep(storage::Storage& fs, const std::string& job_dir,
                                                int64_t step, const std::string& store_job_dir,
                                                const std::string& job_id, uint32_t world_size,
                                                const UploadOptions& options = {});

// A rank of this node registered again (a new run of the job): its
// manifests in the store's uncommitted steps are from an earlier run, and
// must not complete a step the new run writes again with the other ranks'
// new parts. Removes them; returns how many. With `keep_run` (the
// registering run's id), a manifest of that run stays: the same run
// registered again (its trainer reconnected to a restarted zccd) goes on
// with the parts it sent. A step another node commits meanwhile keeps every
// manifest: one removed just as the step was committed is written back.
absl::StatusOr<uint32_t> ForgetRankParts(storage::Storage& fs, const std::string& store_job_dir,
                                         const std::vector<uint32_t>& ranks,
                                         const std::string& keep_run = "");

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_STEP_UPLOAD_H_
