#include "daemon/restore/restore_buffers.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace zcc::daemon {

absl::Status RestoreBuffers::CheckRoom() const {
  zcc::MutexLock lock(&mu_);
  if (buffers_.size() >= kMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this rank already holds ", buffers_.size(),
        " restore buffers; release them with RestoreDone before asking for more"));
  }
  return absl::OkStatus();
}

uint64_t RestoreBuffers::Add(std::optional<shm::Segment> buffer, int64_t step,
                             std::function<void()> on_done) {
  zcc::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  buffers_.emplace(id, Buffer{std::move(buffer), step, std::move(on_done)});
  return id;
}

absl::StatusOr<int64_t> RestoreBuffers::Remove(uint64_t id) {
  Buffer buffer;  // unmapped and removed on return, outside the lock
  {
    zcc::MutexLock lock(&mu_);
    auto it = buffers_.find(id);
    if (it == buffers_.end()) {
      return absl::NotFoundError(absl::StrCat("no restore buffer ", id, " for this rank"));
    }
    buffer = std::move(it->second);
    buffers_.erase(it);
  }
  if (buffer.on_done) buffer.on_done();
  return buffer.step;
}

void RestoreBuffers::Clear() {
  std::map<uint64_t, Buffer> buffers;
  {
    zcc::MutexLock lock(&mu_);
    buffers.swap(buffers_);
  }
}

RestoreBuffers::Filling RestoreBuffers::BeingFilled(uint64_t bytes) {
  zcc::MutexLock lock(&mu_);
  filling_bytes_ += bytes;
  return Filling(this, bytes);
}

RestoreBuffers::Filling::~Filling() {
  if (owner_ == nullptr) return;
  zcc::MutexLock lock(&owner_->mu_);
  owner_->filling_bytes_ -= bytes_;
}

uint64_t RestoreBuffers::bytes() const {
  zcc::MutexLock lock(&mu_);
  uint64_t total = filling_bytes_;
  for (const auto& [id, buffer] : buffers_) {
    if (buffer.segment.has_value()) total += buffer.segment->size();
  }
  return total;
}

}  // namespace zcc::daemon
