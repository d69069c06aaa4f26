// An exclusive claim, held for the life of a process, on something only one
// zccd may own at a time: a shared-memory prefix or a control socket. It is an
// flock(2) on a lock file, so the kernel releases it when the holder dies (a
// SIGKILLed zccd leaves no stale claim) and a second zccd learns of the first
// without guessing from timestamps. The holder writes its pid into the file
// so that the refusal can name it.
//
// Move-only RAII handle: the holder removes the lock file when it lets go
// (while still holding it; a claimant checks after locking that the file it
// locked is still the one at the path, so a file removed under it is never
// taken for the claim). A killed holder leaves the file, unlocked, for the
// next claimant. Not thread-safe (one owner).
#ifndef ZCC_COMMON_INSTANCE_LOCK_H_
#define ZCC_COMMON_INSTANCE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/fd.h"

namespace zcc {

class InstanceLock {
 public:
  // Locks `path` (created mode 0644 if missing). `what` names the claimed
  // thing in errors ("shared-memory prefix 'zcc'"). FailedPrecondition when
  // a live process holds it, naming its pid; PermissionDenied when the file
  // belongs to another uid (someone else's file cannot decide whether zccd
  // starts).
  static absl::StatusOr<InstanceLock> Acquire(const std::string& path, const std::string& what);

  // True when a live process holds the lock on `path` (false when the file is
  // absent or unlocked). For diagnostics and tests.
  static bool IsHeld(const std::string& path);

  InstanceLock(InstanceLock&&) noexcept = default;
  InstanceLock& operator=(InstanceLock&& other) noexcept;
  ~InstanceLock() { Release(); }

  const std::string& path() const { return path_; }

 private:
  InstanceLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  void Release();

  std::string path_;
  UniqueFd fd_;
};

// The lock file of shared-memory prefix `prefix`: in /dev/shm beside the
// segments (a container with a /dev/shm of its own has locks of its own), and
// named so that no "<prefix>." listing of segments can match it (prefixes
// never start with a dot).
std::string ShmPrefixLockPath(const std::string& prefix);

}  // namespace zcc

#endif  // ZCC_COMMON_INSTANCE_LOCK_H_
