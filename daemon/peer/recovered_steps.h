// The steps of the peer tier being read in place (recovered_step.h), shown
// to restores through zccd's storage: under its job directory, each looks
// like a committed step on disk (listed there, `latest` names it while no
// newer step is on disk), its paths served by the RecoveredStep; every
// other path goes to the storage underneath. zccd shows a step until its
// restores are done with it and, where rank 0 restored, it has been written
// into the job directory (MaterializeStep) or could not be; a later restore
// finds it in the tier again.
//
// Thread-safety: thread-safe. Ownership: borrows `base` (as StorageWrapper);
// shares the steps it shows with the Files it hands out.
#ifndef ZCC_DAEMON_PEER_RECOVERED_STEPS_H_
#define ZCC_DAEMON_PEER_RECOVERED_STEPS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "daemon/peer/recovered_step.h"
#include "storage/storage_wrapper.h"

namespace zcc::daemon::peer {

class RecoveredSteps final : public storage::StorageWrapper {
 public:
  explicit RecoveredSteps(storage::Storage* base) : StorageWrapper(base) {}

  // Shows `step` under its job directory, in place of one shown there before.
  void Add(std::shared_ptr<RecoveredStep> step) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops showing `step` (if it is still the one shown there).
  void Remove(const RecoveredStep* step) ABSL_LOCKS_EXCLUDED(mu_);
  // The step shown under `job_dir`, or null.
  std::shared_ptr<RecoveredStep> Find(const std::string& job_dir) const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the pulls of every step shown (zccd stops).
  void CancelAll() ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::unique_ptr<storage::File>> OpenForRead(
      const std::string& path, const storage::OpenOptions& options) override;
  absl::StatusOr<storage::FileInfo> Stat(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& path) override;

 private:
  // The step that serves `path`: one of its files (or its directory), or
  // its job directory's `latest` while the disk has no newer step.
  std::shared_ptr<RecoveredStep> Serving(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  mutable zcc::Mutex mu_;
  std::map<std::string, std::shared_ptr<RecoveredStep>> by_job_dir_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_RECOVERED_STEPS_H_
