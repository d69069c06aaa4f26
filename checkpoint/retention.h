// Retention of committed steps and garbage collection of abandoned partial
// directories in one job directory.
//
// Thread-safety: stateless; callers serialise runs on the same job directory
// (the committer's daemon does retention for its jobs).
#ifndef ZCC_CHECKPOINT_RETENTION_H_
#define ZCC_CHECKPOINT_RETENTION_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

struct RetentionPolicy {
  // Newest committed steps kept (>= 1), counted up to the one `latest`
  // names: steps above it (left behind by a run that went back to an older
  // step) are neither counted nor removed.
  uint32_t keep_last = 3;
  uint32_t keep_every = 0;   // also keep steps divisible by this; 0 = off
};

struct RetentionResult {
  std::vector<int64_t> removed_steps;
  std::vector<std::string> removed_partials;
};

// Asked about each step retention would remove, right before it does: steps
// being restored are pinned by the caller, who decides at that moment (so a
// restore that begins while retention runs is not raced).
struct RetentionGuard {
  // False keeps the step. Null: every step outside the policy goes.
  std::function<bool(int64_t step)> may_remove;
  // After a step may_remove let go is removed, or its removal failed.
  std::function<void(int64_t step)> done;
  // False keeps step-N.partial even when it looks abandoned (the caller knows
  // it is being written or waits for other ranks). Null: age alone decides.
  std::function<bool(int64_t step)> may_remove_partial;
};

// Removes committed steps outside the policy. Never removes the step named by
// `latest`, the newest committed step, or a step `guard` keeps (steps being
// restored). Partial directories (step-N.partial, *.superseded), step
// directories a removal left without COMMITTED, and temporary files of an
// atomic write (latest.tmp.*) whose last modification is older than
// `partial_max_age` are removed too: a commit that did not complete in that
// time is abandoned. Where steps commit in place (an object store,
// step_dirs.h) a step-N/ without COMMITTED is such a partial step. Everything
// goes through `fs` (null: the default POSIX storage).
absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const RetentionGuard& guard,
                                               absl::Duration partial_max_age,
                                               storage::Storage* fs = nullptr);
// The same, keeping `protected_steps`.
absl::StatusOr<RetentionResult> ApplyRetention(const std::string& job_dir,
                                               const RetentionPolicy& policy,
                                               const std::set<int64_t>& protected_steps,
                                               absl::Duration partial_max_age,
                                               storage::Storage* fs = nullptr);

// A committed step above `latest` that a run left behind, with the time its
// COMMITTED was written when it was found.
struct LeftBehindStep {
  int64_t step = 0;
  absl::Time committed;
};

// The committed steps above the one `latest` names that a run left behind:
// committed before `latest` was last written (pointed back below them), by
// the storage's clock. One committed since (a commit whose write of
// `latest` failed, a previous layout's step written for this one) is the
// current run's and is not listed; nor is one not told apart (equal times,
// on storage with whole-second ones). Empty without a `latest`, and where
// `latest` changed while it was read (another node's commit).
absl::StatusOr<std::vector<LeftBehindStep>> LeftBehindSteps(const std::string& job_dir,
                                                            storage::Storage* fs = nullptr);

// `above` (LeftBehindSteps) less the steps a run took up: where
// `went_on_from` is one of them (a run restored that step left behind from
// its directory and trained on from it), it and the steps below it
// committed no later than it (its own run's, not a later run's of a smaller
// number) are that run's past, not steps its commits pass.
std::vector<LeftBehindStep> WithoutTakenUp(std::vector<LeftBehindStep> above,
                                           int64_t went_on_from);

// A run that went back to an older step left its newer committed steps
// above `latest`, neither restored nor counted. Once the run that went on
// commits past one (`latest` now names a newer step), it would be on the
// timeline again, with the other run's bytes: a restore falling back past a
// damaged step took it, and retention counted it among the newest. Removes
// those of `passed` (LeftBehindSteps before this run's commit, less
// WithoutTakenUp) that `latest` is past now, as ApplyRetention removes a
// step and with its `guard`; returns them. A step whose COMMITTED is not the
// one listed (this run committed the step again since: another node's commit
// in a store) or cannot be read stays.
absl::StatusOr<std::vector<int64_t>> RemovePassedSteps(const std::string& job_dir,
                                                       const std::vector<LeftBehindStep>& passed,
                                                       const RetentionGuard& guard,
                                                       storage::Storage* fs = nullptr);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_RETENTION_H_
