// zccd's gRPC server: the Control and Status services over a unix-domain
// socket, backed by a Registry. A move-only handle: Start() binds and serves,
// Shutdown() (or the destructor) stops accepting requests, drains the registry
// (in-flight writes finish) and removes the socket.
#ifndef ZCC_DAEMON_SERVER_H_
#define ZCC_DAEMON_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/config.h"

namespace zcc::daemon {

class Server {
 public:
  // Validates `config`, refuses to start when another zccd answers on the
  // socket, replaces a stale socket file, and starts serving.
  static absl::StatusOr<Server> Start(DaemonConfig config);

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

#endif  // ZCC_DAEMON_SERVER_H_
