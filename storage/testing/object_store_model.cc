#include "storage/testing/object_store_model.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"
#include "storage/whole_file.h"

namespace zcc::storage::testing {
namespace {

// A written file: durable, entry included, once synced.
class StoreFile final : public File {
 public:
  StoreFile(std::unique_ptr<File> base, std::function<absl::Status()> persist)
      : base_(std::move(base)), persist_(std::move(persist)) {}

  const std::string& path() const override { return base_->path(); }
  bool direct() const override { return base_->direct(); }
  uint32_t queue_depth() const override { return base_->queue_depth(); }
  uint32_t in_flight() const override { return base_->in_flight(); }
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
  absl::Status Sync() override {
    ZCC_RETURN_IF_ERROR(base_->Sync());
    return persist_();
  }
  absl::Status Close() override { return base_->Close(); }

 private:
  std::unique_ptr<File> base_;
  std::function<absl::Status()> persist_;
};

}  // namespace

absl::Status ObjectStoreModel::Persist(const std::string& dir) {
  for (std::string d = dir;; d = DirName(d)) {
    ZCC_RETURN_IF_ERROR(base()->SyncDir(d));
    if (d == "/" || d.empty()) return absl::OkStatus();
  }
}

absl::StatusOr<std::unique_ptr<File>> ObjectStoreModel::OpenForWrite(const std::string& path,
                                                                     const OpenOptions& options) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> file, base()->OpenForWrite(path, options));
  const std::string dir = DirName(path);
  return std::unique_ptr<File>(
      std::make_unique<StoreFile>(std::move(file), [this, dir] { return Persist(dir); }));
}

absl::Status ObjectStoreModel::MakeDirs(const std::string& path) {
  ZCC_RETURN_IF_ERROR(base()->MakeDirs(path));
  return Persist(DirName(path));
}

absl::Status ObjectStoreModel::Rename(const std::string& from, const std::string&) {
  return absl::UnimplementedError(absl::StrCat("an object store cannot rename ", from));
}

absl::Status ObjectStoreModel::Exchange(const std::string& a, const std::string& b) {
  ZCC_RETURN_IF_ERROR(Stat(a).status());
  ZCC_RETURN_IF_ERROR(Stat(b).status());
  return absl::UnimplementedError(absl::StrCat("an object store cannot exchange ", a));
}

absl::Status ObjectStoreModel::Remove(const std::string& path) {
  ZCC_RETURN_IF_ERROR(base()->Remove(path));
  return Persist(DirName(path));
}

absl::Status ObjectStoreModel::RemoveTree(const std::string& path) {
  ZCC_RETURN_IF_ERROR(base()->RemoveTree(path));
  return Persist(DirName(path));
}

absl::StatusOr<VersionedFile> ObjectStoreModel::ReadVersioned(const std::string& path,
                                                              uint64_t max_bytes) {
  VersionedFile file;
  ZCC_ASSIGN_OR_RETURN(file.content, ReadWholeFile(*this, path, max_bytes));
  file.version = absl::StrCat("v:", file.content);
  return file;
}

absl::Status ObjectStoreModel::WriteIfVersion(const std::string& path, const std::string& content,
                                              const std::string& version) {
  if (before_write_) before_write_();
  auto now = ReadVersioned(path, uint64_t{1} << 20);
  if (!now.ok() && !absl::IsNotFound(now.status())) return now.status();
  const std::string current = now.ok() ? now->version : "";
  if (current != version) {
    return absl::FailedPreconditionError(absl::StrCat(path, " changed: precondition failed"));
  }
  return WriteFileAtomic(*this, path, content);
}

}  // namespace zcc::storage::testing
