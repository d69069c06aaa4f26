// A node-local job (RegisterRequest.node_local_root) keeps, on each node, the
// newest step that node sent to the object store: <job_dir>/step-N.sent/,
// its ranks' files as they were written (daemon/jobs/job_uploader.h). A
// restore of that step from the store reads those files from the node's disk
// instead of over the network, where the copy is the store's step: each
// rank manifest kept there must be byte for byte the store's, and each file
// it lists must be there with the size it lists. Every other file, and every
// file of a step without such a copy, comes from the store.
//
// Reads stay checked piece by piece as ever; a kept copy found damaged is
// dropped (Forget), and the restore reads the step again from the store
// before it would call the step damaged (restore_service.cc).
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_RESTORE_KEPT_COPIES_H_
#define ZCC_DAEMON_RESTORE_KEPT_COPIES_H_

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "storage/storage_wrapper.h"

namespace zcc::daemon {

class KeptCopies final : public storage::StorageWrapper {
 public:
  // Reads through `base` (borrowed; outlives this), which reaches both the
  // store and the local roots. What was found for a step is known for
  // `remember` (a copy sent or dropped meanwhile is seen after that).
  explicit KeptCopies(storage::Storage* base, absl::Duration remember = absl::Seconds(30))
      : StorageWrapper(base), remember_(remember) {}

  // Reads of `upload_dir`'s steps may come from the copies kept in `job_dir`.
  void Watch(const std::string& upload_dir, const std::string& job_dir) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a file of `step_dir` was read from a kept copy (one since
  // dropped included: a read begun before another restore's Forget).
  bool Served(const std::string& step_dir) const ABSL_LOCKS_EXCLUDED(mu_);
  // No more reads of `step_dir` from a kept copy: the copy found damaged is
  // removed (as the caller's file-system identity). A copy kept there anew
  // after that (a later run of the job writing the step again) is read.
  void Forget(const std::string& step_dir) ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::unique_ptr<storage::File>> OpenForRead(
      const std::string& path, const storage::OpenOptions& options) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A step's files found kept: name in the step -> the kept file's path.
  struct Found {
    std::map<std::string, std::string> files;
    absl::Time when;
  };
  // The kept directory for `step_dir` of a watched store ("" when none).
  std::string KeptDirFor(const std::string& step_dir) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Which files of `step_dir` (the store's) `kept_dir` holds as the store
  // does (I/O: called without mu_).
  std::map<std::string, std::string> Match(const std::string& step_dir,
                                           const std::string& kept_dir);

  const absl::Duration remember_;
  mutable zcc::Mutex mu_;
  std::map<std::string, std::string> watched_ ABSL_GUARDED_BY(mu_);  // upload_dir -> job_dir
  std::map<std::string, Found> found_ ABSL_GUARDED_BY(mu_);          // by step_dir
  // Whether a copy kept at `kept_dir` now was kept after `step_dir` was
  // forgotten at `when` (I/O: called without mu_).
  bool KeptSince(const std::string& kept_dir, absl::Time when);

  // The steps read from a kept copy lately, oldest first (Served). Not
  // kept with `found_`: a restore that reads longer than `remember_` asks
  // after its read, when what was found has been looked up again.
  std::deque<std::string> served_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kServedKept = 256;

  // step_dir -> when Forget dropped its kept copy.
  std::map<std::string, absl::Time> forgotten_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_KEPT_COPIES_H_
