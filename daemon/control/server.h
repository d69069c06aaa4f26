// zccd's gRPC server: the Control and Status services over a unix-domain
// socket, backed by a Registry. A move-only handle: Start() binds and serves,
// Shutdown() (or the destructor) stops accepting requests, drains the registry
// (in-flight writes finish) and removes the socket.
#ifndef ZCC_DAEMON_CONTROL_SERVER_H_
#define ZCC_DAEMON_CONTROL_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/daemon_config.h"
#include "daemon/pull/pull_service.h"
#include "storage/storage.h"

namespace zcc::daemon {

// Optional listeners and exporters besides the unix socket.
struct ServerOptions {
  // host:port for a read-only TCP listener serving the Status service and the
  // standard gRPC health service (for probes); empty = off. Its callers see
  // every job, as root would: bind it to a trusted address.
  std::string status_tcp_listen;
  // host:port for Prometheus scraping (GET /metrics); empty = off.
  std::string metrics_http_listen;
  // node_exporter textfile-collector directory; empty = off.
  std::string metrics_textfile_dir;
  absl::Duration metrics_textfile_interval = absl::Seconds(15);
  // Where ranks write their shards (borrowed; outlives the server); null =
  // the default POSIX storage. zccd sets a fault-injecting one when
  // ZCCD_INJECT_STORAGE_FAULTS is set.
  storage::Storage* shard_storage = nullptr;
  // Makes the CUDA engine that serves daemon-pull registrations when the
  // config enables them (zccd passes NewPullEngine); null: none.
  PullEngineFactory pull_engine;
  // Runs before a registration reserves staging memory, with the segment's
  // name and the bytes; zccd sets a delay when ZCCD_INJECT_RESERVE_DELAY_MS
  // is set (fault drills, and the tests that stall a registration). Null:
  // nothing.
  std::function<void(const std::string&, uint64_t)> before_reserve;
};

class Server {
 public:
  // Validates `config`, refuses to start when another zccd answers on the
  // socket, replaces a stale socket file, and starts serving. Tells systemd
  // READY=1 (when run under it) and feeds its watchdog while healthy.
  static absl::StatusOr<Server> Start(DaemonConfig config, ServerOptions options = {});

  // The TCP status listener's port (0 when off); useful with port 0.
  int status_tcp_port() const;
  // The metrics HTTP port (0 when off).
  int metrics_http_port() const;
  // The peer service's TCP port (0 when off: config.peer.listen empty).
  int peer_port() const;

  Server(Server&&) noexcept;
  Server& operator=(Server&&) noexcept;
  ~Server();

  const DaemonConfig& config() const;
  // Blocks until a Shutdown() called from another thread has completed.
  void Wait();
  void Shutdown();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_SERVER_H_
