// The daemon's unix-domain socket, accepted by zccd itself rather than by
// gRPC, so that every connection's peer credentials (SO_PEERCRED: the kernel's
// pid, uid and gid of the connecting process, in zccd's pid namespace) are
// known. Each accepted connection is handed to the gRPC server, which names it
// "fd:<n>" as the call's peer; PeerTable maps that back to the credentials.
//
// Thread-safety: PeerTable is safe for concurrent use. UnixListener owns its
// accept thread and the listening socket; Stop() (or the destructor) ends the
// thread promptly and removes the socket file.
#ifndef ZCC_DAEMON_CONTROL_UNIX_LISTENER_H_
#define ZCC_DAEMON_CONTROL_UNIX_LISTENER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/fd.h"
#include "common/mutex.h"

namespace grpc {
class Server;
}

namespace zcc::daemon {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class PeerTable {
 public:
  void Set(int fd, PeerCredentials creds);
  // Credentials of a gRPC peer string of the form "fd:<n>"; nullopt otherwise.
  std::optional<PeerCredentials> Lookup(const std::string& peer) const;

 private:
  mutable zcc::Mutex mu_;
  std::map<int, PeerCredentials> by_fd_ ABSL_GUARDED_BY(mu_);
};

class UnixListener {
 public:
  // Binds and listens on `path` (mode `mode`); the path must not be in use.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path, uint32_t mode);
  ~UnixListener();

  // Accepts connections on a thread of its own and hands each to `server`
  // after recording its credentials in `peers`. Both must outlive Stop().
  void Start(grpc::Server* server, PeerTable* peers);
  void Stop();

 private:
  UnixListener(std::string path, UniqueFd listen_fd, UniqueFd wake_fd);
  void AcceptLoop(grpc::Server* server, PeerTable* peers);

  const std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: written by Stop() to end the accept loop
  std::thread thread_;
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_UNIX_LISTENER_H_
