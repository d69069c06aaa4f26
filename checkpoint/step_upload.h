// The tiered mode's second tier: a step committed on the node-local root is
// copied to the job's directory in an object store and committed there, by
// the protocol a step written straight into a store follows (step_dirs.h,
// committer.h): a COMMITTED of an earlier commit of the step is removed
// first, every file is copied (the shards streamed in multipart parts),
// COMMITTED last, then `latest` by a compare-and-swap. A failure or a crash
// leaves the store's step uncommitted, never mixed; retention and gc remove
// it once old.
//
// Thread-safety: stateless; callers upload one step of a job at a time.
#ifndef ZCC_CHECKPOINT_STEP_UPLOAD_H_
#define ZCC_CHECKPOINT_STEP_UPLOAD_H_

#include <cstdint>
#include <functional>
#include <string>

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
// it there; both paths of `fs` (zccd's routed storage). FailedPrecondition
// when the local step is not committed.
absl::StatusOr<UploadStats> UploadStep(storage::Storage& fs, const std::string& job_dir,
                                       int64_t step, const std::string& store_job_dir,
                                       const UploadOptions& options = {});

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_STEP_UPLOAD_H_
