// The Peer service (proto/peer.proto) over a ReplicaStore: what other zccds
// push here is checked (key, size, XXH3) before it is kept, and served back
// only for the job and uid it was pushed for. Served on the TCP listener of
// config.peer, whose credentials (mutual TLS) keep out any caller without
// the cluster's certificate before these handlers run.
#ifndef ZCC_DAEMON_PEER_PEER_SERVICE_H_
#define ZCC_DAEMON_PEER_PEER_SERVICE_H_

#include <functional>
#include <set>
#include <string>

#include "absl/status/statusor.h"

#include "daemon/peer/piece_assembly.h"
#include "daemon/peer/replica_store.h"
#include "proto/peer.grpc.pb.h"

namespace zcc::daemon::peer {

class PeerService final : public v1::Peer::Service {
 public:
  // A PinStep call (job, uid, step, everyone answered), from a gRPC thread:
  // the pin held now for the job (-1: none), or an error as the answer.
  using PinHandler =
      std::function<absl::StatusOr<int64_t>(const std::string&, uint32_t, int64_t, bool)>;
  // A WentBack call (job, uid, restored, the ranks that went on and when:
  // `ago` before the call arrived), from a gRPC thread: whether it was
  // taken here, or an error as the answer.
  using WentBackHandler = std::function<absl::StatusOr<bool>(
      const std::string&, uint32_t, int64_t, const std::set<uint32_t>&, absl::Duration)>;

  // `store` is borrowed and outlives the service. `on_pin` (may be null:
  // PinStep is then refused as unimplemented) handles PinStep calls,
  // `on_went_back` (likewise) WentBack calls. `parts_idle`: how long a
  // piece pushed in parts waits for its next part (PieceAssembly).
  PeerService(std::string node, std::string failure_domain, ReplicaStore* store,
              PinHandler on_pin = nullptr, WentBackHandler on_went_back = nullptr,
              absl::Duration parts_idle = absl::Minutes(10))
      : node_(std::move(node)),
        failure_domain_(std::move(failure_domain)),
        store_(store),
        on_pin_(std::move(on_pin)),
        on_went_back_(std::move(on_went_back)),
        instance_(NewInstance()),
        parts_(parts_idle) {}

  // What Hello answers as this run's instance (PeerHelloResponse.instance).
  const std::string& instance() const { return instance_; }

  grpc::Status Hello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                     v1::PeerHelloResponse* resp) override;
  grpc::Status PushReplica(grpc::ServerContext* ctx, grpc::ServerReader<v1::ReplicaChunk>* reader,
                           v1::PushReplicaResponse* resp) override;
  grpc::Status PullReplica(grpc::ServerContext* ctx, const v1::PullReplicaRequest* req,
                           grpc::ServerWriter<v1::ReplicaChunk>* writer) override;
  grpc::Status ListReplicas(grpc::ServerContext* ctx, const v1::ListReplicasRequest* req,
                            v1::ListReplicasResponse* resp) override;
  grpc::Status PinStep(grpc::ServerContext* ctx, const v1::PinStepRequest* req,
                       v1::PinStepResponse* resp) override;
  grpc::Status WentBack(grpc::ServerContext* ctx, const v1::WentBackRequest* req,
                        v1::WentBackResponse* resp) override;

 private:
  // 16 random hex digits.
  static std::string NewInstance();
  // A part of a piece (header.length > 0), after its header was checked.
  grpc::Status PushPart(grpc::ServerContext& ctx, grpc::ServerReader<v1::ReplicaChunk>* reader,
                        const v1::ReplicaHeader& header, const std::string& from,
                        v1::PushReplicaResponse* resp);

  const std::string node_;
  const std::string failure_domain_;
  ReplicaStore* const store_;
  const PinHandler on_pin_;
  const WentBackHandler on_went_back_;
  const std::string instance_;
  PieceAssembly parts_;  // pieces pushed in parts
};

// Who is calling: the names in its certificate (subject alternative names,
// else the common name), or its address on a plaintext listener.
std::string PeerIdentity(const grpc::ServerContext& ctx);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_SERVICE_H_
