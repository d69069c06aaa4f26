// Who is calling a control or status RPC: the connection's SO_PEERCRED, as
// the kernel reported it when zccd accepted the connection.
#ifndef ZCC_DAEMON_CONTROL_CALLER_H_
#define ZCC_DAEMON_CONTROL_CALLER_H_

#include <sys/types.h>

namespace zcc::daemon {

struct Caller {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_CALLER_H_
