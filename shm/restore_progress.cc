#include "shm/restore_progress.h"

#include "common/futex.h"
#include "common/mutex.h"

namespace zcc::shm {
namespace {

// zccd's reads of restores into a segment: a read's progress (its check of
// the attempt, then its count) never lands after another read's beginning.
// Two reads of one rank may overlap (a restore asked again while the first
// is still being cancelled); the old one's count under the new attempt
// would have the client copy tensors out of the new slot before they were
// read and checked. One lock for every segment: each holds it for a few
// stores.
zcc::Mutex& ProgressMu() {
  static zcc::Mutex mu;
  return mu;
}

}  // namespace

uint64_t BeginRestoreRead(ControlBlock* cb, uint32_t slot) {
  // A reader that sees the new attempt sees this slot and no count of the
  // old attempt (ReadRestoreProgress checks the attempt on both sides).
  uint64_t attempt;
  {
    zcc::MutexLock lock(&ProgressMu());
    cb->restore_ready.store(0, std::memory_order_relaxed);
    cb->restore_slot.store(slot, std::memory_order_relaxed);
    attempt = cb->restore_attempt.fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  WakeRestoreWaiters(cb);
  return attempt;
}

void WakeRestoreWaiters(ControlBlock* cb) {
  // Sequentially consistent with the waiter's count and its read of the bell
  // (WaitForRestoreProgress): either it sees the bell moved, or this sees it
  // waiting.
  cb->restore_bell.fetch_add(1, std::memory_order_seq_cst);
  if (cb->restore_waiters.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&cb->restore_bell);
}

void WaitForRestoreProgress(ControlBlock* cb, uint32_t seen) {
  cb->restore_waiters.fetch_add(1, std::memory_order_seq_cst);
  if (cb->restore_bell.load(std::memory_order_seq_cst) == seen) {
    FutexWait(&cb->restore_bell, seen, absl::InfiniteDuration());
  }
  cb->restore_waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void PublishRestoreReady(ControlBlock* cb, uint64_t attempt, uint64_t ready) {
  {
    zcc::MutexLock lock(&ProgressMu());
    if (cb->restore_attempt.load(std::memory_order_acquire) != attempt) return;
    cb->restore_ready.store(ready, std::memory_order_release);
  }
  WakeRestoreWaiters(cb);
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
