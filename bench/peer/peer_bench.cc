// The peer tier's transport: pieces pushed to and pulled from another zccd's
// Peer service (gRPC, mutual TLS, every piece checked by XXH3 on both ends),
// against a plain TCP stream of the same bytes between two threads over the
// same loopback, in the same run. Both ends live in this process (the
// service as zccd serves it: PeerService over a ReplicaStore); on a
// cluster the two ends are two nodes and the link is the network.
//
// Rows (GB/s; ratio = peer / TCP, target >= 0.8 for TLS):
//   peer_push_tls_vs_tcp, peer_pull_tls_vs_tcp: 16 pieces of 64 MiB (--quick: 4)
//   peer_push_plaintext_vs_tcp: the same push without TLS (peer.insecure),
//     which shows what TLS costs and what gRPC does.
// Median of 3 rounds, each round's TCP reference run right after its pushes.
//
// Environment: ZCC_BENCH_DIR (certificates are made there with
// tools/testing/make_test_certs.sh, run from the repository root).
// Flags: --quick, --only=PATTERN.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/peer/tcp_stream.h"
#include "bench/report.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_service.h"
#include "daemon/peer/replica_store.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;
using daemon::PeerConfig;
using daemon::peer::PeerClient;
using daemon::peer::ReplicaKey;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Server {
  daemon::peer::ReplicaStore store;
  daemon::peer::PeerService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  Server(const std::shared_ptr<grpc::ServerCredentials>& creds, uint64_t budget)
      : store(budget), service("bench", "", &store) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", creds, &port);
    b.RegisterService(&service);
    b.SetMaxReceiveMessageSize(4 << 20);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(); }
};

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
  }
  auto wanted = [&](const std::string& row) { return only.empty() || std::regex_search(row, std::regex(only)); };
  const int pieces = quick ? 4 : 16;
  const size_t piece = size_t{64} << 20;
  const char* dir_env = std::getenv("ZCC_BENCH_DIR");
  const std::string dir = absl::StrCat(dir_env != nullptr ? dir_env : "/tmp", "/peer_bench_certs");
  if (std::system(absl::StrCat("tools/testing/make_test_certs.sh ", dir, " node-a node-b").c_str()) != 0) {
    std::fprintf(stderr, "peer_bench: cannot make certificates (run from the repository root)\n");
    return 1;
  }
  std::string bytes(piece, '\0');
  for (size_t i = 0; i < piece; ++i) bytes[i] = static_cast<char>(i * 2654435761u >> 13);
  const double gb = static_cast<double>(piece) * pieces / 1e9;

  for (bool tls : {true, false}) {
    const std::string push_row = tls ? "peer_push_tls_vs_tcp" : "peer_push_plaintext_vs_tcp";
    const std::string pull_row = "peer_pull_tls_vs_tcp";
    if (!wanted(push_row) && !(tls && wanted(pull_row))) continue;
    PeerConfig server_cfg, client_cfg;
    if (tls) {
      server_cfg.cert_file = dir + "/node-a.pem";
      server_cfg.key_file = dir + "/node-a.key";
      server_cfg.ca_file = dir + "/ca.pem";
      client_cfg = server_cfg;
      client_cfg.cert_file = dir + "/node-b.pem";
      client_cfg.key_file = dir + "/node-b.key";
    } else {
      server_cfg.insecure = client_cfg.insecure = true;
    }
    auto sc = zcc::daemon::peer::LoadPeerCredentials(server_cfg);
    auto cc = zcc::daemon::peer::LoadPeerCredentials(client_cfg);
    if (!sc.ok() || !cc.ok()) {
      std::fprintf(stderr, "peer_bench: credentials: %s %s\n", sc.status().ToString().c_str(),
                   cc.status().ToString().c_str());
      return 1;
    }
    std::vector<double> push, pull, tcp;
    for (int round = 0; round < 3; ++round) {
      Server server(sc->server, uint64_t{piece} * pieces * 2);
      PeerClient client(absl::StrCat("127.0.0.1:", server.port), cc->channel);
      auto start = Clock::now();
      for (int p = 0; p < pieces; ++p) {
        const absl::Status st = client.Push(ReplicaKey{"bench", 0, 0, round, absl::StrCat("p", p)},
                                            bytes.data(), bytes.size(), absl::Minutes(5));
        if (!st.ok()) {
          std::fprintf(stderr, "peer_bench: push: %s\n", st.ToString().c_str());
          return 1;
        }
      }
      push.push_back(gb / Seconds(start, Clock::now()));
      if (tls) {
        start = Clock::now();
        for (int p = 0; p < pieces; ++p) {
          auto got = client.Pull(ReplicaKey{"bench", 0, 0, round, absl::StrCat("p", p)}, absl::Minutes(5));
          if (!got.ok() || got->size() != bytes.size()) {
            std::fprintf(stderr, "peer_bench: pull: %s\n", got.status().ToString().c_str());
            return 1;
          }
        }
        pull.push_back(gb / Seconds(start, Clock::now()));
      }
      tcp.push_back(gb / TcpSeconds(bytes, pieces));
    }
    const std::string what = absl::StrCat(" (", pieces, " x 64 MiB, loopback)");
    if (wanted(push_row)) {
      Emit({push_row + what, Median(push), Median(tcp), 0, tls ? ">= 0.8" : "", "GB/s"});
    }
    if (tls && wanted(pull_row)) {
      Emit({pull_row + what, Median(pull), Median(tcp), 0, ">= 0.8", "GB/s"});
    }
  }
  return 0;
}
