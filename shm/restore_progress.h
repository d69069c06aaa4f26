// How far zccd's read of a committed step into a staging slot has come: the
// registered tensors, in registration order, whose bytes in the slot are read
// and checked against their checksums. A client whose Restore marks some
// tensors for an early copy (Client::Restore, RestoreOptions::early_copy)
// copies each of them as soon as it is checked, while zccd reads the rest,
// instead of after the whole step.
//
// zccd publishes, one read at a time per segment: BeginRestoreRead names the
// slot and starts an attempt (a number that only grows), PublishRestoreReady
// raises the count of checked tensors. A client reads the three words with
// ReadRestoreProgress, which retries until they belong to one attempt, and
// sleeps on restore_bell (a futex word zccd increments on every change).
// A client sleeps through WaitForRestoreProgress, which zccd's publications
// wake. Restore's reply names the attempt it was served from: a client that copied
// from another (a read ahead that was dropped, a step that turned out
// damaged) copies everything again from what the reply names.
//
// Trust: zccd never reads these words back; a client that writes them only
// misleads itself.
#ifndef ZCC_SHM_RESTORE_PROGRESS_H_
#define ZCC_SHM_RESTORE_PROGRESS_H_

#include <cstdint>

#include "shm/control_block.h"

namespace zcc::shm {

struct RestoreProgress {
  uint64_t attempt = 0;  // 0: no read published yet
  uint32_t slot = 0;
  uint64_t ready = 0;    // registered tensors [0, ready) checked in `slot`
};

// zccd: a read into `slot` begins; returns its attempt number.
uint64_t BeginRestoreRead(ControlBlock* cb, uint32_t slot);
// zccd: the first `ready` registered tensors of `attempt` are checked
// (ignored once another attempt began).
void PublishRestoreReady(ControlBlock* cb, uint64_t attempt, uint64_t ready);
// The client: the progress of the newest attempt, consistent.
RestoreProgress ReadRestoreProgress(const ControlBlock& cb);
// The client: sleeps until restore_bell is no longer `seen` (a publication,
// or WakeRestoreWaiters).
void WaitForRestoreProgress(ControlBlock* cb, uint32_t seen);
// Moves the bell and wakes every sleeper (the client stopping its own waiter).
void WakeRestoreWaiters(ControlBlock* cb);

}  // namespace zcc::shm

#endif  // ZCC_SHM_RESTORE_PROGRESS_H_
