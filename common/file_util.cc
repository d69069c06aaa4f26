#include "common/file_util.h"

#include <atomic>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "common/status.h"

namespace zcc {

absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is ", st.st_size,
                                                      " bytes; at most ", max_bytes, " expected"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

static absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view content) {
  // Unique per call: two threads writing the same path never share a
  // temporary file (the last rename wins, whole).
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", sequence.fetch_add(1));
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
    absl::Status st = WriteAll(fd.get(), content, tmp);
    if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoToStatus(errno, absl::StrCat("fsync ", tmp));
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat("rename ", tmp, " to ", path));
  }
  return FsyncDir(DirName(path));
}

absl::Status MakeDirs(const std::string& path, int mode) {
  if (path.empty()) return absl::InvalidArgumentError("MakeDirs: empty path");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", partial));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(path + " is not a directory");
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open directory ", path));
  if (::fsync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync directory ", path));
  return absl::OkStatus();
}

static int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  if (::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), ::closedir);
  if (!dir) return ErrnoToStatus(errno, absl::StrCat("opendir ", path));
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  if (errno != 0) return ErrnoToStatus(errno, absl::StrCat("readdir ", path));
  return names;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::string> CanonicalPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    return ErrnoToStatus(errno, absl::StrCat("resolve ", path));
  }
  return std::string(buf);
}

absl::StatusOr<bool> IsUnderRoot(const std::string& path, const std::string& root) {
  ZCC_ASSIGN_OR_RETURN(std::string p, CanonicalPath(path));
  ZCC_ASSIGN_OR_RETURN(std::string r, CanonicalPath(root));
  if (p == r) return true;
  if (r == "/") return true;
  return p.size() > r.size() && p.compare(0, r.size(), r) == 0 && p[r.size()] == '/';
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (!a.empty() && a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace zcc
