#include "daemon/jobs/job_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/recovery.h"
#include "checkpoint/reader.h"
#include "common/fd.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/manifest.h"
#include "storage/whole_file.h"

namespace zcc::daemon {
namespace {

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

bool IsStepEntry(const std::string& name) { return absl::StartsWith(name, "step-"); }

// The allowed root (canonical) that `canonical_root` lies in, if any.
std::string AllowedRootOf(const DaemonConfig& config, const std::string& canonical_root) {
  std::string best;
  auto consider = [&](const std::string& allowed) {
    auto canonical = CanonicalPath(allowed);
    if (!canonical.ok()) return;
    auto under = IsUnderRoot(canonical_root, *canonical);
    if (under.ok() && *under && canonical->size() > best.size()) best = *canonical;
  };
  for (const std::string& allowed : config.allowed_roots) consider(allowed);
  consider(config.default_root);
  return best;
}

// Hands entries that an earlier zccd left root-owned inside a user's job
// directory (steps, files) to the user, without following any symlink: every
// step is relative to a directory opened with O_NOFOLLOW, so a link swapped in
// meanwhile is chowned itself at worst, never its target.
void HandOverRootOwned(int dir_fd, const FsOwner& owner, int depth) {
  const int fd = ::dup(dir_fd);
  if (fd < 0) return;
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return;
  }
  while (struct dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (st.st_uid == 0 &&
        ::fchownat(dir_fd, name.c_str(), owner.uid, owner.gid, AT_SYMLINK_NOFOLLOW) != 0) {
      ZCC_LOG(WARNING) << "cannot hand " << name << " to uid " << owner.uid << ": "
                       << ErrnoToStatus(errno, "chown");
    }
    if (S_ISDIR(st.st_mode) && depth > 0) {
      UniqueFd sub(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.get() >= 0) HandOverRootOwned(sub.get(), owner, depth - 1);
    }
  }
  ::closedir(dir);
}

absl::Status CreateJobDir(const std::string& job_dir, bool in_allowed_root, const FsOwner& owner) {
  if (in_allowed_root) {
    // The administrator's directory: zccd makes the job's directory there and
    // hands it over (through the new directory's descriptor, not its name).
    if (::mkdir(job_dir.c_str(), 0750) != 0) {
      // Made by someone else since we looked: it is theirs, never handed to
      // this caller (the ownership check that follows decides).
      if (errno == EEXIST) return absl::OkStatus();
      return ErrnoToStatus(errno, absl::StrCat("create ", job_dir));
    }
    UniqueFd fd(::open(job_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoToStatus(errno, absl::StrCat("open ", job_dir));
    if (::geteuid() == 0 && owner.uid != 0 && ::fchown(fd.get(), owner.uid, owner.gid) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("hand ", job_dir, " to uid ", owner.uid));
    }
    if (::fchmod(fd.get(), 0750) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod ", job_dir));
    // The new entry, durable before anything is committed in the directory
    // (commits sync the job directory, not its parent).
    return FsyncDir(DirName(job_dir));
  }
  // Deeper than an allowed root: only where the user may write themselves.
  {
    ScopedFsIdentity as_owner(owner);
    if (::mkdir(job_dir.c_str(), 0750) != 0) {
      if (errno == EEXIST) return absl::OkStatus();
      return Annotate(ErrnoToStatus(errno, absl::StrCat("create ", job_dir)),
                      absl::StrCat("as uid ", owner.uid));
    }
  }
  // The parent synced as zccd, which can open one the user may write but
  // not read (0733). Best effort, and silent: the path is the user's to
  // change meanwhile (a symlink), and an error would tell them what lies
  // where they may not look. A parent not synced leaves the entry as durable
  // as the file system makes it; the job's commits sync what is inside.
  (void)FsyncDir(DirName(job_dir));
  return absl::OkStatus();
}

// The uid an OWNER object names; DataLoss for anything else.
absl::StatusOr<uid_t> ParseOwner(const std::string& path, absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  uint32_t uid = 0;
  if (!absl::ConsumePrefix(&rest, "uid ") || !absl::SimpleAtoi(rest, &uid)) {
    return absl::DataLossError(absl::StrCat(path, " does not name an owner ('uid N')"));
  }
  return static_cast<uid_t>(uid);
}

// Whether something is at `path`; the store's error (denied, unreachable)
// when it cannot tell.
absl::StatusOr<bool> Present(storage::Storage& fs, const std::string& path) {
  auto info = fs.Stat(path);
  if (info.ok()) return true;
  if (absl::IsNotFound(info.status())) return false;
  return info.status();
}

// ResolveJobDir for a root in an object store.
absl::StatusOr<std::string> ResolveStoreJobDir(const JobDirRequest& req) {
  if (req.stores == nullptr || req.storage == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint root ", req.root, " is an object store; this zccd has no object-store root"));
  }
  ZCC_RETURN_IF_ERROR(req.stores->CheckRoot(req.root, req.job_credentials));
  storage::Storage& fs = *req.storage;
  std::string root = req.root;
  while (!root.empty() && root.back() == '/') root.pop_back();
  // The root may not be a job's directory (one with an owner), nor lie in one.
  for (std::string dir = root; dir.size() > 5 && req.stores->CheckRoot(dir).ok();
       dir = ParentOf(dir)) {
    ZCC_ASSIGN_OR_RETURN(const bool owned, Present(fs, JoinPath(dir, kOwnerFileName)));
    if (owned || (req.is_registered_job_dir && req.is_registered_job_dir(dir))) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint root ", req.root, " lies inside the checkpoint directory of a job (", dir,
          "); choose a root outside every job's directory"));
    }
  }
  const std::string job_dir = StoreJobDir(req.root, req.job_id);
  const std::string owner_path = JoinPath(job_dir, kOwnerFileName);
  auto text = storage::ReadWholeFile(fs, owner_path, 256);
  if (text.ok()) {
    ZCC_ASSIGN_OR_RETURN(const uid_t uid, ParseOwner(owner_path, *text));
    if (req.owner.uid != 0 && uid != req.owner.uid) {
      return absl::PermissionDeniedError(absl::StrCat(job_dir, " belongs to another user"));
    }
    return job_dir;
  }
  if (!absl::IsNotFound(text.status())) {
    return Annotate(text.status(), absl::StrCat("reading the owner of ", job_dir));
  }
  if (!req.create) {
    ZCC_ASSIGN_OR_RETURN(const bool present, Present(fs, job_dir));
    if (!present) {
      return absl::NotFoundError(absl::StrCat("no checkpoints for job '", req.job_id, "' under ",
                                              req.root));
    }
    return job_dir;
  }
  // A new job directory (or one other tools wrote): the caller's.
  absl::Status created = fs.MakeDirs(job_dir);
  if (created.ok()) {
    created = storage::WriteFileAtomic(fs, owner_path, absl::StrCat("uid ", req.owner.uid, "\n"));
  }
  ZCC_RETURN_IF_ERROR(Annotate(created, absl::StrCat("creating ", job_dir)));
  return job_dir;
}

}  // namespace

bool LooksLikeJobDirectory(const std::string& dir) {
  struct stat st;
  if (::lstat(JoinPath(dir, format::kLatestFileName).c_str(), &st) == 0) return true;
  auto names = ListDir(dir);
  if (!names.ok()) return false;
  for (const std::string& name : *names) {
    if (IsStepEntry(name)) return true;
  }
  return false;
}

absl::StatusOr<std::string> ResolveJobDir(const DaemonConfig& config, const JobDirRequest& req) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id));
  const std::string root = req.root.empty() ? config.default_root : req.root;
  if (IsObjectStoreUrl(root)) return ResolveStoreJobDir(req);
  if (root[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint root '", root,
                                                   "' must be an absolute path"));
  }
  auto canonical_root = CanonicalPath(root);
  if (!canonical_root.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint root ", root, " is not usable: ", canonical_root.status().message()));
  }
  const std::string allowed_root = AllowedRootOf(config, *canonical_root);
  if (allowed_root.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint root ", root, " is not under an allowed root (",
        absl::StrJoin(config.allowed_roots, ", "), "); start zccd with --allowed_roots"));
  }
  // Nothing from the root up to its allowed root may be a job's directory: a
  // job in there would share the entries of that job's commits.
  for (std::string dir = *canonical_root;; dir = ParentOf(dir)) {
    const bool registered = req.is_registered_job_dir && req.is_registered_job_dir(dir);
    if (registered || LooksLikeJobDirectory(dir)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint root ", root, " lies inside the checkpoint directory of a job (", dir,
          "); choose a root outside every job's directory"));
    }
    if (dir == allowed_root || dir == "/") break;
  }
  const std::string job_dir = JoinPath(*canonical_root, req.job_id);
  struct stat st;
  if (::lstat(job_dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, job_dir);
    if (!req.create) {
      return absl::NotFoundError(absl::StrCat("no checkpoints for job '", req.job_id, "' under ", root));
    }
    ZCC_RETURN_IF_ERROR(CreateJobDir(job_dir, *canonical_root == allowed_root, req.owner));
  }
  // A job directory planted as a symlink out of the root is refused.
  auto inside = IsUnderRoot(job_dir, *canonical_root);
  if (!inside.ok() || !*inside) {
    return absl::PermissionDeniedError(absl::StrCat(job_dir, " resolves outside ", root));
  }
  ZCC_RETURN_IF_ERROR(AuthorizeDir(job_dir, req.owner.uid));
  // Nor may it hold another job's directory (one made before this one).
  if (auto names = ListDir(job_dir); names.ok()) {
    for (const std::string& name : *names) {
      const std::string child = JoinPath(job_dir, name);
      if (IsStepEntry(name) || ::lstat(child.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      if ((req.is_registered_job_dir && req.is_registered_job_dir(child)) ||
          LooksLikeJobDirectory(child)) {
        return absl::PermissionDeniedError(absl::StrCat(
            job_dir, " holds the checkpoint directory of another job (", child,
            "); a job directory cannot contain another's"));
      }
    }
  }
  if (req.create && ::geteuid() == 0 && req.owner.uid != 0) {
    UniqueFd fd(::open(job_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() >= 0) HandOverRootOwned(fd.get(), req.owner, /*depth=*/1);
  }
  return job_dir;
}

absl::Status AuthorizeDir(const std::string& job_dir, uid_t uid) {
  if (uid == 0) return absl::OkStatus();
  struct stat st;
  if (::stat(job_dir.c_str(), &st) != 0) return ErrnoToStatus(errno, job_dir);
  if (st.st_uid == uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(job_dir, " belongs to another user"));
}

FsOwner DirOwner(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return {};
  return {st.st_uid, st.st_gid};
}

void RecoverJobDirectories(const DaemonConfig& config) {
  // Partial steps older than the commit timeout were abandoned by a previous
  // instance (or a crashed node); younger ones may be another daemon's work in
  // progress in a shared root and are left alone. Committed steps are not
  // touched here (no retention without the job's policy).
  size_t removed = 0;
  std::set<std::string> roots(config.allowed_roots.begin(), config.allowed_roots.end());
  roots.insert(config.default_root);
  for (const std::string& root : roots) {
    auto jobs = ListDir(root);
    if (!jobs.ok()) continue;
    for (const std::string& job : *jobs) {
      if (!ValidateJobId(job).ok()) continue;
      const std::string job_dir = JoinPath(root, job);
      ScopedFsIdentity as_owner(DirOwner(job_dir));
      auto recovered = checkpoint::RecoverJobDir(job_dir, config.commit_timeout);
      if (!recovered.ok()) {
        // Not a job directory, or unreadable: nothing of ours to repair.
        ZCC_LOG(DEBUG) << "not recovering " << job_dir << ": " << recovered.status();
        continue;
      }
      for (const std::string& name : recovered->removed) {
        ZCC_LOG(WARNING) << "removed abandoned partial checkpoint " << JoinPath(job_dir, name);
        ++removed;
      }
      if (recovered->latest_repaired.has_value()) {
        ZCC_LOG(WARNING) << "pointed " << JoinPath(job_dir, format::kLatestFileName) << " at "
                         << format::StepDirName(*recovered->latest_repaired)
                         << " (a commit was cut short before writing it)";
      }
    }
  }
  if (removed > 0) {
    ZCC_LOG(WARNING) << "removed " << removed << " abandoned partial checkpoint(s) at start";
  }
}

}  // namespace zcc::daemon
