// A staging segment: one Boost.Interprocess shared-memory object per registered
// rank, holding the control block and the staging slots. Move-only RAII handle:
// the mapping is unmapped on destruction, and the segment name is removed only
// by the handle that created it (the daemon). Boost.Interprocess exceptions are
// converted to absl::Status here and nowhere else.
#ifndef ZCC_SHM_SEGMENT_H_
#define ZCC_SHM_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shm/control_block.h"

namespace zcc::shm {

class Segment {
 public:
  // Creates `name` exclusively with mode 0600, sizes it to `bytes` and maps it.
  // When `owner_uid` is not -1 the object is chowned to it (the daemon runs as
  // root and the trainer as a user). The new memory is zero. Its first
  // `reserve_bytes` (all by default) are reserved now (allocated, so that a
  // full /dev/shm fails here and not with SIGBUS in the trainer); the rest
  // must be reserved with Reserve() before anyone writes there, and must fit
  // in /dev/shm's free space now (ResourceExhausted otherwise).
  static absl::StatusOr<Segment> Create(const std::string& name, uint64_t bytes,
                                        uid_t owner_uid = static_cast<uid_t>(-1),
                                        uint64_t reserve_bytes = ~uint64_t{0});

  // Reserves [offset, offset + bytes) of a segment this handle created (or
  // opened): ResourceExhausted when /dev/shm is full. Fast for memory
  // already reserved. Thread-safe.
  absl::Status Reserve(uint64_t offset, uint64_t bytes) const;

  // Maps an existing segment read-write; fails unless its size is exactly
  // `expected_bytes`. Never removes the name.
  static absl::StatusOr<Segment> Open(const std::string& name, uint64_t expected_bytes);

  // Makes the first `bytes` of the mapping present in this process's page
  // tables, allocating (zeroing) what is not reserved yet, so that nothing
  // after it stops at a page fault there: a direct read into the memory, a
  // copy. Unimplemented on a kernel without MADV_POPULATE_WRITE
  // (before 5.14), where it does nothing. Writes no byte.
  absl::Status Populate(uint64_t offset, uint64_t bytes) const;

  // Gives a segment this handle created a new name and owner (the pool's
  // memory handed to a registration): AlreadyExists when `new_name` is
  // taken. The mapping and the memory are kept.
  absl::Status Rename(const std::string& new_name, uid_t owner_uid);

  // Changes the size of a segment this handle created to `bytes`, keeping
  // what the mapping already holds (and its page tables), and reserves its
  // first `reserve_bytes` as Create does (fast where reserved already); the
  // rest must fit in /dev/shm's free space now.
  absl::Status Resize(uint64_t bytes, uint64_t reserve_bytes);

  // Removes the shared-memory object `name` (stale segments after a daemon
  // crash): NotFound when there is none, the kernel's reason when it cannot
  // be removed (another uid's object in a sticky /dev/shm, say).
  static absl::Status Remove(const std::string& name);

  // Names of existing shared-memory objects that start with `prefix` (from /dev/shm).
  static std::vector<std::string> ListWithPrefix(const std::string& prefix);

  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  ~Segment();

  const std::string& name() const;
  uint8_t* base() const;
  uint64_t size() const;
  ControlBlock* control() const { return reinterpret_cast<ControlBlock*>(base()); }
  // Whether another process cut the object short under this mapping (an
  // ftruncate): it is shorter than the mapping now, or an access here found
  // it so, after which the mapping holds zeros (shm/truncation_guard.h;
  // without the guard such an access ends the process). One fstat.
  bool cut() const;
  // Start of slot `i` given the slot size the caller trusts (never read from shm).
  uint8_t* slot(uint32_t i, uint64_t slot_bytes) const {
    return base() + ControlBlockBytes() + uint64_t{i} * slot_bytes;
  }

 private:
  struct Impl;
  explicit Segment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc::shm

#endif  // ZCC_SHM_SEGMENT_H_
