#include "daemon/restore_buffers.h"

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

uint64_t RestoreBuffers::Add(shm::Segment buffer, int64_t step) {
  zcc::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  buffers_.emplace(id, std::make_pair(std::move(buffer), step));
  return id;
}

absl::StatusOr<int64_t> RestoreBuffers::Remove(uint64_t id) {
  std::optional<shm::Segment> segment;  // unmapped and removed on return, outside the lock
  int64_t step = -1;
  {
    zcc::MutexLock lock(&mu_);
    auto it = buffers_.find(id);
    if (it == buffers_.end()) {
      return absl::NotFoundError(absl::StrCat("no restore buffer ", id, " for this rank"));
    }
    step = it->second.second;
    segment.emplace(std::move(it->second.first));
    buffers_.erase(it);
  }
  return step;
}

void RestoreBuffers::Clear() {
  std::map<uint64_t, std::pair<shm::Segment, int64_t>> buffers;
  {
    zcc::MutexLock lock(&mu_);
    buffers.swap(buffers_);
  }
}

}  // namespace zcc::daemon
