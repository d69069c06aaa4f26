#include "client/staging_pins.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace zcc::client_internal {

StagingPins::StagingPins(std::shared_ptr<DeviceCopier> copier, uint8_t* base, size_t bytes,
                         std::vector<size_t> cuts)
    : copier_(std::move(copier)) {
  starts_.push_back(base);
  for (size_t cut : cuts) {
    if (cut > 0 && cut < bytes && base + cut > starts_.back()) starts_.push_back(base + cut);
  }
  starts_.push_back(base + bytes);
  thread_ = std::thread([this] { Run(); });
}

StagingPins::~StagingPins() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  zcc::MutexLock lock(&mu_);
  for (size_t i = 0; i < registered_; ++i) {
    const absl::Status st = copier_->UnregisterHostMemory(starts_[i]);
    if (!st.ok()) ZCC_LOG(WARNING) << "zcc client: unregister staging memory: " << st;
  }
}

void StagingPins::Run() {
  const size_t pieces = starts_.size() - 1;
  for (size_t i = 0; i < pieces; ++i) {
    {
      zcc::MutexLock lock(&mu_);
      if (stop_) break;
    }
    // Not under mu_: pinning a slot takes a while, and Await's callers
    // waiting for an earlier piece must not wait for this one.
    const absl::Status st = copier_->RegisterHostMemory(starts_[i], starts_[i + 1] - starts_[i]);
    zcc::MutexLock lock(&mu_);
    if (!st.ok()) {
      failed_ = absl::Status(st.code(), absl::StrCat("pinning staging memory (piece ", i + 1,
                                                     " of ", pieces, "): ", st.message()));
      ZCC_LOG(WARNING) << "zcc client: " << failed_;
      break;
    }
    registered_ = i + 1;
  }
  zcc::MutexLock lock(&mu_);
  finished_ = true;
  if (registered_ == pieces) all_done_.store(true, std::memory_order_release);
}

bool StagingPins::Overlapping(const void* p, size_t n, size_t* last) const {
  const auto* begin = static_cast<const uint8_t*>(p);
  const uint8_t* end = begin + std::max<size_t>(n, 1);
  if (end <= starts_.front() || begin >= starts_.back()) return false;
  // The last piece starting before `end`.
  const auto it = std::lower_bound(starts_.begin(), starts_.end() - 1, end);
  *last = static_cast<size_t>(it - starts_.begin()) - 1;
  return true;
}

absl::Status StagingPins::AwaitPieces(size_t count) const {
  zcc::MutexLock lock(&mu_);
  auto ready = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registered_ >= count || finished_;
  };
  mu_.Await(absl::Condition(&ready));
  if (registered_ >= count) return absl::OkStatus();
  if (!failed_.ok()) return failed_;
  return absl::CancelledError("staging memory was being released before it was pinned");
}

absl::Status StagingPins::Await(const void* p, size_t n) const {
  if (all_done_.load(std::memory_order_acquire)) return absl::OkStatus();
  size_t last = 0;
  if (!Overlapping(p, n, &last)) return absl::OkStatus();
  return AwaitPieces(last + 1);
}

absl::Status StagingPins::AwaitAll() const {
  if (all_done_.load(std::memory_order_acquire)) return absl::OkStatus();
  return AwaitPieces(starts_.size() - 1);
}

}  // namespace zcc::client_internal
