// Staging memory made ready before a registration asks for it
// (staging_pool_mb). A registration's staging segment is new tmpfs memory:
// the kernel allocates and zeroes every page, and the first restore's direct
// reads then map it into zccd page by page; together about 0.5 s a GB on the
// machines measured, as long as reading a GB from a fast disk. zccd lives
// long, unlike a trainer: a thread of the pool makes segments ahead of time
// (allocated, zeroed, and mapped into zccd's page tables), under names of its
// own ("<name_prefix>.<n>"), and a registration takes one over: renamed,
// chowned and resized to what it needs (shm::Segment::Rename, Resize), its
// memory still zero, as a new segment's is.
//
// The pool fills only within room() (the staging budget left, the free space
// of /dev/shm and the memory the system can spare, reckoned by the caller),
// never within refill_after of a registration taking from it (the restores
// that follow registrations read into memory mapped into zccd, and mapping
// a new entry would stall those reads), and gives memory back when room()
// shrinks below what it holds (Recheck, from the housekeeper's every round)
// or a registration needs the budget (ReleaseDownTo, from JobTable::Admit). Entries are of one size: the
// configured entry size, or else the first slot of the last registration
// that took one (1 GiB until then), which is what the next trainer of that
// job, after a restart, needs at once.
//
// Thread-safety: all methods may be called concurrently.
// Ownership: owns its entries (removed when dropped) and its thread, which
// the destructor stops.
#ifndef ZCC_DAEMON_MEMORY_STAGING_POOL_H_
#define ZCC_DAEMON_MEMORY_STAGING_POOL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "shm/segment.h"

namespace zcc::daemon {

class StagingPool {
 public:
  static constexpr uint64_t kDefaultEntryBytes = uint64_t{1} << 30;

  struct Options {
    std::string name_prefix;   // entries are "<name_prefix>.<n>"
    uint64_t target_bytes = 0;  // 0: no pool
    uint64_t entry_bytes = 0;   // 0: sized by the registrations that take entries
    // The bytes the pool may hold now, given that it holds `pooled`.
    std::function<uint64_t(uint64_t pooled)> room;
    // Called, outside the pool's lock, whenever what the pool holds changes.
    std::function<void(uint64_t pooled)> on_change;
    // After a registration took an entry, the pool makes none for this long:
    // the restores that follow registrations read into memory of zccd's,
    // and making an entry (its mapping) would hold them up.
    absl::Duration refill_after = absl::Seconds(30);
  };

  explicit StagingPool(Options options);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Starts filling (nothing happens without it, or with target_bytes 0).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // For a registration whose segment is `total` bytes, of which the first
  // `now` are needed at once: the entry that covers most of `now` without
  // being larger than `total` (else the smallest one), or nullopt when the
  // pool is empty. Learns `now` as the size of the entries to make next.
  std::optional<shm::Segment> Take(uint64_t now, uint64_t total) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes `pooled` (an entry Take returned) the segment `name`: owned by
  // `owner`, `bytes` long, its first `reserve_bytes` reserved (fast where
  // the entry's memory lies). On an error the entry is gone (removed under
  // whichever name it had).
  static absl::StatusOr<shm::Segment> Adopt(shm::Segment pooled, const std::string& name,
                                            uint64_t bytes, uint64_t reserve_bytes, uid_t owner);

  // A segment as shm::Segment::Create makes it (zero, all reserved), from an
  // entry when the pool has one (a restore buffer's memory), else anew.
  absl::StatusOr<shm::Segment> MakeSegment(const std::string& name, uint64_t bytes, uid_t owner)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Takes entries out until at most `keep` bytes are pooled, the largest
  // first, and returns them: the caller drops them (their memory freed) after
  // its own locks are released.
  std::vector<shm::Segment> ReleaseDownTo(uint64_t keep) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks room() again: gives back what no longer fits (memory pressure, a
  // budget taken by registrations) and fills again where there is room.
  void Recheck() ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes pooled now, ready to be taken.
  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Entries made, and taken by registrations, since the start.
  uint64_t made() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t taken() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Fill() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<shm::Segment> TakeOutDownTo(uint64_t keep) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t BytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The size of the next entry, 0 when the pool is full or has no room.
  uint64_t NextEntryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed();

  const Options options_;

  mutable zcc::Mutex mu_;
  std::vector<shm::Segment> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t entry_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_name_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t made_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped by Recheck and Take: makes the filler ask room() again.
  uint64_t pokes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_take_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::thread filler_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_MEMORY_STAGING_POOL_H_
