#include "daemon/restore/shared_reads.h"

#include <utility>

#include "absl/time/clock.h"

namespace zcc::daemon {

void SharedReads::ExpireLocked(absl::Time now, std::map<std::string, Entry>* dropped) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.state != Entry::State::kReading && now - it->second.at > linger_) {
      dropped->insert(entries_.extract(it++));
    } else {
      ++it;
    }
  }
}

void SharedReads::Expire() {
  std::map<std::string, Entry> dropped;  // unmapped after the lock is released
  zcc::MutexLock lock(&mu_);
  ExpireLocked(absl::Now(), &dropped);
}

bool SharedReads::Claim(const std::string& key) {
  const absl::Time now = absl::Now();
  std::map<std::string, Entry> dropped;  // unmapped after the lock is released
  zcc::MutexLock lock(&mu_);
  ExpireLocked(now, &dropped);
  auto [it, inserted] = entries_.try_emplace(key);
  if (inserted || it->second.state == Entry::State::kFailed) {
    it->second = Entry();
    it->second.at = now;
    return true;
  }
  return false;
}

void SharedReads::Land(const std::string& key, std::shared_ptr<const shm::Segment> holder,
                       const uint8_t* data, uint64_t bytes) {
  zcc::MutexLock lock(&mu_);
  Entry& e = entries_[key];
  e.state = Entry::State::kLanded;
  e.landed = Landed{std::move(holder), data, bytes};
  e.at = absl::Now();
}

void SharedReads::Fail(const std::string& key) {
  zcc::MutexLock lock(&mu_);
  Entry& e = entries_[key];
  e.state = Entry::State::kFailed;
  e.landed = Landed();
  e.at = absl::Now();
}

std::optional<SharedReads::Landed> SharedReads::Await(const std::string& key,
                                                      const std::function<bool()>& cancelled) {
  zcc::MutexLock lock(&mu_);
  while (true) {
    auto it = entries_.find(key);
    // Gone (expired) or failed: the caller reads it.
    if (it == entries_.end() || it->second.state == Entry::State::kFailed) return std::nullopt;
    if (it->second.state == Entry::State::kLanded) return it->second.landed;
    if (cancelled && cancelled()) return std::nullopt;
    auto settled = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto found = entries_.find(key);
      return found == entries_.end() || found->second.state != Entry::State::kReading;
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), absl::Milliseconds(100));
  }
}

}  // namespace zcc::daemon
