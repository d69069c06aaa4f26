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

}  // namespace zcc
