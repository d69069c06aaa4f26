// zccd's peer service (DESIGN.md 5c) in real zccd processes: listeners with
// the operator's certificates (mutual TLS), pieces pushed and pulled back
// checked, a caller without the cluster's certificate refused, status and
// metrics showing what a zccd holds for others, and bad peer settings
// refused at start with the file or field named.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_credentials.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::string MakeCerts(const std::string& dir) {
  const std::string certs = dir + "/certs";
  const std::string cmd =
      absl::StrCat(Runfile("tools/testing/make_test_certs.sh"), " ", certs, " node-a node-b");
  REQUIRE(std::system(cmd.c_str()) == 0);
  return certs;
}

std::vector<std::string> PeerFlags(const std::string& certs, const std::string& node,
                                   const std::string& domain) {
  return {"--peer_listen=127.0.0.1:0",           "--peer_cert=" + certs + "/" + node + ".pem",
          "--peer_key=" + certs + "/" + node + ".key", "--peer_ca=" + certs + "/ca.pem",
          "--node_name=" + node,                  "--failure_domain=" + domain,
          "--replica_budget_mb=64",               "--metrics_listen=127.0.0.1:0"};
}

daemon::PeerConfig Identity(const std::string& certs, const std::string& node) {
  daemon::PeerConfig c;
  c.cert_file = certs + "/" + node + ".pem";
  c.key_file = certs + "/" + node + ".key";
  c.ca_file = certs + "/ca.pem";
  return c;
}

daemon::peer::PeerClient ClientTo(int port, const daemon::PeerConfig& as) {
  auto creds = daemon::peer::LoadPeerCredentials(as);
  REQUIRE(creds.ok());
  return daemon::peer::PeerClient(absl::StrCat("127.0.0.1:", port), creds->channel);
}

TEST_CASE("two zccds with the cluster's certificates hold each other's pieces") {
  const std::string dir = ShortTempDir("it-peer");
  const std::string certs = MakeCerts(dir);
  Daemon a(dir, {PeerFlags(certs, "node-a", "rack-1"), "", "zccd-a"});
  Daemon b(dir, {PeerFlags(certs, "node-b", "rack-2"), "", "zccd-b"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  const int port_a = PortFromLog(a, kPort);
  const int port_b = PortFromLog(b, kPort);
  REQUIRE(port_a > 0);
  REQUIRE(port_b > 0);

  // node-b's identity talks to zccd A, and node-a's to zccd B.
  auto to_a = ClientTo(port_a, Identity(certs, "node-b"));
  auto to_b = ClientTo(port_b, Identity(certs, "node-a"));
  auto hello = to_a.Hello("node-b", "rack-2", kTimeout);
  REQUIRE(hello.ok());
  CHECK(hello->node() == "node-a");
  CHECK(hello->failure_domain() == "rack-1");
  CHECK(hello->replica_budget_bytes() == 64ull << 20);

  std::string bytes(5 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + (i >> 13));
  const daemon::peer::ReplicaKey key{"itest", 1000, 2, 20, "model.w"};
  REQUIRE(to_a.Push(key, bytes.data(), bytes.size(), kTimeout).ok());
  REQUIRE(to_b.Push(key, bytes.data(), 1000, kTimeout).ok());
  auto back = to_a.Pull(key, kTimeout);
  REQUIRE(back.ok());
  CHECK(*back == bytes);

  // Status and metrics say what each holds for others.
  auto [code, out] = Zccctl(dir, a, {"status"});
  INFO(out);
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "peer service: node node-a in rack-1, port " +
                                   std::to_string(port_a) + " (mutual TLS)"));
  CHECK(absl::StrContains(out, "1 piece(s), 0.01 of 0.07 GB"));
  const int metrics_a = PortFromLog(a, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  CHECK(MetricValue(metrics_a, "zcc_peer_replica_bytes") == static_cast<double>(bytes.size()));
  const int metrics_b = PortFromLog(b, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  CHECK(MetricValue(metrics_b, "zcc_peer_replica_bytes") == 1000);

  // Without the cluster's certificate: nothing in, nothing out.
  auto rogue = ClientTo(port_a, Identity(certs, "rogue"));
  CHECK_FALSE(rogue.Hello("rogue", "", kTimeout).ok());
  CHECK_FALSE(rogue.Pull(key, kTimeout).ok());
  CHECK_FALSE(rogue.Push(daemon::peer::ReplicaKey{"itest", 1000, 2, 21, "model.w"}, "x", 1,
                         kTimeout).ok());
  // A piece is served for its own uid only.
  daemon::peer::ReplicaKey other_uid = key;
  other_uid.uid = 1001;
  CHECK(to_a.Pull(other_uid, kTimeout).status().code() == absl::StatusCode::kNotFound);
  CHECK(MetricValue(metrics_a, "zcc_peer_replica_bytes") == static_cast<double>(bytes.size()));

  CHECK(a.Stop() == 0);
  CHECK(b.Stop() == 0);
}

TEST_CASE("zccd refuses peer settings it cannot serve, naming what is wrong") {
  const std::string dir = ShortTempDir("it-peerbad");
  const std::string certs = MakeCerts(dir);
  SECTION("a certificate file that is not there") {
    Daemon d(dir, {{"--peer_listen=127.0.0.1:0", "--peer_cert=" + certs + "/missing.pem",
                    "--peer_key=" + certs + "/node-a.key", "--peer_ca=" + certs + "/ca.pem"}});
    CHECK_FALSE(d.Start());
    CHECK(absl::StrContains(d.Log(), certs + "/missing.pem"));
  }
  SECTION("a listener with neither certificates nor insecure") {
    Daemon d(dir, {{"--peer_listen=127.0.0.1:0"}});
    CHECK_FALSE(d.Start());
    CHECK(absl::StrContains(d.Log(), "peer.listen: needs cert_file, key_file and ca_file"));
  }
  SECTION("plaintext only where asked for, and said so") {
    Daemon d(dir, {{"--peer_listen=127.0.0.1:0", "--peer_insecure"}});
    REQUIRE(d.Start());
    CHECK(PortFromLog(d, R"(peer service on \S+ \(port (\d+), PLAINTEXT)") > 0);
    CHECK(d.Stop() == 0);
  }
}

}  // namespace
}  // namespace zcc::testing
