// zccd's object-store roots (DaemonConfig::object_store_roots): each opened
// once at start, with its endpoint and credentials, and reached by its URL
// through one storage for all of zccd's checkpoint I/O (a RoutedStorage:
// "s3://bucket/prefix/..." to that root's store, every other path to the
// local storage). A job on such a root has the directory
// "s3://bucket/prefix/<job_id>", and its writers, commits, retention,
// restores and status take that path like a local one; steps there commit
// in place (checkpoint/step_dirs.h).
//
// A root that cannot be opened (a bad endpoint setting) does not stop zccd:
// its error is given to each registration that names it. A root for which
// zccd has no credentials serves the jobs that bring their own (RouteJob).
//
// A job's own credentials (from its trainer) serve its directory alone:
// RouteJob routes "<root>/<job_id>" through a client of its own for as long
// as the returned handle lives (the Job holds it). They stay in memory and
// are never logged.
//
// Thread-safety: thread-safe after construction. Ownership: owns the roots'
// clients and storages; borrows `local`, which must outlive it.
#ifndef ZCC_DAEMON_JOBS_OBJECT_STORE_ROOTS_H_
#define ZCC_DAEMON_JOBS_OBJECT_STORE_ROOTS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "config/daemon_config.h"
#include "storage/routed_storage.h"
#include "storage/s3/s3_location.h"
#include "storage/storage.h"

namespace zcc::daemon {

// True for a checkpoint root that names an object store.
bool IsObjectStoreUrl(const std::string& root);

// A job's directory under an object-store root: "<root>/<job_id>", the
// root without trailing slashes. The one spelling of it, for the routes and
// the job's resolution alike.
std::string StoreJobDir(const std::string& root_url, const std::string& job_id);

class ObjectStoreRoots {
 public:
  // `env` looks up zccd's environment (null: getenv).
  ObjectStoreRoots(const std::vector<ObjectStoreRoot>& roots, storage::Storage* local,
                   const storage::s3::EnvLookup& env = nullptr);

  // Every path of zccd's checkpoints: local ones and the roots' URLs.
  storage::Storage* storage() { return &routed_; }

  // OK when `url` is a configured root or lies under one that opened;
  // PermissionDenied when it is under none, FailedPrecondition (with the
  // reason) when its root could not be opened, or when zccd has no
  // credentials for it and the job brings none (`job_credentials` false).
  absl::Status CheckRoot(const std::string& url, bool job_credentials = true) const;

  // The job directory "<root_url>/<job_id>" reached with `credentials` while
  // the handle lives. A route for it that is held already is returned as it
  // is: the first registration's credentials serve the job until it is gone.
  class JobRoute;
  absl::StatusOr<std::shared_ptr<JobRoute>> RouteJob(const std::string& root_url,
                                                     const std::string& job_id,
                                                     storage::s3::Credentials credentials);

  // The configured roots' URLs, for messages.
  std::vector<std::string> Urls() const;

 private:
  struct Root {
    std::string url;  // without a trailing slash
    storage::s3::Endpoint endpoint;
    // With zccd's own credentials; null when it has none for this root.
    std::unique_ptr<storage::s3::S3Location> location;
    absl::Status error;              // why it could not be opened at all
    absl::Status credentials_error;  // why zccd has no credentials for it
  };
  // The configured root `url` is or lies under (the longest), or null.
  const Root* Find(const std::string& url) const;

  std::vector<Root> roots_;
  storage::RoutedStorage routed_;
  zcc::Mutex mu_;
  std::map<std::string, std::weak_ptr<JobRoute>> job_routes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_OBJECT_STORE_ROOTS_H_
