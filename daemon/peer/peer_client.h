// A connection to another zccd's Peer service (proto/peer.proto): pushes
// pieces there and pulls them back, each checked end to end (XXH3 of the
// bytes computed here on push, checked here on pull: a peer that serves
// damaged or short bytes gets DataLoss, never a piece).
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_PEER_CLIENT_H_
#define ZCC_DAEMON_PEER_PEER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/peer/call_cancel.h"
#include "daemon/peer/replica_store.h"
#include "proto/peer.grpc.pb.h"

namespace zcc::daemon::peer {

class PeerClient {
 public:
  // `target` is host:port; `creds` from LoadPeerCredentials. With TLS the
  // peer's certificate must name the host in `target`. Clients of one
  // target with different `connection` numbers use TCP connections of their
  // own (gRPC shares one between channels that are alike otherwise), so
  // that their calls do not queue behind each other's on one connection.
  PeerClient(const std::string& target, std::shared_ptr<grpc::ChannelCredentials> creds,
             int connection = 0);

  const std::string& target() const { return target_; }

  absl::StatusOr<v1::PeerHelloResponse> Hello(const std::string& node,
                                              const std::string& failure_domain,
                                              absl::Duration timeout);
  // Sends `nbytes` at `data` as the piece `key`, in chunks.
  absl::Status Push(const ReplicaKey& key, const void* data, size_t nbytes, absl::Duration timeout);
  // The same with the bytes' XXH3 already known (a held piece's, computed
  // when it was kept): the receiver checks the bytes against it. `cancel`
  // (may be null) ends the call early (Cancelled). `went_on_from` >= 0: the
  // rank's first step after it went on from a restore of that step; the
  // receiver drops the rank's newer steps (ReplicaStore::Put). `length` >
  // 0: only the part [offset, offset + length) of the piece (a peer whose
  // Hello says takes_parts keeps the piece once all its parts arrived).
  // `kept` (may be null): whether the peer keeps the piece now (a part:
  // this one completed it). `with_pieces` (a rank's manifest, pushed whole;
  // may be null): the step's other pieces pushed to the peer before it,
  // each of which it must hold to take the step for whole.
  absl::Status Push(const ReplicaKey& key, const void* data, size_t nbytes, uint64_t xxh3,
                    absl::Duration timeout, CallCancel* cancel = nullptr,
                    int64_t went_on_from = -1, uint64_t offset = 0, uint64_t length = 0,
                    bool* kept = nullptr, const std::vector<std::string>* with_pieces = nullptr);
  // The piece's bytes, checked against the size and XXH3 the peer sent first.
  // `cancel` (may be null) ends the call early (Cancelled).
  absl::StatusOr<std::string> Pull(const ReplicaKey& key, absl::Duration timeout,
                                   CallCancel* cancel = nullptr);
  // The same, each chunk handed to `sink` as it arrives (after `size`, called
  // once with the size the peer announced, before any chunk): OK only when
  // the whole piece came and matched its checksum. On any error what the
  // sink took must be discarded; an error from the sink ends the pull.
  // `cancel` (may be null) ends the call early (Cancelled).
  absl::Status PullInto(const ReplicaKey& key, absl::Duration timeout,
                        absl::FunctionRef<absl::Status(uint64_t)> size,
                        absl::FunctionRef<absl::Status(absl::string_view)> sink,
                        CallCancel* cancel = nullptr);
  // `n` bytes of the piece from `offset` into `dst` (a restore reading a
  // recovered step in place): OK only when the peer's piece is
  // `piece_bytes` long (DataLoss otherwise: another run's copy) and exactly
  // those bytes came. A range has no checksum of its own (the reader checks
  // the tensors in it); with `check_held` the peer first checks the whole
  // piece it holds against its XXH3 (DataLoss when damaged there).
  // `cancel` (may be null) ends the call early (Cancelled).
  absl::Status PullRange(const ReplicaKey& key, uint64_t piece_bytes, uint64_t offset, void* dst,
                         size_t n, bool check_held, absl::Duration timeout,
                         CallCancel* cancel = nullptr);
  // PinStep (proto/peer.proto): the job's pin as its leader found it, or
  // (step < 0) a nudge to the leader. Returns the pin the peer holds now
  // for the job (-1: none).
  absl::StatusOr<int64_t> PinStep(const std::string& job_id, uint32_t uid, int64_t step,
                                  bool everyone_answered, absl::Duration timeout,
                                  CallCancel* cancel = nullptr);
  // WentBack (proto/peer.proto): the job's `ranks` went on from a restore
  // of `restored`, `ago` before this call. Returns whether the peer took it.
  absl::StatusOr<bool> WentBack(const std::string& job_id, uint32_t uid, int64_t restored,
                                const std::vector<uint32_t>& ranks, absl::Duration ago,
                                absl::Duration timeout, CallCancel* cancel = nullptr);
  absl::StatusOr<std::vector<ReplicaInfo>> List(const std::string& job_id, uint32_t uid,
                                                absl::Duration timeout,
                                                CallCancel* cancel = nullptr);

 private:
  const std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Peer::Stub> stub_;
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_CLIENT_H_
