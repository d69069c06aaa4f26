// Where a registering job's checkpoints go: its directory under the root it
// names (a local one, or an object store's), and, in the tiered mode, its
// directory in the store it uploads to; with the job's own credentials for
// that store routed first, so that its directory is reached (the owner check
// included) with them alone.
//
// Thread-safety: stateless.
#ifndef ZCC_DAEMON_CONTROL_JOB_PLACEMENT_H_
#define ZCC_DAEMON_CONTROL_JOB_PLACEMENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/control/caller.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {

// <root>/<job_id> for the caller, made if new (daemon::ResolveJobDir);
// `job_credentials`: the job routed its own to the store.
using ResolveJobDirFn = std::function<absl::StatusOr<std::string>(
    const std::string& root, const std::string& job_id, const Caller& caller,
    bool job_credentials)>;
// The job's own credentials for an object-store root, routed while the
// handle lives (ObjectStoreRoots::RouteJob).
using RouteJobFn = std::function<absl::StatusOr<std::shared_ptr<void>>(
    const std::string& root, const std::string& job_id, const v1::StoreCredentials&)>;

struct JobPlacement {
  std::string job_dir;
  std::string upload_dir;             // the tiered mode's; empty: none
  std::shared_ptr<void> store_route;  // the job's own credentials; null: none
};

// InvalidArgument for an upload_root that is no store, a tiered job whose
// checkpoint_root is a store already, credentials without a store.
absl::StatusOr<JobPlacement> PlaceJob(const v1::RegisterRequest& req, const Caller& caller,
                                      const ResolveJobDirFn& resolve, const RouteJobFn& route);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_JOB_PLACEMENT_H_
