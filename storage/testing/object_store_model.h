// ObjectStoreModel: a MemoryStorage (or any Storage) made to behave as an
// object store does, for tests of what zcc does on one without a server:
// no Rename or Exchange (Unimplemented; renames() false), a file appears
// whole when synced (atomic_file_writes() true), and every completed change
// is durable at once, with no directory to sync: a synced file, a directory
// made, a removal. Under MemoryStorage's crashes (Crash, CrashAfter) it
// then loses only what an object store loses: writes never completed.
//
// Thread-safety: as the wrapped Storage, but conditional writes are not
// atomic against each other (tests run them from one thread). Ownership: borrows `base`.
#ifndef ZCC_STORAGE_TESTING_OBJECT_STORE_MODEL_H_
#define ZCC_STORAGE_TESTING_OBJECT_STORE_MODEL_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "storage/storage_wrapper.h"

namespace zcc::storage::testing {

class ObjectStoreModel final : public StorageWrapper {
 public:
  explicit ObjectStoreModel(Storage* base) : StorageWrapper(base) {}

  bool atomic_file_writes(const std::string&) const override { return true; }
  bool renames(const std::string&) const override { return false; }
  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const std::string& path,
                                                     const OpenOptions& options) override;
  absl::Status MakeDirs(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path) override;
  // Versions are contents (what an ETag stands for).
  absl::StatusOr<VersionedFile> ReadVersioned(const std::string& path,
                                              uint64_t max_bytes) override;
  absl::Status WriteIfVersion(const std::string& path, const std::string& content,
                              const std::string& version) override;

  // Runs before each conditional write's comparison: a test's other writer.
  void BeforeConditionalWrite(std::function<void()> hook) { before_write_ = std::move(hook); }

 private:
  // Syncs `dir` and every directory above it.
  absl::Status Persist(const std::string& dir);

  std::function<void()> before_write_;
};

}  // namespace zcc::storage::testing

#endif  // ZCC_STORAGE_TESTING_OBJECT_STORE_MODEL_H_
