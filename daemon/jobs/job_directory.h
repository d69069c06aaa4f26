// Job directories: where a job's checkpoints live (<root>/<job_id>), who may
// use them, and what zccd repairs in them at start.
//
// Ownership model (zccd running as root, DESIGN.md section 7): a job directory
// belongs to the uid and primary gid of the user that registered the job,
// mode 0750, and so does everything in it, because zccd writes there with
// that user's file-system identity (common/fs_identity.h). Other users cannot
// enter it; the group can read the checkpoints when the user grants it. The
// job directory itself is created by zccd when its root is an allowed root
// (the administrator's), and with the user's identity below that, so a user
// can only place checkpoints where they could write themselves. A checkpoint
// root never lies inside a job directory, and a job directory never holds
// another job's: one job's commit can never collide with another's entries.
//
// Thread-safety: stateless functions.
#ifndef ZCC_DAEMON_JOBS_JOB_DIRECTORY_H_
#define ZCC_DAEMON_JOBS_JOB_DIRECTORY_H_

#include <sys/types.h>

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/fs_identity.h"
#include "config/daemon_config.h"
#include "daemon/jobs/object_store_roots.h"
#include "storage/storage.h"

namespace zcc::daemon {

// The object in a job directory of an object store that says whose it is.
inline constexpr char kOwnerFileName[] = "OWNER";

// True for a directory that holds a job's checkpoints: it has a `latest`
// entry or a step directory (committed or partial).
bool LooksLikeJobDirectory(const std::string& dir);

struct JobDirRequest {
  std::string root;  // as requested; empty = the default root; or an s3:// URL
  std::string job_id;
  FsOwner owner;     // the caller
  bool create = false;
  // True for directories of jobs registered now (which may not have
  // committed anything yet).
  std::function<bool(const std::string&)> is_registered_job_dir;
  // zccd's object-store roots (null: none), for a root that is a URL.
  const ObjectStoreRoots* stores = nullptr;
  // The job brings its own credentials for the store (routed already).
  bool job_credentials = false;
  // Where the stores' job directories are read and written (routed).
  storage::Storage* storage = nullptr;
};

// <canonical root>/<job_id> after checking the root: absolute, existing, under
// an allowed root, not inside a job directory (symlinks resolved). With
// `create` a missing job directory is made (0750, the owner's); without it
// NotFound. An existing one must resolve inside the root, hold no other job's
// directory, and belong to the caller (or the caller is root).
//
// An s3:// root must be, or lie under, one of zccd's object-store roots; the
// job directory is then "<root>/<job_id>" in the store. A store has no file
// owners: the job directory's OWNER object, written when zccd creates the
// job there, names the uid it belongs to, and only that uid (or root) may
// use it afterwards. A job directory found without OWNER (written by other
// tools) goes to the first caller, who gets OWNER written.
absl::StatusOr<std::string> ResolveJobDir(const DaemonConfig& config, const JobDirRequest& request);

// OK when `uid` may act on checkpoints in `job_dir`: root, or its owner.
absl::Status AuthorizeDir(const std::string& job_dir, uid_t uid);

// The owner of an existing directory (uid 0 when it cannot be read).
FsOwner DirOwner(const std::string& dir);

// At start, for every job directory under the roots, with its owner's
// identity: removes partial steps older than the commit timeout, and writes a
// missing `latest` left by a crash inside a job's first commit.
void RecoverJobDirectories(const DaemonConfig& config);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_JOBS_JOB_DIRECTORY_H_
