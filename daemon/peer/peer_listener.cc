#include "daemon/peer/peer_listener.h"

#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace zcc::daemon::peer {
namespace {

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace

PeerListener::PeerListener(const PeerConfig& config, std::string node, PeerCredentials creds,
                           ReplicaStore* store, PeerService::PinHandler on_pin,
                           PeerService::WentBackHandler on_went_back)
    : node_(std::move(node)),
      failure_domain_(config.failure_domain),
      creds_(std::move(creds)),
      service_(node_, failure_domain_, store, std::move(on_pin), std::move(on_went_back)) {}

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Start(
    const PeerConfig& config, ReplicaStore* store, PeerService::PinHandler on_pin,
    PeerService::WentBackHandler on_went_back) {
  auto creds = LoadPeerCredentials(config);
  if (!creds.ok()) return creds.status();
  std::string node = config.node_name.empty() ? HostName() : config.node_name;
  std::unique_ptr<PeerListener> l(
      new PeerListener(config, std::move(node), *std::move(creds), store, std::move(on_pin),
                       std::move(on_went_back)));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, l->creds_.server, &l->port_);
  builder.RegisterService(&l->service_);
  // Chunks are 1 MiB; a little room for the header.
  builder.SetMaxReceiveMessageSize(4 << 20);
  // The peers' keepalive pings (peer_client.cc), every 10 s even when idle.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  l->server_ = builder.BuildAndStart();
  if (l->server_ == nullptr || l->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("peer: cannot listen on ", config.listen));
  }
  ZCC_LOG(INFO) << "peer service on " << config.listen << " (port " << l->port_ << ", "
                << (l->tls() ? "mutual TLS" : "PLAINTEXT, no authentication: peer.insecure")
                << "), node '" << l->node_ << "'"
                << (l->failure_domain_.empty() ? "" : absl::StrCat(", failure domain '",
                                                                    l->failure_domain_, "'"))
                << ", " << store->budget_bytes() << " bytes for replicas";
  return l;
}

void PeerListener::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

PeerListener::~PeerListener() { Stop(); }

}  // namespace zcc::daemon::peer
