#include "storage/fault_storage.h"

#include <cerrno>
#include <deque>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"

namespace zcc::storage {

// Passes requests to the base file unless the storage's plan says otherwise;
// failed requests complete with their error on the next wait.
// Forwards what it does not change (FileWrapper): path, alignment, queue depth,
// request size, Size and Truncate.
class FaultInjectingFile final : public FileWrapper {
 public:
  FaultInjectingFile(std::unique_ptr<File> base, FaultInjectingStorage* owner, bool covered)
      : FileWrapper(std::move(base)), owner_(owner), covered_(covered) {}

  uint32_t in_flight() const override {
    return base().in_flight() + static_cast<uint32_t>(failed_.size());
  }

  absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n, uint64_t tag) override {
    ZCC_RETURN_IF_ERROR(CheckRoom());
    if (!covered_) return base().SubmitWrite(offset, src, n, tag);
    Sleep();
    const FaultInjectingStorage::Decision d = owner_->DecideWrite(n, direct());
    if (d.fail_errno != 0) return Fail(d.fail_errno, "write", offset, tag);
    return base().SubmitWrite(offset, src, d.bytes, tag);
  }

  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) override {
    ZCC_RETURN_IF_ERROR(CheckRoom());
    if (!covered_) return base().SubmitRead(offset, dst, n, tag);
    Sleep();
    const FaultInjectingStorage::Decision d = owner_->DecideRead(n, direct());
    if (d.fail_errno != 0) return Fail(d.fail_errno, "read", offset, tag);
    return base().SubmitRead(offset, dst, d.bytes, tag);
  }

  absl::StatusOr<IoCompletion> WaitForCompletion() override {
    if (!failed_.empty()) {
      IoCompletion c = std::move(failed_.front());
      failed_.pop_front();
      return c;
    }
    return base().WaitForCompletion();
  }

  bool HasCompletion() const override { return !failed_.empty() || base().HasCompletion(); }

  absl::Status Sync() override {
    if (covered_) {
      Sleep();
      if (owner_->SyncFails()) {
        return zcc::ErrnoToStatus(EIO, absl::StrCat("fdatasync ", path(), " (injected fault)"));
      }
    }
    return base().Sync();
  }

  absl::Status Close() override {
    failed_.clear();
    return base().Close();
  }

 private:
  absl::Status CheckRoom() const {
    if (in_flight() >= queue_depth()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path(), ": ", queue_depth(), " requests in flight already"));
    }
    return absl::OkStatus();
  }

  absl::Status Fail(int err, const char* op, uint64_t offset, uint64_t tag) {
    IoCompletion c;
    c.tag = tag;
    c.status = zcc::ErrnoToStatus(
        err, absl::StrCat(op, " ", path(), " at offset ", offset, " (injected fault)"));
    failed_.push_back(std::move(c));
    return absl::OkStatus();
  }

  void Sleep() const {
    const absl::Duration d = owner_->Delay();
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }

  FaultInjectingStorage* const owner_;
  const bool covered_;
  std::deque<IoCompletion> failed_;
};

FaultInjectingStorage::FaultInjectingStorage(Storage* base, FaultPlan plan)
    : StorageWrapper(base), plan_(std::move(plan)) {}

void FaultInjectingStorage::SetPlan(FaultPlan plan) {
  zcc::MutexLock lock(&mu_);
  plan_ = std::move(plan);
  bytes_written_ = writes_ = reads_ = bytes_read_ = faults_ = renames_ = 0;
}

uint64_t FaultInjectingStorage::bytes_written() const {
  zcc::MutexLock lock(&mu_);
  return bytes_written_;
}
uint64_t FaultInjectingStorage::write_requests() const {
  zcc::MutexLock lock(&mu_);
  return writes_;
}
uint64_t FaultInjectingStorage::read_requests() const {
  zcc::MutexLock lock(&mu_);
  return reads_;
}
uint64_t FaultInjectingStorage::bytes_read() const {
  zcc::MutexLock lock(&mu_);
  return bytes_read_;
}
uint64_t FaultInjectingStorage::faults_injected() const {
  zcc::MutexLock lock(&mu_);
  return faults_;
}

bool FaultInjectingStorage::Covers(const std::string& path) const {
  zcc::MutexLock lock(&mu_);
  return plan_.path_filter.empty() || path.find(plan_.path_filter) != std::string::npos;
}

absl::Duration FaultInjectingStorage::Delay() const {
  zcc::MutexLock lock(&mu_);
  return plan_.op_delay;
}

// Limits `n` to `cap` bytes; on direct files to whole blocks, at least one.
static size_t Shorten(size_t n, size_t cap, bool direct) {
  if (cap == 0 || n <= cap) return n;
  if (!direct) return cap;
  const size_t aligned = AlignDown(cap, kDirectIoAlignment);
  return aligned == 0 ? kDirectIoAlignment : aligned;
}

FaultInjectingStorage::Decision FaultInjectingStorage::DecideWrite(size_t n, bool direct) {
  zcc::MutexLock lock(&mu_);
  ++writes_;
  Decision d;
  if (plan_.eio_on_write != 0 && writes_ == plan_.eio_on_write) {
    ++faults_;
    d.fail_errno = EIO;
    return d;
  }
  d.bytes = Shorten(n, plan_.max_write_bytes, direct);
  if (plan_.enospc_after_bytes.has_value()) {
    const uint64_t room =
        *plan_.enospc_after_bytes > bytes_written_ ? *plan_.enospc_after_bytes - bytes_written_ : 0;
    if (d.bytes > room) {
      // The device takes what fits; on a direct file only whole blocks.
      d.bytes = direct ? AlignDown(room, kDirectIoAlignment) : room;
      if (d.bytes == 0) {
        ++faults_;
        d.fail_errno = ENOSPC;
        return d;
      }
    }
  }
  bytes_written_ += d.bytes;
  return d;
}

FaultInjectingStorage::Decision FaultInjectingStorage::DecideRead(size_t n, bool direct) {
  zcc::MutexLock lock(&mu_);
  ++reads_;
  Decision d;
  if (plan_.eio_on_read != 0 && reads_ == plan_.eio_on_read) {
    ++faults_;
    d.fail_errno = EIO;
    return d;
  }
  d.bytes = Shorten(n, plan_.max_read_bytes, direct);
  bytes_read_ += d.bytes;
  return d;
}

bool FaultInjectingStorage::SyncFails() {
  zcc::MutexLock lock(&mu_);
  if (!plan_.fail_sync) return false;
  ++faults_;
  return true;
}

void FaultInjectingStorage::DelayNameOp(const std::string& path) const {
  if (!Covers(path)) return;
  const absl::Duration d = Delay();
  if (d > absl::ZeroDuration()) absl::SleepFor(d);
}

bool FaultInjectingStorage::NameOpFails(const std::string& path, bool sync_dir) {
  if (!Covers(path)) return false;
  DelayNameOp(path);
  zcc::MutexLock lock(&mu_);
  const bool fails = sync_dir ? plan_.fail_sync_dir : ++renames_ == plan_.eio_on_rename;
  if (fails) ++faults_;
  return fails;
}

absl::Status FaultInjectingStorage::SyncDir(const std::string& path) {
  if (NameOpFails(path, /*sync_dir=*/true)) {
    return ErrnoToStatus(EIO, absl::StrCat("fsync directory ", path, " (injected fault)"));
  }
  return base()->SyncDir(path);
}

absl::Status FaultInjectingStorage::Rename(const std::string& from, const std::string& to) {
  if (NameOpFails(to, /*sync_dir=*/false)) {
    return ErrnoToStatus(EIO, absl::StrCat("rename ", from, " to ", to, " (injected fault)"));
  }
  return base()->Rename(from, to);
}

absl::Status FaultInjectingStorage::Exchange(const std::string& a, const std::string& b) {
  if (NameOpFails(b, /*sync_dir=*/false)) {
    return ErrnoToStatus(EIO, absl::StrCat("exchange ", a, " and ", b, " (injected fault)"));
  }
  return base()->Exchange(a, b);
}

absl::Status FaultInjectingStorage::MakeDirs(const std::string& path) {
  DelayNameOp(path);
  return base()->MakeDirs(path);
}

absl::Status FaultInjectingStorage::Remove(const std::string& path) {
  DelayNameOp(path);
  return base()->Remove(path);
}

absl::Status FaultInjectingStorage::RemoveTree(const std::string& path) {
  DelayNameOp(path);
  return base()->RemoveTree(path);
}

absl::StatusOr<FileInfo> FaultInjectingStorage::Stat(const std::string& path) {
  DelayNameOp(path);
  return base()->Stat(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingStorage::List(const std::string& path) {
  DelayNameOp(path);
  return base()->List(path);
}

OpenOptions FaultInjectingStorage::AdjustOpen(const std::string& path, const OpenOptions& options) {
  OpenOptions adjusted = options;
  if (!options.direct) return adjusted;
  zcc::MutexLock lock(&mu_);
  const bool covered =
      plan_.path_filter.empty() || path.find(plan_.path_filter) != std::string::npos;
  if (!covered || !plan_.refuse_direct_io) return adjusted;
  adjusted.direct = false;
  if (!warned_direct_refused_) {
    warned_direct_refused_ = true;
    ZCC_LOG(WARNING)
        << "the file system of " << path
        << " refuses O_DIRECT (injected fault); falling back to buffered I/O + fdatasync";
  }
  return adjusted;
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectingStorage::OpenForWrite(
    const std::string& path, const OpenOptions& options) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> base,
                       base()->OpenForWrite(path, AdjustOpen(path, options)));
  return std::unique_ptr<File>(new FaultInjectingFile(std::move(base), this, Covers(path)));
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectingStorage::OpenForRead(
    const std::string& path, const OpenOptions& options) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> base,
                       base()->OpenForRead(path, AdjustOpen(path, options)));
  return std::unique_ptr<File>(new FaultInjectingFile(std::move(base), this, Covers(path)));
}

absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view spec) {
  FaultPlan plan;
  for (absl::string_view pair : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    pair = absl::StripAsciiWhitespace(pair);
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, '=');
    const absl::string_view key = kv.first;
    const absl::string_view value = kv.second;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage fault plan: '", pair, "': ", why));
    };
    if (pair.find('=') == absl::string_view::npos) return bad("expected key=value");
    uint64_t n = 0;
    const bool numeric = absl::SimpleAtoi(value, &n);
    if (key == "path") {
      plan.path_filter = std::string(value);
      continue;
    }
    if (!numeric) return bad("the value must be a non-negative integer");
    if (key == "enospc_after_bytes") {
      plan.enospc_after_bytes = n;
    } else if (key == "eio_on_write") {
      plan.eio_on_write = n;
    } else if (key == "eio_on_read") {
      plan.eio_on_read = n;
    } else if (key == "max_write_bytes") {
      plan.max_write_bytes = n;
    } else if (key == "max_read_bytes") {
      plan.max_read_bytes = n;
    } else if (key == "fail_sync" || key == "refuse_direct_io" || key == "fail_sync_dir") {
      if (n > 1) return bad("must be 0 or 1");
      (key == "fail_sync" ? plan.fail_sync
                          : key == "fail_sync_dir" ? plan.fail_sync_dir : plan.refuse_direct_io) =
          n == 1;
    } else if (key == "eio_on_rename") {
      plan.eio_on_rename = n;
    } else if (key == "op_delay_ms") {
      if (n > 3'600'000) return bad("at most an hour");
      plan.op_delay = absl::Milliseconds(n);
    } else {
      return bad(
          "unknown key (path, enospc_after_bytes, eio_on_write, eio_on_read, max_write_bytes, "
          "max_read_bytes, fail_sync, refuse_direct_io, op_delay_ms, fail_sync_dir, "
          "eio_on_rename)");
    }
  }
  return plan;
}

std::string DescribeFaultPlan(const FaultPlan& plan) {
  std::string out = absl::StrCat("files matching '", plan.path_filter, "'");
  if (plan.enospc_after_bytes) absl::StrAppend(&out, ", ENOSPC after ", *plan.enospc_after_bytes, " bytes");
  if (plan.eio_on_write) absl::StrAppend(&out, ", EIO on write #", plan.eio_on_write);
  if (plan.eio_on_read) absl::StrAppend(&out, ", EIO on read #", plan.eio_on_read);
  if (plan.max_write_bytes) absl::StrAppend(&out, ", writes cut to ", plan.max_write_bytes, " bytes");
  if (plan.max_read_bytes) absl::StrAppend(&out, ", reads cut to ", plan.max_read_bytes, " bytes");
  if (plan.fail_sync) absl::StrAppend(&out, ", fdatasync fails");
  if (plan.refuse_direct_io) absl::StrAppend(&out, ", O_DIRECT refused");
  if (plan.fail_sync_dir) absl::StrAppend(&out, ", directory fsync fails");
  if (plan.eio_on_rename) absl::StrAppend(&out, ", EIO on rename #", plan.eio_on_rename);
  if (plan.op_delay > absl::ZeroDuration()) {
    absl::StrAppend(&out, ", ", absl::FormatDuration(plan.op_delay), " per request");
  }
  return out;
}

}  // namespace zcc::storage
