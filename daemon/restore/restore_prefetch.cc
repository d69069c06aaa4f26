#include "daemon/restore/restore_prefetch.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "common/log.h"

namespace zcc::daemon {

RestorePrefetch::RestorePrefetch(uint32_t slot, Choose choose, Read read, Finish finish)
    : slot_(slot),
      choose_(std::move(choose)),
      read_(std::move(read)),
      finish_(std::move(finish)),
      start_(absl::Now()),
      thread_([this] { Run(); }) {}

RestorePrefetch::~RestorePrefetch() {
  cancel_.store(true);
  if (thread_.joinable()) thread_.join();
  std::optional<Chosen> chosen;
  bool taken;
  {
    zcc::MutexLock lock(&mu_);
    chosen = chosen_;
    taken = slot_taken_;
  }
  // Without a choice, Run() has finished already.
  if (chosen.has_value() && finish_) finish_(chosen, taken);
}

void RestorePrefetch::Run() {
  absl::StatusOr<std::optional<Chosen>> chosen = absl::CancelledError("not chosen");
  if (!cancel_.load()) chosen = choose_();
  if (!chosen.ok()) {
    ZCC_LOG(WARNING) << "restore prefetch: no step to read ahead: " << chosen.status();
  }
  {
    zcc::MutexLock lock(&mu_);
    chosen_done_ = true;
    if (chosen.ok()) chosen_ = *chosen;
    if (!chosen_.has_value()) {
      read_done_ = true;
      outcome_ = absl::NotFoundError("no step was read ahead");
      read_end_ = absl::Now();
    }
  }
  // Nothing to read: the slot goes back at once, not when a restore or the
  // first snapshot comes.
  if (!chosen.ok() || !chosen->has_value()) {
    if (finish_) finish_(std::nullopt, false);
    return;
  }
  const std::function<bool()> cancelled = [this] { return cancel_.load(); };
  absl::StatusOr<uint64_t> read = read_(**chosen, cancelled);
  zcc::MutexLock lock(&mu_);
  read_done_ = true;
  outcome_ = std::move(read);
  read_end_ = absl::Now();
}

bool RestorePrefetch::AwaitUnlessCancelled(const bool* ready,
                                           const std::function<bool()>& cancelled) {
  // The caller's cancellation (a client that went away) has no wake-up:
  // looked at every 20 ms.
  while (!mu_.AwaitWithTimeout(absl::Condition(ready), absl::Milliseconds(20))) {
    if (cancelled && cancelled()) return false;
  }
  return true;
}

std::optional<RestorePrefetch::Chosen> RestorePrefetch::AwaitChoice(
    const std::function<bool()>& cancelled) {
  zcc::MutexLock lock(&mu_);
  if (!AwaitUnlessCancelled(&chosen_done_, cancelled)) return std::nullopt;
  return chosen_;
}

std::optional<absl::StatusOr<uint64_t>> RestorePrefetch::TakeRead(
    const std::function<bool()>& cancelled) {
  zcc::MutexLock lock(&mu_);
  if (!AwaitUnlessCancelled(&read_done_, cancelled)) return std::nullopt;
  slot_taken_ = true;
  return outcome_;
}

absl::Duration RestorePrefetch::ReadTime() const {
  zcc::MutexLock lock(&mu_);
  return std::min(read_end_, absl::Now()) - start_;
}

}  // namespace zcc::daemon
