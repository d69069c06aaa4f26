// zccd's peer service (DESIGN.md 5c) in real zccd processes: listeners with
// the operator's certificates (mutual TLS), pieces pushed and pulled back
// checked, a caller without the cluster's certificate refused, status and
// metrics showing what a zccd holds for others, lost nodes' ranks restored
// from the tier (a holder whose memory damaged its copy refused by
// checksum; a job that went back, never from the run it left), replicas
// within the node's staging budget, and bad peer
// settings refused at start with the file or field named.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/reader.h"
#include "common/testing/eventually.h"
#include "common/testing/free_port.h"
#include "common/testing/temp_dir.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_credentials.h"
#include "tests/process_harness.h"
#include "tests/test_model.h"

namespace zcc::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);
// What replication may take: its serialization, pushes and listings run at
// idle priority, and where other work fills every core (other tests beside
// this one) they wait for a free one; a run that once passed 30 s here
// without a push was that, not a stall.
constexpr absl::Duration kReplicationWait = absl::Seconds(120);

std::string MakeCerts(const std::string& dir, const std::string& nodes = "node-a node-b node-c") {
  const std::string certs = dir + "/certs";
  const std::string cmd =
      absl::StrCat(Runfile("tools/testing/make_test_certs.sh"), " ", certs, " ", nodes);
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

// PeerFlags, each rank's every second step replicated.
std::vector<std::string> ReplicatingPeerFlags(const std::string& certs, const std::string& node,
                                              const std::string& domain) {
  std::vector<std::string> f = PeerFlags(certs, node, domain);
  f.push_back("--replicate_every=2");
  return f;
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

// Damages memory in place, as a bad DIMM or a stray write would: flips one
// byte in every copy of `pattern` in the private writable memory of process
// `pid` (stopped meanwhile), through /proc/PID/mem. Returns how many copies
// it damaged.
int DamageCopiesInMemory(pid_t pid, const std::string& pattern) {
  REQUIRE(pattern.size() >= 16);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  absl::Cleanup resume = [pid] { ::kill(pid, SIGCONT); };
  REQUIRE(zcc::testing::Eventually(
      [pid] {  // stopped: state 'T' after the command's closing parenthesis
        std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
        const std::string line((std::istreambuf_iterator<char>(stat)), {});
        const size_t paren = line.rfind(')');
        return paren != std::string::npos && line.compare(paren, 3, ") T") == 0;
      },
      absl::Seconds(10)));
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  const int mem = ::open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(mem >= 0);
  absl::Cleanup close_mem = [mem] { ::close(mem); };
  constexpr uint64_t kChunk = uint64_t{64} << 20;
  int damaged = 0;
  std::string line;
  std::string buf;
  while (std::getline(maps, line)) {
    unsigned long begin = 0, end = 0;  // NOLINT(runtime/int): sscanf's %lx
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, perms) != 3) continue;
    if (std::string(perms) != "rw-p") continue;  // heap, anonymous memory, stacks
    for (uint64_t at = begin; at < end;) {
      const size_t wanted = std::min<uint64_t>(end - at, kChunk);
      buf.resize(wanted);
      const ssize_t got = ::pread(mem, buf.data(), buf.size(), static_cast<off_t>(at));
      if (got <= 0) break;
      buf.resize(static_cast<size_t>(got));
      for (size_t pos = buf.find(pattern); pos != std::string::npos;
           pos = buf.find(pattern, pos + 1)) {
        const uint64_t where = at + pos + pattern.size() / 2;
        const char flipped = static_cast<char>(buf[pos + pattern.size() / 2] ^ 0x5a);
        REQUIRE(::pwrite(mem, &flipped, 1, static_cast<off_t>(where)) == 1);
        ++damaged;
      }
      // (A short read: the rest of the region cannot be read.)
      if (at + buf.size() >= end || buf.size() < wanted) break;
      at += buf.size() - (pattern.size() - 1);  // a copy across the chunks' edge is found too
    }
  }
  return damaged;
}

// 64 bytes from the middle of tensor `name` of the plain test model's rank
// `rank` at `step`, as every copy of its shard file holds them.
std::string TensorBytes(int rank, int world, const std::string& name, int64_t step) {
  for (const ModelTensor& t : BuildModel("plain", rank, world, 6, 256)) {
    if (t.name != name) continue;
    std::string bytes(t.nbytes, '\0');
    FillTensor(t, step, reinterpret_cast<uint8_t*>(bytes.data()));
    return bytes.substr(bytes.size() / 2, 64);
  }
  FAIL("no tensor " << name);
  return "";
}

// Waits until each of `zccds` says its ranks' step `step` is at every buddy.
void AwaitReplicated(const std::string& dir, std::initializer_list<Daemon*> zccds, int step) {
  const std::string want = absl::StrCat("replication: step ", step, " at every buddy");
  for (Daemon* d : zccds) {
    REQUIRE(zcc::testing::Eventually(
        [&] { return absl::StrContains(Zccctl(dir, *d, {"status"}).second, want); },
        kReplicationWait));
  }
}

// Two ranks of `job`, rank i on on[i], sharing a collective and reporting
// their nodes: steps to 12, step 5 committed, a step every 1.5 s; paused
// after step 9, which on SIGUSR1 goes back to step 5 ("went_back_to=5")
// and trains on.
std::vector<std::unique_ptr<Subprocess>> StartGoingBack(const std::string& dir,
                                                        const std::string& job,
                                                        std::initializer_list<Daemon*> on) {
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  int rank = 0;
  for (Daemon* d : on) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("train", rank),
        {"--job=" + job, absl::StrCat("--rank=", rank),
         absl::StrCat("--world=", on.size()), "--steps=12",
         "--save_every=5", "--share_peers", "--collective=" + collective, "--linger_ms=60000",
         "--pause_at=9", "--go_back_at=9", "--go_back_to=5", "--step_ms=1500"}));
    ++rank;
  }
  return trainers;
}

// SIGKILLs the trainers and reaps them (gone for their zccds too).
void KillAll(const std::vector<std::unique_ptr<Subprocess>>& trainers) {
  for (const auto& t : trainers) {
    t->Signal(SIGKILL);
    REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  }
}

// Restarts job `job`'s ranks (world = on.size()), rank r on on[r], in
// restore mode, and checks that every rank restores `step` with every
// tensor equal to what it trained; `log` is shown when one fails.
void RestoreOn(const std::string& dir, const std::string& job, const std::vector<Daemon*>& on,
               int step, Daemon& log) {
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> restarted;
  for (size_t rank = 0; rank < on.size(); ++rank) {
    restarted.push_back(StartTrainer(
        *on[rank], dir, absl::StrCat("restore", rank),
        {"--job=" + job, absl::StrCat("--rank=", rank), absl::StrCat("--world=", on.size()),
         "--mode=restore", "--share_peers", "--collective=" + collective,
         absl::StrCat("--expect_step=", step)}));
  }
  for (auto& t : restarted) {
    const std::optional<int> code = t->Wait(absl::Seconds(120));
    INFO(t->Output());
    INFO(log.Log());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(absl::StrContains(t->Output(), absl::StrCat("restored_step=", step)));
    CHECK(absl::StrContains(t->Output(), "mismatched_tensors=0"));
  }
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
  CHECK(absl::StrContains(out, "1 piece(s), 0.01 of 0.07 GB: 1 piece(s), 0.01 GB held for other "
                                "nodes, 0 piece(s), 0.00 GB this node's own"));
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

TEST_CASE("a job's trainers tell their zccds the job's nodes; each knows its buddy and who is up") {
  const std::string dir = ShortTempDir("it-peerjob");
  const std::string certs = MakeCerts(dir);
  // Three "nodes" sharing one checkpoint root; node-a and node-c in rack-1.
  const std::string root = dir + "/ckpt";
  Daemon a(dir, {PeerFlags(certs, "node-a", "rack-1"), root, "zccd-a"});
  Daemon b(dir, {PeerFlags(certs, "node-b", "rack-2"), root, "zccd-b"});
  Daemon c(dir, {PeerFlags(certs, "node-c", "rack-1"), root, "zccd-c"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  REQUIRE(c.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  const std::string addr_a = absl::StrCat("127.0.0.1:", PortFromLog(a, kPort));
  const std::string addr_b = absl::StrCat("127.0.0.1:", PortFromLog(b, kPort));
  const std::string addr_c = absl::StrCat("127.0.0.1:", PortFromLog(c, kPort));

  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  int rank = 0;
  for (Daemon* d : {&a, &b, &c}) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("rank", rank),
        {"--job=peers", absl::StrCat("--rank=", rank), "--world=3", "--steps=2", "--save_every=0",
         "--share_peers", "--collective=" + collective, "--linger_ms=60000"}));
    ++rank;
  }
  const std::string want[] = {addr_a, addr_b, addr_c};
  for (int r = 0; r < 3; ++r) {
    REQUIRE(trainers[r]->WaitForOutput("peer_address=" + want[r] + " buddies=", absl::Seconds(60)));
  }

  // Once A has heard from every peer: node-b is its buddy (the only node in
  // another rack), node-c is up, both named from their own answers.
  std::string out;
  auto status_shows = [&](const std::vector<std::string>& needles) {
    return zcc::testing::Eventually(
        [&] {
          out = Zccctl(dir, a, {"status"}).second;
          for (const std::string& n : needles) {
            if (!absl::StrContains(out, n)) return false;
          }
          return true;
        },
        kReplicationWait);
  };
  CHECK(status_shows({"peers:", addr_a + "  ranks 0  this zccd",
                      addr_b + " (node-b in rack-2)  ranks 1  up", addr_c + " (node-c in rack-1)  ranks 2  up"}));
  INFO(out);
  CHECK(absl::StrContains(out, "ranks 1  up, seen"));
  std::string line_b = out.substr(out.find(addr_b + " (node-b"));
  line_b = line_b.substr(0, line_b.find('\n'));
  CHECK(absl::StrContains(line_b, "[buddy]"));
  std::string line_c = out.substr(out.find(addr_c + " (node-c"));
  line_c = line_c.substr(0, line_c.find('\n'));
  CHECK_FALSE(absl::StrContains(line_c, "[buddy]"));

  // Node B is lost: A sees it down, and says since when it last answered.
  b.Kill();
  CHECK(status_shows({addr_b + " (node-b in rack-2)  ranks 1  DOWN, seen"}));
  for (auto& t : trainers) t->Signal(SIGKILL);
  CHECK(a.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("each rank's steps reach its buddy byte for byte, as a disk write makes them") {
  const std::string dir = ShortTempDir("it-peerrep");
  const std::string certs = MakeCerts(dir);
  const std::string root = dir + "/ckpt";  // shared, so that the steps commit
  Daemon a(dir, {ReplicatingPeerFlags(certs, "node-a", "rack-1"), root, "zccd-a"});
  Daemon b(dir, {ReplicatingPeerFlags(certs, "node-b", "rack-2"), root, "zccd-b"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  const int port_a = PortFromLog(a, kPort);
  const int port_b = PortFromLog(b, kPort);
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  int rank = 0;
  for (Daemon* d : {&a, &b}) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("rank", rank),
        {"--job=rep", absl::StrCat("--rank=", rank), "--world=2", "--steps=6", "--save_every=3",
         "--block", "--share_peers", "--collective=" + collective, "--linger_ms=60000"}));
    ++rank;
  }
  // Steps 2, 4 and 6 are replicated (6 surely: the newest); 3 and 6 written
  // to disk and committed.
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  REQUIRE(WaitForPath(root + "/rep/step-00000006/COMMITTED", absl::Seconds(60)));
  std::string out;
  REQUIRE(zcc::testing::Eventually(
      [&] {
        out = Zccctl(dir, a, {"status"}).second;
        return absl::StrContains(out, "replication: step 6 at every buddy, newest 6");
      },
      kReplicationWait));
  // The job's pin leader (the lower address) asked the other what it holds
  // after its own push and when the other nudged it after its push, and sent
  // it the pin: both know both ranks' step 6 whole in the tier.
  std::string out_b;
  CHECK(zcc::testing::Eventually(
      [&] {
        out = Zccctl(dir, a, {"status"}).second;
        out_b = Zccctl(dir, b, {"status"}).second;
        return absl::StrContains(out, "memory tier: step 6 whole") &&
               absl::StrContains(out_b, "memory tier: step 6 whole");
      },
      kReplicationWait));
  // One of them leads (the lower address, once each sees the other up): it
  // asked, and told the other, which took the pin from it (logged once the
  // call returns: maybe after the other's status shows it).
  CHECK(zcc::testing::Eventually(
      [&] {
        const std::string logs = a.Log() + b.Log();
        return absl::StrContains(logs, "step 6 pinned at 1 of 1 other zccd(s)") &&
               absl::StrContains(logs, "as the job's pin leader found");
      },
      kReplicationWait));

  // What node-b holds for rank 0 (pulled with node-a's certificate), and
  // what node-a holds for rank 1: the very files of the committed step 6.
  for (auto [port, as, owner, owner_zccd] :
       {std::tuple<int, const char*, uint32_t, Daemon*>{port_b, "node-a", 0, &a},
        {port_a, "node-b", 1, &b}}) {
    auto peer = ClientTo(port, Identity(certs, as));
    auto listed = peer.List("rep", ::getuid(), kTimeout);
    REQUIRE(listed.ok());
    int files = 0;
    for (const daemon::peer::ReplicaInfo& info : *listed) {
      if (info.key.rank != owner || info.key.step != 6) continue;
      auto pulled = peer.Pull(info.key, kTimeout);
      REQUIRE(pulled.ok());
      const std::string on_disk = root + "/rep/step-00000006/" + info.key.piece;
      std::string want;
      {
        std::FILE* f = std::fopen(on_disk.c_str(), "rb");
        INFO(on_disk);
        REQUIRE(f != nullptr);
        char buf[1 << 16];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) want.append(buf, n);
        std::fclose(f);
      }
      CHECK(*pulled == want);
      ++files;
    }
    // The shards and the manifest at least.
    CHECK(files >= 2);
    // Only every 2nd step is replicated (a step still waiting when a newer
    // one comes is replaced by it, so 2 and 4 may or may not be held), or
    // the snapshot after one left out while the previous one serialized,
    // in its place (the owner's zccd says so).
    // (A zccd lists the copies it keeps of its own ranks' steps too: that
    // rank's zccd says so.)
    for (const auto& info : *listed) {
      INFO(info.key.piece << " of rank " << info.key.rank << ", step " << info.key.step);
      if (info.key.step % 2 == 0) continue;
      const Daemon* rank_zccd = info.key.rank == owner ? owner_zccd : (owner == 0 ? &b : &a);
      CHECK_THAT(rank_zccd->Log(),
                 Catch::Contains(absl::StrCat("rank ", info.key.rank, ": step ", info.key.step,
                                              " replicated in place of step ",
                                              info.key.step - 1, ", left out")));
    }
  }
  // Prometheus: the bytes pushed, no lag once step 6 is everywhere, the buddy up.
  const int metrics_a = PortFromLog(a, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  const char* kUp = R"(zcc_peers{state="up"})";
  const char* kDown = R"(zcc_peers{state="down"})";
  CHECK(MetricValue(metrics_a, "zcc_replication_bytes_sent_total") > 1000);
  CHECK(zcc::testing::Eventually(
      [&] {
        return MetricValue(metrics_a, "zcc_replication_lag_steps") == 0 &&
               MetricValue(metrics_a, "zcc_replication_lag_seconds") == 0 &&
               MetricValue(metrics_a, kUp) == 1 && MetricValue(metrics_a, kDown) == 0;
      },
      absl::Seconds(15)));
  for (auto& t : trainers) t->Signal(SIGKILL);
  CHECK(b.Stop() == 0);
  // The buddy gone: down at the next probe.
  CHECK(zcc::testing::Eventually(
      [&] { return MetricValue(metrics_a, kUp) == 0 && MetricValue(metrics_a, kDown) == 1; },
      absl::Seconds(20)));
  CHECK(a.Stop() == 0);
}

TEST_CASE("a lost node's rank restores the peer tier's newest step on a replacement node") {
  const std::string dir = ShortTempDir("it-peerlost");
  const std::string certs = MakeCerts(dir);
  // Node-local roots: no disk checkpoint at all (save_every 0).
  Daemon a(dir, {ReplicatingPeerFlags(certs, "node-a", "rack-1"), dir + "/a-root", "zccd-a"});
  auto b = std::make_unique<Daemon>(dir, DaemonOptions{ReplicatingPeerFlags(certs, "node-b", "rack-2"), dir + "/b-root",
                                                       "zccd-b"});
  Daemon c(dir, {ReplicatingPeerFlags(certs, "node-c", "rack-1"), dir + "/c-root", "zccd-c"});
  REQUIRE(a.Start());
  REQUIRE(b->Start());
  REQUIRE(c.Start());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  int rank = 0;
  for (Daemon* d : {&a, b.get()}) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("train", rank),
        {"--job=lost", absl::StrCat("--rank=", rank), "--world=2", "--steps=5", "--save_every=0",
         "--block", "--share_peers", "--collective=" + collective, "--linger_ms=60000",
         // Step 2's replication (the first: connections and TLS handshakes)
         // done before step 4 is due: replication never waits for itself and
         // leaves a step out instead, which under a loaded machine's 1.5 s
         // for step 2 left step 4 out and failed this test once.
         "--step_ms=1500"}));
    ++rank;
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  AwaitReplicated(dir, {&a, b.get()}, 4);
  // Node B is lost with everything on it; the job is restarted with rank 1
  // on node C, which has nothing.
  KillAll(trainers);
  b->Kill();
  b.reset();
  std::filesystem::remove_all(dir + "/b-root");
  RestoreOn(dir, "lost", {&a, &c}, 4, c);
  // Listed at once, as the restores saw it, the newest: in place until it
  // is written (then from the disk, written before it stops being shown).
  const std::string listed = Zccctl(dir, a, {"list", "lost"}).second;
  INFO(listed);
  CHECK(absl::StrContains(listed, "step-00000004  (latest)"));
  CHECK((absl::StrContains(listed, "(latest)  [peer tier, in memory]") ||
         std::filesystem::exists(dir + "/a-root/lost/step-00000004/COMMITTED")));
  // Read in place (straight from the tier into the ranks' staging memory);
  // behind the restores, rank 0's zccd (node A, whose root has no step
  // either) writes it into its root and commits it there, node C only
  // stops showing it.
  CHECK(absl::StrContains(c.Log(), "step 4 recovered from the peer tier, read in place"));
  CHECK(zcc::testing::Eventually(
      [&] { return absl::StrContains(a.Log(), "step 4 of the peer tier written into"); },
      absl::Seconds(60)));
  CHECK(std::filesystem::exists(dir + "/a-root/lost/step-00000004/COMMITTED"));
  CHECK(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(c.Log(), "step 4 of the peer tier read in place here; rank 0's");
      },
      absl::Seconds(60)));
  CHECK_FALSE(std::filesystem::exists(dir + "/c-root/lost/step-00000004"));
  CHECK(a.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("the job's newest step whole in the tier outlives newer steps of one rank under a "
          "tight replica budget, and a lost node's rank restores it") {
  const std::string dir = ShortTempDir("it-peerpin");
  const std::string certs = MakeCerts(dir);
  // A rank's step is 2.4 MB; 8 MiB at each zccd hold three. Node a holds
  // rank 1's step 2 and its own copies of rank 0's steps 2 (pinned: the
  // job's newest whole step, rank 1 going no further) and 4; no newer own
  // copy fits beside them, and none may push step 2 out.
  auto flags = [&](const std::string& node, const std::string& rack) {
    std::vector<std::string> f = ReplicatingPeerFlags(certs, node, rack);
    f.push_back("--replica_budget_mb=8");
    return f;
  };
  Daemon a(dir, {flags("node-a", "rack-1"), dir + "/a-root", "zccd-a"});
  Daemon b(dir, {flags("node-b", "rack-2"), dir + "/b-root", "zccd-b"});
  Daemon c(dir, {flags("node-c", "rack-1"), dir + "/c-root", "zccd-c"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  REQUIRE(c.Start());
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  // Rank 1 stops after step 2 (it stays registered); rank 0 trains on to
  // step 10, each of its even steps replicated to node b.
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank : {0, 1}) {
    Daemon& d = rank == 0 ? a : b;
    trainers.push_back(StartTrainer(
        d, dir, absl::StrCat("train", rank),
        {"--job=pin", absl::StrCat("--rank=", rank), "--world=2",
         absl::StrCat("--steps=", rank == 0 ? 10 : 2), "--save_every=0", "--block",
         "--share_peers", "--collective=" + collective, "--linger_ms=60000", "--step_ms=300"}));
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  // Node b knows step 2 as the newest whole step of the job and keeps it;
  // rank 0's newer steps that do not fit beside it are refused, not it.
  REQUIRE(zcc::testing::Eventually(
      [&] { return absl::StrContains(b.Log(), "job pin: step 2 is the newest whole"); },
      absl::Seconds(60)));
  REQUIRE(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(a.Log(),
                                 "job pin rank 0: step 10 not replicated: RESOURCE_EXHAUSTED");
      },
      absl::Seconds(60)));
  // What node b holds of rank 0: step 2 whole, and one newer step (4, or a
  // later one where the writer, busy, left 4 out and handed in the newest
  // snapshot in its place).
  const int port_b = PortFromLog(b, R"(peer service on \S+ \(port (\d+), mutual TLS\))");
  auto listed = ClientTo(port_b, Identity(certs, "node-a")).List("pin", ::getuid(), kTimeout);
  REQUIRE(listed.ok());
  std::set<int64_t> rank0_steps;
  for (const daemon::peer::ReplicaInfo& info : *listed) {
    if (info.key.rank == 0 && info.key.piece == "r00000.manifest.json") rank0_steps.insert(info.key.step);
  }
  INFO("rank 0's steps held at node b: " << absl::StrJoin(rank0_steps, ", "));
  CHECK(rank0_steps.size() == 2);
  CHECK(rank0_steps.count(2) == 1);
  KillAll(trainers);
  a.Kill();
  std::filesystem::remove_all(dir + "/a-root");
  RestoreOn(dir, "pin", {&c, &b}, 2, c);
  CHECK(b.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("a node and its buddy both lost: the restore falls back to disk and says why") {
  const std::string dir = ShortTempDir("it-peerboth");
  const std::string certs = MakeCerts(dir);
  // A shared root: step 4 is committed on disk; steps 2, 4 and 6 replicated.
  const std::string root = dir + "/ckpt";
  auto a = std::make_unique<Daemon>(dir, DaemonOptions{ReplicatingPeerFlags(certs, "node-a", "rack-1"), root, "zccd-a"});
  auto b = std::make_unique<Daemon>(dir, DaemonOptions{ReplicatingPeerFlags(certs, "node-b", "rack-2"), root, "zccd-b"});
  Daemon c(dir, {ReplicatingPeerFlags(certs, "node-c", "rack-1"), root, "zccd-c"});
  REQUIRE(a->Start());
  REQUIRE(b->Start());
  REQUIRE(c.Start());
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  int rank = 0;
  for (Daemon* d : {a.get(), b.get()}) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("train", rank),
        {"--job=both", absl::StrCat("--rank=", rank), "--world=2", "--steps=7", "--save_every=4",
         "--block", "--share_peers", "--collective=" + collective, "--linger_ms=60000",
         // Step 4's serialization (0.8 s on a loaded machine) done before
         // step 6 is due: else step 7 goes in its place (the test waits for 6).
         "--step_ms=1000"}));
    ++rank;
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  REQUIRE(WaitForPath(root + "/both/step-00000004/COMMITTED", absl::Seconds(60)));
  AwaitReplicated(dir, {a.get(), b.get()}, 6);
  // Nodes A and B (each the other's buddy) are both lost; the job restarts
  // with both ranks on node C.
  KillAll(trainers);
  a->Kill();
  b->Kill();
  a.reset();
  b.reset();
  const std::string again = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> restarted;
  for (int r = 0; r < 2; ++r) {
    restarted.push_back(StartTrainer(
        c, dir, absl::StrCat("restore", r),
        {"--job=both", absl::StrCat("--rank=", r), "--world=2", "--mode=restore",
         "--share_peers", "--collective=" + again, "--expect_step=4", "--expect_from=disk"}));
  }
  for (auto& t : restarted) {
    const std::optional<int> code = t->Wait(absl::Seconds(120));
    INFO(t->Output());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(absl::StrContains(t->Output(), "mismatched_tensors=0"));
  }
  CHECK(absl::StrContains(c.Log(), "the peer tier holds no whole step newer than step 4"));
  CHECK(c.Stop() == 0);
}

TEST_CASE("a job that went back and lost a node before that node's first step after the restore "
          "reached its buddy restores the step it went back to, not the run it left") {
  const std::string dir = ShortTempDir("it-peerback");
  const std::string certs = MakeCerts(dir);
  // A shared root: step 5 is committed on disk; the run trains to step 9
  // (steps 6 and 8, replicated, are newer than every commit), goes back to
  // step 5 and trains on.
  const std::string root = dir + "/ckpt";
  auto a = std::make_unique<Daemon>(dir, DaemonOptions{ReplicatingPeerFlags(certs, "node-a", "rack-1"), root, "zccd-a"});
  Daemon b(dir, {ReplicatingPeerFlags(certs, "node-b", "rack-2"), root, "zccd-b"});
  Daemon c(dir, {ReplicatingPeerFlags(certs, "node-c", "rack-1"), root, "zccd-c"});
  REQUIRE(a->Start());
  REQUIRE(b.Start());
  REQUIRE(c.Start());
  // (A step every 1.5 s: each replicated step serialized before the next
  // is due, and time between the restore and the first step after it, in
  // which node A's zccd is stopped below.)
  std::vector<std::unique_ptr<Subprocess>> trainers = StartGoingBack(dir, "back", {a.get(), &b});
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("paused", absl::Seconds(90)));
  REQUIRE(WaitForPath(root + "/back/step-00000005/COMMITTED", absl::Seconds(60)));
  AwaitReplicated(dir, {a.get(), &b}, 8);
  // Both ranks go back to step 5. Node A's zccd stops before its rank's
  // first step after the restore (6) is snapshotted, so that step never
  // reaches node B, which holds node A's steps 6 and 8 of the run left.
  for (auto& t : trainers) t->Signal(SIGUSR1);
  REQUIRE(trainers[0]->WaitForOutput("went_back_to=5", absl::Seconds(60)));
  a->process()->Signal(SIGSTOP);
  INFO(trainers[0]->Output());
  REQUIRE(trainers[1]->WaitForOutput("went_back_to=5", absl::Seconds(60)));
  // Node B's rank goes on from step 5: what node B holds of the run left
  // goes, node A's rank's pieces too.
  REQUIRE(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(
            b.Log(), "job back went on from step 5: the peer tier's pieces held here of the run it "
                     "left are dropped (rank 0: step(s) 6, 8");
      },
      absl::Seconds(60)));
  // Node A is lost; rank 0 restarts on node C. Step 5 is the newest step
  // both ranks have of the run that went on (rank 1's own newer steps have
  // no rank 0 beside them).
  KillAll(trainers);
  a->Kill();
  a.reset();
  RestoreOn(dir, "back", {&c, &b}, 5, c);
  CHECK(b.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("a lost node's job restarted from an older step than the peer tier's newest trains "
          "on from it; the tier's step, of the run it left, is never written to disk") {
  const std::string dir = ShortTempDir("it-peerolder");
  const std::string certs = MakeCerts(dir);
  // A shared root: step 5 committed on disk; steps 6 and 8 replicated only.
  const std::string root = dir + "/ckpt";
  Daemon a(dir, {ReplicatingPeerFlags(certs, "node-a", "rack-1"), root, "zccd-a"});
  auto b = std::make_unique<Daemon>(
      dir, DaemonOptions{ReplicatingPeerFlags(certs, "node-b", "rack-2"), root, "zccd-b"});
  Daemon c(dir, {ReplicatingPeerFlags(certs, "node-c", "rack-1"), root, "zccd-c"});
  REQUIRE(a.Start());
  REQUIRE(b->Start());
  REQUIRE(c.Start());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  {
    const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
    int rank = 0;
    for (Daemon* d : {&a, b.get()}) {
      trainers.push_back(StartTrainer(
          *d, dir, absl::StrCat("train", rank),
          {"--job=older", absl::StrCat("--rank=", rank), "--world=2", "--steps=8",
           "--save_every=5", "--block", "--share_peers", "--collective=" + collective,
           "--linger_ms=60000", "--step_ms=1500"}));
      ++rank;
    }
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(90)));
  REQUIRE(WaitForPath(root + "/older/step-00000005/COMMITTED", absl::Seconds(60)));
  AwaitReplicated(dir, {&a, b.get()}, 8);
  KillAll(trainers);
  b->Kill();
  b.reset();
  // Restarted from step 5 on purpose (rank 1 on node C), on to step 7, no
  // commit of its own. The restores find step 8 in the tier (the newest)
  // and node A, rank 0's, would write it to disk behind them.
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> resumed;
  int rank = 0;
  for (Daemon* d : {&a, &c}) {
    resumed.push_back(StartTrainer(
        *d, dir, absl::StrCat("resume", rank),
        {"--job=older", absl::StrCat("--rank=", rank), "--world=2", "--mode=resume",
         "--restore_step=5", "--steps=2", "--save_every=0", "--share_peers",
         "--collective=" + collective}));
    ++rank;
  }
  for (auto& t : resumed) {
    const std::optional<int> code = t->Wait(absl::Seconds(120));
    INFO(t->Output());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(absl::StrContains(t->Output(), "restored_step=5"));
  }
  INFO(a.Log());
  // Node A says the tier's step 8 is of the run left; it is never written.
  CHECK(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(a.Log(), "step 8 recovered from the peer tier is of the run "
                                          "it left") ||
               absl::StrContains(a.Log(), "step 8 of the peer tier written into");
      },
      absl::Seconds(60)));
  CHECK_FALSE(absl::StrContains(a.Log(), "step 8 of the peer tier written into"));
  // Past the quiet time a write would have waited for: none is tried (one
  // would fail where the holders dropped their copies already, as they do
  // when told the job went on, and find them where one was not told yet).
  absl::SleepFor(absl::Seconds(5));
  CHECK_FALSE(absl::StrContains(a.Log(), "step 8 of the peer tier could not be written"));
  CHECK_FALSE(std::filesystem::exists(root + "/older/step-00000008"));
  CHECK(*checkpoint::ReadLatest(root + "/older") == 5);
  CHECK(a.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("a holder whose memory damaged its copy is refused by checksum; the next holder serves") {
  const std::string dir = ShortTempDir("it-peerdmg");
  const std::string certs = MakeCerts(dir, "node-a node-b node-c node-d");
  // Three nodes in three racks, each rank's steps at both other nodes.
  auto flags = [&](const std::string& node, const std::string& rack) {
    std::vector<std::string> f = ReplicatingPeerFlags(certs, node, rack);
    f.push_back("--replicas=2");
    return f;
  };
  Daemon a(dir, {flags("node-a", "rack-1"), dir + "/a-root", "zccd-a"});
  auto b = std::make_unique<Daemon>(dir, DaemonOptions{flags("node-b", "rack-2"), dir + "/b-root",
                                                       "zccd-b"});
  Daemon c(dir, {flags("node-c", "rack-3"), dir + "/c-root", "zccd-c"});
  REQUIRE(a.Start());
  REQUIRE(b->Start());
  REQUIRE(c.Start());
  const std::string collective = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  int rank = 0;
  for (Daemon* d : {&a, b.get(), &c}) {
    trainers.push_back(StartTrainer(
        *d, dir, absl::StrCat("train", rank),
        {"--job=dmg", absl::StrCat("--rank=", rank), "--world=3", "--steps=7", "--save_every=0",
         "--block", "--share_peers", "--collective=" + collective, "--linger_ms=60000",
         "--step_ms=1000"}));
    ++rank;
  }
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  AwaitReplicated(dir, {&a, b.get(), &c}, 6);
  KillAll(trainers);
  // Node B is lost. Of its rank's step 6, node A's copy of the parameters'
  // file and node C's copy of the optimizer state's file are damaged in
  // their zccds' memory after they arrived whole: whichever holder a read
  // asks first, one file's first holder is damaged.
  b->Kill();
  b.reset();
  std::filesystem::remove_all(dir + "/b-root");
  CHECK(DamageCopiesInMemory(a.process()->pid(),
                             TensorBytes(1, 3, "rank1.layers.0.weight", 6)) >= 1);
  CHECK(DamageCopiesInMemory(c.process()->pid(),
                             TensorBytes(1, 3, "optim/rank1.layers.0.weight.exp_avg", 6)) >= 1);
  // The job restarts with rank 1 on node D, which has nothing: every rank
  // restores step 6 from the peer tier, every tensor equal to what it
  // trained (the trainer checks each against the model's bytes).
  Daemon d(dir, {flags("node-d", "rack-2"), dir + "/d-root", "zccd-d"});
  REQUIRE(d.Start());
  RestoreOn(dir, "dmg", {&a, &d, &c}, 6, d);
  CHECK(absl::StrContains(d.Log(), "step 6 recovered from the peer tier, read in place"));
  // A holder refused its damaged copy, and the read went to the next one.
  CHECK(absl::StrContains(d.Log(), "no longer match their checksum; trying the next holder"));
  CHECK(absl::StrContains(a.Log() + c.Log(), "damaged in this zccd's memory"));
  CHECK(a.Stop() == 0);
  CHECK(c.Stop() == 0);
  CHECK(d.Stop() == 0);
}

TEST_CASE("a static peer is a buddy for a job that never reports its nodes") {
  const std::string dir = ShortTempDir("it-peerstatic");
  const std::string certs = MakeCerts(dir);
  Daemon b(dir, {PeerFlags(certs, "node-b", "rack-2"), "", "zccd-b"});
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  const std::string addr_b = absl::StrCat("127.0.0.1:", PortFromLog(b, kPort));
  std::vector<std::string> flags = PeerFlags(certs, "node-a", "rack-1");
  flags.push_back("--replicate_every=2");
  flags.push_back("--peer_static=" + addr_b);
  Daemon a(dir, {flags, "", "zccd-a"});
  REQUIRE(a.Start());
  // One rank, no collective, no SetJobPeers.
  auto t = StartTrainer(a, dir, "solo", {"--job=solo", "--steps=4", "--save_every=0", "--block",
                                         "--linger_ms=60000"});
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  std::string out;
  REQUIRE(zcc::testing::Eventually(
      [&] {
        out = Zccctl(dir, a, {"status"}).second;
        return absl::StrContains(out, "replication: step 4 at every buddy");
      },
      kReplicationWait));
  INFO(out);
  CHECK(absl::StrContains(out, addr_b + " (node-b in rack-2)  ranks -  up"));
  CHECK(absl::StrContains(out, "[buddy]"));
  auto [code, b_out] = Zccctl(dir, b, {"status"});
  CHECK(absl::StrContains(b_out, "held for other nodes"));
  CHECK_FALSE(absl::StrContains(b_out, "GB: 0 piece(s)"));
  // node-a keeps its own copy of what it replicated (and holds nothing for b).
  CHECK(absl::StrContains(out, "GB: 0 piece(s), 0.00 GB held for other nodes"));
  CHECK_FALSE(absl::StrContains(out, "GB held for other nodes, 0 piece(s)"));
  t->Signal(SIGKILL);
  REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  CHECK(a.Stop() == 0);
  CHECK(b.Stop() == 0);
}

TEST_CASE("a static peer that runs none of a job's ranks is told when the job goes back, and drops "
          "the run left of a node that could not tell it") {
  const std::string dir = ShortTempDir("it-peerstaticback");
  const std::string certs = MakeCerts(dir, "node-a node-b node-c");
  // Node b, in rack 2, runs none of the job's ranks: it is the buddy of
  // nodes a and c (rack 1) by the static peer list alone.
  Daemon b(dir, {PeerFlags(certs, "node-b", "rack-2"), "", "zccd-b"});
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  const std::string addr_b = absl::StrCat("127.0.0.1:", PortFromLog(b, kPort));
  const std::string root = dir + "/ckpt";
  auto flags = [&](const std::string& node) {
    std::vector<std::string> f = ReplicatingPeerFlags(certs, node, "rack-1");
    f.push_back("--peer_static=" + addr_b);
    return f;
  };
  auto a = std::make_unique<Daemon>(dir, DaemonOptions{flags("node-a"), root, "zccd-a"});
  Daemon c(dir, {flags("node-c"), root, "zccd-c"});
  REQUIRE(a->Start());
  REQUIRE(c.Start());
  // Steps 6 and 8 of both ranks replicated to node b, step 5 committed; at
  // step 9 both ranks go back to step 5 and train on.
  std::vector<std::unique_ptr<Subprocess>> trainers = StartGoingBack(dir, "sback", {a.get(), &c});
  for (auto& t : trainers) REQUIRE(t->WaitForOutput("paused", absl::Seconds(90)));
  REQUIRE(WaitForPath(root + "/sback/step-00000005/COMMITTED", absl::Seconds(60)));
  AwaitReplicated(dir, {a.get(), &c}, 8);
  // Node a's zccd stops right after its rank's restore, before its first
  // step after it (6) is snapshotted: it neither tells node b nor pushes
  // that step there, which would drop rank 0's newer steps.
  for (auto& t : trainers) t->Signal(SIGUSR1);
  REQUIRE(trainers[0]->WaitForOutput("went_back_to=5", absl::Seconds(60)));
  a->process()->Signal(SIGSTOP);
  REQUIRE(trainers[1]->WaitForOutput("went_back_to=5", absl::Seconds(60)));
  // Node c's rank goes on: node c tells node b, which drops what it holds
  // of the run left, rank 0's steps too (a push of rank 1's first step
  // after the restore drops rank 1's newer steps only).
  REQUIRE(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(b.Log(), "job sback went on from step 5: the peer tier's pieces "
                                          "held here of the run it left are dropped (rank 0: "
                                          "step(s) 6, 8");
      },
      absl::Seconds(60)));
  INFO(b.Log());
  // (Node c says so once node b's answer is back, a moment after b's drop.)
  CHECK(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(c.Log(),
                                 "that it went on from step 5 (it runs none of the job's ranks)");
      },
      absl::Seconds(30)));
  KillAll(trainers);
  a->process()->Signal(SIGCONT);
  a->Kill();
  a.reset();
  CHECK(b.Stop() == 0);
  CHECK(c.Stop() == 0);
}

TEST_CASE("replicas count in the staging budget: they give way to a trainer's registration, and "
          "get only the room the node's trainers leave") {
  const std::string dir = ShortTempDir("it-peerbudget");
  const std::string certs = MakeCerts(dir);
  // Node b's budget: 9 MiB for staging and replicas together. A rank of
  // the test model stages 6.8 MiB (three slots of 2.3 MiB); one of its steps
  // replicated is 2.3 MiB: beside a trainer's staging, none fits.
  std::vector<std::string> flags_b = PeerFlags(certs, "node-b", "rack-2");
  flags_b.push_back("--staging_budget_mb=9");
  Daemon b(dir, {flags_b, dir + "/b-root", "zccd-b"});
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  std::vector<std::string> flags_a = PeerFlags(certs, "node-a", "rack-1");
  flags_a.push_back("--replicate_every=2");
  flags_a.push_back("--peer_static=" + absl::StrCat("127.0.0.1:", PortFromLog(b, kPort)));
  Daemon a(dir, {flags_a, dir + "/a-root", "zccd-a"});
  REQUIRE(a.Start());
  // Node a's rank replicates its even steps to node b (training until the
  // test kills it): b holds one or two of them when its own trainer comes.
  auto remote = StartTrainer(a, dir, "remote",
                             {"--job=remote", "--steps=100000", "--save_every=0", "--block",
                              "--step_ms=250"});
  REQUIRE(zcc::testing::Eventually(
      [&] {
        // "replication: step N at every buddy", N >= 4 (steps move on every 250 ms).
        const std::string out = Zccctl(dir, a, {"status"}).second;
        const std::string at_step = "replication: step ";
        const size_t at = out.find(at_step);
        if (at == std::string::npos) return false;
        const long long step = std::atoll(out.c_str() + at + at_step.size());
        return step >= 4 && out.find(" at every buddy", at) != std::string::npos;
      },
      kReplicationWait));
  // Node b's trainer needs 6.8 MiB: admitted, the replicas giving way.
  auto local = StartTrainer(b, dir, "local", {"--job=local", "--steps=3", "--save_every=0",
                                              "--block", "--linger_ms=60000"});
  REQUIRE(local->WaitForOutput("published=", absl::Seconds(60)));
  INFO(b.Log());
  CHECK(absl::StrContains(b.Log(), "job local rank 0: dropped "));
  CHECK(absl::StrContains(b.Log(), "bytes of the peer tier's replicas to admit the registration"));
  const std::string status_b = Zccctl(dir, b, {"status"}).second;
  INFO(status_b);
  CHECK(absl::StrContains(status_b, "staging budget: "));
  CHECK(absl::StrContains(status_b, " of 0.01 GB in use: "));
  CHECK(absl::StrContains(status_b, "GB the peer tier's replicas (they give way to registrations)"));
  // Beside it, node b has no room for a step of node a's rank: its pushes
  // are refused, the staging budget named, and node a's replication lags.
  CHECK(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(a.Log(), "raise staging_budget_bytes");
      },
      kReplicationWait));
  for (auto* t : {remote.get(), local.get()}) {
    t->Signal(SIGKILL);
    REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  }
  CHECK(a.Stop() == 0);
  CHECK(b.Stop() == 0);
}

TEST_CASE("a step its buddy dropped for a trainer's registration goes to it again once there is "
          "room, with no newer step to replace it") {
  const std::string dir = ShortTempDir("it-peeragain");
  const std::string certs = MakeCerts(dir);
  // Node b's budget, as above: beside its own trainer's staging, no step of
  // node a's rank fits. Its trainer's memory is freed as soon as it is gone.
  std::vector<std::string> flags_b = PeerFlags(certs, "node-b", "rack-2");
  flags_b.insert(flags_b.end(), {"--staging_budget_mb=9", "--retain_snapshots_s=0"});
  Daemon b(dir, {flags_b, dir + "/b-root", "zccd-b"});
  REQUIRE(b.Start());
  const char* kPort = R"(peer service on \S+ \(port (\d+), mutual TLS\))";
  std::vector<std::string> flags_a = PeerFlags(certs, "node-a", "rack-1");
  flags_a.insert(flags_a.end(), {"--replicate_every=2", "--check_buddies_s=1",
                                 "--peer_static=" + absl::StrCat("127.0.0.1:", PortFromLog(b, kPort))});
  Daemon a(dir, {flags_a, dir + "/a-root", "zccd-a"});
  REQUIRE(a.Start());
  // Node a's rank trains 6 steps and stays. Its newest replicated step is
  // 6, or an earlier one where 6 came while the one before was still being
  // serialized (a loaded machine): whichever it is, N, replication is at
  // rest once N is at every buddy and the newest handed in. (A step left
  // out while the writer was busy is handed in once it is free: at rest is
  // the same N seen twice, a second apart.)
  auto remote = StartTrainer(a, dir, "remote",
                             {"--job=remote", "--steps=6", "--save_every=0", "--block",
                              "--step_ms=100", "--linger_ms=600000"});
  REQUIRE(remote->WaitForOutput("published=6", absl::Seconds(60)));
  const std::regex at_rest(R"(replication: step (\d+) at every buddy, newest (\d+),)");
  std::string n;
  auto at_rest_step = [&]() -> std::string {
    std::smatch m;
    const std::string out = Zccctl(dir, a, {"status"}).second;
    return std::regex_search(out, m, at_rest) && m[1] == m[2] ? std::string(m[1]) : "";
  };
  REQUIRE(zcc::testing::Eventually(
      [&] {
        n = at_rest_step();
        if (n.empty()) return false;
        absl::SleepFor(absl::Seconds(1));
        return at_rest_step() == n;
      },
      kReplicationWait));
  INFO("step " << n << " replicated");
  // Node b's trainer takes the room: step N is dropped there, and node a
  // finds it gone at its next look and pushes it again, refused for want of
  // room while the trainer stays.
  auto local = StartTrainer(b, dir, "local", {"--job=local", "--steps=3", "--save_every=0",
                                              "--block", "--linger_ms=600000"});
  REQUIRE(local->WaitForOutput("published=", absl::Seconds(60)));
  INFO(b.Log());
  REQUIRE(absl::StrContains(b.Log(), "bytes of the peer tier's replicas to admit the registration"));
  CHECK(zcc::testing::Eventually(
      [&] {
        return absl::StrContains(a.Log(), "no longer holds step " + n + " of rank 0") &&
               absl::StrContains(a.Log(), "raise staging_budget_bytes");
      },
      kReplicationWait));
  const std::string lagging = Zccctl(dir, a, {"status"}).second;
  INFO(lagging);
  CHECK_FALSE(absl::StrContains(lagging, "replication: step " + n + " at every buddy"));
  CHECK(absl::StrContains(lagging, "REPLICATION FAILING: "));
  // Once the trainer is gone, node a pushes step N to node b again.
  local->Signal(SIGKILL);
  REQUIRE(local->Wait(absl::Seconds(10)).has_value());
  CHECK(zcc::testing::Eventually(
      [&] {
        const std::string out = Zccctl(dir, a, {"status"}).second;
        return absl::StrContains(out, "replication: step " + n + " at every buddy") &&
               absl::StrContains(out, "1 step(s) pushed again after a buddy dropped them") &&
               !absl::StrContains(out, "REPLICATION FAILING");
      },
      absl::Seconds(60)));
  INFO(a.Log());
  INFO(Zccctl(dir, a, {"status"}).second);
  remote->Signal(SIGKILL);
  REQUIRE(remote->Wait(absl::Seconds(10)).has_value());
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
