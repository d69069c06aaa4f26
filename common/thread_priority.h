// Marks the calling thread as background work (in a trainer process the host
// copy thread, the client's notifier and monitor; in zccd the staging slot
// reserver): SCHED_BATCH and nice 10. Such a thread never preempts the
// training thread when it is woken (the training thread wakes it in
// Snapshot), so the trainer's cost stays its own, and it yields the CPU to a
// restore the trainer waits for.
// A hint: failures are ignored.
#ifndef ZCC_COMMON_THREAD_PRIORITY_H_
#define ZCC_COMMON_THREAD_PRIORITY_H_

#include <pthread.h>

namespace zcc {

void MakeThisThreadBackground();

// Marks the calling thread as work for otherwise idle cores (SCHED_IDLE): it
// runs only when no other thread of any priority wants the CPU (zccd's
// tiered upload, which must never slow a trainer down).
void MakeThisThreadIdle();

// Puts `thread` (of this process) back at normal priority (SCHED_OTHER),
// before its owner joins it: an idle thread told to stop might otherwise
// wait long for a CPU on a busy machine, and hold up the join.
void LeaveIdlePriority(pthread_t thread);

// The calling thread at idle priority for this object's life, then back to
// the scheduling it had (a pool thread running one background task).
class IdlePriority {
 public:
  IdlePriority();
  ~IdlePriority();
  IdlePriority(const IdlePriority&) = delete;
  IdlePriority& operator=(const IdlePriority&) = delete;

 private:
  int policy_ = 0;
  int priority_ = 0;
  bool saved_ = false;
};

}  // namespace zcc

#endif  // ZCC_COMMON_THREAD_PRIORITY_H_
