// POSIX file helpers with absl::Status errors. Durability is explicit: nothing
// here fsyncs unless its name or a parameter says so.
#ifndef ZCC_COMMON_FILE_UTIL_H_
#define ZCC_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc {

// Reads a whole file; refuses files larger than `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes);

// Writes `path` through a temporary file in the same directory, fsyncs it,
// renames it over `path` and fsyncs the directory: readers see either the old
// or the new content, never a torn file.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view content);

// mkdir -p with `mode` for the directories it creates.
absl::Status MakeDirs(const std::string& path, int mode = 0755);

// fsync of a directory, so that entries created or renamed in it are durable.
absl::Status FsyncDir(const std::string& path);

// The directory part of `path`: "." without a slash, "/" for "/name".
std::string DirName(const std::string& path);

// Removes a directory tree (like rm -rf); a missing path is OK.
absl::Status RemoveTree(const std::string& path);

// Names in a directory, without "." and "..", unsorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);

bool PathExists(const std::string& path);

// The canonical absolute form of an existing path (realpath(3)).
absl::StatusOr<std::string> CanonicalPath(const std::string& path);

// True when canonical `path` equals canonical `root` or lies below it.
// Both must exist; symlinks are resolved first, so a link out of the root is
// caught.
absl::StatusOr<bool> IsUnderRoot(const std::string& path, const std::string& root);

std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace zcc

#endif  // ZCC_COMMON_FILE_UTIL_H_
