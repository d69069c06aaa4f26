// A loopback TCP port for a test's listener: the one the kernel picked for a
// socket bound to port 0 and closed again (another process could take it in
// between; tests that use it retry nothing and accept that small risk).
#ifndef ZCC_COMMON_TESTING_FREE_PORT_H_
#define ZCC_COMMON_TESTING_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace zcc::testing {

inline int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace zcc::testing

#endif  // ZCC_COMMON_TESTING_FREE_PORT_H_
