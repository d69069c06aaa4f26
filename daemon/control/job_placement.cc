#include "daemon/control/job_placement.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "daemon/jobs/object_store_roots.h"

namespace zcc::daemon {

absl::StatusOr<JobPlacement> PlaceJob(const v1::RegisterRequest& req, const Caller& caller,
                                      const ResolveJobDirFn& resolve, const RouteJobFn& route) {
  // The tiered mode: a local root, uploaded to a store.
  const bool tiered = !req.upload_root().empty();
  if (tiered && !IsObjectStoreUrl(req.upload_root())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload_root ", req.upload_root(), " is not an object store (s3://bucket/prefix)"));
  }
  if (tiered && IsObjectStoreUrl(req.checkpoint_root())) {
    return absl::InvalidArgumentError(
        "upload_root is for a job that checkpoints to a local root first; this job's "
        "checkpoint_root is an object store already");
  }
  if (req.node_local_root() && !tiered) {
    return absl::InvalidArgumentError(
        "node_local_root is for the tiered mode: it needs an upload_root (s3://bucket/prefix) "
        "where the nodes' files of each step meet and commit");
  }
  const std::string& store_root = tiered ? req.upload_root() : req.checkpoint_root();
  JobPlacement place;
  if (req.has_store_credentials()) {
    if (!IsObjectStoreUrl(store_root)) {
      return absl::InvalidArgumentError(
          "store_credentials are for an s3:// checkpoint_root or upload_root; this job has none");
    }
    ZCC_ASSIGN_OR_RETURN(place.store_route,
                         route(store_root, req.job_id(), req.store_credentials()));
  }
  const bool own = place.store_route != nullptr;
  // Checkpoints of this job id under this root belong to whoever made them.
  ZCC_ASSIGN_OR_RETURN(place.job_dir, resolve(req.checkpoint_root(), req.job_id(), caller, own));
  if (tiered) {
    ZCC_ASSIGN_OR_RETURN(place.upload_dir, resolve(req.upload_root(), req.job_id(), caller, own));
  }
  return place;
}

}  // namespace zcc::daemon
