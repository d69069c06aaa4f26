#include "daemon/rank/staging_slots.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/tsan.h"

namespace zcc::daemon {

StagingSlots::StagingSlots(shm::Segment segment, uint32_t num_slots, uint64_t slot_bytes)
    : segment_(std::move(segment)),
      num_slots_(num_slots),
      slot_bytes_(slot_bytes),
      ring_(segment_.control(), num_slots) {
  for (auto& step : ingested_full_step_) step.store(-1);
}

StagingSlots::~StagingSlots() { StopReserving(); }

std::vector<shm::ReadySlot> StagingSlots::Ready(
    std::vector<absl::Status>* bad, const std::function<void(uint32_t)>& after_read) const {
  return ring_.Ready(bad, after_read);
}

absl::StatusOr<shm::ReadySlot> StagingSlots::Take(uint32_t index) {
  absl::StatusOr<shm::ReadySlot> slot = ring_.Take(index);
  // Daemon-pull: zccd's own copy thread filled the slot (common/tsan.h).
  if (slot.ok()) TsanAcquire(segment_.base());
  return slot;
}

void StagingSlots::Free(uint32_t index) {
  // Daemon-pull: zccd's copy thread may fill the slot next (common/tsan.h).
  TsanRelease(segment_.base());
  ring_.Free(index);
}

void StagingSlots::NoteIngested(const shm::ReadySlot& slot) {
  const bool full = slot.kind == shm::SnapshotKind::kFull;
  ingested_full_step_[slot.index].store(full ? slot.step : -1);
  if (!full) return;
  last_full_slot_.store(slot.index);
  last_full_step_.store(slot.step);
}

bool StagingSlots::ClaimForWrite(uint32_t index, int64_t step) {
  if (index >= num_slots_ || ingested_full_step_[index].load() != step) return false;
  if (!ring_.ClaimForWrite(index, step)) return false;
  // A restore that took the slot in between marked it (TakeForRestore).
  if (ingested_full_step_[index].load() == step) return true;
  Free(index);
  return false;
}

std::optional<SlotSnapshot> StagingSlots::NewestFull() const {
  const int64_t step = last_full_step_.load();
  if (step < 0) return std::nullopt;
  return SlotSnapshot{last_full_slot_.load(), step};
}

std::vector<SlotSnapshot> StagingSlots::IntactFree() const {
  std::vector<SlotSnapshot> intact;
  for (uint32_t i = 0; i < num_slots_; ++i) {
    const int64_t ingested = ingested_full_step_[i].load();
    if (ingested >= 0 && ring_.FreeSlotStep(i) == ingested) intact.push_back({i, ingested});
  }
  return intact;
}

std::optional<uint32_t> StagingSlots::TakeForRestore() {
  std::optional<uint32_t> slot = ring_.TakeFree();
  // What it held is overwritten: no longer a snapshot a successor could use.
  if (slot.has_value()) ingested_full_step_[*slot].store(-1);
  return slot;
}

StagingSlots::RestoreRead::RestoreRead(StagingSlots& slots) : slots_(slots) {
  zcc::MutexLock lock(&slots_.reserve_mu_);
  ++slots_.restore_reads_;
}

StagingSlots::RestoreRead::~RestoreRead() {
  zcc::MutexLock lock(&slots_.reserve_mu_);
  --slots_.restore_reads_;  // the reserver wakes when it reaches 0
}

void StagingSlots::ReserveInBackground(std::vector<uint32_t> slots,
                                       std::function<void(const std::string&)> on_error) {
  to_reserve_ = std::move(slots);
  on_reserve_error_ = std::move(on_error);
}

void StagingSlots::StartReserving() {
  if (to_reserve_.empty()) return;
  reserver_ = std::thread([this] { ReserveLoop(); });
}

void StagingSlots::ReserveLoop() {
  // Background work (SCHED_BATCH, nice 10): with few cores a reservation
  // (~0.1 s of kernel time a GB) must not slow a restore that the trainer
  // is waiting for, which usually follows the registration at once.
  MakeThisThreadBackground();
  for (size_t i = 0; i < to_reserve_.size(); ++i) {
    const uint32_t slot = to_reserve_[i];
    {
      // The first at once: a trainer whose restore holds slot 0 (a read
      // ahead) but who snapshots first needs it. The others after the
      // restore's read (RestoreRead), for at most a few seconds of it: a
      // restore of many GB does not hold the trainer's slots back.
      zcc::MutexLock lock(&reserve_mu_);
      if (i > 0) {
        reserve_mu_.AwaitWithTimeout(
            absl::Condition(
                +[](StagingSlots* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->reserve_mu_) {
                  return s->restore_reads_ == 0 || s->reserver_stop_;
                },
                this),
            absl::Seconds(5));
      }
      if (reserver_stop_) return;
    }
    const absl::Status st = segment_.Reserve(Offset(slot), slot_bytes_);
    if (!st.ok()) {
      if (on_reserve_error_) {
        on_reserve_error_(absl::StrCat("staging slot ", slot, " stays unused: ", st.message()));
      }
      continue;
    }
    Free(slot);
  }
}

void StagingSlots::StopReserving() {
  {
    zcc::MutexLock lock(&reserve_mu_);
    reserver_stop_ = true;  // wakes a reserver waiting for a restore's read
  }
  if (reserver_.joinable()) reserver_.join();
}

void StagingSlots::Heartbeat() {
  if (segment_taken_.load()) return;
  segment_.control()->daemon_heartbeat_ns.store(shm::MonotonicNanos(), std::memory_order_relaxed);
}

uint64_t StagingSlots::ClientHeartbeatNs() const {
  return segment_.control()->client_heartbeat_ns.load(std::memory_order_relaxed);
}

void StagingSlots::RingDoorbell() {
  shm::ControlBlock* cb = segment_.control();
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);
}

void StagingSlots::Close() {
  shm::ControlBlock* cb = segment_.control();
  cb->closed.store(1);
  FutexWakeAll(&cb->closed);
  cb->free_bell.fetch_add(1);
  FutexWakeAll(&cb->free_bell);
}

shm::Segment StagingSlots::TakeSegment() {
  segment_taken_.store(true);
  return std::move(segment_);
}

}  // namespace zcc::daemon
