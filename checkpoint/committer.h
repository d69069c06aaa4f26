// Turns a complete step-N.partial/ into the committed step-N/. Run by the
// daemon that serves global rank 0 of a job.
//
// A step is complete when every rank's manifest (r00000 .. r<world-1>) is
// present; manifests are written last by each rank, so their presence means
// the shard files are durable. Commit then: validates every manifest (same
// job, step and world size; files present with the announced sizes; no tensor
// key written twice), writes the index files and COMMITTED, fsyncs, renames the
// directory to step-N/, fsyncs the job directory and swaps `latest` atomically.
// A crash at any point leaves either the old state or the new one visible:
// restore only ever picks directories named step-N that contain COMMITTED.
//
// Thread-safety: stateless; callers serialise commits of the same job.
#ifndef ZCC_CHECKPOINT_COMMITTER_H_
#define ZCC_CHECKPOINT_COMMITTER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

enum class CommitOutcome {
  kCommitted,
  kWaiting,  // some rank's manifest is not there yet
};

struct CommitResult {
  CommitOutcome outcome = CommitOutcome::kWaiting;
  uint32_t manifests_present = 0;
  uint64_t total_bytes = 0;  // all shard files of the step
};

absl::StatusOr<CommitResult> TryCommit(const std::string& job_dir, const std::string& job_id,
                                       int64_t step, uint32_t world_size,
                                       storage::Storage* storage = nullptr);

// Recovery after a crash between a step directory's rename and the write of
// `latest` in the job's first commit: when `latest` is absent or does not name
// a step, and committed step directories exist, points `latest` at the newest
// of them whose COMMITTED reads back (the step restore chooses anyway).
// Returns the step written, or nullopt when nothing needed repair. A `latest`
// naming a step is never changed: steps above it are either an abandoned
// timeline or a commit cut short before its swap, and neither is committed.
absl::StatusOr<std::optional<int64_t>> RepairLatest(const std::string& job_dir);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_COMMITTER_H_
