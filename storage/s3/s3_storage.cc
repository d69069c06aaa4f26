#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "storage/completion_queue.h"

namespace zcc::storage::s3 {
namespace {

// Bytes of a streamed file kept in memory until Sync: the last block, whose
// padding a direct writer cuts off with Truncate.
constexpr size_t kHeldBack = kDirectIoAlignment;
// S3's smallest part but the last.
constexpr size_t kMinPartBytes = size_t{5} << 20;

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

std::string Base(const std::string& name) {
  std::string s = name;
  while (!s.empty() && s.back() == '/') s.pop_back();
  const size_t slash = s.find_last_of('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

}  // namespace

// A file being written: in memory (buffered), or streamed in parts (direct).
class S3WriteFile final : public File {
 public:
  S3WriteFile(S3Storage* storage, std::string path, std::string key, bool streamed,
              bool background)
      : storage_(storage),
        path_(std::move(path)),
        key_(std::move(key)),
        streamed_(streamed),
        background_(background) {}
  // Dropped without Close (an error path of its owner): the upload is
  // aborted, and an error the owner never saw is logged, not lost.
  ~S3WriteFile() override {
    if (absl::Status st = Close(); !st.ok()) {
      ZCC_LOG(WARNING) << path_ << ": dropped unclosed after an error: " << st;
    }
  }

  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }
  uint32_t queue_depth() const override { return 1; }
  uint32_t in_flight() const override { return in_flight_; }

  absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n, uint64_t tag) override {
    if (in_flight_ >= 1) return absl::FailedPreconditionError("a request is in flight");
    if (sealed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": written after Sync (an object cannot change once uploaded)"));
    }
    absl::Status st = streamed_ ? Append(offset, src, n) : Place(offset, src, n);
    ++in_flight_;
    IoCompletion c;
    c.tag = tag;
    c.status = st;
    c.bytes = st.ok() ? n : 0;
    done_.Push(std::move(c));
    return absl::OkStatus();
  }
  absl::Status SubmitRead(uint64_t, void*, size_t, uint64_t) override {
    return absl::FailedPreconditionError(absl::StrCat(path_, " is open for writing"));
  }
  absl::StatusOr<IoCompletion> WaitForCompletion() override { return done_.Wait(&in_flight_); }
  bool HasCompletion() const override { return done_.HasCompletion(); }

  absl::StatusOr<uint64_t> Size() override { return uploaded_ + tail_.size(); }

  absl::Status Truncate(uint64_t size) override {
    if (sealed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": truncated after Sync"));
    if (size < uploaded_) {
      return absl::FailedPreconditionError(absl::StrCat(
          path_, ": cannot cut to ", size, " bytes; ", uploaded_, " are uploaded already"));
    }
    tail_.resize(size - uploaded_, '\0');
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (sealed_) return first_error();
    sealed_ = true;
    if (upload_id_.empty()) {
      // Small enough never to have started parts: one PUT.
      ZCC_RETURN_IF_ERROR(first_error());
      return Record(storage_->client().Put(storage_->options().bucket, key_, tail_).status());
    }
    // (An upload is started with its first part: the tail, if any, is the last.)
    if (!tail_.empty()) StartPart(std::move(tail_));
    tail_.clear();
    AwaitParts(0);
    ZCC_RETURN_IF_ERROR(first_error());
    std::vector<PartReceipt> parts;
    {
      zcc::MutexLock lock(&mu_);
      parts = parts_;
    }
    absl::Status st = storage_->client()
                          .CompleteMultipart(storage_->options().bucket, key_, upload_id_, parts)
                          .status();
    if (st.ok()) upload_id_.clear();  // complete: nothing to abort
    return Record(st);
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    closed_ = true;
    AwaitParts(0);
    if (!upload_id_.empty()) {
      // Never completed: nothing of it may become visible, nor linger. An
      // abort that fails leaves the parts stored until `zccctl gc` aborts
      // the upload: say so, without failing the close (nothing is visible).
      if (absl::Status st =
              storage_->client().AbortMultipart(storage_->options().bucket, key_, upload_id_);
          !st.ok()) {
        ZCC_LOG(WARNING) << path_ << ": could not abort the unfinished multipart upload "
                         << upload_id_ << " (zccctl gc removes it): " << st;
      }
      upload_id_.clear();
    }
    return first_error();
  }

 private:
  // A buffered file: bytes anywhere, kept in memory until Sync.
  absl::Status Place(uint64_t offset, const void* src, size_t n) {
    if (offset + n > tail_.size()) tail_.resize(offset + n, '\0');
    std::memcpy(tail_.data() + offset, src, n);
    return absl::OkStatus();
  }

  // A streamed file: each request at the end of what was written.
  absl::Status Append(uint64_t offset, const void* src, size_t n) {
    ZCC_RETURN_IF_ERROR(first_error());
    const uint64_t end = uploaded_ + tail_.size();
    if (offset != end) {
      return absl::FailedPreconditionError(absl::StrCat(
          path_, ": a write at ", offset, " where the object ends at ", end,
          " (objects are written in order)"));
    }
    // A part once part_bytes are there (the held-back bytes included, so that
    // requests of part_bytes make parts of about that size).
    const size_t part = std::max(storage_->options().part_bytes, kMinPartBytes + kHeldBack);
    if (tail_.capacity() < part + n) tail_.reserve(part + n);
    tail_.append(static_cast<const char*>(src), n);
    if (tail_.size() < part) return absl::OkStatus();
    if (upload_id_.empty()) {
      auto id = storage_->client().CreateMultipart(storage_->options().bucket, key_);
      if (!id.ok()) return Record(id.status());
      upload_id_ = *id;
    }
    // At most `concurrency` parts of this file in flight (its memory).
    AwaitParts(storage_->options().concurrency - 1);
    // All but the held-back bytes go as one part (parts need not be of one
    // size, only at least 5 MiB but the last): the part is the buffer the
    // requests were appended to, moved, not copied again.
    std::string held(tail_, tail_.size() - kHeldBack);
    tail_.resize(tail_.size() - kHeldBack);
    uploaded_ += tail_.size();
    StartPart(std::move(tail_));
    tail_ = std::move(held);
    return absl::OkStatus();
  }

  void StartPart(std::string bytes) {
    int number;
    {
      zcc::MutexLock lock(&mu_);
      parts_.emplace_back();
      number = static_cast<int>(parts_.size());
      ++parts_in_flight_;
    }
    auto body = std::make_shared<std::string>(std::move(bytes));
    storage_->pool_.Post([this, number, body] {
      // A background file's part at idle priority, the pool's thread back to
      // normal after it.
      std::optional<IdlePriority> idle;
      if (background_) idle.emplace();
      auto part = storage_->client().UploadPart(storage_->options().bucket, key_, upload_id_,
                                                number, *body);
      zcc::MutexLock lock(&mu_);
      if (part.ok()) {
        parts_[number - 1] = *std::move(part);
      } else if (error_.ok()) {
        error_ = part.status();
      }
      --parts_in_flight_;
    });
  }

  void AwaitParts(int at_most) {
    zcc::MutexLock lock(&mu_);
    auto few = [this, at_most]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return parts_in_flight_ <= at_most;
    };
    mu_.Await(absl::Condition(&few));
  }

  absl::Status Record(absl::Status st) {
    zcc::MutexLock lock(&mu_);
    if (!st.ok() && error_.ok()) error_ = st;
    return st;
  }
  absl::Status first_error() const {
    zcc::MutexLock lock(&mu_);
    return error_;
  }

  S3Storage* const storage_;
  const std::string path_;
  const std::string key_;
  const bool streamed_;
  const bool background_;
  CompletionQueue done_;
  uint32_t in_flight_ = 0;
  bool sealed_ = false;
  bool closed_ = false;
  std::string tail_;        // bytes not uploaded (all of a buffered file)
  uint64_t uploaded_ = 0;   // bytes handed to part uploads
  std::string upload_id_;   // the multipart upload, once started
  mutable zcc::Mutex mu_;
  std::vector<PartReceipt> parts_ ABSL_GUARDED_BY(mu_);
  int parts_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// A file being read: ranged GETs on the storage's threads.
class S3ReadFile final : public File {
 public:
  S3ReadFile(S3Storage* storage, std::string path, std::string key, uint64_t size,
             uint32_t queue_depth)
      : storage_(storage),
        path_(std::move(path)),
        key_(std::move(key)),
        size_(size),
        queue_depth_(std::max<uint32_t>(1, queue_depth)) {}
  ~S3ReadFile() override { (void)Close(); }

  const std::string& path() const override { return path_; }
  bool direct() const override { return false; }
  uint32_t queue_depth() const override { return queue_depth_; }
  uint32_t in_flight() const override { return in_flight_; }
  size_t preferred_request_bytes() const override {
    return storage_->options().read_request_bytes;
  }

  absl::Status SubmitWrite(uint64_t, const void*, size_t, uint64_t) override {
    return absl::FailedPreconditionError(absl::StrCat(path_, " is open for reading"));
  }
  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) override {
    if (in_flight_ >= queue_depth_) {
      return absl::FailedPreconditionError(absl::StrCat(queue_depth_, " requests in flight"));
    }
    ++in_flight_;
    // Past the end there is nothing to ask for.
    const size_t want = offset >= size_ ? 0 : static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
    if (want == 0) {
      done_.Push(IoCompletion{tag, absl::OkStatus(), 0});
      return absl::OkStatus();
    }
    storage_->pool_.Post([this, offset, dst, want, tag] {
      auto got = storage_->client().GetRange(storage_->options().bucket, key_, offset, dst, want);
      IoCompletion c;
      c.tag = tag;
      c.status = got.status();
      c.bytes = got.ok() ? *got : 0;
      // The object was `size_` bytes when opened: fewer here is not its end
      // (a reply cut short, or the object replaced meanwhile).
      if (got.ok() && *got < want) {
        c.status = absl::DataLossError(absl::StrCat(
            path_, ": ", *got, " bytes came of the ", want, " asked for at offset ", offset,
            " of an object of ", size_, " bytes"));
        c.bytes = 0;
      }
      done_.Push(std::move(c));
    });
    return absl::OkStatus();
  }
  absl::StatusOr<IoCompletion> WaitForCompletion() override { return done_.Wait(&in_flight_); }
  bool HasCompletion() const override { return done_.HasCompletion(); }
  absl::StatusOr<uint64_t> Size() override { return size_; }
  absl::Status Truncate(uint64_t) override {
    return absl::FailedPreconditionError(absl::StrCat(path_, " is open for reading"));
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override {
    while (in_flight_ > 0) (void)done_.Wait(&in_flight_);  // their buffers stay the caller's
    return absl::OkStatus();
  }

 private:
  S3Storage* const storage_;
  const std::string path_;
  const std::string key_;
  const uint64_t size_;
  const uint32_t queue_depth_;
  CompletionQueue done_;
  uint32_t in_flight_ = 0;
};

S3Storage::S3Storage(S3Client* client, S3StorageOptions options)
    : client_(client), options_(std::move(options)), pool_(std::max(1, options_.concurrency)) {}

S3Storage::~S3Storage() = default;

std::string S3Storage::Key(const std::string& path) const {
  std::string rel = path;
  while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  if (options_.prefix.empty()) return rel;
  return rel.empty() ? options_.prefix : absl::StrCat(options_.prefix, "/", rel);
}

absl::Status S3Storage::CheckPath(const std::string& path) const {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not an absolute path"));
  }
  // An object key is taken as it is: "." and ".." would name other keys on
  // a file system than in the store.
  for (absl::string_view segment : absl::StrSplit(path, '/')) {
    if (segment == "." || segment == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' holds a '.' or '..' segment, which an object store does "
                                  "not resolve"));
    }
  }
  return absl::OkStatus();
}

absl::Status S3Storage::CheckDir(const std::string& path) {
  // One key under it is enough (Stat would list them all for the newest
  // time, and a job's directory holds every step's objects).
  const std::string key = Key(path);
  if (key.empty()) return absl::OkStatus();
  ZCC_ASSIGN_OR_RETURN(Listing under, client_->List(options_.bucket, key + "/", "", 1));
  if (!under.objects.empty()) return absl::OkStatus();
  if (client_->Head(options_.bucket, key).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
}

absl::StatusOr<std::unique_ptr<File>> S3Storage::OpenForWrite(const std::string& path,
                                                              const OpenOptions& options) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  ZCC_RETURN_IF_ERROR(CheckDir(Parent(path)));
  return std::unique_ptr<File>(
      new S3WriteFile(this, path, Key(path), options.direct, options.background));
}

absl::StatusOr<std::unique_ptr<File>> S3Storage::OpenForRead(const std::string& path,
                                                             const OpenOptions& options) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  ZCC_ASSIGN_OR_RETURN(ObjectInfo info, client_->Head(options_.bucket, Key(path)));
  return std::unique_ptr<File>(
      new S3ReadFile(this, path, Key(path), info.size, options.queue_depth));
}

absl::Status S3Storage::MakeDirs(const std::string& path) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  if (key.empty()) return absl::OkStatus();  // the root
  if (client_->Head(options_.bucket, key).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(path, " is a file"));
  }
  return client_->Put(options_.bucket, key + "/", "").status();
}

absl::Status S3Storage::SyncDir(const std::string& path) {
  // What is uploaded is durable: only the directory's existence is checked.
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  return CheckDir(path);
}

absl::Status S3Storage::Rename(const std::string& from, const std::string&) {
  return absl::UnimplementedError(
      absl::StrCat("rename of ", from, ": an object store has no rename"));
}

absl::Status S3Storage::Exchange(const std::string& a, const std::string& b) {
  ZCC_RETURN_IF_ERROR(Stat(a).status());
  ZCC_RETURN_IF_ERROR(Stat(b).status());
  return absl::UnimplementedError(
      absl::StrCat("exchange of ", a, " and ", b, ": an object store has no rename"));
}

absl::Status S3Storage::Remove(const std::string& path) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  ZCC_ASSIGN_OR_RETURN(FileInfo info, Stat(path));
  if (info.is_dir) return absl::FailedPreconditionError(absl::StrCat("remove ", path, ": a directory"));
  return client_->Delete(options_.bucket, Key(path));
}

absl::Status S3Storage::RemoveTree(const std::string& path) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  if (key.empty()) {
    return absl::InvalidArgumentError("refusing to remove the whole bucket prefix");
  }
  ZCC_ASSIGN_OR_RETURN(Listing under, client_->List(options_.bucket, key + "/", ""));
  // (A store that lists keys outside the prefix asked for removes nothing.)
  for (const ObjectInfo& o : under.objects) {
    if (!absl::StartsWith(o.key, key + "/")) {
      return absl::DataLossError(absl::StrCat("removing ", path, ": the store listed '", o.key,
                                              "', which is not under it; nothing more removed"));
    }
  }
  for (const ObjectInfo& o : under.objects) {
    ZCC_RETURN_IF_ERROR(client_->Delete(options_.bucket, o.key));
  }
  // Uploads started under it and never completed go too.
  ZCC_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                       client_->ListMultipart(options_.bucket, key + "/"));
  for (const MultipartUpload& u : uploads) {
    ZCC_RETURN_IF_ERROR(client_->AbortMultipart(options_.bucket, u.key, u.upload_id));
  }
  return client_->Delete(options_.bucket, key);  // a file of that name
}

absl::StatusOr<FileInfo> S3Storage::Stat(const std::string& path) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  FileInfo info;
  if (key.empty()) {
    info.is_dir = true;
    return info;
  }
  absl::StatusOr<ObjectInfo> object = client_->Head(options_.bucket, key);
  if (object.ok()) {
    info.size = object->size;
    info.modified = object->modified;
    return info;
  }
  if (!absl::IsNotFound(object.status())) return object.status();
  ZCC_ASSIGN_OR_RETURN(Listing under, client_->List(options_.bucket, key + "/", ""));
  if (under.objects.empty()) return absl::NotFoundError(absl::StrCat("stat ", path, ": nothing there"));
  info.is_dir = true;
  // A directory changes when anything under it does: its newest object.
  info.modified = absl::InfinitePast();
  for (const ObjectInfo& o : under.objects) info.modified = std::max(info.modified, o.modified);
  return info;
}

absl::StatusOr<size_t> S3Storage::AbortUploads(const std::string& path, absl::Time started_before) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  ZCC_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                       client_->ListMultipart(options_.bucket, key.empty() ? "" : key + "/"));
  size_t aborted = 0;
  for (const MultipartUpload& u : uploads) {
    if (u.initiated >= started_before) continue;
    ZCC_RETURN_IF_ERROR(client_->AbortMultipart(options_.bucket, u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

absl::StatusOr<std::vector<std::string>> S3Storage::List(const std::string& path) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  const std::string prefix = key.empty() ? "" : key + "/";
  ZCC_ASSIGN_OR_RETURN(Listing level, client_->List(options_.bucket, prefix, "/"));
  std::set<std::string> names;
  bool marker = false;
  for (const ObjectInfo& o : level.objects) {
    if (o.key == prefix) {
      marker = true;  // the directory's own marker
      continue;
    }
    names.insert(Base(o.key));
  }
  for (const std::string& p : level.prefixes) names.insert(Base(p));
  if (names.empty() && !marker && !key.empty()) {
    return absl::NotFoundError(absl::StrCat("list ", path, ": no such directory"));
  }
  return std::vector<std::string>(names.begin(), names.end());
}

absl::StatusOr<VersionedFile> S3Storage::ReadVersioned(const std::string& path,
                                                       uint64_t max_bytes) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  const std::string key = Key(path);
  ZCC_ASSIGN_OR_RETURN(const ObjectInfo info, client_->Head(options_.bucket, key));
  if (info.size > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", info.size, " bytes; at most ", max_bytes, " expected"));
  }
  // Replaced between the HEAD and the GET, the content is newer than the
  // ETag: a write conditional on that ETag then fails, as it should.
  VersionedFile file;
  file.version = info.etag;
  file.content.resize(info.size);
  ZCC_ASSIGN_OR_RETURN(const size_t got,
                       client_->GetRange(options_.bucket, key, 0, file.content.data(), info.size));
  file.content.resize(got);
  return file;
}

absl::Status S3Storage::WriteIfVersion(const std::string& path, const std::string& content,
                                       const std::string& version) {
  ZCC_RETURN_IF_ERROR(CheckPath(path));
  PutCondition condition;
  if (version.empty()) {
    condition.if_none_match = true;
  } else {
    condition.if_match = version;
  }
  return client_->Put(options_.bucket, Key(path), content, condition).status();
}

}  // namespace zcc::storage::s3
