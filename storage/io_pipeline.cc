#include "storage/io_pipeline.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc::storage {

IoPipeline::IoPipeline(File* file) : file_(file) {}

IoPipeline::~IoPipeline() {
  // Errors no longer matter here; the buffers do.
  while (file_->in_flight() > 0) {
    if (!file_->WaitForCompletion().ok()) break;
  }
}

absl::Status IoPipeline::SubmitWrite(uint64_t offset, const void* src, size_t n) {
  return Submit(true, offset, static_cast<uint8_t*>(const_cast<void*>(src)), n);
}

absl::Status IoPipeline::SubmitRead(uint64_t offset, void* dst, size_t n) {
  return Submit(false, offset, static_cast<uint8_t*>(dst), n);
}

absl::Status IoPipeline::Submit(bool write, uint64_t offset, uint8_t* buf, size_t n) {
  if (full()) return absl::FailedPreconditionError(absl::StrCat(file_->path(), ": pipeline full"));
  Request r;
  r.write = write;
  r.offset = offset;
  r.buf = buf;
  r.n = n;
  const uint64_t id = first_id_ + pending_.size();
  if (n == 0) {
    r.complete = true;
  } else {
    ZCC_RETURN_IF_ERROR(write ? file_->SubmitWrite(offset, buf, n, id)
                              : file_->SubmitRead(offset, buf, n, id));
  }
  pending_.push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status IoPipeline::Advance() {
  ZCC_ASSIGN_OR_RETURN(IoCompletion c, file_->WaitForCompletion());
  if (c.tag < first_id_ || c.tag >= first_id_ + pending_.size()) {
    return absl::InternalError(
        absl::StrCat(file_->path(), ": completion for unknown request ", c.tag));
  }
  Request& r = pending_[c.tag - first_id_];
  if (!c.status.ok()) {
    r.status = std::move(c.status);
    r.complete = true;
    return absl::OkStatus();
  }
  const size_t got = c.bytes;
  r.done += got;
  if (r.done >= r.n) {
    r.complete = true;
    return absl::OkStatus();
  }
  if (got == 0) {
    if (r.write) {
      r.status = absl::InternalError(
          absl::StrCat("write ", file_->path(), " at offset ", r.offset + r.done, ": no progress"));
    }
    r.complete = true;  // a read at end of file
    return absl::OkStatus();
  }
  // A direct read that stops off the alignment grid has reached the end of
  // the file (and could not be continued there anyway).
  if (!r.write && file_->direct() && (r.offset + r.done) % kDirectIoAlignment != 0) {
    r.complete = true;
    return absl::OkStatus();
  }
  const uint64_t offset = r.offset + r.done;
  uint8_t* buf = r.buf + r.done;
  const size_t rest = r.n - r.done;
  absl::Status st = r.write ? file_->SubmitWrite(offset, buf, rest, c.tag)
                            : file_->SubmitRead(offset, buf, rest, c.tag);
  if (!st.ok()) {
    r.status = std::move(st);
    r.complete = true;
  }
  return absl::OkStatus();
}

bool IoPipeline::OldestDone() {
  if (pending_.empty()) return false;
  while (!pending_.front().complete && file_->HasCompletion()) {
    if (!Advance().ok()) return true;  // RetireOldest reports the failure
  }
  return pending_.front().complete;
}

absl::StatusOr<size_t> IoPipeline::RetireOldest() {
  if (pending_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(file_->path(), ": nothing to retire"));
  }
  while (!pending_.front().complete) ZCC_RETURN_IF_ERROR(Advance());
  Request r = std::move(pending_.front());
  pending_.pop_front();
  ++first_id_;
  if (!r.status.ok()) return r.status;
  return r.done;
}

absl::Status IoPipeline::Finish() {
  absl::Status first;
  while (!pending_.empty()) {
    const size_t before = pending_.size();
    absl::StatusOr<size_t> r = RetireOldest();
    if (!r.ok() && first.ok()) first = r.status();
    if (pending_.size() == before) break;  // the file failed; nothing more will complete
  }
  return first;
}

absl::Status WriteAt(File& file, uint64_t offset, const void* src, size_t n) {
  IoPipeline pipe(&file);
  ZCC_RETURN_IF_ERROR(pipe.SubmitWrite(offset, src, n));
  return pipe.RetireOldest().status();
}

absl::StatusOr<size_t> ReadAt(File& file, uint64_t offset, void* dst, size_t n) {
  IoPipeline pipe(&file);
  ZCC_RETURN_IF_ERROR(pipe.SubmitRead(offset, dst, n));
  return pipe.RetireOldest();
}

}  // namespace zcc::storage
