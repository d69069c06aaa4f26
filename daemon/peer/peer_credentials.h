// The credentials of zccd's peer connections (config.peer): mutual TLS with
// the operator's certificates, or, only where `insecure` says so, plaintext.
// Both ends present a certificate the cluster's CA signed; a connection
// without one is refused by gRPC before any request is read.
#ifndef ZCC_DAEMON_PEER_PEER_CREDENTIALS_H_
#define ZCC_DAEMON_PEER_PEER_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/daemon_config.h"

namespace zcc::daemon::peer {

struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  bool tls = false;
};

// Reads the PEM files (each at most 1 MiB); an error names the file and why.
absl::StatusOr<PeerCredentials> LoadPeerCredentials(const PeerConfig& config);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_PEER_CREDENTIALS_H_
