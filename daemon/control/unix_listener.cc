#include "daemon/control/unix_listener.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace zcc::daemon {

void PeerTable::Set(int fd, PeerCredentials creds) {
  zcc::MutexLock lock(&mu_);
  by_fd_[fd] = creds;  // fd numbers are reused: the newest connection wins
}

std::optional<PeerCredentials> PeerTable::Lookup(const std::string& peer) const {
  if (!absl::StartsWith(peer, "fd:")) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(absl::string_view(peer).substr(3), &fd)) return std::nullopt;
  zcc::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

UnixListener::UnixListener(std::string path, UniqueFd listen_fd, UniqueFd wake_fd)
    : path_(std::move(path)), listen_fd_(std::move(listen_fd)), wake_fd_(std::move(wake_fd)) {}

UnixListener::~UnixListener() { Stop(); }

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path,
                                                                 uint32_t mode) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", path, " is too long"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  if (::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bind ", path));
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
  if (::listen(fd.get(), 128) != 0) return ErrnoToStatus(errno, absl::StrCat("listen ", path));
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoToStatus(errno, "eventfd");
  return std::unique_ptr<UnixListener>(new UnixListener(path, std::move(fd), std::move(wake)));
}

void UnixListener::Start(grpc::Server* server, PeerTable* peers) {
  thread_ = std::thread([this, server, peers] { AcceptLoop(server, peers); });
}

void UnixListener::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t unused = ::write(wake_fd_.get(), &one, sizeof(one));
    (void)unused;
    thread_.join();
  }
  if (listen_fd_.valid()) {
    listen_fd_.Reset();
    ::unlink(path_.c_str());
  }
}

void UnixListener::AcceptLoop(grpc::Server* server, PeerTable* peers) {
  while (true) {
    struct pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ZCC_LOG(ERROR) << ErrnoToStatus(errno, "poll on the control socket");
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        ZCC_LOG(WARNING) << ErrnoToStatus(errno, "accept on the control socket");
      }
      continue;
    }
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ZCC_LOG(WARNING) << ErrnoToStatus(errno, "SO_PEERCRED") << "; connection refused";
      ::close(conn);
      continue;
    }
    peers->Set(conn, PeerCredentials{cred.pid, cred.uid, cred.gid});
    grpc::AddInsecureChannelFromFd(server, conn);  // gRPC owns the fd from here
  }
}

}  // namespace zcc::daemon
