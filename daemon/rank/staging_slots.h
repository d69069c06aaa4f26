// StagingSlots: one rank's staging segment as zccd sees it. It owns the
// segment and the slot protocol over it (shm/slot_ring.h), keeps which free
// slot still holds an intact FULL snapshot (what a successor may restore from
// memory), lends free slots to restores from disk, reserves the memory of the
// slots after the first in the background (woken, not polled, when the
// restore that usually follows a registration has read), and signals the
// trainer through the control block (heartbeat, doorbell, close).
//
// Thread-safety: all methods may be called from any thread, except where a
// method says it must come before StartReserving. Ownership: owns the segment
// until TakeSegment hands it to a successor.
#ifndef ZCC_DAEMON_RANK_STAGING_SLOTS_H_
#define ZCC_DAEMON_RANK_STAGING_SLOTS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"

namespace zcc::daemon {

// A FULL snapshot left in a staging slot.
struct SlotSnapshot {
  uint32_t slot = 0;
  int64_t step = -1;
  // The timeline it belongs to (format::RankManifest::timeline), recorded
  // when it is passed on (RankSession::IntactSnapshots): a rank that
  // restores it alone goes on in it.
  std::string timeline;
};

class StagingSlots {
 public:
  StagingSlots(shm::Segment segment, uint32_t num_slots, uint64_t slot_bytes);
  ~StagingSlots();  // StopReserving()
  StagingSlots(const StagingSlots&) = delete;
  StagingSlots& operator=(const StagingSlots&) = delete;

  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* data(uint32_t slot) const { return segment_.slot(slot, slot_bytes_); }
  // Where slot `slot` starts, from the segment's start.
  uint64_t Offset(uint32_t slot) const { return static_cast<uint64_t>(data(slot) - base()); }
  shm::ControlBlock* control() const { return segment_.control(); }
  uint8_t* base() const { return segment_.base(); }
  const std::string& name() const { return segment_.name(); }
  uint64_t segment_bytes() const { return segment_.size(); }
  // Whether the segment was cut short under zccd's mapping (shm::Segment::cut).
  bool cut() const { return segment_.cut(); }

  // ---- ingest ----
  // The slots the trainer published, in publication order (shm::SlotRing).
  std::vector<shm::ReadySlot> Ready(
      std::vector<absl::Status>* bad,
      const std::function<void(uint32_t)>& after_read = nullptr) const;
  // Takes a published slot; its bytes are then the daemon's to read.
  absl::StatusOr<shm::ReadySlot> Take(uint32_t index);
  // Gives a slot back to the trainer.
  void Free(uint32_t index);
  // Records what an ingested slot holds: a FULL snapshot stays intact there
  // until the trainer takes the slot again.
  void NoteIngested(const shm::ReadySlot& slot);
  // The newest FULL snapshot ingested, if any.
  std::optional<SlotSnapshot> NewestFull() const;
  // Claims a free slot that still holds the FULL snapshot of `step` it was
  // ingested with (not a restore read into it since), for a write
  // (shm::SlotRing::ClaimForWrite).
  bool ClaimForWrite(uint32_t index, int64_t step);
  // A restore of `step` replaced the trainer's state: where the newest FULL
  // snapshot ingested is of a later step, NewestFull has none until the
  // next one is ingested.
  void ForgetFullNewerThan(int64_t step) {
    int64_t newest = last_full_step_.load();
    while (newest > step && !last_full_step_.compare_exchange_weak(newest, -1)) {
    }
  }
  uint32_t InUse() const { return ring_.InUse(); }

  // ---- memory tier and restores ----
  // Free slots that still hold the FULL snapshot last ingested into them.
  std::vector<SlotSnapshot> IntactFree() const;
  // Marks slot `slot` as holding snapshot `step` intact (-1: nothing).
  void SetIntact(uint32_t slot, int64_t step) { ingested_full_step_[slot].store(step); }
  // A free slot for a restore from disk to fill (held until ReleaseRestore),
  // or nullopt when the trainer holds them all.
  std::optional<uint32_t> TakeForRestore();
  void ReleaseRestore(uint32_t slot) { Free(slot); }

  // Marks a read of a restore into these slots for as long as it lives: the
  // background reservation of the slots after the first waits meanwhile
  // (the trainer snapshots only after its restore; on a machine with few
  // cores the reservation's kernel work would slow the read).
  class RestoreRead {
   public:
    explicit RestoreRead(StagingSlots& slots);
    ~RestoreRead();
    RestoreRead(const RestoreRead&) = delete;
    RestoreRead& operator=(const RestoreRead&) = delete;

   private:
    StagingSlots& slots_;
  };

  // ---- background reservation ----
  // The slots `slots`, held back (SlotRing::HoldBack), get their memory
  // reserved on a thread of their own by StartReserving and are then freed
  // for the trainer. A slot whose memory cannot be had stays held back and
  // is reported to `on_error`. Call before StartReserving.
  void ReserveInBackground(std::vector<uint32_t> slots,
                           std::function<void(const std::string&)> on_error);
  void StartReserving();
  // Ends the reservation (a slot not yet reserved stays held back) and
  // joins its thread. Idempotent.
  void StopReserving();

  // ---- signals to the trainer ----
  // zccd's heartbeat in the control block (none once the segment is taken).
  void Heartbeat();
  uint64_t ClientHeartbeatNs() const;
  // Wakes the ingest thread waiting on the doorbell.
  void RingDoorbell();
  // Tells the trainer the registration is closed and wakes its waits.
  void Close();

  // Hands the segment over to a successor session (after Stop).
  shm::Segment TakeSegment();

 private:
  void ReserveLoop();

  shm::Segment segment_;
  const uint32_t num_slots_;
  const uint64_t slot_bytes_;
  shm::SlotRing ring_;
  // Per slot, the step of the FULL snapshot last ingested from it (-1: none,
  // or an EMA-only one): with the slot free and still showing that step, the
  // snapshot is intact.
  std::array<std::atomic<int64_t>, shm::kMaxSlots> ingested_full_step_;
  // The newest FULL snapshot ingested and the slot that held it.
  std::atomic<int64_t> last_full_step_{-1};
  std::atomic<uint32_t> last_full_slot_{0};
  // Set once the segment was handed to a successor: the heartbeat leaves it.
  std::atomic<bool> segment_taken_{false};

  // The reserver waits on this for a restore's reads to end (or the stop)
  // before it reserves the slots after the first.
  zcc::Mutex reserve_mu_;
  int restore_reads_ ABSL_GUARDED_BY(reserve_mu_) = 0;
  bool reserver_stop_ ABSL_GUARDED_BY(reserve_mu_) = false;
  // Set before StartReserving.
  std::vector<uint32_t> to_reserve_;
  std::function<void(const std::string&)> on_reserve_error_;
  std::thread reserver_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_STAGING_SLOTS_H_
