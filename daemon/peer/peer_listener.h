// zccd's peer listener (config.peer.listen): the Peer service on TCP with
// the config's credentials, over the replicas this zccd holds for others.
#ifndef ZCC_DAEMON_PEER_PEER_LISTENER_H_
#define ZCC_DAEMON_PEER_PEER_LISTENER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/daemon_config.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_service.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer {

class PeerListener {
 public:
  // Loads the credentials and starts serving the replicas in `store`
  // (borrowed; outlives the listener); an error names the file or the
  // address that failed.
  // `on_pin` and `on_went_back` (may be null) take the PinStep and
  // WentBack calls (peer_service.h).
  static absl::StatusOr<std::unique_ptr<PeerListener>> Start(
      const PeerConfig& config, ReplicaStore* store, PeerService::PinHandler on_pin = nullptr,
      PeerService::WentBackHandler on_went_back = nullptr);
  ~PeerListener();

  int port() const { return port_; }
  const std::string& node_name() const { return node_; }
  const std::string& failure_domain() const { return failure_domain_; }
  bool tls() const { return creds_.tls; }
  // For connections to other zccds: the same certificate and CA.
  const std::shared_ptr<grpc::ChannelCredentials>& channel_credentials() const {
    return creds_.channel;
  }

  // Stops accepting and finishes the calls in flight (within 2 s).
  void Stop();

 private:
  PeerListener(const PeerConfig& config, std::string node, PeerCredentials creds,
               ReplicaStore* store, PeerService::PinHandler on_pin,
               PeerService::WentBackHandler on_went_back);

  const std::string node_;
  const std::string failure_domain_;
  const PeerCredentials creds_;
  PeerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_LISTENER_H_
