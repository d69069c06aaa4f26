// PosixStorage: the Storage of the local file systems. A file opened with
// queue_depth > 1 keeps its requests in flight with io_uring; otherwise (or
// where the kernel refuses io_uring) each request runs synchronously on the
// submitting thread with pread/pwrite. Direct I/O is O_DIRECT; a file system
// that refuses it (open fails with EINVAL, e.g. ramfs, or tmpfs before Linux
// 6.6) gets a buffered file and one WARNING line per PosixStorage.
//
// Thread-safety: PosixStorage is thread-safe; each File is used by one thread
// at a time. Ownership: see storage.h.
#ifndef ZCC_STORAGE_POSIX_STORAGE_H_
#define ZCC_STORAGE_POSIX_STORAGE_H_

#include <atomic>
#include <memory>
#include <string>

#include "storage/storage.h"

namespace zcc::storage {

struct PosixStorageOptions {
  // Files with queue_depth > 1 use an io_uring each. false: every request is
  // a synchronous pread/pwrite (queue depth 1).
  bool use_io_uring = true;
};

class PosixStorage final : public Storage {
 public:
  explicit PosixStorage(PosixStorageOptions options = {});

  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const std::string& path,
                                                     const OpenOptions& options) override;
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(const std::string& path,
                                                    const OpenOptions& options) override;
  absl::Status MakeDirs(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& path) override;

 private:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, int flags,
                                             const OpenOptions& options);

  const PosixStorageOptions options_;
  std::atomic<bool> warned_direct_refused_{false};
  std::atomic<bool> warned_no_io_uring_{false};
};

// A process-wide PosixStorage with default options; never destroyed.
Storage* DefaultStorage();

// `storage`, or DefaultStorage() where it is null (an optional parameter).
inline Storage& StorageOrDefault(Storage* storage) {
  return storage != nullptr ? *storage : *DefaultStorage();
}

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_POSIX_STORAGE_H_
