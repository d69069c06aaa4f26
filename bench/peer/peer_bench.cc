// The peer tier's transport: pieces pushed to and pulled from another zccd's
// Peer service (gRPC, mutual TLS, every piece checked by XXH3 on both ends),
// against a plain TCP stream of the same bytes over the same link, in the
// same run.
//
// Between two network namespaces where it can make them (root and iproute2,
// as the multi-node tests): two nodes joined by veth pairs to a bridge. The
// far end is this binary again, run in node 1 (`--serve=IP`: the service
// as zccd serves it, its PeerListener over a ReplicaStore, with TLS and without,
// and a TCP sink); this process moves into node 0 and pushes and pulls.
// Elsewhere (or with --loopback) both ends live in this process over
// loopback. The row's name says which. On a cluster the two ends are two
// nodes and the link is the network.
//
// Rows (GB/s; ratio = peer / TCP, target >= 0.8 for TLS):
//   peer_push_tls_vs_tcp, peer_pull_tls_vs_tcp: 16 pieces of 64 MiB (--quick: 4)
//   peer_push_plaintext_vs_tcp: the same push without TLS (peer.insecure),
//     which shows what TLS costs and what gRPC does.
// Median of 3 rounds, each round's TCP reference run right after its pushes.
//
// Environment: ZCC_BENCH_DIR (certificates are made there with
// tools/testing/make_test_certs.sh, run from the repository root).
// Flags: --quick, --only=PATTERN, --loopback, --streams=N (N pushes, or
// pulls, at a time, each on a connection of its own; default: as zccd
// sends a step's files, Replicator::Options::push_connections).
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/peer/tcp_stream.h"
#include "bench/report.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_listener.h"
#include "daemon/peer/replica_store.h"
#include "daemon/peer/replicator.h"
#include "tests/netns_cluster.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;
using daemon::PeerConfig;
using daemon::peer::PeerClient;
using daemon::peer::ReplicaKey;

// The far end's ports in its own namespace.
constexpr int kTlsPort = 7701;
constexpr int kPlaintextPort = 7702;
constexpr int kTcpPort = 7703;
constexpr size_t kPiece = size_t{64} << 20;
constexpr int kRounds = 3;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The certificates of both ends: node-a serves (with `server_ip` in its
// names when it lives in a namespace), node-b pushes and pulls.
PeerConfig Credentials(const std::string& dir, bool tls, bool server) {
  PeerConfig cfg;
  if (!tls) {
    cfg.insecure = true;
    return cfg;
  }
  const std::string node = server ? "node-a" : "node-b";
  cfg.cert_file = absl::StrCat(dir, "/", node, ".pem");
  cfg.key_file = absl::StrCat(dir, "/", node, ".key");
  cfg.ca_file = dir + "/ca.pem";
  return cfg;
}

// The far end's service, as zccd serves it (its PeerListener) over a
// replica store of its own.
struct Server {
  daemon::peer::ReplicaStore store;
  std::unique_ptr<daemon::peer::PeerListener> listener;
  // Listening on `address`, or null `listener` (the error printed).
  Server(PeerConfig config, uint64_t budget, const std::string& address) : store(budget) {
    config.listen = address;
    config.node_name = "bench";
    auto started = daemon::peer::PeerListener::Start(config, &store);
    if (!started.ok()) {
      std::fprintf(stderr, "peer_bench: %s\n", started.status().ToString().c_str());
      return;
    }
    listener = *std::move(started);
  }
  int port() const { return listener->port(); }
};

// --serve=IP: the far end in its namespace, until its stdin closes.
int ServeFarEnd(const std::string& ip, const std::string& dir, uint64_t budget) {
  Server tls_server(Credentials(dir, true, true), budget, absl::StrCat(ip, ":", kTlsPort));
  Server plain_server(Credentials(dir, false, true), budget, absl::StrCat(ip, ":", kPlaintextPort));
  if (tls_server.listener == nullptr || plain_server.listener == nullptr) {
    std::fprintf(stderr, "peer_bench far end: cannot serve on %s\n", ip.c_str());
    return 1;
  }
  TcpSink sink(ip, kTcpPort, kPiece);
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}

// The far end as a child process in a namespace: started with `argv`,
// ready once it says so; stopped by closing its stdin.
class FarEnd {
 public:
  static std::unique_ptr<FarEnd> Start(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return nullptr;
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return nullptr;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::perror("peer_bench: exec far end");
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    std::unique_ptr<FarEnd> far(new FarEnd(pid, in[1]));
    std::string said;
    char c;
    while (said.find("ready\n") == std::string::npos && ::read(out[0], &c, 1) == 1) said += c;
    ::close(out[0]);
    if (said.find("ready\n") == std::string::npos) return nullptr;  // (reaped by the destructor)
    return far;
  }
  ~FarEnd() {
    ::close(stdin_);
    int status;
    ::waitpid(pid_, &status, 0);
  }

 private:
  FarEnd(pid_t pid, int stdin_fd) : pid_(pid), stdin_(stdin_fd) {}
  pid_t pid_;
  int stdin_;
};

// This thread (and every thread started after) into namespace `ns`.
bool EnterNamespace(const std::string& ns) {
  const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "";
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  std::string only, serve;
  bool loopback = false;
  // As zccd sends a step's files to a buddy (Replicator::Options).
  int streams = zcc::daemon::peer::Replicator::Options{}.push_connections;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
    if (std::strncmp(argv[i], "--serve=", 8) == 0) serve = argv[i] + 8;
    if (std::strcmp(argv[i], "--loopback") == 0) loopback = true;
    if (std::strncmp(argv[i], "--streams=", 10) == 0) streams = std::max(1, std::atoi(argv[i] + 10));
  }
  auto wanted = [&](const std::string& row) { return only.empty() || std::regex_search(row, std::regex(only)); };
  const int pieces = quick ? 4 : 16;
  // Every round's pieces held (none may give way: each round's step is
  // whole and the newest when it arrives).
  const uint64_t budget = uint64_t{kPiece} * pieces * kRounds;
  const char* dir_env = std::getenv("ZCC_BENCH_DIR");
  const std::string dir = absl::StrCat(dir_env != nullptr ? dir_env : "/tmp", "/peer_bench_certs");
  if (!serve.empty()) return ServeFarEnd(serve, dir, budget);

  // Two nodes where namespaces can be made, else loopback.
  std::unique_ptr<zcc::testing::NetnsCluster> cluster;
  if (!loopback) {
    auto made = zcc::testing::NetnsCluster::Create(2);
    if (made.ok()) {
      cluster = std::move(*made);
    } else {
      std::fprintf(stderr, "peer_bench: no namespaces (%s); both ends over loopback\n",
                   made.status().ToString().c_str());
    }
  }
  const std::string far_ip = cluster != nullptr ? cluster->ip(1) : "127.0.0.1";
  if (std::system(absl::StrCat("tools/testing/make_test_certs.sh ", dir, " node-a",
                               cluster != nullptr ? "=" + far_ip : "", " node-b")
                      .c_str()) != 0) {
    std::fprintf(stderr, "peer_bench: cannot make certificates (run from the repository root)\n");
    return 1;
  }
  std::unique_ptr<FarEnd> far;
  if (cluster != nullptr) {
    std::vector<std::string> args = cluster->Exec(1);
    args.insert(args.end(), {SelfPath(), "--serve=" + far_ip});
    if (quick) args.push_back("--quick");
    far = FarEnd::Start(args);
    if (far == nullptr || !EnterNamespace(cluster->ns(0))) {
      std::fprintf(stderr, "peer_bench: the far end in %s did not start\n", cluster->ns(1).c_str());
      return 1;
    }
  }
  const std::string link = cluster != nullptr ? "between namespaces" : "loopback";

  std::string bytes(kPiece, '\0');
  for (size_t i = 0; i < kPiece; ++i) bytes[i] = static_cast<char>(i * 2654435761u >> 13);
  const double gb = static_cast<double>(kPiece) * pieces / 1e9;

  for (bool tls : {true, false}) {
    const std::string push_row = tls ? "peer_push_tls_vs_tcp" : "peer_push_plaintext_vs_tcp";
    const std::string pull_row = "peer_pull_tls_vs_tcp";
    if (!wanted(push_row) && !(tls && wanted(pull_row))) continue;
    auto cc = zcc::daemon::peer::LoadPeerCredentials(Credentials(dir, tls, false));
    if (!cc.ok()) {
      std::fprintf(stderr, "peer_bench: credentials: %s\n", cc.status().ToString().c_str());
      return 1;
    }
    std::vector<double> push, pull, tcp;
    for (int round = 0; round < kRounds; ++round) {
      // Over loopback a server of this process, a fresh one each round.
      std::unique_ptr<Server> local;
      std::string target = absl::StrCat(far_ip, ":", tls ? kTlsPort : kPlaintextPort);
      if (cluster == nullptr) {
        local = std::make_unique<Server>(Credentials(dir, tls, true), budget, "127.0.0.1:0");
        if (local->listener == nullptr) return 1;
        target = absl::StrCat("127.0.0.1:", local->port());
      }
      PeerClient client(target, cc->channel);
      // With --streams=N, N pushes at a time, each on a connection of its own.
      std::vector<std::unique_ptr<PeerClient>> clients;
      for (int s = 1; s < streams; ++s) {
        clients.push_back(std::make_unique<PeerClient>(target, cc->channel, s));
      }
      // Piece p goes on stream p % streams; each stream's calls one after
      // the other. False when a call failed (said on stderr).
      auto side_by_side = [&](bool pulls) {
        std::atomic<bool> failed{false};
        auto calls = [&](PeerClient* c, int first) {
          for (int p = first; p < pieces && !failed; p += streams) {
            const ReplicaKey key{"bench", 0, 0, round, absl::StrCat("p", p)};
            absl::Status st;
            if (pulls) {
              auto got = c->Pull(key, absl::Minutes(5));
              st = !got.ok() ? got.status()
                   : got->size() != bytes.size() ? absl::DataLossError("short piece")
                                                 : absl::OkStatus();
            } else {
              st = c->Push(key, bytes.data(), bytes.size(), absl::Minutes(5));
            }
            if (!st.ok()) {
              std::fprintf(stderr, "peer_bench: %s %s: %s\n", pulls ? "pull from" : "push to",
                           target.c_str(), st.ToString().c_str());
              failed = true;
            }
          }
        };
        std::vector<std::thread> threads;
        for (int s = 1; s < streams; ++s) threads.emplace_back(calls, clients[s - 1].get(), s);
        calls(&client, 0);
        for (std::thread& t : threads) t.join();
        return !failed;
      };
      auto start = Clock::now();
      if (!side_by_side(/*pulls=*/false)) return 1;
      push.push_back(gb / Seconds(start, Clock::now()));
      if (tls) {
        start = Clock::now();
        if (!side_by_side(/*pulls=*/true)) return 1;
        pull.push_back(gb / Seconds(start, Clock::now()));
      }
      tcp.push_back(gb / (cluster != nullptr ? TcpSendSeconds(far_ip, kTcpPort, bytes, pieces)
                                             : TcpSeconds(bytes, pieces)));
    }
    const std::string what = absl::StrCat(" (", pieces, " x 64 MiB, ", link,
                                          ", ", streams, " at a time)");
    if (wanted(push_row)) {
      Emit({push_row + what, Median(push), Median(tcp), 0, tls ? ">= 0.8" : "", "GB/s"});
    }
    if (tls && wanted(pull_row)) {
      Emit({pull_row + what, Median(pull), Median(tcp), 0, ">= 0.8", "GB/s"});
    }
  }
  return 0;
}
