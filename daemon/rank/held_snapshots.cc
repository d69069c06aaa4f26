#include "daemon/rank/held_snapshots.h"

#include <utility>

#include "daemon/rank/rank_session.h"

namespace zcc::daemon {

HeldSnapshots::HeldSnapshots(Inheritance inherited) {
  zcc::MutexLock lock(&mu_);
  held_ = std::move(inherited.held);
  if (!held_.empty()) predecessor_ = std::move(inherited.predecessor);
  any_.store(!held_.empty());
}

HeldSnapshots::~HeldSnapshots() = default;

std::vector<SlotSnapshot> HeldSnapshots::List() const {
  zcc::MutexLock lock(&mu_);
  return held_;
}

std::vector<int64_t> HeldSnapshots::Steps() const {
  zcc::MutexLock lock(&mu_);
  std::vector<int64_t> steps;
  for (const SlotSnapshot& s : held_) steps.push_back(s.step);
  return steps;
}

std::optional<uint32_t> HeldSnapshots::Slot(int64_t step) const {
  std::optional<SlotSnapshot> found = Find(step);
  if (!found.has_value()) return std::nullopt;
  return found->slot;
}

std::optional<SlotSnapshot> HeldSnapshots::Find(int64_t step) const {
  zcc::MutexLock lock(&mu_);
  for (const SlotSnapshot& s : held_) {
    if (s.step == step) return s;
  }
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<RankSession>> HeldSnapshots::TakePredecessorForEma() {
  zcc::MutexLock lock(&mu_);
  if (predecessor_ema_taken_) return std::shared_ptr<RankSession>();  // a second restore
  if (predecessor_ == nullptr) {
    return absl::FailedPreconditionError("no snapshot of the previous trainer is held any more");
  }
  predecessor_ema_taken_ = true;
  return predecessor_;
}

std::vector<SlotSnapshot> HeldSnapshots::Release() {
  std::vector<SlotSnapshot> held;
  std::shared_ptr<RankSession> predecessor;  // destroyed here, outside the lock
  {
    zcc::MutexLock lock(&mu_);
    any_.store(false);
    held.swap(held_);
    predecessor.swap(predecessor_);
  }
  return held;
}

}  // namespace zcc::daemon
