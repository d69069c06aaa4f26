#include "storage/routed_storage.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/storage_wrapper.h"

namespace zcc::storage {
namespace {

// A routed storage's file, known by the path it was opened with.
class RoutedFile final : public FileWrapper {
 public:
  RoutedFile(std::unique_ptr<File> base, std::string path)
      : FileWrapper(std::move(base)), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
};

absl::StatusOr<std::unique_ptr<File>> Named(absl::StatusOr<std::unique_ptr<File>> file,
                                            const std::string& path) {
  if (!file.ok() || (*file)->path() == path) return file;
  return std::unique_ptr<File>(std::make_unique<RoutedFile>(*std::move(file), path));
}

}  // namespace

namespace {

// A route's key: its prefix without trailing slashes.
std::string RouteKey(std::string prefix) {
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  return prefix;
}

}  // namespace

void RoutedStorage::AddRoute(const std::string& prefix, Storage* target,
                             const std::string& target_path) {
  const std::string key = RouteKey(prefix);
  zcc::MutexLock lock(&mu_);
  routes_[key] = Route{target, target_path};
}

void RoutedStorage::RemoveRoute(const std::string& prefix, const Storage* target) {
  zcc::MutexLock lock(&mu_);
  auto it = routes_.find(RouteKey(prefix));
  if (it != routes_.end() && it->second.target == target) routes_.erase(it);
}

RoutedStorage::Resolved RoutedStorage::Resolve(const std::string& path) const {
  zcc::MutexLock lock(&mu_);
  // The longest prefix first: map order puts "a/b" after "a", so walk back
  // from the first key past `path`.
  auto it = routes_.upper_bound(path);
  while (it != routes_.begin()) {
    --it;
    const std::string& prefix = it->first;
    if (absl::StartsWith(path, prefix) &&
        (path.size() == prefix.size() || path[prefix.size()] == '/')) {
      std::string rest = path.substr(prefix.size());
      std::string target = it->second.target_path;
      if (!rest.empty() && !target.empty() && target.back() == '/') rest.erase(0, 1);
      return {it->second.target, target + rest};
    }
  }
  return {base_, path};
}

bool RoutedStorage::atomic_file_writes(const std::string& path) const {
  const Resolved r = Resolve(path);
  return r.fs->atomic_file_writes(r.path);
}

bool RoutedStorage::renames(const std::string& path) const {
  const Resolved r = Resolve(path);
  return r.fs->renames(r.path);
}

absl::StatusOr<std::unique_ptr<File>> RoutedStorage::OpenForWrite(const std::string& path,
                                                                  const OpenOptions& options) {
  const Resolved r = Resolve(path);
  return Named(r.fs->OpenForWrite(r.path, options), path);
}

absl::StatusOr<std::unique_ptr<File>> RoutedStorage::OpenForRead(const std::string& path,
                                                                 const OpenOptions& options) {
  const Resolved r = Resolve(path);
  return Named(r.fs->OpenForRead(r.path, options), path);
}

absl::Status RoutedStorage::MakeDirs(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->MakeDirs(r.path);
}

absl::Status RoutedStorage::SyncDir(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->SyncDir(r.path);
}

absl::Status RoutedStorage::Rename(const std::string& from, const std::string& to) {
  const Resolved a = Resolve(from);
  const Resolved b = Resolve(to);
  if (a.fs != b.fs) {
    return absl::UnimplementedError(absl::StrCat("cannot rename ", from, " to ", to,
                                                 ": they are in different storages"));
  }
  return a.fs->Rename(a.path, b.path);
}

absl::Status RoutedStorage::Exchange(const std::string& x, const std::string& y) {
  const Resolved a = Resolve(x);
  const Resolved b = Resolve(y);
  if (a.fs != b.fs) {
    return absl::UnimplementedError(absl::StrCat("cannot exchange ", x, " and ", y,
                                                 ": they are in different storages"));
  }
  return a.fs->Exchange(a.path, b.path);
}

absl::Status RoutedStorage::Remove(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->Remove(r.path);
}

absl::Status RoutedStorage::RemoveTree(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->RemoveTree(r.path);
}

absl::StatusOr<FileInfo> RoutedStorage::Stat(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->Stat(r.path);
}

absl::StatusOr<std::vector<std::string>> RoutedStorage::List(const std::string& path) {
  const Resolved r = Resolve(path);
  return r.fs->List(r.path);
}

absl::StatusOr<VersionedFile> RoutedStorage::ReadVersioned(const std::string& path,
                                                           uint64_t max_bytes) {
  const Resolved r = Resolve(path);
  return r.fs->ReadVersioned(r.path, max_bytes);
}

absl::Status RoutedStorage::WriteIfVersion(const std::string& path, const std::string& content,
                                           const std::string& version) {
  const Resolved r = Resolve(path);
  return r.fs->WriteIfVersion(r.path, content, version);
}

}  // namespace zcc::storage
