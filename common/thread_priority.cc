#include "common/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace zcc {

void MakeThisThreadBackground() {
  struct sched_param param = {};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  // On Linux, setpriority on a thread id sets that thread's nice value only.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
}

IdlePriority::IdlePriority() {
  struct sched_param param = {};
  saved_ = pthread_getschedparam(pthread_self(), &policy_, &param) == 0;
  priority_ = param.sched_priority;
  MakeThisThreadIdle();
}

IdlePriority::~IdlePriority() {
  if (!saved_) return;
  struct sched_param param = {};
  param.sched_priority = priority_;
  (void)pthread_setschedparam(pthread_self(), policy_, &param);
}

void MakeThisThreadIdle() {
  struct sched_param param = {};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
}

void LeaveIdlePriority(pthread_t thread) {
  struct sched_param param = {};
  (void)pthread_setschedparam(thread, SCHED_OTHER, &param);
}

}  // namespace zcc
