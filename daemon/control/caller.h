// Who is calling a control or status RPC: the connection's SO_PEERCRED, as
// the kernel reported it when zccd accepted the connection; and how long the
// caller waits for the answer.
#ifndef ZCC_DAEMON_CONTROL_CALLER_H_
#define ZCC_DAEMON_CONTROL_CALLER_H_

#include <sys/types.h>

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zcc::daemon {

struct Caller {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

// How long the caller of a request waits for its answer.
struct CallerWait {
  // Whether the caller stopped waiting (it cancelled, or its deadline
  // passed). Null: it waits as long as the work takes.
  std::function<bool()> gone;
  // When the answer is due: the caller's deadline less the time the reply
  // takes. Work that waits on something else answers by then that it still
  // waits, instead of being cut off without a reason.
  absl::Time answer_by = absl::InfiniteFuture();
  // When the request arrived.
  absl::Time began = absl::Now();

  bool Gone() const { return gone != nullptr && gone(); }
  bool AnswerDue() const { return Gone() || absl::Now() >= answer_by; }
  // Whether half the time to answer has passed (never without a deadline).
  bool PastHalfway() const {
    return answer_by != absl::InfiniteFuture() && absl::Now() > began + (answer_by - began) / 2;
  }
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_CALLER_H_
