#include "common/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace zcc {
namespace {

// The pid the holder wrote, as text for a message ("" when unreadable).
std::string HolderPid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  uint64_t pid = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &pid)) return "";
  return absl::StrCat(pid);
}

}  // namespace

std::string ShmPrefixLockPath(const std::string& prefix) {
  return absl::StrCat("/dev/shm/.zccd.", prefix, ".lock");
}

absl::StatusOr<InstanceLock> InstanceLock::Acquire(const std::string& path,
                                                   const std::string& what) {
  // A holder removes the file as it lets go: the file locked here may have
  // been removed (and another made in its place) between open and flock.
  for (int attempt = 0; attempt < 100; ++attempt) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd.valid()) {
      return ErrnoToStatus(errno, absl::StrCat("open lock file ", path, " for ", what));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    if (st.st_uid != ::geteuid()) {
      return absl::PermissionDeniedError(
          absl::StrCat("lock file ", path, " for ", what, " belongs to uid ", st.st_uid,
                       ", not to this zccd's uid ", ::geteuid(), "; remove it"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return ErrnoToStatus(errno, absl::StrCat("lock ", path));
      const std::string pid = HolderPid(fd.get());
      return absl::FailedPreconditionError(absl::StrCat(
          "another zccd", pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"),
          " is running with ", what, " (it holds ", path,
          "); stop it first, or give this one another"));
    }
    struct stat now;
    if (::stat(path.c_str(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
      continue;  // removed by the holder that just let go: lock the new one
    }
    const std::string pid = absl::StrCat(::getpid(), "\n");
    if (::ftruncate(fd.get(), 0) != 0 ||
        ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      return ErrnoToStatus(errno, absl::StrCat("write pid to ", path));
    }
    return InstanceLock(path, std::move(fd));
  }
  return absl::UnavailableError(absl::StrCat("lock file ", path, " for ", what,
                                             " keeps being replaced; is a zccd restarting in a loop?"));
}

InstanceLock& InstanceLock::operator=(InstanceLock&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

void InstanceLock::Release() {
  if (!fd_.valid()) return;
  ::unlink(path_.c_str());  // still locked: no claimant can have taken this file
  fd_.Reset();
}

bool InstanceLock::IsHeld(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return false;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;  // released when fd closes
  return errno == EWOULDBLOCK;
}

}  // namespace zcc
