#include "common/fs_identity.h"

#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

#include "common/log.h"

namespace zcc {
namespace {

// glibc's setgroups changes every thread of the process; the system call
// itself changes only the caller, which is what a per-thread identity needs.
int SetThreadGroups(const std::vector<gid_t>& groups) {
  return static_cast<int>(::syscall(SYS_setgroups, groups.size(), groups.data()));
}

}  // namespace

ScopedFsIdentity::ScopedFsIdentity(const FsOwner& owner) {
  if (::geteuid() != 0 || owner.uid == 0) return;
  const int n = ::getgroups(0, nullptr);
  if (n > 0) {
    old_groups_.resize(static_cast<size_t>(n));
    if (::getgroups(n, old_groups_.data()) != n) old_groups_.clear();
  }
  if (SetThreadGroups({}) != 0) {
    ZCC_LOG(ERROR) << "cannot drop supplementary groups to act as uid " << owner.uid;
  }
  // setfsuid/setfsgid return the previous value and cannot report failure
  // directly: asking again with an invalid id reads the current one back.
  old_gid_ = static_cast<gid_t>(::setfsgid(owner.gid));
  old_uid_ = static_cast<uid_t>(::setfsuid(owner.uid));
  active_ = true;
  if (static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1))) != owner.uid ||
      static_cast<gid_t>(::setfsgid(static_cast<gid_t>(-1))) != owner.gid) {
    // Without CAP_SETUID/CAP_SETGID zccd would act as root in a user's
    // directory: refuse to go on rather than write there with root's rights.
    ZCC_LOG(ERROR) << "cannot take the file-system identity of uid " << owner.uid << " gid "
                   << owner.gid << " (zccd needs CAP_SETUID and CAP_SETGID); stopping";
    std::abort();
  }
}

absl::Status ScopedFsIdentity::Probe() {
  if (::geteuid() != 0) return absl::OkStatus();
  // The effective capability set, from the kernel's own report (a probe with
  // a real uid would fail in a user namespace that maps only root, where no
  // other user can connect anyway).
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t effective = 0;
  bool found = false;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      found = absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &effective);
      break;
    }
  }
  constexpr uint64_t kSetGid = uint64_t{1} << 6;  // CAP_SETGID
  constexpr uint64_t kSetUid = uint64_t{1} << 7;  // CAP_SETUID
  if (!found || (effective & (kSetGid | kSetUid)) == (kSetGid | kSetUid)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "zccd runs as root but cannot act as the users whose checkpoints it writes: it needs "
      "CAP_SETUID and CAP_SETGID (see deploy/zccd.service, CapabilityBoundingSet)");
}

ScopedFsIdentity::~ScopedFsIdentity() {
  if (!active_) return;
  ::setfsuid(old_uid_);
  ::setfsgid(old_gid_);
  SetThreadGroups(old_groups_);
}

}  // namespace zcc
