#include "metrics/http_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace zcc::metrics {
namespace {

constexpr absl::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, bool head, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                 "Connection: close\r\n\r\n");
  if (!head) absl::StrAppend(&out, body);
  return out;
}

std::string PlainError(absl::string_view status, bool head = false,
                       absl::string_view extra_headers = "") {
  return Response(status, "text/plain; charset=utf-8", absl::StrCat(status, "\n"), head,
                  extra_headers);
}

// One client connection: reading its request, then writing the response.
struct Connection {
  UniqueFd fd;
  absl::Time deadline;
  std::string request;
  std::string response;
  size_t sent = 0;
  bool responding = false;
};

}  // namespace

struct HttpExporter::Impl {
  HttpExporterOptions options;
  RenderFn render;
  UniqueFd listener;
  UniqueFd wake;  // eventfd: Stop writes it to end the poll loop
  uint16_t port = 0;

  zcc::Mutex stop_mu;  // serializes Stop callers
  std::thread thread ABSL_GUARDED_BY(stop_mu);

  ~Impl() { Stop(); }

  void Stop() {
    zcc::MutexLock lock(&stop_mu);
    if (!thread.joinable()) return;
    const uint64_t one = 1;
    while (::write(wake.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread.join();
    listener.Reset();
  }

  // The response to a complete request head ("METHOD target HTTP/1.x\r\n...").
  std::string Handle(absl::string_view head) {
    const absl::string_view line = head.substr(0, head.find_first_of("\r\n"));
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[1][0] != '/') {
      return PlainError("400 Bad Request");
    }
    if (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
      return PlainError("505 HTTP Version Not Supported");
    }
    const absl::string_view method = parts[0];
    const bool head_only = method == "HEAD";
    if (method != "GET" && !head_only) {
      return PlainError("405 Method Not Allowed", false, "Allow: GET, HEAD\r\n");
    }
    const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (path != "/metrics") return PlainError("404 Not Found", head_only);
    return Response("200 OK", kMetricsContentType, render(), head_only);
  }

  // Reads what is available; moves to responding once the request head is in.
  // False when the connection is to be closed.
  bool OnReadable(Connection& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (n == 0) return false;  // closed before a complete request
      c.request.append(buf, static_cast<size_t>(n));
      size_t end = c.request.find("\r\n\r\n");
      if (end == std::string::npos) end = c.request.find("\n\n");
      if (end != std::string::npos && end <= options.max_request_bytes) {
        c.response = Handle(absl::string_view(c.request).substr(0, end));
      } else if (c.request.size() > options.max_request_bytes) {
        c.response = PlainError("431 Request Header Fields Too Large");
      } else {
        continue;
      }
      c.responding = true;
      return OnWritable(c);
    }
  }

  // Sends what the socket takes; false when done (or failed): close it.
  bool OnWritable(Connection& c) {
    while (c.sent < c.response.size()) {
      const ssize_t n = ::send(c.fd.get(), c.response.data() + c.sent, c.response.size() - c.sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.sent += static_cast<size_t>(n);
    }
    ::shutdown(c.fd.get(), SHUT_WR);
    return false;
  }

  void Run() {
    std::vector<Connection> conns;
    std::vector<struct pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake.get(), POLLIN, 0});
      const bool accepting = static_cast<int>(conns.size()) < options.max_connections;
      fds.push_back({listener.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      absl::Time first_deadline = absl::InfiniteFuture();
      for (const Connection& c : conns) {
        fds.push_back({c.fd.get(), static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
        first_deadline = std::min(first_deadline, c.deadline);
      }
      int timeout_ms = -1;
      if (first_deadline != absl::InfiniteFuture()) {
        timeout_ms = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(first_deadline - absl::Now()) + 1));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        ZCC_LOG(ERROR) << "metrics http: poll: " << std::strerror(errno);
        return;
      }
      if (fds[0].revents != 0) return;  // Stop

      const absl::Time now = absl::Now();
      std::vector<Connection> kept;
      kept.reserve(conns.size());
      for (size_t i = 0; i < conns.size(); ++i) {
        Connection& c = conns[i];
        const short revents = fds[i + 2].revents;
        bool keep = true;
        if (revents & (POLLERR | POLLNVAL)) {
          keep = false;
        } else if (!c.responding && (revents & (POLLIN | POLLHUP))) {
          keep = OnReadable(c);
        } else if (c.responding && (revents & (POLLOUT | POLLHUP))) {
          keep = OnWritable(c);
        }
        if (keep && now >= c.deadline) keep = false;  // too slow: drop it
        if (keep) kept.push_back(std::move(c));
      }
      conns = std::move(kept);

      if (fds[1].revents & POLLIN) {
        while (static_cast<int>(conns.size()) < options.max_connections) {
          const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
              ZCC_LOG(WARNING) << "metrics http: accept: " << std::strerror(errno);
            }
            break;
          }
          Connection c;
          c.fd = UniqueFd(fd);
          c.deadline = absl::Now() + options.connection_timeout;
          conns.push_back(std::move(c));
        }
      }
    }
  }
};

absl::StatusOr<HttpExporter> HttpExporter::Start(HttpExporterOptions options, RenderFn render) {
  if (!render) return absl::InvalidArgumentError("metrics http exporter needs a render function");
  if (options.max_request_bytes < 64 || options.max_connections < 1 ||
      options.connection_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics http exporter: max_request_bytes >= 64, max_connections >= 1 and a positive "
        "connection_timeout are needed");
  }
  struct sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options.port);
  if (::inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics http exporter: host must be an IPv4 address, got \"", options.host, "\""));
  }
  const std::string where = absl::StrCat(options.host, ":", options.port);

  auto impl = std::make_unique<Impl>();
  impl->listener = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->listener.valid()) return zcc::ErrnoToStatus(errno, "metrics http: socket");
  const int one = 1;
  if (::setsockopt(impl->listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    return zcc::ErrnoToStatus(errno, "metrics http: SO_REUSEADDR");
  }
  if (::bind(impl->listener.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    return zcc::ErrnoToStatus(errno, absl::StrCat("metrics http: bind ", where));
  }
  if (::listen(impl->listener.get(), 64) != 0) {
    return zcc::ErrnoToStatus(errno, absl::StrCat("metrics http: listen ", where));
  }
  socklen_t len = sizeof(addr);
  if (::getsockname(impl->listener.get(), reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
    return zcc::ErrnoToStatus(errno, "metrics http: getsockname");
  }
  impl->port = ntohs(addr.sin_port);
  impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake.valid()) return zcc::ErrnoToStatus(errno, "metrics http: eventfd");
  impl->options = std::move(options);
  impl->render = std::move(render);
  Impl* raw = impl.get();
  {
    zcc::MutexLock lock(&raw->stop_mu);
    raw->thread = std::thread([raw] { raw->Run(); });
  }
  return HttpExporter(std::move(impl));
}

HttpExporter::HttpExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpExporter::HttpExporter(HttpExporter&&) noexcept = default;
HttpExporter& HttpExporter::operator=(HttpExporter&&) noexcept = default;
HttpExporter::~HttpExporter() = default;

void HttpExporter::Stop() {
  if (impl_ != nullptr) impl_->Stop();
}

uint16_t HttpExporter::port() const { return impl_->port; }

}  // namespace zcc::metrics
