#include "shm/slot_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/status.h"

namespace zcc::shm {
namespace {

constexpr uint32_t S(SlotState s) { return static_cast<uint32_t>(s); }

}  // namespace

std::optional<SlotRing::Claimed> SlotRing::Claim(bool due, uint32_t save_every) {
  // The free slot whose snapshot is oldest goes first, so the free slots keep
  // the newest snapshots: after a crash zccd can serve any of the last
  // num_slots steps from memory, which lets ranks whose newest differ agree.
  uint32_t tried = 0;  // bit per slot
  for (;;) {
    std::optional<uint32_t> oldest;
    uint64_t oldest_seq = 0;
    for (uint32_t i = 0; i < num_slots_; ++i) {
      const SlotHeader& s = cb_->slots[i];
      if ((tried >> i) & 1 || s.state.load(std::memory_order_relaxed) != S(SlotState::kFree)) {
        continue;
      }
      const uint64_t seq = s.seq.load(std::memory_order_relaxed);
      if (!oldest.has_value() || seq < oldest_seq) {
        oldest = i;
        oldest_seq = seq;
      }
    }
    if (!oldest.has_value()) break;
    tried |= 1u << *oldest;
    uint32_t expected = S(SlotState::kFree);
    if (cb_->slots[*oldest].state.compare_exchange_strong(expected, S(SlotState::kFilling),
                                                          std::memory_order_acq_rel)) {
      ForgetStep(*oldest);
      return Claimed{*oldest, std::nullopt};
    }
  }
  if (!due || save_every == 0) return std::nullopt;
  // The oldest published ordinary snapshot gives way to the due step.
  std::optional<uint32_t> victim;
  uint64_t victim_seq = 0;
  for (uint32_t i = 0; i < num_slots_; ++i) {
    const SlotHeader& s = cb_->slots[i];
    if (s.state.load(std::memory_order_acquire) != S(SlotState::kReady)) continue;
    const int64_t step = s.step.load(std::memory_order_relaxed);
    if (step >= 0 && step % save_every == 0) continue;  // a due step: never dropped
    const uint64_t seq = s.seq.load(std::memory_order_relaxed);
    if (!victim.has_value() || seq < victim_seq) {
      victim = i;
      victim_seq = seq;
    }
  }
  if (!victim.has_value()) return std::nullopt;
  SlotHeader& s = cb_->slots[*victim];
  const int64_t replaced = s.step.load(std::memory_order_relaxed);
  uint32_t expected = S(SlotState::kReady);
  if (!s.state.compare_exchange_strong(expected, S(SlotState::kFilling),
                                       std::memory_order_acq_rel)) {
    return std::nullopt;  // zccd took it meanwhile
  }
  ForgetStep(*victim);
  return Claimed{*victim, replaced};
}

void SlotRing::ForgetStep(uint32_t index) {
  // Its bytes are being overwritten from now on: it holds no step until it
  // is published again. (A copy that fails is abandoned half written: the
  // slot, free again, must not pass for the snapshot it held before, which
  // a write after the trainer died, or a restore from memory, would take.)
  cb_->slots[index].step.store(-1, std::memory_order_release);
}

void SlotRing::Publish(uint32_t index, int64_t step, SnapshotKind kind) {
  SlotHeader& s = cb_->slots[index];
  s.step.store(step, std::memory_order_relaxed);
  s.kind.store(static_cast<uint32_t>(kind), std::memory_order_relaxed);
  s.seq.store(cb_->next_seq.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
  s.state.store(S(SlotState::kReady), std::memory_order_release);
  cb_->doorbell.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&cb_->doorbell);
}

void SlotRing::Abandon(uint32_t index) {
  cb_->slots[index].state.store(S(SlotState::kFree), std::memory_order_release);
}

uint32_t SlotRing::FreeCount() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < num_slots_; ++i) {
    n += cb_->slots[i].state.load(std::memory_order_acquire) == S(SlotState::kFree);
  }
  return n;
}

std::vector<ReadySlot> SlotRing::Ready(std::vector<absl::Status>* bad,
                                       const std::function<void(uint32_t)>& after_read) const {
  std::vector<ReadySlot> ready;
  for (uint32_t i = 0; i < num_slots_; ++i) {
    ReadySlot slot;
    const absl::Status st = ReadReadySlot(*cb_, i, &slot);
    if (st.ok()) {
      ready.push_back(slot);
    } else if (st.code() == absl::StatusCode::kDataLoss && bad != nullptr) {
      bad->push_back(st);
    }
    if (after_read) after_read(i);
  }
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  return ready;
}

absl::StatusOr<ReadySlot> SlotRing::Take(uint32_t index) {
  uint32_t expected = S(SlotState::kReady);
  if (!cb_->slots[index].state.compare_exchange_strong(expected, S(SlotState::kIngesting),
                                                       std::memory_order_acq_rel)) {
    return absl::NotFoundError(absl::StrCat("slot ", index, " is no longer ready"));
  }
  ReadySlot slot;
  ZCC_RETURN_IF_ERROR(ReadSlotContents(cb_->slots[index], index, &slot));
  return slot;
}

void SlotRing::Free(uint32_t index) {
  cb_->slots[index].state.store(S(SlotState::kFree), std::memory_order_release);
  cb_->free_bell.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&cb_->free_bell);
}

bool SlotRing::ClaimForWrite(uint32_t index, int64_t step) {
  SlotHeader& s = cb_->slots[index];
  if (s.step.load(std::memory_order_acquire) != step) return false;
  uint32_t expected = S(SlotState::kFree);
  if (!s.state.compare_exchange_strong(expected, S(SlotState::kIngesting),
                                       std::memory_order_acq_rel)) {
    return false;
  }
  // Claimed: nothing can change it now. A slot reused since (and freed
  // again) holds another step.
  if (s.step.load(std::memory_order_acquire) == step) return true;
  Free(index);
  return false;
}

std::optional<uint32_t> SlotRing::TakeFree() {
  // The client's own claim: free slot, oldest snapshot first.
  std::optional<Claimed> claimed = Claim(/*due=*/false, 0);
  if (!claimed.has_value()) return std::nullopt;
  // kFilling -> kIngesting: a slot zccd holds, like one it ingests.
  cb_->slots[claimed->index].state.store(S(SlotState::kIngesting), std::memory_order_release);
  return claimed->index;
}

void SlotRing::Hold(uint32_t index, int64_t step) {
  SlotHeader& s = cb_->slots[index];
  s.step.store(step, std::memory_order_relaxed);
  s.kind.store(static_cast<uint32_t>(SnapshotKind::kFull), std::memory_order_relaxed);
  s.state.store(S(SlotState::kIngesting), std::memory_order_release);
}

void SlotRing::HoldBack(uint32_t index) {
  SlotHeader& s = cb_->slots[index];
  s.step.store(-1, std::memory_order_relaxed);
  s.state.store(S(SlotState::kIngesting), std::memory_order_release);
}

std::optional<int64_t> SlotRing::FreeSlotStep(uint32_t index) const {
  const SlotHeader& s = cb_->slots[index];
  if (s.state.load(std::memory_order_acquire) != S(SlotState::kFree)) return std::nullopt;
  return s.step.load(std::memory_order_acquire);
}

uint32_t SlotRing::InUse() const { return num_slots_ - FreeCount(); }

}  // namespace zcc::shm
