// Futex wait/wake on a 32-bit atomic that may live in shared memory mapped by
// several processes (no FUTEX_PRIVATE_FLAG). This is the interprocess wake-up
// primitive between the client and zccd: a waiter sleeps in the kernel until
// the word changes, no polling.
#ifndef ZCC_COMMON_FUTEX_H_
#define ZCC_COMMON_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace zcc {

// Sleeps while `*word == expected`, at most `timeout` (absl::InfiniteDuration()
// for no limit). Returns on a wake-up, a value change, a signal or the timeout;
// callers re-check their condition in a loop.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// Wakes every waiter on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace zcc

#endif  // ZCC_COMMON_FUTEX_H_
