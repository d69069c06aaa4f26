// The fixed-size records at the start of every staging segment. The daemon
// creates the segment and writes the geometry; the client (trainer process)
// fills slots and publishes them. Everything here is trivially copyable or a
// lock-free atomic, uses offsets (never pointers) and has a fixed size, since
// two processes map it at different addresses.
//
// Trust: the daemon never re-reads geometry from shared memory (it keeps its
// own copy) and validates every slot word it reads (ValidateSlotForIngest), since
// a buggy or hostile client can write anything here.
//
// Slot states change only through shm::SlotRing (shm/slot_ring.h), whose
// header holds the state machine. kRestoreReady is reserved; restores use a
// buffer of their own.
#ifndef ZCC_SHM_CONTROL_BLOCK_H_
#define ZCC_SHM_CONTROL_BLOCK_H_

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zcc::shm {

inline constexpr uint64_t kMagic = 0x316d68735f63637aULL;  // "zcc_shm1" little-endian
inline constexpr uint32_t kLayoutVersion = 3;
inline constexpr uint32_t kMaxSlots = 8;
inline constexpr uint32_t kMinSlots = 2;
inline constexpr uint64_t kPageBytes = 4096;

enum class SlotState : uint32_t {
  kFree = 0,
  kFilling = 1,
  kReady = 2,
  kIngesting = 3,
  kRestoreReady = 4,
};
inline constexpr uint32_t kNumSlotStates = 5;

enum class SnapshotKind : uint32_t {
  kEmaOnly = 0,  // only EMA-eligible parameters were copied
  kFull = 1,     // every registered tensor was copied
};

struct alignas(64) SlotHeader {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> kind;    // SnapshotKind
  std::atomic<int64_t> step;     // valid while kReady / kIngesting / kRestoreReady
  std::atomic<uint64_t> seq;     // publication order, increasing per segment; 0: never published
};

struct alignas(64) ControlBlock {
  // Geometry, written once by the daemon before the client attaches.
  uint64_t magic;
  uint32_t version;
  uint32_t num_slots;
  uint64_t generation;
  uint64_t segment_bytes;
  uint64_t slots_offset;  // from the segment start to slot 0; page aligned
  uint64_t slot_bytes;    // page multiple
  uint64_t manifest_hash;

  // Client -> daemon: incremented after a slot turns kReady (futex word).
  alignas(64) std::atomic<uint32_t> doorbell;
  // Daemon -> client: incremented after a slot turns kFree (futex word).
  alignas(64) std::atomic<uint32_t> free_bell;
  // Daemon -> client: nonzero once the daemon has dropped this registration
  // (unregister, shutdown); also a futex word so a waiting client wakes.
  std::atomic<uint32_t> closed;
  std::atomic<uint64_t> daemon_heartbeat_ns;  // CLOCK_MONOTONIC, by the daemon
  std::atomic<uint64_t> client_heartbeat_ns;  // CLOCK_MONOTONIC, by the client
  std::atomic<uint64_t> snapshots_published;  // counted by the client
  std::atomic<uint64_t> snapshots_skipped;    // counted by the client (no free slot)
  std::atomic<uint64_t> next_seq;             // client's publication counter
  // Daemon -> client: checkpoint writes of this rank that failed, and the
  // step of the newest failure (-1: none), so the trainer hears of a failing
  // checkpoint without asking (Client::Stats, and an error in its log).
  std::atomic<uint64_t> persist_failures;
  std::atomic<int64_t> last_failed_step;

  // Daemon -> client: how far zccd's read of a step into a staging slot has
  // come (shm/restore_progress.h), so that the client copies what is checked
  // while the rest is read. restore_bell is the futex word.
  alignas(64) std::atomic<uint32_t> restore_bell;
  // Client -> daemon: threads sleeping on restore_bell. zccd makes the wake-up
  // system call only when there are some (a rank of 100k small tensors would
  // otherwise pay one per tensor); a waiter that comes late sees the bell
  // moved and does not sleep.
  std::atomic<uint32_t> restore_waiters;
  std::atomic<uint32_t> restore_slot;
  std::atomic<uint64_t> restore_attempt;
  std::atomic<uint64_t> restore_ready;

  SlotHeader slots[kMaxSlots];
};

static_assert(std::is_standard_layout_v<ControlBlock>);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

// OK for a slot count in [kMinSlots, kMaxSlots]; otherwise InvalidArgument
// "<what> must be in [2, 8], got N" (no prefix when `what` is empty). The one check of a slot count, wherever
// it comes from (config file, flags, a registration, zccd's reply).
absl::Status ValidateNumSlots(uint32_t num_slots, absl::string_view what = "num_slots");

// Bytes reserved at the start of the segment for the control block.
constexpr uint64_t ControlBlockBytes() {
  return (sizeof(ControlBlock) + kPageBytes - 1) / kPageBytes * kPageBytes;
}

constexpr uint64_t RoundUpToPage(uint64_t n) { return (n + kPageBytes - 1) / kPageBytes * kPageBytes; }

// The largest slot (64 TiB): beyond any host's memory, and small enough that
// a segment of the most slots, its control block and pull channel cannot
// overflow 64 bits (checked wherever a slot size arrives from outside).
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 46;

// Total segment size for `num_slots` slots of `slot_bytes` (a page multiple).
constexpr uint64_t SegmentBytes(uint32_t num_slots, uint64_t slot_bytes) {
  return ControlBlockBytes() + uint64_t{num_slots} * slot_bytes;
}

// Writes the geometry and zeroes every atomic; called by the daemon on a fresh segment.
void InitControlBlock(ControlBlock* cb, uint32_t num_slots, uint64_t slot_bytes,
                      uint64_t generation, uint64_t manifest_hash);

// Checks the geometry a client sees against what the daemon told it over RPC.
absl::Status ValidateGeometry(const ControlBlock& cb, uint32_t num_slots, uint64_t slot_bytes,
                              uint64_t generation);

// A READY slot as the daemon reads it, after validation.
struct ReadySlot {
  uint32_t index;
  int64_t step;
  SnapshotKind kind;
  uint64_t seq;
};

// What slot `index` holds (step, kind, seq), validated: DataLoss for a
// negative step or an unknown kind. For the slot's current owner.
absl::Status ReadSlotContents(const SlotHeader& slot, uint32_t index, ReadySlot* out);

// Reads slot `index` (< the daemon's own num_slots) as the daemon sees it.
// Returns the slot when it is kReady with sane values; NotFound when it is not
// ready; DataLoss with a description when a word is out of range (unknown state,
// negative step, unknown kind).
absl::Status ValidateSlotWord(uint32_t state_word);
absl::Status ReadReadySlot(const ControlBlock& cb, uint32_t index, ReadySlot* out);

// CLOCK_MONOTONIC in nanoseconds: the heartbeat clock, shared by all processes
// of one machine.
uint64_t MonotonicNanos();

}  // namespace zcc::shm

#endif  // ZCC_SHM_CONTROL_BLOCK_H_
