#include "daemon/restore/step_checks.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/log.h"
#include "common/status.h"

namespace zcc::daemon {

StepChecks::Entry& StepChecks::AwaitIdle(const StepKey& key) {
  struct Idle {
    const std::map<StepKey, Entry>* entries;
    const StepKey* key;
    bool operator()() const {
      auto it = entries->find(*key);
      return it == entries->end() || !it->second.busy;
    }
  };
  Idle idle{&entries_, &key};
  mu_.Await(absl::Condition(&idle));
  return entries_[key];
}

void StepChecks::KeepIndex(const StepKey& key,
                           std::shared_ptr<const checkpoint::GroupedIndex> index) {
  entries_[key].index = std::move(index);
  indexed_.erase(std::remove(indexed_.begin(), indexed_.end(), key), indexed_.end());
  indexed_.push_back(key);
  while (indexed_.size() > kCachedIndexes) {
    auto it = entries_.find(indexed_.front());
    if (it != entries_.end()) it->second.index.reset();
    indexed_.pop_front();
  }
}

void StepChecks::Trim() {
  if (entries_.size() <= kCachedSteps) return;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const bool held = std::find(indexed_.begin(), indexed_.end(), it->first) != indexed_.end();
    it = it->second.busy || held ? std::next(it) : entries_.erase(it);
  }
}

absl::Status StepChecks::Check(const std::string& step_dir) {
  auto record = checkpoint::ReadCommitRecord(step_dir, io_.storage);
  if (!record.ok()) return record.status();
  const StepKey key(step_dir, record->manifest_hash);
  {
    zcc::MutexLock lock(&mu_);
    Entry& entry = AwaitIdle(key);
    if (entry.verdict.has_value()) return *entry.verdict;
    entry.busy = true;
  }
  const absl::Time start = absl::Now();
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  // No tensor data: the restore checks each piece's checksum as it reads it.
  const absl::Status status =
      checkpoint::CheckStepMetadata(step_dir, io_, &grouped);
  if (status.ok()) {
    ZCC_LOG(INFO) << "checked the metadata of " << step_dir << " in "
                  << absl::FormatDuration(absl::Now() - start);
  } else {
    metrics_->errors(metrics::ErrorKind::kVerify).Increment();
    ZCC_LOG(ERROR) << "checkpoint " << step_dir << " failed its metadata check: "
                   << status.message();
  }
  zcc::MutexLock lock(&mu_);
  Entry& entry = entries_[key];
  entry.busy = false;
  // A read may have found the step damaged meanwhile: that stands.
  if (!entry.verdict.has_value()) entry.verdict = status;
  if (status.ok()) KeepIndex(key, std::move(grouped));
  const absl::Status verdict = *entries_[key].verdict;
  Trim();
  return verdict;
}

absl::StatusOr<std::shared_ptr<const checkpoint::GroupedIndex>> StepChecks::Index(
    const std::string& step_dir) {
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, checkpoint::ReadCommitRecord(step_dir, io_.storage));
  const StepKey key(step_dir, record.manifest_hash);
  {
    zcc::MutexLock lock(&mu_);
    Entry& entry = AwaitIdle(key);
    if (entry.index != nullptr) return entry.index;
    entry.busy = true;
  }
  absl::StatusOr<std::shared_ptr<const checkpoint::GroupedIndex>> index =
      checkpoint::LoadGroupedIndex(step_dir, io_.storage);
  zcc::MutexLock lock(&mu_);
  entries_[key].busy = false;
  if (index.ok()) KeepIndex(key, *index);
  Trim();
  return index;
}

void StepChecks::MarkDamaged(const std::string& step_dir, uint64_t manifest_hash,
                             const absl::Status& why) {
  metrics_->errors(metrics::ErrorKind::kVerify).Increment();
  zcc::MutexLock lock(&mu_);
  entries_[StepKey(step_dir, manifest_hash)].verdict = why;
  Trim();
}

void StepChecks::Forget(const std::string& step_dir) {
  zcc::MutexLock lock(&mu_);
  for (auto it = entries_.lower_bound(StepKey(step_dir, 0));
       it != entries_.end() && it->first.first == step_dir;) {
    if (it->second.busy) {
      ++it;
      continue;
    }
    indexed_.erase(std::remove(indexed_.begin(), indexed_.end(), it->first), indexed_.end());
    it = entries_.erase(it);
  }
}

}  // namespace zcc::daemon
