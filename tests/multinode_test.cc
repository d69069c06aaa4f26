// The peer tier across "nodes": zccds and trainers in network namespaces on
// one machine (tests/netns_cluster.h), each node with its own address, its
// own zccd (socket, shm prefix, node-local root) and the cluster's
// certificates for that address. A job with one rank per node tells its
// zccds the job's nodes; each learns its buddy, sees the others up, sees a
// partitioned node go down and come back, and a lost node stay down.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/netns_cluster.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

constexpr int kPeerPort = 7071;  // every node has its own network: one port for all

// Node i's line in `zccctl status` of another zccd contains all of `needles`
// within `timeout`.
bool StatusShows(const std::string& dir, const Daemon& d, const std::vector<std::string>& needles,
                 std::string* out) {
  return Eventually(
      [&] {
        *out = Zccctl(dir, d, {"status"}).second;
        for (const std::string& n : needles) {
          if (!absl::StrContains(*out, n)) return false;
        }
        return true;
      },
      absl::Seconds(40), absl::Milliseconds(200));
}

// Node i of `net` with its own zccd: certificates for the nodes' addresses
// (made once per test), a node-local root, its rack, and `flags` besides.
std::vector<std::unique_ptr<Daemon>> StartNodes(const NetnsCluster& net, const std::string& dir,
                                                const std::vector<std::string>& names,
                                                const std::vector<std::string>& racks,
                                                const std::vector<std::string>& flags = {}) {
  std::string certs_cmd = absl::StrCat(Runfile("tools/testing/make_test_certs.sh"), " ", dir,
                                       "/certs");
  for (size_t i = 0; i < names.size(); ++i) absl::StrAppend(&certs_cmd, " ", names[i], "=", net.ip(i));
  REQUIRE(RunCommand(certs_cmd).ok());
  const std::string certs = dir + "/certs/";
  std::vector<std::unique_ptr<Daemon>> zccds;
  for (size_t i = 0; i < names.size(); ++i) {
    DaemonOptions o;
    o.name = names[i];
    o.root = absl::StrCat(dir, "/", names[i], "-root");  // node-local
    o.wrapper = net.Exec(static_cast<int>(i));
    o.extra_flags = {absl::StrCat("--peer_listen=", net.ip(i), ":", kPeerPort),
                     "--peer_cert=" + certs + names[i] + ".pem",
                     "--peer_key=" + certs + names[i] + ".key", "--peer_ca=" + certs + "ca.pem",
                     "--node_name=" + names[i], "--failure_domain=" + racks[i]};
    for (const std::string& f : flags) o.extra_flags.push_back(f);
    zccds.push_back(std::make_unique<Daemon>(dir, o));
    REQUIRE(zccds.back()->Start());
  }
  return zccds;
}

TEST_CASE("three nodes in network namespaces: membership, buddies, a partition and a lost node") {
  auto made = NetnsCluster::Create(3);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  NetnsCluster& net = **made;
  const std::string dir = ShortTempDir("it-mn");
  std::vector<std::unique_ptr<Daemon>> zccds =
      StartNodes(net, dir, {"node-a", "node-b", "node-c"}, {"rack-1", "rack-2", "rack-1"});
  std::vector<std::string> addr;
  for (int i = 0; i < 3; ++i) addr.push_back(absl::StrCat(net.ip(i), ":", kPeerPort));

  // One rank per node; the ranks' collective over the bridge.
  const std::string collective = absl::StrCat(net.ip(0), ":7072");
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int r = 0; r < 3; ++r) {
    trainers.push_back(StartTrainer(
        *zccds[r], dir, absl::StrCat("rank", r),
        {"--job=mn", absl::StrCat("--rank=", r), "--world=3", "--steps=2", "--save_every=0",
         "--share_peers", "--collective=" + collective, "--linger_ms=120000"},
        net.Exec(r)));
  }
  for (int r = 0; r < 3; ++r) {
    INFO(trainers[r]->Output());
    REQUIRE(trainers[r]->WaitForOutput("peer_address=" + addr[r] + " buddies=", absl::Seconds(60)));
  }

  // node-a sees both others up, named from their answers over the bridge;
  // node-b (the only other rack) holds its replicas.
  const Daemon& a = *zccds[0];
  std::string out;
  CHECK(StatusShows(dir, a,
                    {addr[0] + "  ranks 0  this zccd",
                     addr[1] + " (node-b in rack-2)  ranks 1  up, seen",
                     addr[2] + " (node-c in rack-1)  ranks 2  up, seen"},
                    &out));
  INFO(out);
  CHECK(absl::StrContains(out, "ranks 1  up, seen"));
  std::string b_line = out.substr(out.find(addr[1] + " (node-b"));
  CHECK(absl::StrContains(b_line.substr(0, b_line.find('\n')), "[buddy]"));
  // node-b's buddy: the next node after it in address order, node-c (both
  // others are in another rack).
  CHECK(StatusShows(dir, *zccds[1],
                    {addr[0] + " (node-a in rack-1)  ranks 0  up",
                     addr[2] + " (node-c in rack-1)  ranks 2  up"},
                    &out));
  std::string c_line = out.substr(out.find(addr[2] + " (node-c"));
  CHECK(absl::StrContains(c_line.substr(0, c_line.find('\n')), "[buddy]"));
  std::string a_line = out.substr(out.find(addr[0] + " (node-a"));
  CHECK_FALSE(absl::StrContains(a_line.substr(0, a_line.find('\n')), "[buddy]"));

  // A partition: node-b's link down, then up again.
  REQUIRE(net.SetLink(1, false).ok());
  CHECK(StatusShows(dir, a, {addr[1] + " (node-b in rack-2)  ranks 1  DOWN, seen"}, &out));
  REQUIRE(net.SetLink(1, true).ok());
  CHECK(StatusShows(dir, a, {addr[1] + " (node-b in rack-2)  ranks 1  up, seen"}, &out));

  // node-c is lost: its trainer and zccd killed, its network gone.
  trainers[2]->Signal(SIGKILL);
  zccds[2]->Kill();
  REQUIRE(net.Remove(2).ok());
  CHECK(StatusShows(dir, a, {addr[2] + " (node-c in rack-1)  ranks 2  DOWN, seen"}, &out));

  for (auto& t : trainers) t->Signal(SIGKILL);
  CHECK(zccds[0]->Stop() == 0);
  CHECK(zccds[1]->Stop() == 0);
}

// Replication across the bridge while the trainers train: a partition of
// the buddy's link skips no snapshot, the lag grows and shows, and the
// replication catches up once the link is back.
TEST_CASE("two nodes replicate every step; a partition makes lag, not skipped snapshots") {
  auto made = NetnsCluster::Create(2);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  NetnsCluster& net = **made;
  const std::string dir = ShortTempDir("it-mnrep");
  std::vector<std::unique_ptr<Daemon>> zccds =
      StartNodes(net, dir, {"node-a", "node-b"}, {"rack-1", "rack-2"}, {"--replicate_every=1"});
  const std::string collective = absl::StrCat(net.ip(0), ":7072");
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int r = 0; r < 2; ++r) {
    // 300 steps of 100 ms: half a minute of training.
    trainers.push_back(StartTrainer(
        *zccds[r], dir, absl::StrCat("rank", r),
        {"--job=rep", absl::StrCat("--rank=", r), "--world=2", "--steps=300", "--step_ms=100",
         "--save_every=0", "--share_peers", "--collective=" + collective, "--linger_ms=60000"},
        net.Exec(r)));
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("buddies=", absl::Seconds(60)));
  const Daemon& a = *zccds[0];
  std::string out;
  // Replicating: node-a's steps reach node-b.
  REQUIRE(StatusShows(dir, a, {"replication: step ", "at every buddy"}, &out));
  REQUIRE(Eventually(
      [&] {
        out = Zccctl(dir, a, {"status"}).second;
        return absl::StrContains(out, "replication:") && !absl::StrContains(out, "step - at");
      },
      absl::Seconds(30)));
  // The partition: the buddy unreachable; the lag grows, and the push in
  // flight fails once keepalive finds the link dead.
  REQUIRE(net.SetLink(1, false).ok());
  CHECK(StatusShows(dir, a, {"lagging"}, &out));
  CHECK(StatusShows(dir, a, {"REPLICATION FAILING"}, &out));
  INFO(out);
  REQUIRE(net.SetLink(1, true).ok());
  // Training ends; the replication catches up with the newest step.
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(120)));
  CHECK(StatusShows(dir, a, {"replication: step 300 at every buddy, newest 300"}, &out));
  // No snapshot was skipped for it.
  for (auto& t : trainers) {
    const auto v = t->Values();
    CHECK(v.at("published") == "300");
    CHECK(v.at("skipped_no_slot") == "0");
    CHECK(v.at("skipped_disconnected") == "0");
  }
  for (auto& t : trainers) t->Signal(SIGKILL);
  CHECK(zccds[0]->Stop() == 0);
  CHECK(zccds[1]->Stop() == 0);
}

// The node-loss test of the issue, in namespaces: two nodes train with
// replication and no disk checkpoint; node B is lost whole (processes,
// node-local root, network); the job restarts with rank 1 on node C, which
// restores the replicated step from node A's memory, bit-exact.
TEST_CASE("a node lost whole: its rank restores on a replacement node from the peer tier") {
  auto made = NetnsCluster::Create(3);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  NetnsCluster& net = **made;
  const std::string dir = ShortTempDir("it-mnlost");
  std::vector<std::unique_ptr<Daemon>> zccds =
      StartNodes(net, dir, {"node-a", "node-b", "node-c"}, {"rack-1", "rack-2", "rack-2"},
                 {"--replicate_every=5"});
  auto job = [&](int rank, int node, const std::string& collective,
                 std::vector<std::string> more) {
    std::vector<std::string> flags = {"--job=lost", absl::StrCat("--rank=", rank), "--world=2",
                                      "--share_peers", "--collective=" + collective};
    for (auto& f : more) flags.push_back(std::move(f));
    return StartTrainer(*zccds[node], dir, absl::StrCat("rank", rank, "-node", node), flags,
                        net.Exec(node));
  };
  // 23 steps, replicated every 5, never written to disk.
  std::vector<std::unique_ptr<Subprocess>> trainers;
  const std::string collective = absl::StrCat(net.ip(0), ":7072");
  trainers.push_back(job(0, 0, collective, {"--steps=23", "--save_every=0", "--block",
                                            "--linger_ms=120000"}));
  trainers.push_back(job(1, 1, collective, {"--steps=23", "--save_every=0", "--block",
                                            "--linger_ms=120000"}));
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(90)));
  std::string out;
  for (int i : {0, 1}) {
    REQUIRE(StatusShows(dir, *zccds[i], {"replication: step 20 at every buddy"}, &out));
  }
  // Node B is lost whole; node A's trainer dies with the job.
  for (auto& t : trainers) {
    t->Signal(SIGKILL);
    REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  }
  zccds[1]->Kill();
  zccds[1].reset();
  std::filesystem::remove_all(dir + "/node-b-root");
  REQUIRE(net.Remove(1).ok());

  // The job restarts: rank 0 on node A, rank 1 on node C.
  const std::string again = absl::StrCat(net.ip(0), ":7073");
  std::vector<std::unique_ptr<Subprocess>> restarted;
  restarted.push_back(job(0, 0, again, {"--mode=restore", "--expect_step=20"}));
  restarted.push_back(job(1, 2, again, {"--mode=restore", "--expect_step=20"}));
  for (auto& t : restarted) {
    const std::optional<int> code = t->Wait(absl::Seconds(120));
    INFO(t->Output());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(absl::StrContains(t->Output(), "restored_step=20"));
    CHECK(absl::StrContains(t->Output(), "mismatched_tensors=0"));
  }
  CHECK(absl::StrContains(zccds[2]->Log(), "step 20 recovered from the peer tier"));
  CHECK(zccds[0]->Stop() == 0);
  CHECK(zccds[2]->Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
