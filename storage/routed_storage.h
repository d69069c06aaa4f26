// RoutedStorage: one Storage over several. A path under a route's prefix (a
// URL such as "s3://bucket/prefix", or a directory) goes to that route's
// storage, the prefix replaced by the route's own path; every other path
// goes to the base storage. zccd reaches its object-store roots this way:
// a job's directory is the URL "s3://bucket/prefix/job", and everything that
// reads or writes checkpoints (writers, the commit, retention, restores,
// status) takes it like any other path.
//
// A prefix matches whole path components: "s3://b/ckpt" routes
// "s3://b/ckpt/job", not "s3://b/ckpt2". The longest matching prefix wins.
// Rename and Exchange between two storages are Unimplemented, as on a
// storage that cannot rename at all.
//
// Thread-safety: thread-safe; routes may be added while paths are used.
// Ownership: borrows the base and every route's storage; they must outlive
// it and the Files it hands out.
#ifndef ZCC_STORAGE_ROUTED_STORAGE_H_
#define ZCC_STORAGE_ROUTED_STORAGE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "storage/storage.h"

namespace zcc::storage {

class RoutedStorage final : public Storage {
 public:
  explicit RoutedStorage(Storage* base) : base_(base) {}

  // `prefix` and every path under it go to `target`, as `target_path`
  // followed by the rest of the path. A route added again replaces the old.
  void AddRoute(const std::string& prefix, Storage* target, const std::string& target_path);
  // Removes the route of `prefix` if it still goes to `target`.
  void RemoveRoute(const std::string& prefix, const Storage* target);

  bool atomic_file_writes(const std::string& path) const override;
  bool renames(const std::string& path) const override;
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
  absl::StatusOr<VersionedFile> ReadVersioned(const std::string& path,
                                              uint64_t max_bytes) override;
  absl::Status WriteIfVersion(const std::string& path, const std::string& content,
                              const std::string& version) override;

 private:
  struct Route {
    Storage* target = nullptr;
    std::string target_path;
  };
  struct Resolved {
    Storage* fs = nullptr;
    std::string path;
  };
  Resolved Resolve(const std::string& path) const ABSL_LOCKS_EXCLUDED(mu_);

  Storage* const base_;
  mutable zcc::Mutex mu_;
  std::map<std::string, Route> routes_ ABSL_GUARDED_BY(mu_);  // by prefix
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_ROUTED_STORAGE_H_
