// What zccd knows of committed steps it may restore: the verdict of each
// step's metadata check (checkpoint::CheckStepMetadata: COMMITTED, manifests,
// step index, shard sizes and headers; no tensor data), what a read found
// wrong with it (MarkDamaged), and the grouped index of the steps restored
// last. Keyed by step directory and manifest hash, so a step rewritten under
// the same name is checked again.
//
// Each step is checked (or its index loaded) once, by the first restore that
// asks, outside the cache's lock: the ranks of a job that miss the cache
// together wait for that one read, while restores of other steps (other
// jobs) go on. A check stalled on a slow disk holds up only its own step.
//
// Thread-safety: thread-safe. The lock guards the table only and is never
// held across I/O.
#ifndef ZCC_DAEMON_RESTORE_STEP_CHECKS_H_
#define ZCC_DAEMON_RESTORE_STEP_CHECKS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "common/mutex.h"
#include "metrics/metrics.h"

namespace zcc::daemon {

class StepChecks {
 public:
  // `metrics` (borrowed) counts failed checks as verify errors; the checks
  // read with `io` (its storage: the daemon's).
  StepChecks(metrics::ZccMetrics* metrics, const checkpoint::IoOptions& io)
      : metrics_(metrics), io_(io) {}
  StepChecks(const StepChecks&) = delete;
  StepChecks& operator=(const StepChecks&) = delete;

  // The metadata check's verdict for `step_dir`, or what a read found
  // (MarkDamaged). The step's index is kept when it checks out.
  absl::Status Check(const std::string& step_dir) ABSL_LOCKS_EXCLUDED(mu_);
  // The grouped index of `step_dir`: kept by its check, or loaded (and kept)
  // when no longer held.
  absl::StatusOr<std::shared_ptr<const checkpoint::GroupedIndex>> Index(
      const std::string& step_dir) ABSL_LOCKS_EXCLUDED(mu_);
  // Records that `step_dir`, as committed with `manifest_hash` (its COMMITTED
  // record when the read began), failed while being read (`why`), whatever
  // its metadata check found, so that the next choice skips it. A step
  // committed again since under the same name is not marked.
  void MarkDamaged(const std::string& step_dir, uint64_t manifest_hash, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what is known of `step_dir` (every manifest hash), but checks
  // under way.
  void Forget(const std::string& step_dir) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using StepKey = std::pair<std::string, uint64_t>;  // step directory, manifest hash
  struct Entry {
    // A check or index load of this step is under way (by one caller,
    // outside the lock); the others wait for it.
    bool busy = false;
    std::optional<absl::Status> verdict;
    std::shared_ptr<const checkpoint::GroupedIndex> index;
  };
  // The step's entry, once no one is reading for it (made if new).
  Entry& AwaitIdle(const StepKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepIndex(const StepKey& key, std::shared_ptr<const checkpoint::GroupedIndex> index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Trim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Bounded: an index of a million tensors takes hundreds of MB.
  static constexpr size_t kCachedIndexes = 2;
  static constexpr size_t kCachedSteps = 256;

  metrics::ZccMetrics* const metrics_;
  const checkpoint::IoOptions io_;
  zcc::Mutex mu_;
  std::map<StepKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Steps whose index is held, oldest first.
  std::deque<StepKey> indexed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_STEP_CHECKS_H_
