#include "shm/restore_progress.h"

#include "common/futex.h"

namespace zcc::shm {

uint64_t BeginRestoreRead(ControlBlock* cb, uint32_t slot) {
  // A reader that sees the new attempt sees this slot and no count of the
  // old attempt (ReadRestoreProgress checks the attempt on both sides).
  cb->restore_ready.store(0, std::memory_order_relaxed);
  cb->restore_slot.store(slot, std::memory_order_relaxed);
  const uint64_t attempt = cb->restore_attempt.fetch_add(1, std::memory_order_acq_rel) + 1;
  cb->restore_bell.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&cb->restore_bell);
  return attempt;
}

void PublishRestoreReady(ControlBlock* cb, uint64_t attempt, uint64_t ready) {
  if (cb->restore_attempt.load(std::memory_order_acquire) != attempt) return;
  cb->restore_ready.store(ready, std::memory_order_release);
  cb->restore_bell.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&cb->restore_bell);
}

RestoreProgress ReadRestoreProgress(const ControlBlock& cb) {
  RestoreProgress p;
  for (;;) {
    p.attempt = cb.restore_attempt.load(std::memory_order_acquire);
    p.slot = cb.restore_slot.load(std::memory_order_acquire);
    p.ready = cb.restore_ready.load(std::memory_order_acquire);
    if (cb.restore_attempt.load(std::memory_order_acquire) == p.attempt) return p;
  }
}

}  // namespace zcc::shm
