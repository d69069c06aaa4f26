// Marks the calling thread as background work (in a trainer process the host
// copy thread, the client's notifier and monitor; in zccd the staging slot
// reserver): SCHED_BATCH and nice 10. Such a thread never preempts the
// training thread when it is woken (the training thread wakes it in
// Snapshot), so the trainer's cost stays its own, and it yields the CPU to a
// restore the trainer waits for.
// A hint: failures are ignored.
#ifndef ZCC_COMMON_THREAD_PRIORITY_H_
#define ZCC_COMMON_THREAD_PRIORITY_H_

namespace zcc {

void MakeThisThreadBackground();

}  // namespace zcc

#endif  // ZCC_COMMON_THREAD_PRIORITY_H_
