// The default zccd socket, shared by the daemon, the client and zccctl so
// that all three always agree.
#ifndef ZCC_COMMON_DEFAULT_PATHS_H_
#define ZCC_COMMON_DEFAULT_PATHS_H_

#include <string>

namespace zcc {

// /run/zcc/zccd.sock for root; $XDG_RUNTIME_DIR/zcc/zccd.sock or
// /tmp/zcc-<uid>/zccd.sock otherwise.
std::string DefaultSocketPath();

}  // namespace zcc

#endif  // ZCC_COMMON_DEFAULT_PATHS_H_
