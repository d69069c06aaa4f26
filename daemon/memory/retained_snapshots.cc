#include "daemon/memory/retained_snapshots.h"

#include <utility>

namespace zcc::daemon {

std::vector<int64_t> RetainedSnapshots::Keep(uint32_t rank, std::shared_ptr<RankSession> stopped,
                                             absl::Time expires) {
  Entry entry{std::move(stopped), {}, expires};
  entry.snapshots = entry.session->IntactSnapshots();
  std::vector<int64_t> steps;
  for (const SlotSnapshot& s : entry.snapshots) steps.push_back(s.step);
  std::optional<Entry> replaced;  // destroyed outside the lock
  if (steps.empty()) return steps;
  zcc::MutexLock lock(&mu_);
  auto it = entries_.find(rank);
  if (it != entries_.end()) {
    replaced = std::move(it->second);
    it->second = std::move(entry);
  } else {
    entries_.emplace(rank, std::move(entry));
  }
  return steps;
}

std::optional<RetainedSnapshots::Entry> RetainedSnapshots::Take(uint32_t rank) {
  zcc::MutexLock lock(&mu_);
  auto it = entries_.find(rank);
  if (it == entries_.end()) return std::nullopt;
  Entry entry = std::move(it->second);
  entries_.erase(it);
  return entry;
}

size_t RetainedSnapshots::size() const {
  zcc::MutexLock lock(&mu_);
  return entries_.size();
}

std::map<uint32_t, RetainedSnapshots::Entry> RetainedSnapshots::TakeAll() {
  zcc::MutexLock lock(&mu_);
  return std::exchange(entries_, {});
}

size_t RetainedSnapshots::DropExpired(absl::Time now) {
  std::vector<Entry> dropped;
  {
    zcc::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.expires > now) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(it->second));
      it = entries_.erase(it);
    }
  }
  return dropped.size();
}

std::optional<RetainedSnapshots::Entry> RetainedSnapshots::TakeFirstToExpire() {
  zcc::MutexLock lock(&mu_);
  auto first = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (first == entries_.end() || it->second.expires < first->second.expires) first = it;
  }
  if (first == entries_.end()) return std::nullopt;
  Entry entry = std::move(first->second);
  entries_.erase(first);
  return entry;
}

uint64_t RetainedSnapshots::bytes() const {
  zcc::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [rank, entry] : entries_) total += entry.session->budget_bytes();
  return total;
}

bool RetainedSnapshots::empty() const {
  zcc::MutexLock lock(&mu_);
  return entries_.empty();
}

void RetainedSnapshots::FillStatus(v1::JobStatus* out, absl::Time now) const {
  zcc::MutexLock lock(&mu_);
  for (const auto& [rank, entry] : entries_) {
    v1::RetainedStatus* r = out->add_retained();
    r->set_rank(rank);
    for (const SlotSnapshot& s : entry.snapshots) r->add_steps(s.step);
    r->set_bytes(entry.session->budget_bytes());
    r->set_expires_in_seconds(absl::ToDoubleSeconds(entry.expires - now));
  }
}

}  // namespace zcc::daemon
