#include "daemon/memory/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_priority.h"

namespace zcc::daemon {

namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

uint64_t RoundUp(uint64_t bytes, uint64_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

StagingPool::StagingPool(Options options)
    : options_(std::move(options)),
      entry_bytes_(options_.entry_bytes > 0 ? options_.entry_bytes : kDefaultEntryBytes) {}

StagingPool::~StagingPool() {
  {
    zcc::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (filler_.joinable()) {
    LeaveIdlePriority(filler_.native_handle());  // so that it sees the stop soon
    filler_.join();
  }
}

void StagingPool::Start() {
  if (options_.target_bytes == 0) return;
  zcc::MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  ++pokes_;
  filler_ = std::thread([this] { Fill(); });
}

uint64_t StagingPool::BytesLocked() const {
  uint64_t bytes = 0;
  for (const shm::Segment& e : entries_) bytes += e.size();
  return bytes;
}

uint64_t StagingPool::bytes() const {
  zcc::MutexLock lock(&mu_);
  return BytesLocked();
}

uint64_t StagingPool::made() const {
  zcc::MutexLock lock(&mu_);
  return made_;
}

uint64_t StagingPool::taken() const {
  zcc::MutexLock lock(&mu_);
  return taken_;
}

void StagingPool::Changed() {
  if (options_.on_change) options_.on_change(bytes());
}

std::optional<shm::Segment> StagingPool::Take(uint64_t now, uint64_t total) {
  std::optional<shm::Segment> taken;
  {
    zcc::MutexLock lock(&mu_);
    if (options_.entry_bytes == 0 && now > 0) {
      entry_bytes_ = std::min(RoundUp(now, kHugePage), options_.target_bytes);
    }
    // The largest entry that fits in the segment; else the smallest (the
    // segment shrinks it).
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const bool fits = it->size() <= total;
      if (best == entries_.end()) {
        best = it;
      } else if (fits != (best->size() <= total)) {
        if (fits) best = it;
      } else if (fits ? it->size() > best->size() : it->size() < best->size()) {
        best = it;
      }
    }
    if (best == entries_.end()) return std::nullopt;
    taken.emplace(std::move(*best));
    entries_.erase(best);
    ++taken_;
    last_take_ = absl::Now();
  }
  Changed();
  return taken;
}

absl::StatusOr<shm::Segment> StagingPool::Adopt(shm::Segment pooled, const std::string& name,
                                                 uint64_t bytes, uint64_t reserve_bytes,
                                                 uid_t owner) {
  ZCC_RETURN_IF_ERROR(pooled.Rename(name, owner));
  ZCC_RETURN_IF_ERROR(pooled.Resize(bytes, reserve_bytes));
  return pooled;
}

absl::StatusOr<shm::Segment> StagingPool::MakeSegment(const std::string& name, uint64_t bytes,
                                                      uid_t owner) {
  if (std::optional<shm::Segment> pooled = Take(0, bytes); pooled.has_value()) {
    absl::StatusOr<shm::Segment> adopted = Adopt(*std::move(pooled), name, bytes, bytes, owner);
    if (adopted.ok()) return adopted;
    ZCC_LOG(WARNING) << name << ": the staging pool's memory could not be used ("
                     << adopted.status() << "); making it anew";
  }
  return shm::Segment::Create(name, bytes, owner);
}

std::vector<shm::Segment> StagingPool::TakeOutDownTo(uint64_t keep) {
  std::vector<shm::Segment> out;
  zcc::MutexLock lock(&mu_);
  std::sort(entries_.begin(), entries_.end(),
            [](const shm::Segment& a, const shm::Segment& b) { return a.size() < b.size(); });
  uint64_t bytes = BytesLocked();
  while (bytes > keep && !entries_.empty()) {
    bytes -= entries_.back().size();
    out.push_back(std::move(entries_.back()));
    entries_.pop_back();
  }
  return out;
}

std::vector<shm::Segment> StagingPool::ReleaseDownTo(uint64_t keep) {
  std::vector<shm::Segment> released = TakeOutDownTo(keep);
  if (!released.empty()) Changed();
  return released;
}

void StagingPool::Recheck() {
  zcc::MutexLock lock(&mu_);
  ++pokes_;
}

uint64_t StagingPool::NextEntryLocked() {
  const uint64_t pooled = BytesLocked();
  if (pooled >= options_.target_bytes) return 0;
  return std::min(entry_bytes_, options_.target_bytes - pooled);
}

void StagingPool::Fill() {
  // Making memory ready is never more urgent than a trainer or a write.
  MakeThisThreadIdle();
  uint64_t seen = 0;
  for (;;) {
    uint64_t pooled = 0;
    uint64_t next = 0;
    bool refill = false;
    std::string name;
    {
      zcc::MutexLock lock(&mu_);
      auto poked = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || pokes_ != seen;
      };
      mu_.Await(absl::Condition(&poked));
      if (stopping_) return;
      seen = pokes_;
      pooled = BytesLocked();
      next = NextEntryLocked();
      refill = absl::Now() - last_take_ >= options_.refill_after;
    }
    // room() outside the lock: it may take others (the job table's, which
    // is held while a registration takes an entry).
    const uint64_t room = options_.room(pooled);
    if (pooled > room) {
      const size_t released = TakeOutDownTo(room).size();  // freed here, outside the lock
      ZCC_LOG(INFO) << "staging pool: gave back " << released
                    << " entr(ies) to the system or the staging budget (" << room / 1e9
                    << " GB allowed now)";
      Changed();
      continue;
    }
    // Not yet after a take: the next Recheck asks again.
    if (next == 0 || pooled + next > room || !refill) continue;
    {
      zcc::MutexLock lock(&mu_);
      name = absl::StrCat(options_.name_prefix, ".", next_name_++);
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<shm::Segment> entry = shm::Segment::Create(name, next);
    if (entry.ok()) {
      if (absl::Status st = entry->Populate(0, next); !st.ok() && !absl::IsUnimplemented(st)) {
        entry = st;
      }
    }
    if (!entry.ok()) {
      // Not fatal: registrations make their own memory. Tried again at the
      // next Recheck; at once under the next name when this one was taken.
      ZCC_LOG(WARNING) << "staging pool: could not make " << next << " bytes ready: "
                       << entry.status();
      if (absl::IsAlreadyExists(entry.status())) {
        zcc::MutexLock lock(&mu_);
        ++pokes_;
      }
      continue;
    }
    {
      zcc::MutexLock lock(&mu_);
      if (stopping_) return;
      entries_.push_back(*std::move(entry));
      ++made_;
      ++pokes_;  // the next one, if there is room
      pooled = BytesLocked();
    }
    ZCC_LOG(DEBUG) << "staging pool: " << name << " ready (" << next / 1e9 << " GB in "
                   << absl::ToDoubleSeconds(absl::Now() - start) << " s)";
    if (pooled >= options_.target_bytes) {
      ZCC_LOG(INFO) << "staging pool: " << pooled / 1e9 << " GB of staging memory ready";
    }
    Changed();
  }
}

}  // namespace zcc::daemon
