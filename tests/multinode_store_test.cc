// The object-store tier across "nodes" (tests/netns_cluster.h): the store
// (moto's server, signatures checked) on a node of its own, and a zccd on
// each of two other nodes with a node-local root, no file system shared
// between them. A 4-rank job, two ranks a node, checkpoints in the tiered
// mode on node-local disks: each node sends its own ranks' part of every
// step, and the step commits in the store once both parts are there. A
// node cut off from the store holds that step back without losing it; a
// lost node's ranks restore from the store on the other node, bit-exact. A
// job writing straight to the store from both nodes commits there, and each
// rank restores on the other node.
#include <signal.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include <nlohmann/json.hpp>
#include "tests/netns_cluster.h"
#include "tests/process_harness.h"
#include "tests/s3_test_server.h"

namespace zcc::testing {
namespace {

constexpr int kStoreNode = 0;

// The store on node 0 and a zccd on each of nodes 1 and 2.
struct Cluster {
  Cluster() {
    auto made = NetnsCluster::Create(3);
    INFO(made.status().ToString());
    REQUIRE(made.ok());
    net = *std::move(made);
    dir = ShortTempDir("mn-store");
    auto started = StartS3TestServer(dir, net->Exec(kStoreNode), net->ip(kStoreNode));
    INFO(started.status().ToString());
    REQUIRE(started.ok());
    server = *std::move(started);
    root_url = absl::StrCat("s3://", server.bucket, "/ckpt");
    for (int node : {1, 2}) {
      DaemonOptions o;
      o.name = absl::StrCat("node", node);
      o.root = absl::StrCat(dir, "/node", node, "-root");  // node-local
      o.wrapper = net->Exec(node);
      o.extra_flags = {"--allowed_roots=" + root_url, "--retain_snapshots_s=0"};
      o.env = Env();
      zccds.push_back(std::make_unique<Daemon>(dir, o));
      REQUIRE(zccds.back()->Start());
    }
  }
  ~Cluster() {
    for (auto& z : zccds) {
      if (z != nullptr) z->Stop();
    }
  }

  std::vector<std::string> Env() const {
    return {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_ACCESS_KEY_ID=" + server.access_key,
            "AWS_SECRET_ACCESS_KEY=" + server.secret_key, "AWS_REGION=us-east-1"};
  }
  Daemon& zccd(int node) { return *zccds[node - 1]; }
  std::string LocalJobDir(int node) const { return absl::StrCat(dir, "/node", node, "-root/itest"); }
  std::string Logs() { return zccds[0]->Log() + (zccds[1] ? zccds[1]->Log() : ""); }

  // Trainers of the 4-rank job's `ranks` on `node`, tiered on node-local
  // disks, with `flags` besides.
  std::vector<std::unique_ptr<Subprocess>> Ranks(int node, const std::vector<int>& ranks,
                                                 const std::string& tag,
                                                 const std::vector<std::string>& flags) {
    return Trainers(node, ranks, tag,
                    {"--root=" + zccd(node).root(), "--upload_root=" + root_url,
                     "--node_local_root", "--upload_keep_last=3"},
                    flags);
  }
  // Trainers of the 4-rank job writing straight to the store (no local disk).
  std::vector<std::unique_ptr<Subprocess>> DirectRanks(int node, const std::vector<int>& ranks,
                                                       const std::string& tag,
                                                       const std::vector<std::string>& flags) {
    return Trainers(node, ranks, tag, {"--root=" + root_url}, flags);
  }
  std::vector<std::unique_ptr<Subprocess>> Trainers(int node, const std::vector<int>& ranks,
                                                    const std::string& tag,
                                                    const std::vector<std::string>& placement,
                                                    const std::vector<std::string>& flags) {
    std::vector<std::unique_ptr<Subprocess>> out;
    for (int rank : ranks) {
      std::vector<std::string> f = placement;
      f.push_back("--run_id=" + tag);  // each phase of the test is a run of its own
      f.push_back(absl::StrCat("--rank=", rank));
      f.push_back("--world=4");
      f.insert(f.end(), flags.begin(), flags.end());
      out.push_back(StartTrainer(zccd(node), dir, absl::StrCat(tag, "-r", rank, "-n", node), f,
                                 net->Exec(node)));
    }
    return out;
  }
  void WaitAll(std::vector<std::unique_ptr<Subprocess>>& trainers) {
    for (auto& t : trainers) {
      const std::optional<int> code = t->Wait(absl::Seconds(120));
      INFO(t->Output() << Logs());
      REQUIRE(code.has_value());
      REQUIRE(*code == 0);
    }
  }
  // zccctl on the store's node (the test's own network cannot reach it).
  std::pair<int, std::string> StoreCtl(std::vector<std::string> args) {
    static int n = 0;
    std::vector<std::string> argv = net->Exec(kStoreNode);
    argv.push_back(Runfile("tools/zccctl"));
    for (auto& a : args) argv.push_back(std::move(a));
    Subprocess p(argv, absl::StrCat(dir, "/zccctl-store.", n++, ".log"), -1, Env());
    const int code = p.Wait(absl::Seconds(60)).value_or(-1);
    return {code, p.Output()};
  }
  // The store's `latest` for the job names `step`, read there.
  bool StoreLatestIs(int64_t step) {
    auto [code, out] = StoreCtl({"list", root_url + "/itest"});
    return code == 0 &&
           absl::StrContains(out, absl::StrCat(root_url, "/itest/step-",
                                               absl::StrFormat("%08d", step), "  (latest)"));
  }
  // The step directories in a node's local root, sorted.
  std::vector<std::string> LocalSteps(int node) const {
    std::vector<std::string> steps;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(LocalJobDir(node), ec)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "step-")) steps.push_back(name);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  // All sent: the node keeps only its copy of the newest step it sent.
  bool OnlyKept(int node, const std::string& step) const {
    return LocalSteps(node) == std::vector<std::string>{"step-000000" + step + ".sent"};
  }

  std::unique_ptr<NetnsCluster> net;
  std::string dir;
  S3TestServer server;
  std::string root_url;
  std::vector<std::unique_ptr<Daemon>> zccds;
};

TEST_CASE("node-local disks: each node sends its ranks' part of a step, the store commits it "
          "whole, and a lost node's ranks restore from the store") {
  Cluster c;
  auto on1 = c.Ranks(1, {0, 1}, "train", {"--steps=20", "--block"});
  auto on2 = c.Ranks(2, {2, 3}, "train", {"--steps=20", "--block"});
  c.WaitAll(on2);
  c.WaitAll(on1);
  // Rank 0 waited for step 20 to commit: its zccd saw it in the store.
  CHECK(on1[0]->Values()["committed"] == "20");

  // The store holds every rank of the step, verified byte for byte; its
  // retention kept 3 steps.
  auto [verify_code, verified] = c.StoreCtl({"verify", c.root_url + "/itest"});
  INFO(verified << c.Logs());
  CHECK(verify_code == 0);
  CHECK(absl::StrContains(verified, "/itest/step-00000020: OK (4 ranks"));
  auto [list_code, listed] = c.StoreCtl({"--json", "list", c.root_url + "/itest"});
  INFO(listed);
  REQUIRE(list_code == 0);
  REQUIRE(listed.find('{') != std::string::npos);
  const auto list = nlohmann::json::parse(listed.substr(listed.find('{')));
  std::vector<int64_t> steps;
  for (const auto& cp : list["checkpoints"]) steps.push_back(cp["step"].get<int64_t>());
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.back() == 20);
  CHECK(steps.size() <= 3);
  // Neither node committed anything locally; each kept its part of the
  // newest step it sent, and no other.
  CHECK(Eventually([&] { return c.OnlyKept(1, "20") && c.OnlyKept(2, "20"); }, absl::Seconds(20),
                   absl::Milliseconds(50)));
  for (int node : {1, 2}) {
    CHECK(absl::StrContains(c.zccd(node).Log(), "(this node's ranks; "));
  }
  // A node found the other's part there and committed the step.
  CHECK(absl::StrContains(c.Logs(), "step=20 bytes="));
  CHECK(absl::StrContains(c.Logs(), "committed there)"));

  // Node 2 is lost with its disk; the job comes back on node 1 alone, every
  // rank reading the store, except for the files of ranks 0 and 1, which
  // node 1 kept. Rank 0's model shard there is damaged: rank 0 reads the
  // step again from the store.
  c.zccds[1]->Kill();
  c.zccds[1].reset();
  std::filesystem::remove_all(c.dir + "/node2-root");
  REQUIRE(DamageTensorByte(c.LocalJobDir(1) + "/step-00000020.sent/model-r00000.safetensors"));
  auto back = c.Ranks(1, {0, 1, 2, 3}, "restore",
                      {"--mode=restore", "--expect_step=20", "--expect_from=disk"});
  c.WaitAll(back);
  for (auto& t : back) CHECK(t->Values()["mismatched_tensors"] == "0");
  const std::string log = c.zccd(1).Log();
  INFO(log);
  CHECK(absl::StrContains(log, "restoring from " + c.root_url + "/itest"));
  CHECK(absl::StrContains(log, "/itest/step-00000020 from this node's kept copy"));
  CHECK(absl::StrContains(log, "rank 0: step-00000020 read partly from this node's kept copy "
                               "failed"));
  CHECK_FALSE(absl::StrContains(log, "falling back to an older step"));
}

TEST_CASE("node-local disks: a node cut off from the store holds its steps back; they "
          "commit once the link is back") {
  Cluster c;
  // One run: paused after step 10, trained on to 20 while node 2 is cut off,
  // then kept registered while the link comes back.
  const std::vector<std::string> flags = {"--steps=20", "--block", "--pause_at=10",
                                          "--wait_commit=false", "--linger_ms=120000"};
  auto on1 = c.Ranks(1, {0, 1}, "train", flags);
  auto on2 = c.Ranks(2, {2, 3}, "train", flags);
  for (auto* group : {&on1, &on2}) {
    for (auto& t : *group) REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  }
  REQUIRE(Eventually([&] { return c.StoreLatestIs(10); }, absl::Seconds(60),
                     absl::Milliseconds(200)));

  // Node 2 loses its link: its parts of steps 15 and 20 cannot reach the
  // store, so the store's newest step stays 10 although node 1 sent its.
  REQUIRE(c.net->SetLink(2, false).ok());
  for (auto* group : {&on1, &on2}) {
    for (auto& t : *group) t->Signal(SIGUSR1);
  }
  for (auto* group : {&on1, &on2}) {
    for (auto& t : *group) REQUIRE(t->WaitForOutput("step=20 ", absl::Seconds(60)));
  }
  // Node 1 sent its parts of 15 and 20; node 2's wait, and the store's
  // newest step is still 10.
  REQUIRE(Eventually([&] { return absl::StrContains(c.zccd(1).Log(), "step=20 bytes="); },
                     absl::Seconds(30), absl::Milliseconds(50)));
  CHECK(absl::StrContains(c.zccd(1).Log(), "2 of 4 ranks there, the last node commits"));
  std::string status;
  const bool node2_waits = Eventually(
      [&] {
        status = Zccctl(c.dir, c.zccd(2), {"status"}).second;
        return absl::StrContains(status, "(this node's ranks): step 10, committed there: step ") &&
               absl::StrContains(status, "step 20 waiting");
      },
      absl::Seconds(20), absl::Milliseconds(200));
  {
    INFO(status);
    CHECK(node2_waits);
  }
  const bool node1_sent = Eventually(
      [&] {
        status = Zccctl(c.dir, c.zccd(1), {"status"}).second;
        return absl::StrContains(status, "(this node's ranks): step 20, committed there: step 10");
      },
      absl::Seconds(20), absl::Milliseconds(200));
  {
    INFO(status);
    CHECK(node1_sent);
  }
  CHECK(c.StoreLatestIs(10));
  CHECK(c.LocalSteps(2).size() > 1);  // node 2 still holds its parts

  // The link is back: node 2's requests, retried meanwhile, get through;
  // it sends step 15, then 20, and each commits.
  REQUIRE(c.net->SetLink(2, true).ok());
  CHECK(Eventually([&] { return c.StoreLatestIs(20); }, absl::Seconds(90),
                   absl::Milliseconds(500)));
  for (const char* step : {"15", "20"}) {
    auto [code, verified] = c.StoreCtl({"verify", c.root_url + "/itest/step-000000" + step});
    INFO(verified << c.Logs());
    CHECK(code == 0);
    CHECK(absl::StrContains(verified, "OK (4 ranks"));
  }
  CHECK(Eventually([&] { return c.OnlyKept(2, "20"); }, absl::Seconds(20),
                   absl::Milliseconds(50)));
  // `zccctl list` says which steps this node keeps its part of.
  {
    auto [code, listed] = Zccctl(c.dir, c.zccd(2), {"list", "itest"});
    INFO(listed);
    CHECK(code == 0);
    CHECK(absl::StrContains(listed, "[store, this node's part kept]"));
    CHECK(absl::StrContains(listed, "step-00000015"));
  }
  for (auto* group : {&on1, &on2}) {
    for (auto& t : *group) t->Signal(SIGKILL);
  }
}

TEST_CASE("straight to the store from two nodes: the step commits there; each rank restores on "
          "the other node") {
  Cluster c;
  auto on1 = c.DirectRanks(1, {0, 1}, "train", {"--steps=10", "--block"});
  auto on2 = c.DirectRanks(2, {2, 3}, "train", {"--steps=10", "--block"});
  c.WaitAll(on2);
  c.WaitAll(on1);
  CHECK(on1[0]->Values()["committed"] == "10");
  auto [code, verified] = c.StoreCtl({"verify", c.root_url + "/itest"});
  INFO(verified << c.Logs());
  CHECK(code == 0);
  CHECK(absl::StrContains(verified, "/itest/step-00000010: OK (4 ranks"));
  // Nothing of the job on either node's disk.
  CHECK(c.LocalSteps(1).empty());
  CHECK(c.LocalSteps(2).empty());
  auto back2 = c.DirectRanks(2, {0, 1}, "restore",
                             {"--mode=restore", "--expect_step=10", "--expect_from=disk"});
  auto back1 = c.DirectRanks(1, {2, 3}, "restore",
                             {"--mode=restore", "--expect_step=10", "--expect_from=disk"});
  c.WaitAll(back2);
  c.WaitAll(back1);
  for (auto* group : {&back1, &back2}) {
    for (auto& t : *group) CHECK(t->Values()["mismatched_tensors"] == "0");
  }
}

}  // namespace
}  // namespace zcc::testing
