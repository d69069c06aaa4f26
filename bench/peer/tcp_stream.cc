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

namespace zcc::bench {
namespace {

sockaddr_in Address(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty()) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    std::fprintf(stderr, "tcp reference: not an IPv4 address: %s\n", host.c_str());
    std::exit(1);
  }
  return a;
}

}  // namespace

TcpSink::TcpSink(const std::string& host, int port, size_t buffer_bytes) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Address(host, port);
  socklen_t len = sizeof(a);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_fd_, 4) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("tcp reference: listen");
    std::exit(1);
  }
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this, buffer_bytes] { Serve(buffer_bytes); });
}

TcpSink::~TcpSink() {
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  thread_.join();
  ::close(listen_fd_);
}

void TcpSink::Serve(size_t buffer_bytes) {
  std::string into(std::max<size_t>(buffer_bytes, 1), '\0');
  while (true) {
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    size_t at = 0;
    while (true) {
      const ssize_t n = ::read(fd, into.data() + at, std::min<size_t>(1 << 20, into.size() - at));
      if (n <= 0) break;
      at = (at + n) % into.size();
    }
    const char ack = 1;
    (void)!::write(fd, &ack, 1);
    ::close(fd);
  }
}

double TcpSendSeconds(const std::string& host, int port, const std::string& bytes, int pieces) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Address(host, port);
  const auto start = std::chrono::steady_clock::now();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("tcp reference: connect");
    std::exit(1);
  }
  for (int p = 0; p < pieces; ++p) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n =
          ::write(fd, bytes.data() + off, std::min<size_t>(1 << 20, bytes.size() - off));
      if (n <= 0) {
        std::perror("tcp reference: write");
        std::exit(1);
      }
      off += n;
    }
  }
  ::shutdown(fd, SHUT_WR);
  char ack = 0;
  if (::read(fd, &ack, 1) != 1) {
    std::fprintf(stderr, "tcp reference: the sink did not confirm\n");
    std::exit(1);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  return s;
}

double TcpSeconds(const std::string& bytes, int pieces) {
  TcpSink sink("127.0.0.1", 0, bytes.size());
  return TcpSendSeconds("127.0.0.1", sink.port(), bytes, pieces);
}

}  // namespace zcc::bench
