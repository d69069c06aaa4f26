#include "common/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace zcc {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "futex words must be plain 32-bit integers");

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts;
  struct timespec* tsp = nullptr;
  if (timeout != absl::InfiniteDuration()) {
    if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
    ts = absl::ToTimespec(timeout);
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, tsp, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace zcc
