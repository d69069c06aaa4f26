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
class StoreFile final : public FileWrapper {
 public:
  StoreFile(std::unique_ptr<File> base, std::function<absl::Status()> persist)
      : FileWrapper(std::move(base)), persist_(std::move(persist)) {}
  absl::Status Sync() override {
    ZCC_RETURN_IF_ERROR(base().Sync());
    return persist_();
  }

 private:
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
