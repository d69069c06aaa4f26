// MemoryStorage: a Storage held in memory, for tests, and the crash that no
// disk offers on demand. Besides what every reader sees, it keeps what would
// survive a power cut: each file's data as of its last File::Sync and each
// directory's entries as of its last SyncDir. Crash() drops everything else,
// as a machine that loses power loses its page cache; CrashAfter(n) first
// lets the process "die" at its n+1-th change (that operation and every one
// after it fail), so that a test can cut a protocol at each of its steps.
//
// The model is the strict one POSIX promises: a new file, a rename or an
// unlink survives only once its directory was synced, a file's data only once
// the file was. (A directory renamed and synced only at its destination is
// found at both names after a crash, where a real file system shows one.)
// Paths are absolute, "/" always exists, and "." and ".." are refused.
// Direct files check alignment as O_DIRECT does.
//
// Thread-safety: thread-safe; each File is used by one thread at a time.
// Ownership: it must outlive its Files.
#ifndef ZCC_STORAGE_MEMORY_STORAGE_H_
#define ZCC_STORAGE_MEMORY_STORAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "storage/storage.h"

namespace zcc::storage {

class MemoryStorage final : public Storage {
 public:
  MemoryStorage();
  // keep_synced = false: no copy of what a power cut would keep (Sync and
  // SyncDir keep nothing; Crash() then loses everything): files in memory
  // at memcpy speed, for building a step's files there (a replica's).
  explicit MemoryStorage(bool keep_synced);
  ~MemoryStorage() override;

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

  // Changes made so far: opens for writing, writes, truncates, syncs,
  // directory syncs, directories made, renames, exchanges and removals.
  uint64_t changes() const;
  // From the (n+1)-th change on (counted from now), every operation fails
  // with Unavailable "crashed", until Crash().
  void CrashAfter(uint64_t n);
  // The power cut: every file reachable through synced entries goes back to
  // its synced data, every directory to its synced entries; the rest is
  // gone. Files opened before fail from now on; a CrashAfter is cleared.
  void Crash();
  // Moves the data of the file at `path` out and removes the file (no copy).
  absl::StatusOr<std::string> Take(const std::string& path);

 private:
  friend class MemoryFile;
  struct Node;
  using NodePtr = std::shared_ptr<Node>;

  // Fails once a CrashAfter has run out; counts one change when `change`.
  absl::Status Gate(bool change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<NodePtr> Find(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The directory that holds `path`, and the last name of `path`.
  absl::StatusOr<std::pair<NodePtr, std::string>> Parent(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable zcc::Mutex mu_;
  NodePtr root_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> crash_at_ ABSL_GUARDED_BY(mu_);  // a count of changes
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  const bool keep_synced_ = true;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // Crash() count: files of older epochs fail
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_MEMORY_STORAGE_H_
