// Where a restore of a tiered job (RegisterRequest.upload_root) reads: the
// local root first, the object store when the local root has no step to give
// or its `latest` is older than the store's (a replaced node's disk). Jobs
// without a store have one tier, the local root.
//
// Thread-safety: not thread-safe; one per restore.
#ifndef ZCC_DAEMON_RESTORE_RESTORE_TIERS_H_
#define ZCC_DAEMON_RESTORE_RESTORE_TIERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace zcc::daemon {

class RestoreTiers {
 public:
  // `upload_dir` empty: no store. `requested` < 0: the newest step.
  RestoreTiers(std::string job_dir, std::string upload_dir, int64_t requested,
               storage::Storage* fs);

  // The job directory to choose a step from now.
  const std::string& current() const { return current_; }
  // After the current tier had no step (NotFound): the other tier, once;
  // false when there is none left to try.
  bool Next();

  // After the current tier's choice passed over newer steps of it (their
  // copy here damaged or failing its check): the newest of those, none
  // newer than `at_most`, that the other tier holds as the same step and
  // intact (`verify` accepts it). `requested` >= 0: that step only. The
  // same step: both copies committed from the same manifests and index
  // (one is an upload of the other), never a step another run wrote under
  // the same name. `chosen` is the current tier's choice, -1 for none.
  // Lists and reads through `fs`.
  struct Elsewhere {
    std::string step_dir;
    int64_t step = -1;
  };
  std::optional<Elsewhere> IntactElsewhere(
      int64_t chosen, int64_t requested, int64_t at_most,
      const std::function<absl::Status(const std::string&)>& verify, storage::Storage* fs) const;

  // Why the store was chosen first ("" when it was not), for the log.
  const std::string& why_store_first() const { return why_store_first_; }

  // Which committed steps AllSteps lists.
  enum class Steps {
    kOnTimeline,  // those a restore of the newest considers: none above
                  // `latest` (checkpoint::CommittedOnTimeline)
    kAll,         // those left behind by a run that went back too
  };
  // The committed steps of both tiers; a collective restore agrees on one
  // of kOnTimeline.
  static absl::StatusOr<std::set<int64_t>> AllSteps(const std::string& job_dir,
                                                    const std::string& upload_dir,
                                                    storage::Storage* fs,
                                                    Steps which = Steps::kOnTimeline);

 private:
  const std::string job_dir_;
  const std::string upload_dir_;
  std::string current_;
  bool switched_ = false;
  std::string why_store_first_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RESTORE_RESTORE_TIERS_H_
