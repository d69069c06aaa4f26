#include "metrics/http_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/testing/status_matchers.h"
#include "metrics/metrics.h"
#include "metrics/testing/exposition_parser.h"

namespace zcc::metrics {
namespace {

// A TCP connection to 127.0.0.1:port with 5 s send/receive timeouts.
UniqueFd Connect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  struct timeval tv = {5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  struct sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Everything the server sends until it closes (or 5 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct HttpResponse {
  int status = 0;
  std::string head;
  std::string body;
};

HttpResponse Request(uint16_t port, const std::string& raw) {
  UniqueFd fd = Connect(port);
  REQUIRE(fd.valid());
  REQUIRE(::send(fd.get(), raw.data(), raw.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(raw.size()));
  const std::string all = ReadAll(fd.get());
  HttpResponse r;
  const size_t split = all.find("\r\n\r\n");
  INFO(all);
  REQUIRE(split != std::string::npos);
  r.head = all.substr(0, split + 2);
  r.body = all.substr(split + 4);
  REQUIRE(absl::StartsWith(r.head, "HTTP/1.1 "));
  REQUIRE(absl::SimpleAtoi(r.head.substr(9, 3), &r.status));
  // The declared length matches what came.
  const size_t cl = r.head.find("Content-Length: ");
  REQUIRE(cl != std::string::npos);
  size_t length = 0;
  REQUIRE(absl::SimpleAtoi(r.head.substr(cl + 16, r.head.find("\r\n", cl) - cl - 16), &length));
  if (!absl::StartsWith(raw, "HEAD ")) CHECK(length == r.body.size());
  return r;
}

HttpResponse Get(uint16_t port, const std::string& path) {
  return Request(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n"
                                    "User-Agent: zcc-test\r\n\r\n"));
}

TEST_CASE("GET /metrics serves the exposition; other paths and methods are refused") {
  ZccMetrics m;
  m.snapshots().Increment(3);
  m.errors(ErrorKind::kWrite).Increment();
  std::atomic<int> renders{0};
  HttpExporterOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  absl::StatusOr<HttpExporter> ex = HttpExporter::Start(options, [&] {
    renders++;
    return m.RenderPrometheusText();
  });
  REQUIRE_OK(ex);
  REQUIRE(ex->port() != 0);

  HttpResponse r = Get(ex->port(), "/metrics");
  CHECK(r.status == 200);
  CHECK_THAT(r.head, Catch::Contains("Content-Type: text/plain; version=0.0.4"));
  CHECK_THAT(r.head, Catch::Contains("Connection: close\r\n"));
  absl::StatusOr<testing::Exposition> e = testing::ParseExposition(r.body);
  REQUIRE_OK(e);
  CHECK(e->Value("zcc_snapshots_total") == 3);
  CHECK(e->Value("zcc_errors_total", {{"kind", "write"}}) == 1);

  m.snapshots().Increment();
  r = Get(ex->port(), "/metrics?name[]=zcc_snapshots_total");
  CHECK(r.status == 200);
  e = testing::ParseExposition(r.body);
  REQUIRE_OK(e);
  CHECK(e->Value("zcc_snapshots_total") == 4);

  // HTTP/1.0 and bare-LF requests from simple tools.
  CHECK(Request(ex->port(), "GET /metrics HTTP/1.0\n\n").status == 200);

  HttpResponse head = Request(ex->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(head.status == 200);
  CHECK(head.body.empty());

  const int before = renders.load();
  CHECK(Get(ex->port(), "/").status == 404);
  CHECK(Get(ex->port(), "/metrics/x").status == 404);
  CHECK(Get(ex->port(), "/metricsx").status == 404);
  HttpResponse post = Request(ex->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  CHECK(post.status == 405);
  CHECK_THAT(post.head, Catch::Contains("Allow: GET, HEAD\r\n"));
  CHECK(Request(ex->port(), "garbage\r\n\r\n").status == 400);
  CHECK(Request(ex->port(), "GET metrics HTTP/1.1\r\n\r\n").status == 400);
  CHECK(Request(ex->port(), "GET /metrics HTTP/2\r\n\r\n").status == 505);
  CHECK(renders.load() == before);  // nothing rendered for refused requests
}

TEST_CASE("requests larger than the limit get 431") {
  HttpExporterOptions options;
  options.max_request_bytes = 1024;
  absl::StatusOr<HttpExporter> ex = HttpExporter::Start(options, [] { return std::string(); });
  REQUIRE_OK(ex);
  const std::string big = absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(4000, 'a'),
                                       "\r\n\r\n");
  CHECK(Request(ex->port(), big).status == 431);
  // A request just within the limit still works.
  const std::string fits = absl::StrCat("GET /metrics HTTP/1.1\r\nX-Pad: ", std::string(900, 'a'),
                                        "\r\n\r\n");
  CHECK(Request(ex->port(), fits).status == 200);
}

TEST_CASE("a slow client neither blocks others nor outlives its timeout") {
  HttpExporterOptions options;
  options.connection_timeout = absl::Seconds(2);
  absl::StatusOr<HttpExporter> ex = HttpExporter::Start(options, [] { return std::string("# x\n"); });
  REQUIRE_OK(ex);
  const absl::Time start = absl::Now();
  UniqueFd idle = Connect(ex->port());
  REQUIRE(idle.valid());
  REQUIRE(::send(idle.get(), "GET /met", 8, MSG_NOSIGNAL) == 8);  // never finished

  // Served long before the idle connection's timeout.
  CHECK(Get(ex->port(), "/metrics").status == 200);
  CHECK(absl::Now() - start < absl::Seconds(1));

  // The idle connection is closed by the server after its timeout.
  char c;
  CHECK(::recv(idle.get(), &c, 1, 0) == 0);
  const absl::Duration waited = absl::Now() - start;
  CHECK(waited >= absl::Milliseconds(1900));
  CHECK(waited < absl::Seconds(4));  // recv's own timeout is 5 s
}

TEST_CASE("Stop is prompt with connections open, and the port is closed after") {
  HttpExporterOptions options;
  options.connection_timeout = absl::Seconds(60);
  absl::StatusOr<HttpExporter> ex = HttpExporter::Start(options, [] { return std::string(); });
  REQUIRE_OK(ex);
  const uint16_t port = ex->port();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(Connect(port));
    REQUIRE(idle.back().valid());
  }
  // Let the server accept them.
  CHECK(Get(port, "/metrics").status == 200);

  const absl::Time start = absl::Now();
  ex->Stop();
  CHECK(absl::Now() - start < absl::Seconds(2));  // not the 60 s connection timeout
  ex->Stop();  // idempotent
  // The open connections were closed, and nothing listens any more.
  char c;
  for (UniqueFd& fd : idle) CHECK(::recv(fd.get(), &c, 1, 0) <= 0);
  CHECK_FALSE(Connect(port).valid());

  // The destructor of a running exporter stops it too.
  {
    absl::StatusOr<HttpExporter> other = HttpExporter::Start({}, [] { return std::string(); });
    REQUIRE_OK(other);
  }
}

TEST_CASE("bind errors and bad options are reported at Start") {
  absl::StatusOr<HttpExporter> first = HttpExporter::Start({}, [] { return std::string(); });
  REQUIRE_OK(first);
  HttpExporterOptions options;
  options.port = first->port();
  absl::StatusOr<HttpExporter> second = HttpExporter::Start(options, [] { return std::string(); });
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains(absl::StrCat("bind 127.0.0.1:", first->port())));

  options = {};
  options.host = "localhost";
  CHECK(HttpExporter::Start(options, [] { return std::string(); }).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options.host = "::1";
  CHECK(HttpExporter::Start(options, [] { return std::string(); }).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(HttpExporter::Start({}, nullptr).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc::metrics
