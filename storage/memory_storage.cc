#include "storage/memory_storage.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace zcc::storage {

struct MemoryStorage::Node {
  explicit Node(bool is_dir) : dir(is_dir), modified(absl::Now()) {}
  const bool dir;
  std::string data;    // a file's bytes as readers see them
  std::string synced;  // ... and as of its last Sync
  std::map<std::string, NodePtr> entries;  // a directory's, as readers see them
  std::map<std::string, NodePtr> durable;  // ... and as of its last SyncDir
  absl::Time modified;
};

namespace {

absl::StatusOr<std::vector<std::string>> Components(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("not an absolute path: '", path, "'"));
  }
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (const std::string& p : parts) {
    if (p == "." || p == "..") {
      return absl::InvalidArgumentError(absl::StrCat("'.' and '..' are not supported: ", path));
    }
  }
  return parts;
}

bool Aligned(uint64_t v) { return v % kDirectIoAlignment == 0; }

}  // namespace

class MemoryFile final : public File {
 public:
  MemoryFile(MemoryStorage* storage, MemoryStorage::NodePtr node, std::string path, bool direct,
             uint32_t depth, bool writable, uint64_t epoch)
      : storage_(storage),
        node_(std::move(node)),
        path_(std::move(path)),
        direct_(direct),
        depth_(depth),
        writable_(writable),
        epoch_(epoch) {}

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  uint32_t queue_depth() const override { return depth_; }
  uint32_t in_flight() const override { return static_cast<uint32_t>(done_.size()); }

  absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n, uint64_t tag) override {
    ZCC_RETURN_IF_ERROR(CheckSubmit(offset, src, n, /*write=*/true));
    IoCompletion c{tag, absl::OkStatus(), 0};
    {
      zcc::MutexLock lock(&storage_->mu_);
      c.status = Usable(/*change=*/true);
      if (c.status.ok()) {
        std::string& data = node_->data;
        if (data.size() < offset + n) data.resize(offset + n, '\0');
        std::memcpy(data.data() + offset, src, n);
        node_->modified = absl::Now();
        c.bytes = n;
      }
    }
    done_.push_back(std::move(c));
    return absl::OkStatus();
  }

  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) override {
    ZCC_RETURN_IF_ERROR(CheckSubmit(offset, dst, n, /*write=*/false));
    IoCompletion c{tag, absl::OkStatus(), 0};
    {
      zcc::MutexLock lock(&storage_->mu_);
      c.status = Usable(/*change=*/false);
      const std::string& data = node_->data;
      if (c.status.ok() && offset < data.size()) {
        c.bytes = std::min<uint64_t>(n, data.size() - offset);
        std::memcpy(dst, data.data() + offset, c.bytes);
      }
    }
    done_.push_back(std::move(c));
    return absl::OkStatus();
  }

  absl::StatusOr<IoCompletion> WaitForCompletion() override {
    if (done_.empty()) return absl::FailedPreconditionError("no request in flight");
    IoCompletion c = std::move(done_.front());
    done_.pop_front();
    return c;
  }
  bool HasCompletion() const override { return !done_.empty(); }

  absl::StatusOr<uint64_t> Size() override {
    zcc::MutexLock lock(&storage_->mu_);
    ZCC_RETURN_IF_ERROR(Usable(false));
    return node_->data.size();
  }
  absl::Status Truncate(uint64_t size) override {
    if (!writable_) return absl::PermissionDeniedError(absl::StrCat(path_, " is open for reading"));
    zcc::MutexLock lock(&storage_->mu_);
    ZCC_RETURN_IF_ERROR(Usable(true));
    node_->data.resize(size, '\0');
    node_->modified = absl::Now();
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    zcc::MutexLock lock(&storage_->mu_);
    ZCC_RETURN_IF_ERROR(Usable(true));
    if (storage_->keep_synced_) node_->synced = node_->data;
    return absl::OkStatus();
  }
  absl::Status Close() override {
    done_.clear();
    return absl::OkStatus();
  }

 private:
  absl::Status CheckSubmit(uint64_t offset, const void* buf, size_t n, bool write) const {
    if (write && !writable_) {
      return absl::PermissionDeniedError(absl::StrCat(path_, " is open for reading"));
    }
    if (done_.size() >= depth_) {
      return absl::FailedPreconditionError(absl::StrCat(depth_, " requests in flight already"));
    }
    if (direct_ && (!Aligned(offset) || !Aligned(n) ||
                    !Aligned(reinterpret_cast<uintptr_t>(buf)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "direct I/O on ", path_, " needs offset, length and buffer aligned to ",
          kDirectIoAlignment));
    }
    return absl::OkStatus();
  }
  absl::Status Usable(bool change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(storage_->mu_) {
    if (epoch_ != storage_->epoch_) {
      return absl::FailedPreconditionError(absl::StrCat(path_, " was open when the storage crashed"));
    }
    return storage_->Gate(change);
  }

  MemoryStorage* const storage_;
  const MemoryStorage::NodePtr node_;
  const std::string path_;
  const bool direct_;
  const uint32_t depth_;
  const bool writable_;
  const uint64_t epoch_;
  std::deque<IoCompletion> done_;  // requests run when submitted
};

MemoryStorage::MemoryStorage() : root_(std::make_shared<Node>(true)) {}
MemoryStorage::MemoryStorage(bool keep_synced)
    : root_(std::make_shared<Node>(true)), keep_synced_(keep_synced) {}

absl::StatusOr<std::string> MemoryStorage::Take(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  if (node->dir) return absl::FailedPreconditionError(absl::StrCat("take ", path, ": a directory"));
  ZCC_ASSIGN_OR_RETURN(auto parent, Parent(path));
  ZCC_RETURN_IF_ERROR(Gate(true));
  std::string data = std::move(node->data);
  node->data.clear();
  node->synced.clear();
  parent.first->entries.erase(parent.second);
  parent.first->modified = absl::Now();
  return data;
}
MemoryStorage::~MemoryStorage() = default;

absl::Status MemoryStorage::Gate(bool change) {
  if (crashed_) return absl::UnavailableError("the storage crashed (injected); see CrashAfter");
  if (!change) return absl::OkStatus();
  if (crash_at_.has_value() && changes_ >= *crash_at_) {
    crashed_ = true;
    return absl::UnavailableError("the storage crashed (injected); see CrashAfter");
  }
  ++changes_;
  return absl::OkStatus();
}

absl::StatusOr<MemoryStorage::NodePtr> MemoryStorage::Find(const std::string& path) const {
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> parts, Components(path));
  NodePtr node = root_;
  for (const std::string& part : parts) {
    if (!node->dir) return absl::FailedPreconditionError(absl::StrCat("not a directory on the way to ", path));
    auto it = node->entries.find(part);
    if (it == node->entries.end()) return absl::NotFoundError(absl::StrCat("no such file or directory: ", path));
    node = it->second;
  }
  return node;
}

absl::StatusOr<std::pair<MemoryStorage::NodePtr, std::string>> MemoryStorage::Parent(
    const std::string& path) const {
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> parts, Components(path));
  if (parts.empty()) return absl::InvalidArgumentError("'/' has no parent");
  std::string name = parts.back();
  parts.pop_back();
  NodePtr dir = root_;
  for (const std::string& part : parts) {
    auto it = dir->entries.find(part);
    if (it == dir->entries.end()) {
      return absl::NotFoundError(absl::StrCat("no such directory on the way to ", path));
    }
    dir = it->second;
    if (!dir->dir) return absl::FailedPreconditionError(absl::StrCat("not a directory on the way to ", path));
  }
  return std::make_pair(dir, std::move(name));
}

absl::StatusOr<std::unique_ptr<File>> MemoryStorage::OpenForWrite(const std::string& path,
                                                                  const OpenOptions& options) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(true));
  ZCC_ASSIGN_OR_RETURN(auto parent, Parent(path));
  auto& [dir, name] = parent;
  NodePtr& slot = dir->entries[name];
  if (slot == nullptr) {
    slot = std::make_shared<Node>(false);
    dir->modified = absl::Now();
  } else if (slot->dir) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
  } else {
    slot->data.clear();  // O_TRUNC: the same file, emptied
    slot->modified = absl::Now();
  }
  return std::unique_ptr<File>(new MemoryFile(this, slot, path, options.direct,
                                              std::max<uint32_t>(options.queue_depth, 1),
                                              /*writable=*/true, epoch_));
}

absl::StatusOr<std::unique_ptr<File>> MemoryStorage::OpenForRead(const std::string& path,
                                                                 const OpenOptions& options) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  if (node->dir) return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
  return std::unique_ptr<File>(new MemoryFile(this, node, path, options.direct,
                                              std::max<uint32_t>(options.queue_depth, 1),
                                              /*writable=*/false, epoch_));
}

absl::Status MemoryStorage::MakeDirs(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> parts, Components(path));
  NodePtr dir = root_;
  for (const std::string& part : parts) {
    auto it = dir->entries.find(part);
    if (it == dir->entries.end()) {
      ZCC_RETURN_IF_ERROR(Gate(true));
      it = dir->entries.emplace(part, std::make_shared<Node>(true)).first;
      dir->modified = absl::Now();
    } else if (!it->second->dir) {
      return absl::FailedPreconditionError(absl::StrCat("not a directory on the way to ", path));
    }
    dir = it->second;
  }
  return absl::OkStatus();
}

absl::Status MemoryStorage::SyncDir(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  if (!node->dir) return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  ZCC_RETURN_IF_ERROR(Gate(true));
  if (keep_synced_) node->durable = node->entries;
  return absl::OkStatus();
}

absl::Status MemoryStorage::Rename(const std::string& from, const std::string& to) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(from));
  ZCC_ASSIGN_OR_RETURN(auto src, Parent(from));
  ZCC_ASSIGN_OR_RETURN(auto dst, Parent(to));
  if (from == to) return absl::OkStatus();
  if (node->dir && absl::StartsWith(to, from + "/")) {
    return absl::InvalidArgumentError(absl::StrCat("rename ", from, " into itself (", to, ")"));
  }
  auto existing = dst.first->entries.find(dst.second);
  if (existing != dst.first->entries.end()) {
    const NodePtr& target = existing->second;
    if (target->dir != node->dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("rename ", from, " to ", to, ": one is a directory, the other is not"));
    }
    if (target->dir && !target->entries.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("rename ", from, " to ", to, ": ", to,
                                                        " is a directory that is not empty"));
    }
  }
  ZCC_RETURN_IF_ERROR(Gate(true));
  src.first->entries.erase(src.second);
  dst.first->entries[dst.second] = node;
  src.first->modified = dst.first->modified = absl::Now();
  return absl::OkStatus();
}

absl::Status MemoryStorage::Exchange(const std::string& a, const std::string& b) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr na, Find(a));
  ZCC_ASSIGN_OR_RETURN(NodePtr nb, Find(b));
  ZCC_ASSIGN_OR_RETURN(auto pa, Parent(a));
  ZCC_ASSIGN_OR_RETURN(auto pb, Parent(b));
  if (absl::StartsWith(a, b + "/") || absl::StartsWith(b, a + "/")) {
    return absl::InvalidArgumentError(absl::StrCat("exchange ", a, " and ", b, ": one holds the other"));
  }
  ZCC_RETURN_IF_ERROR(Gate(true));
  pa.first->entries[pa.second] = nb;
  pb.first->entries[pb.second] = na;
  pa.first->modified = pb.first->modified = absl::Now();
  return absl::OkStatus();
}

absl::Status MemoryStorage::Remove(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  if (node->dir) return absl::FailedPreconditionError(absl::StrCat("remove ", path, ": a directory"));
  ZCC_ASSIGN_OR_RETURN(auto parent, Parent(path));
  ZCC_RETURN_IF_ERROR(Gate(true));
  parent.first->entries.erase(parent.second);
  parent.first->modified = absl::Now();
  return absl::OkStatus();
}

absl::Status MemoryStorage::RemoveTree(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  absl::StatusOr<NodePtr> node = Find(path);
  if (absl::IsNotFound(node.status())) return absl::OkStatus();
  ZCC_RETURN_IF_ERROR(node.status());
  ZCC_ASSIGN_OR_RETURN(auto parent, Parent(path));
  ZCC_RETURN_IF_ERROR(Gate(true));
  parent.first->entries.erase(parent.second);
  parent.first->modified = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<FileInfo> MemoryStorage::Stat(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  FileInfo info;
  info.is_dir = node->dir;
  info.size = node->dir ? 0 : node->data.size();
  info.modified = node->modified;
  return info;
}

absl::StatusOr<std::vector<std::string>> MemoryStorage::List(const std::string& path) {
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(Gate(false));
  ZCC_ASSIGN_OR_RETURN(NodePtr node, Find(path));
  if (!node->dir) return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  std::vector<std::string> names;
  for (const auto& [name, child] : node->entries) names.push_back(name);
  return names;
}

uint64_t MemoryStorage::changes() const {
  zcc::MutexLock lock(&mu_);
  return changes_;
}

void MemoryStorage::CrashAfter(uint64_t n) {
  zcc::MutexLock lock(&mu_);
  crash_at_ = changes_ + n;
}

void MemoryStorage::Crash() {
  zcc::MutexLock lock(&mu_);
  // Each node reachable through synced entries gets its synced state back;
  // a node reached twice (see the header) is restored once.
  std::vector<NodePtr> stack = {root_};
  absl::flat_hash_set<const Node*> seen;
  while (!stack.empty()) {
    NodePtr node = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    if (node->dir) {
      node->entries = node->durable;
      for (const auto& [name, child] : node->entries) stack.push_back(child);
    } else {
      node->data = node->synced;
    }
  }
  crash_at_.reset();
  crashed_ = false;
  ++epoch_;
}

}  // namespace zcc::storage
