#include "bench/peer/tcp_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace zcc::bench {

double TcpSeconds(const std::string& bytes, int pieces) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("tcp reference");
    std::exit(1);
  }
  const uint64_t total = uint64_t{bytes.size()} * pieces;
  std::thread reader([&] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    std::string into(bytes.size(), '\0');
    uint64_t got = 0;
    while (got < total) {
      const ssize_t n = ::read(fd, into.data() + got % into.size(),
                               std::min<uint64_t>(1 << 20, into.size() - got % into.size()));
      if (n <= 0) break;
      got += n;
    }
    ::close(fd);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const auto start = std::chrono::steady_clock::now();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("tcp reference connect");
    std::exit(1);
  }
  for (int p = 0; p < pieces; ++p) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n =
          ::write(fd, bytes.data() + off, std::min<size_t>(1 << 20, bytes.size() - off));
      if (n <= 0) break;
      off += n;
    }
  }
  ::shutdown(fd, SHUT_WR);
  reader.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  ::close(lfd);
  return s;
}

}  // namespace zcc::bench
