// Acting on the file system as another user, one thread at a time.
//
// zccd runs as root and writes each job's checkpoints inside that job's
// directory, which belongs to the job's user. Doing that work with the user's
// file-system identity (Linux's per-thread fsuid/fsgid, no supplementary
// groups) means everything zccd creates there belongs to the user, and the
// kernel checks every path zccd follows with the user's permissions: a
// symlink or directory the user (or another user) planted can never make
// zccd write, read or remove anything that user could not.
//
// Thread-safety: affects only the calling thread; not movable, so an identity
// is always restored on the thread that took it (nesting restores in order).
#ifndef ZCC_COMMON_FS_IDENTITY_H_
#define ZCC_COMMON_FS_IDENTITY_H_

#include <sys/types.h>

#include <vector>

#include "absl/status/status.h"

namespace zcc {

// The owner of a job's files: uid and primary gid of the user that registered it.
struct FsOwner {
  uid_t uid = 0;
  gid_t gid = 0;
};

class ScopedFsIdentity {
 public:
  // Takes `owner`'s file-system identity when this process runs as root and
  // `owner` is not root; otherwise (zccd running as an ordinary user, which
  // serves only itself, or a root-owned job) changes nothing.
  explicit ScopedFsIdentity(const FsOwner& owner);
  ~ScopedFsIdentity();
  ScopedFsIdentity(const ScopedFsIdentity&) = delete;
  ScopedFsIdentity& operator=(const ScopedFsIdentity&) = delete;

  // OK when this process can take users' file-system identities (or has no
  // need to: it does not run as root). zccd checks this at start, so the
  // constructor's failure path (abort: never act as root in a user's
  // directory) is not reached in a working deployment.
  static absl::Status Probe();

  // True when the identity was changed.
  bool active() const { return active_; }

 private:
  bool active_ = false;
  uid_t old_uid_ = 0;
  gid_t old_gid_ = 0;
  std::vector<gid_t> old_groups_;
};

}  // namespace zcc

#endif  // ZCC_COMMON_FS_IDENTITY_H_
