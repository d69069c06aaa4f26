// StorageWrapper: a Storage that passes every call to another one, for
// wrappers that change a few of them (a fault injector, a test's stalled
// disk) to derive from, the way leveldb's EnvWrapper is used. FileWrapper is
// the same for a File (it owns the file it wraps).
//
// Thread-safety: as the wrapped Storage. Ownership: borrows `base`, which
// must outlive the wrapper.
#ifndef ZCC_STORAGE_STORAGE_WRAPPER_H_
#define ZCC_STORAGE_STORAGE_WRAPPER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/storage.h"

namespace zcc::storage {

class FileWrapper : public File {
 public:
  explicit FileWrapper(std::unique_ptr<File> base) : base_(std::move(base)) {}

  File& base() const { return *base_; }

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }
  uint32_t queue_depth() const override { return base_->queue_depth(); }
  uint32_t in_flight() const override { return base_->in_flight(); }
  size_t preferred_request_bytes() const override { return base_->preferred_request_bytes(); }
  absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n, uint64_t tag) override {
    return base_->SubmitWrite(offset, src, n, tag);
  }
  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) override {
    return base_->SubmitRead(offset, dst, n, tag);
  }
  absl::StatusOr<IoCompletion> WaitForCompletion() override { return base_->WaitForCompletion(); }
  bool HasCompletion() const override { return base_->HasCompletion(); }
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }
  absl::Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  absl::Status Sync() override { return base_->Sync(); }
  absl::Status Close() override { return base_->Close(); }

 private:
  std::unique_ptr<File> base_;
};

class StorageWrapper : public Storage {
 public:
  explicit StorageWrapper(Storage* base) : base_(base) {}

  Storage* base() const { return base_; }

  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const std::string& path,
                                                     const OpenOptions& options) override {
    return base_->OpenForWrite(path, options);
  }
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(const std::string& path,
                                                    const OpenOptions& options) override {
    return base_->OpenForRead(path, options);
  }
  bool atomic_file_writes(const std::string& path) const override {
    return base_->atomic_file_writes(path);
  }
  bool renames(const std::string& path) const override { return base_->renames(path); }
  absl::Status MakeDirs(const std::string& path) override { return base_->MakeDirs(path); }
  absl::Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status Exchange(const std::string& a, const std::string& b) override {
    return base_->Exchange(a, b);
  }
  absl::Status Remove(const std::string& path) override { return base_->Remove(path); }
  absl::Status RemoveTree(const std::string& path) override { return base_->RemoveTree(path); }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& path) override {
    return base_->List(path);
  }
  absl::StatusOr<VersionedFile> ReadVersioned(const std::string& path,
                                              uint64_t max_bytes) override {
    return base_->ReadVersioned(path, max_bytes);
  }
  absl::Status WriteIfVersion(const std::string& path, const std::string& content,
                              const std::string& version) override {
    return base_->WriteIfVersion(path, content, version);
  }

 private:
  Storage* const base_;
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_STORAGE_WRAPPER_H_
