// What a job directory needs after a crash, done when zccd starts (and by
// anyone who finds one): abandoned partial steps, removals and atomic writes
// cut short are removed, and a `latest` that a crash inside a job's first
// commit left missing is written. Everything goes through a Storage, so the
// commit-crash tests run it on the storage they crashed.
//
// Thread-safety: stateless; callers serialise work on one job directory.
#ifndef ZCC_CHECKPOINT_RECOVERY_H_
#define ZCC_CHECKPOINT_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

// Recovery after a crash between a step directory's rename and the write of
// `latest` in the job's first commit: when `latest` is absent or does not name
// a step, and committed step directories exist, points `latest` at the newest
// of them whose COMMITTED reads back (the step restore chooses anyway).
// Returns the step written, or nullopt when nothing needed repair. A `latest`
// naming a step is never changed: steps above it are either an abandoned
// timeline or a commit cut short before its swap, and neither is committed.
absl::StatusOr<std::optional<int64_t>> RepairLatest(const std::string& job_dir,
                                                    storage::Storage* fs = nullptr);

struct Recovery {
  std::vector<std::string> removed;       // entries of the job directory
  std::optional<int64_t> latest_repaired;  // RepairLatest's answer
};

// Removes what a commit or a retention run cut short left behind (partials
// older than `partial_max_age`: younger ones may be another daemon's commit
// in progress in a shared root; at any age, the COMMITTED and manifests of
// the contents a commit of a step replaced, left under step-N.partial/:
// ForgetReplacedStep), then RepairLatest. Committed steps are kept,
// whatever the retention policy.
absl::StatusOr<Recovery> RecoverJobDir(const std::string& job_dir, absl::Duration partial_max_age,
                                       storage::Storage* fs = nullptr);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_RECOVERY_H_
