#include "client/tcp_collective.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc {
namespace {

constexpr uint32_t kMagic = 0x7a636331;  // "zcc1"
constexpr uint32_t kHello = 1;
constexpr uint32_t kGather = 2;
constexpr uint32_t kBroadcast = 3;
constexpr uint64_t kMaxGatherBytes = uint64_t{1} << 30;

struct Header {
  uint32_t magic;
  uint32_t op;
  uint64_t sequence;
  uint64_t bytes;
};

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("collective: timed out ", what));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return ErrnoToStatus(errno, absl::StrCat("collective: poll ", what));
  }
}

absl::Status WriteAll(int fd, const void* data, uint64_t bytes, absl::Time deadline,
                      absl::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ZCC_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, what));
    const ssize_t n = ::send(fd, p, std::min<uint64_t>(bytes, 1 << 20), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("collective: ", what, ": ", std::strerror(errno)));
    }
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Reads `bytes` into `data`, or discards them when `data` is null.
absl::Status ReadAll(int fd, void* data, uint64_t bytes, absl::Time deadline,
                     absl::string_view what) {
  auto* p = static_cast<uint8_t*>(data);
  uint8_t scratch[64 << 10];
  while (bytes > 0) {
    ZCC_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, what));
    uint8_t* into = p != nullptr ? p : scratch;
    const uint64_t want = p != nullptr ? std::min<uint64_t>(bytes, 1 << 20)
                                       : std::min<uint64_t>(bytes, sizeof(scratch));
    const ssize_t n = ::recv(fd, into, want, MSG_DONTWAIT);
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat("collective: ", what, ": the member went away"));
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("collective: ", what, ": ", std::strerror(errno)));
    }
    if (p != nullptr) p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_storage> Resolve(const std::string& address, socklen_t* len) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective address '", address, "' is not host:port"));
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string host = address.substr(0, colon);
  if (const int err = ::getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints, &found);
      err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective address '", address, "': ", ::gai_strerror(err)));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

TcpCollective::TcpCollective(const TcpCollectiveOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<TcpCollective>> TcpCollective::Create(
    const TcpCollectiveOptions& options) {
  if (options.size == 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("collective: rank ", options.rank,
                                                   " of a collective of ", options.size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("collective: the timeout must be positive");
  }
  std::unique_ptr<TcpCollective> c(new TcpCollective(options));
  c->peers_.resize(options.rank == 0 ? options.size : 1);
  if (options.size == 1) return c;
  socklen_t len = 0;
  ZCC_ASSIGN_OR_RETURN(sockaddr_storage addr, Resolve(options.address, &len));
  const absl::Time deadline = absl::Now() + options.timeout;
  // The hello carries the collective's size and the member's rank.
  const Header hello{kMagic, kHello, options.size, options.rank};
  if (options.rank != 0) {
    // Rank 0 may not listen yet, in another process or on another host:
    // nothing can wake this member when it starts, so it retries, with a
    // backoff (the one kind of sleep zcc keeps: reconnecting to a peer that
    // is not there yet).
    absl::Duration backoff = absl::Milliseconds(10);
    while (true) {
      UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!fd.valid()) return ErrnoToStatus(errno, "collective: socket");
      if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
        NoDelay(fd.get());
        ZCC_RETURN_IF_ERROR(WriteAll(fd.get(), &hello, sizeof(hello), deadline, "sending hello"));
        c->peers_[0] = std::move(fd);
        return c;
      }
      if (errno != ECONNREFUSED && errno != EINTR && errno != ETIMEDOUT) {
        return ErrnoToStatus(errno, absl::StrCat("collective: connect to ", options.address));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "collective: rank 0 did not listen on ", options.address, " within the timeout"));
      }
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
  }
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return ErrnoToStatus(errno, "collective: socket");
  const int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("collective: bind ", options.address));
  }
  if (::listen(listener.get(), static_cast<int>(std::min<uint32_t>(options.size, 4096))) != 0) {
    return ErrnoToStatus(errno, "collective: listen");
  }
  for (uint32_t joined = 1; joined < options.size;) {
    ZCC_RETURN_IF_ERROR(WaitFor(listener.get(), POLLIN, deadline,
                                absl::StrCat("waiting for the members (", joined, " of ",
                                             options.size, " joined)")));
    UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    NoDelay(fd.get());
    Header h{};
    absl::Status st = ReadAll(fd.get(), &h, sizeof(h), deadline, "reading a hello");
    // Anything else that connected (a port scan, a member of another job) is
    // dropped; a duplicate rank or another size is an error.
    if (!st.ok() || h.magic != kMagic || h.op != kHello) continue;
    if (h.sequence != options.size || h.bytes == 0 || h.bytes >= options.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective: a member joined as rank ", h.bytes, " of ", h.sequence,
                       "; this collective has ranks 1..", options.size - 1, " to join"));
    }
    if (c->peers_[h.bytes].valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective: two members joined as rank ", h.bytes));
    }
    c->peers_[h.bytes] = std::move(fd);
    ++joined;
  }
  return c;
}

absl::Status TcpCollective::Fail(absl::Status st) {
  if (!st.ok() && broken_.ok()) {
    broken_ = st;
    // The members waiting on this one then fail at once, not at their timeout.
    for (UniqueFd& fd : peers_) fd.Reset();
  }
  return st;
}

absl::Status TcpCollective::SendMessage(int fd, uint32_t op, const void* data, uint64_t bytes,
                                        absl::Time deadline) {
  const Header h{kMagic, op, sequence_, bytes};
  ZCC_RETURN_IF_ERROR(WriteAll(fd, &h, sizeof(h), deadline, "sending"));
  return WriteAll(fd, data, bytes, deadline, "sending");
}

absl::StatusOr<uint64_t> TcpCollective::ReceiveHeader(int fd, uint32_t op, uint32_t from,
                                                       absl::Time deadline) {
  Header h{};
  ZCC_RETURN_IF_ERROR(ReadAll(fd, &h, sizeof(h), deadline,
                              absl::StrCat("waiting for rank ", from)));
  if (h.magic != kMagic || h.op != op || h.sequence != sequence_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "collective: rank ", from, " sent operation ", h.op, " #", h.sequence, " while this rank ",
        "is in operation ", op, " #", sequence_, ": the members call the collectives in "
        "different orders"));
  }
  return h.bytes;
}

absl::StatusOr<std::vector<std::string>> TcpCollective::AllGather(absl::string_view mine) {
  ZCC_RETURN_IF_ERROR(broken_);
  if (mine.size() > kMaxGatherBytes) {
    return absl::InvalidArgumentError("collective: AllGather message over 1 GiB");
  }
  ++sequence_;
  const absl::Time deadline = absl::Now() + options_.timeout;
  std::vector<std::string> all(options_.size);
  all[options_.rank] = std::string(mine);
  if (options_.size == 1) return all;
  if (options_.rank != 0) {
    const int fd = peers_[0].get();
    ZCC_RETURN_IF_ERROR(Fail(SendMessage(fd, kGather, mine.data(), mine.size(), deadline)));
    auto bytes = ReceiveHeader(fd, kGather, 0, deadline);
    if (!bytes.ok()) return Fail(bytes.status());
    if (*bytes > kMaxGatherBytes * options_.size) {
      return Fail(absl::DataLossError("collective: AllGather reply too large"));
    }
    std::string packed(*bytes, '\0');
    ZCC_RETURN_IF_ERROR(Fail(ReadAll(fd, packed.data(), packed.size(), deadline, "reading")));
    size_t at = 0;
    for (uint32_t r = 0; r < options_.size; ++r) {
      uint64_t n = 0;
      if (packed.size() - at < sizeof(n)) return Fail(absl::DataLossError("collective: bad reply"));
      std::memcpy(&n, packed.data() + at, sizeof(n));
      at += sizeof(n);
      if (packed.size() - at < n) return Fail(absl::DataLossError("collective: bad reply"));
      all[r] = packed.substr(at, n);
      at += n;
    }
    return all;
  }
  for (uint32_t r = 1; r < options_.size; ++r) {
    const int fd = peers_[r].get();
    auto bytes = ReceiveHeader(fd, kGather, r, deadline);
    if (!bytes.ok()) return Fail(bytes.status());
    if (*bytes > kMaxGatherBytes) return Fail(absl::DataLossError("collective: message too large"));
    all[r].resize(*bytes);
    ZCC_RETURN_IF_ERROR(Fail(ReadAll(fd, all[r].data(), *bytes, deadline, "reading")));
  }
  std::string packed;
  for (const std::string& m : all) {
    const uint64_t n = m.size();
    packed.append(reinterpret_cast<const char*>(&n), sizeof(n));
    packed.append(m);
  }
  for (uint32_t r = 1; r < options_.size; ++r) {
    ZCC_RETURN_IF_ERROR(
        Fail(SendMessage(peers_[r].get(), kGather, packed.data(), packed.size(), deadline)));
  }
  return all;
}

absl::Status TcpCollective::Broadcast(void* data, uint64_t bytes, uint32_t root, void* /*stream*/) {
  ZCC_RETURN_IF_ERROR(broken_);
  if (root >= options_.size) {
    return absl::InvalidArgumentError(absl::StrCat("collective: broadcast root ", root));
  }
  if (data == nullptr && options_.rank == root && bytes > 0) {
    return absl::InvalidArgumentError("collective: the broadcast root has no data");
  }
  ++sequence_;
  if (options_.size == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeout;
  auto receive = [&](int fd, uint32_t from, void* into) -> absl::Status {
    ZCC_ASSIGN_OR_RETURN(uint64_t n, ReceiveHeader(fd, kBroadcast, from, deadline));
    if (n != bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "collective: rank ", from, " broadcasts ", n, " bytes where this rank expects ", bytes));
    }
    return ReadAll(fd, into, bytes, deadline, "reading a broadcast");
  };
  if (options_.rank != 0) {
    const int fd = peers_[0].get();
    if (options_.rank == root) return Fail(SendMessage(fd, kBroadcast, data, bytes, deadline));
    return Fail(receive(fd, 0, data));
  }
  // Rank 0: the root's bytes (its own, or received into `data` or a buffer
  // when it keeps none), then on to every other member.
  std::string relay;
  const void* out = data;
  if (root != 0) {
    void* into = data;
    if (into == nullptr) {
      relay.resize(bytes);
      into = relay.data();
    }
    ZCC_RETURN_IF_ERROR(Fail(receive(peers_[root].get(), root, into)));
    out = into;
  }
  for (uint32_t r = 1; r < options_.size; ++r) {
    if (r == root) continue;
    ZCC_RETURN_IF_ERROR(Fail(SendMessage(peers_[r].get(), kBroadcast, out, bytes, deadline)));
  }
  return absl::OkStatus();
}

}  // namespace zcc
