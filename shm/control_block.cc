#include "shm/control_block.h"

#include <time.h>

#include "absl/strings/str_cat.h"

namespace zcc::shm {

void InitControlBlock(ControlBlock* cb, uint32_t num_slots, uint64_t slot_bytes,
                      uint64_t generation, uint64_t manifest_hash) {
  cb->magic = kMagic;
  cb->version = kLayoutVersion;
  cb->num_slots = num_slots;
  cb->generation = generation;
  cb->slots_offset = ControlBlockBytes();
  cb->slot_bytes = slot_bytes;
  cb->segment_bytes = SegmentBytes(num_slots, slot_bytes);
  cb->manifest_hash = manifest_hash;
  cb->doorbell.store(0);
  cb->free_bell.store(0);
  cb->closed.store(0);
  cb->daemon_heartbeat_ns.store(MonotonicNanos());
  cb->client_heartbeat_ns.store(0);
  cb->snapshots_published.store(0);
  cb->snapshots_skipped.store(0);
  cb->next_seq.store(1);  // 0: a slot never published
  cb->persist_failures.store(0);
  cb->last_failed_step.store(-1);
  cb->restore_bell.store(0);
  cb->restore_waiters.store(0);
  cb->restore_slot.store(0);
  cb->restore_attempt.store(0);
  cb->restore_ready.store(0);
  for (SlotHeader& s : cb->slots) {
    s.state.store(static_cast<uint32_t>(SlotState::kFree));
    s.kind.store(0);
    s.step.store(-1);
    s.seq.store(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
}

absl::Status ValidateGeometry(const ControlBlock& cb, uint32_t num_slots, uint64_t slot_bytes,
                              uint64_t generation) {
  if (cb.magic != kMagic) return absl::DataLossError("staging segment has a bad magic number");
  if (cb.version != kLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "staging segment layout version ", cb.version, ", this client speaks ", kLayoutVersion));
  }
  if (cb.num_slots != num_slots || cb.slot_bytes != slot_bytes || cb.generation != generation ||
      cb.slots_offset != ControlBlockBytes()) {
    return absl::DataLossError(
        "staging segment geometry differs from what the daemon announced at registration");
  }
  return absl::OkStatus();
}

absl::Status ValidateNumSlots(uint32_t num_slots, absl::string_view what) {
  if (num_slots >= kMinSlots && num_slots <= kMaxSlots) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, what.empty() ? "" : " ", "must be in [",
                                                 kMinSlots, ", ", kMaxSlots, "], got ", num_slots));
}

absl::Status ValidateSlotWord(uint32_t state_word) {
  if (state_word >= kNumSlotStates) {
    return absl::DataLossError(absl::StrCat("slot state word ", state_word, " is out of range"));
  }
  return absl::OkStatus();
}

absl::Status ReadSlotContents(const SlotHeader& s, uint32_t index, ReadySlot* out) {
  const int64_t step = s.step.load(std::memory_order_acquire);
  const uint32_t kind = s.kind.load(std::memory_order_acquire);
  if (step < 0) {
    return absl::DataLossError(absl::StrCat("slot ", index, " is ready with negative step ", step));
  }
  if (kind > static_cast<uint32_t>(SnapshotKind::kFull)) {
    return absl::DataLossError(absl::StrCat("slot ", index, " has unknown snapshot kind ", kind));
  }
  out->index = index;
  out->step = step;
  out->kind = static_cast<SnapshotKind>(kind);
  out->seq = s.seq.load(std::memory_order_acquire);
  return absl::OkStatus();
}

absl::Status ReadReadySlot(const ControlBlock& cb, uint32_t index, ReadySlot* out) {
  const SlotHeader& s = cb.slots[index];
  const uint32_t state = s.state.load(std::memory_order_acquire);
  if (absl::Status st = ValidateSlotWord(state); !st.ok()) {
    return absl::DataLossError(absl::StrCat("slot ", index, ": ", st.message()));
  }
  if (state != static_cast<uint32_t>(SlotState::kReady)) {
    return absl::NotFoundError(absl::StrCat("slot ", index, " is not ready"));
  }
  return ReadSlotContents(s, index, out);
}

uint64_t MonotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace zcc::shm
