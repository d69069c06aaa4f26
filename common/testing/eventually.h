// Waiting in tests for something another thread or process does, when there
// is nothing to block on: polls `condition` until it holds or `timeout` ends.
#ifndef ZCC_COMMON_TESTING_EVENTUALLY_H_
#define ZCC_COMMON_TESTING_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zcc::testing {

// True as soon as `condition()` is; false if it is still false after `timeout`.
template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout,
                absl::Duration poll = absl::Milliseconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(poll);
  }
  return true;
}

}  // namespace zcc::testing

#endif  // ZCC_COMMON_TESTING_EVENTUALLY_H_
