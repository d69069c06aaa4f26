// A minimal HTTP/1.1 endpoint for Prometheus scrapes: GET (or HEAD) /metrics
// answers the rendered text as "text/plain; version=0.0.4"; every other path
// is 404 and every other method 405. One connection per request
// ("Connection: close"), no TLS, no authentication: bind it to 127.0.0.1 or
// to an address only the scraper can reach.
#ifndef ZCC_METRICS_HTTP_EXPORTER_H_
#define ZCC_METRICS_HTTP_EXPORTER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zcc::metrics {

struct HttpExporterOptions {
  // IPv4 address to bind; "0.0.0.0" for all interfaces.
  std::string host = "127.0.0.1";
  // 0 = a port chosen by the kernel; see HttpExporter::port().
  uint16_t port = 0;
  // Request line plus headers; a longer request is answered 431 and closed.
  size_t max_request_bytes = 8192;
  // A connection must send its request and take the whole response within
  // this time, or it is closed.
  absl::Duration connection_timeout = absl::Seconds(10);
  // Connections served at once; further ones wait in the listen backlog.
  int max_connections = 16;
};

// A move-only handle on the listening socket and its one thread, which
// accepts and serves connections with non-blocking sockets and poll(), so a
// slow client delays no one else and Stop does not wait for clients. `render`
// runs on that thread for each scrape and must be thread-safe; it has to
// outlive the handle. Stop (and the destructor) closes the listener and every
// open connection and joins the thread; it is thread-safe and idempotent.
class HttpExporter {
 public:
  using RenderFn = std::function<std::string()>;

  static absl::StatusOr<HttpExporter> Start(HttpExporterOptions options, RenderFn render);

  HttpExporter(HttpExporter&&) noexcept;
  HttpExporter& operator=(HttpExporter&&) noexcept;
  ~HttpExporter();

  void Stop();
  // The bound port (the kernel's choice when options.port was 0).
  uint16_t port() const;

 private:
  struct Impl;
  explicit HttpExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc::metrics

#endif  // ZCC_METRICS_HTTP_EXPORTER_H_
