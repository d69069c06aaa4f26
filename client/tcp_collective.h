// TcpCollective: the host implementation of Collective (common/collective.h)
// for trainers without a process group of their own (C++ CPU trainers, tests):
// a star of TCP connections through rank 0, which listens on `address`
// (host:port) and relays. AllGather sends each member's message to rank 0,
// which sends every member all of them; Broadcast sends the root's bytes to
// rank 0, which passes them on. Host memory only.
//
// Every message carries a header (magic, operation, sequence number, length)
// that the receiver checks, so members that call the collectives in different
// orders get an error instead of each other's bytes. Every read and write has
// the options' deadline; a member that goes away or stalls fails the call
// (Unavailable or DeadlineExceeded) on the members that wait for it, and the
// collective is then broken: later calls fail at once, and the member closes
// its connections so that the members waiting on it fail too. (A broadcast's
// root may return before the others fail: what it sent is buffered.)
//
// Thread-safety: one thread at a time (a trainer's restore).
#ifndef ZCC_CLIENT_TCP_COLLECTIVE_H_
#define ZCC_CLIENT_TCP_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "common/fd.h"

namespace zcc {

struct TcpCollectiveOptions {
  uint32_t rank = 0;
  uint32_t size = 1;
  // Rank 0's listening address, "host:port" (IPv4 or a name); rank 0 binds it.
  std::string address;
  // How long Create waits for all members, and each call for its messages.
  absl::Duration timeout = absl::Minutes(5);
};

class TcpCollective final : public Collective {
 public:
  // Rank 0 listens and accepts the other members; the others connect (and
  // retry until the timeout while rank 0 is not listening yet). Returns once
  // every member is connected. InvalidArgument for bad options or address.
  static absl::StatusOr<std::unique_ptr<TcpCollective>> Create(const TcpCollectiveOptions& options);
  ~TcpCollective() override = default;
  TcpCollective(const TcpCollective&) = delete;
  TcpCollective& operator=(const TcpCollective&) = delete;

  uint32_t rank() const override { return options_.rank; }
  uint32_t size() const override { return options_.size; }
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view mine) override;
  absl::Status Broadcast(void* data, uint64_t bytes, uint32_t root, void* stream) override;

 private:
  explicit TcpCollective(const TcpCollectiveOptions& options);
  absl::Status Fail(absl::Status st);
  absl::Status SendMessage(int fd, uint32_t op, const void* data, uint64_t bytes,
                           absl::Time deadline);
  // Reads a header of `op` and this call's sequence number; returns its length.
  absl::StatusOr<uint64_t> ReceiveHeader(int fd, uint32_t op, uint32_t from, absl::Time deadline);

  TcpCollectiveOptions options_;
  // Rank 0: peers_[r] is member r's connection (peers_[0] unused); others:
  // peers_[0] is the connection to rank 0.
  std::vector<UniqueFd> peers_;
  uint64_t sequence_ = 0;
  absl::Status broken_;
};

}  // namespace zcc

#endif  // ZCC_CLIENT_TCP_COLLECTIVE_H_
