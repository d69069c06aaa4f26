// zccd with an object-store root (moto's server, signatures checked): real
// zccd and trainer processes checkpoint straight from the staging slots into
// the store, the steps commit there without renames, and new trainers
// restore them bit-exact from the store. Two zccds with separate local roots
// (no shared file system) commit one 4-rank job together through the store.
// Wrong credentials are a clear error that shows no secret.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/free_port.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_storage.h"
#include "storage/whole_file.h"
#include "tests/process_harness.h"
#include "tests/s3_test_server.h"

namespace zcc::testing {
namespace {

// The test's own view of the store: the bucket as a Storage.
struct Store {
  explicit Store(const S3TestServer& server)
      : client(Endpoint(server), {server.access_key, server.secret_key, "", "test"}),
        storage(&client, Options(server)) {}
  static storage::s3::Endpoint Endpoint(const S3TestServer& server) {
    storage::s3::Endpoint e;
    e.url = server.endpoint;
    return e;
  }
  static storage::s3::S3StorageOptions Options(const S3TestServer& server) {
    storage::s3::S3StorageOptions o;
    o.bucket = server.bucket;
    return o;
  }
  checkpoint::IoOptions Io() {
    checkpoint::IoOptions io;
    io.storage = &storage;
    io.direct_io = false;
    return io;
  }
  storage::s3::S3Client client;
  storage::s3::S3Storage storage;
};

// A zccd whose only extra root is the store's s3://bucket/ckpt, with the
// server's endpoint and keys in its environment (the secret as given).
DaemonOptions StoreDaemon(const std::string& dir, const S3TestServer& server,
                          const std::string& secret, const std::string& name = "zccd") {
  DaemonOptions o;
  o.name = name;
  o.root = JoinPath(dir, name + "-local");  // each node's local root is its own
  o.extra_flags = {absl::StrCat("--allowed_roots=s3://", server.bucket, "/ckpt"),
                   "--retain_snapshots_s=0"};  // restores read the store
  o.env = {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_ACCESS_KEY_ID=" + server.access_key,
           "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1"};
  return o;
}

// The S3 test server, its log in `dir`; the test stops when it cannot start.
S3TestServer StartedServer(const std::string& dir) {
  auto started = StartS3TestServer(dir);
  REQUIRE_OK(started);
  return *std::move(started);
}

std::string RootUrl(const S3TestServer& server) {
  return absl::StrCat("s3://", server.bucket, "/ckpt");
}

// Trainers of ranks `ranks` of a `world`-rank job on `daemon`.
std::vector<std::unique_ptr<Subprocess>> Trainers(const Daemon& daemon, const std::string& dir,
                                                  const std::string& root,
                                                  const std::vector<int>& ranks, int world,
                                                  const std::string& tag,
                                                  const std::vector<std::string>& flags) {
  std::vector<std::unique_ptr<Subprocess>> out;
  for (int rank : ranks) {
    std::vector<std::string> f = {"--root=" + root, absl::StrCat("--rank=", rank),
                                  absl::StrCat("--world=", world)};
    f.insert(f.end(), flags.begin(), flags.end());
    out.push_back(StartTrainer(daemon, dir, absl::StrCat(tag, rank), f));
  }
  return out;
}

void WaitAll(std::vector<std::unique_ptr<Subprocess>>& trainers, const std::string& logs) {
  for (auto& t : trainers) {
    INFO(t->Output() << logs);
    REQUIRE(t->Wait(absl::Seconds(120)) == 0);
  }
}

TEST_CASE("zccd writes, commits and restores a job straight in an object store") {
  const std::string dir = ShortTempDir("s3-root");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);

  auto train = Trainers(daemon, dir, root, {0, 1}, 2, "train",
                        {"--steps=12", "--block", "--ema_decay=0.9"});
  WaitAll(train, daemon.Log());
  CHECK(train[0]->Values()["committed"] == "10");

  // In the store: the steps, committed in place, verified; `latest`; the
  // job's owner. No local disk was used.
  Store store(server);
  const std::string job = "/ckpt/itest";
  auto steps = checkpoint::ListCommittedSteps(job, &store.storage);
  REQUIRE_OK(steps);
  CHECK(*steps == std::vector<int64_t>{5, 10});
  CHECK(*checkpoint::ReadLatest(job, &store.storage) == 10);
  auto report = checkpoint::VerifyStep(JoinPath(job, "step-00000010"), store.Io());
  REQUIRE_OK(report);
  CHECK(report->ranks == 2);
  auto owner = storage::ReadWholeFile(store.storage, JoinPath(job, "OWNER"), 100);
  REQUIRE_OK(owner);
  CHECK(*owner == "uid 0\n");
  auto local = ListDir(daemon.root());
  CHECK((!local.ok() || local->empty()));
  // Nothing but committed steps, their files and the job's own objects.
  auto names = store.storage.List(job);
  REQUIRE_OK(names);
  CHECK(*names == std::vector<std::string>{"OWNER", "latest", "step-00000005", "step-00000010"});

  // zccctl lists the job through zccd, as on a local root.
  auto [code, listed] = Zccctl(dir, daemon, {"list", "itest", "--root", root});
  INFO(listed);
  CHECK(code == 0);
  CHECK(absl::StrContains(listed, "step-00000010"));
  CHECK(absl::StrContains(listed, "latest"));

  // New trainers restore the newest step from the store, bit-exact.
  auto restore = Trainers(daemon, dir, root, {0, 1}, 2, "restore",
                          {"--mode=restore", "--expect_step=10", "--expect_from=disk"});
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  CHECK(restore[1]->Values()["mismatched_tensors"] == "0");

  // A resumed run commits in the same store: step 15 after 10.
  auto resume = Trainers(daemon, dir, root, {0, 1}, 2, "resume",
                         {"--mode=resume", "--steps=5", "--block"});
  WaitAll(resume, daemon.Log());
  CHECK(resume[0]->Values()["committed"] == "15");
  CHECK(*checkpoint::ReadLatest(job, &store.storage) == 15);
  REQUIRE_OK(checkpoint::VerifyStep(JoinPath(job, "step-00000015"), store.Io()).status());

  // A byte of step 15 damaged in the store: the restore finds it by its
  // checksum and falls back to step 10.
  const std::string shard = JoinPath(job, "step-00000015/model-r00001.safetensors");
  auto bytes = storage::ReadWholeFile(store.storage, shard, uint64_t{1} << 30);
  REQUIRE_OK(bytes);
  (*bytes)[bytes->size() - 100] ^= 0x40;
  REQUIRE_OK(storage::WriteFileAtomic(store.storage, shard, *bytes));
  // The ranks restore together (a step one of them cannot read is left by
  // all of them).
  auto fallback = Trainers(daemon, dir, root, {0, 1}, 2, "fallback",
                           {"--mode=restore", "--expect_step=10", "--expect_from=disk",
                            absl::StrCat("--collective=127.0.0.1:", FreeTcpPort())});
  WaitAll(fallback, daemon.Log());
  CHECK(fallback[0]->Values()["mismatched_tensors"] == "0");
  CHECK(fallback[1]->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(daemon.Log(), "step-00000015"));

  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix()).empty());
}

TEST_CASE("straight to the store: a step saved again after a restore of it is committed again, "
          "never left without its COMMITTED") {
  const std::string dir = ShortTempDir("s3-resave");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);
  // Steps 5 and 10 commit; at step 14 (a second on) the ranks restore
  // step 10 in place and snapshot it again (due: written again in place,
  // its COMMITTED taken away by the first rank's write), then train on.
  auto train = Trainers(daemon, dir, root, {0, 1}, 2, "train",
                        {"--steps=14", "--block", "--step_ms=250", "--go_back_at=14",
                         "--go_back_to=10", "--snapshot_restored"});
  WaitAll(train, daemon.Log());
  INFO(daemon.Log());
  CHECK(absl::StrContains(daemon.Log(), "wrote step 10 again after its commit; it is committed "
                                        "again"));
  Store store(server);
  const std::string job = "/ckpt/itest";
  REQUIRE(Eventually(
      [&] {
        auto steps = checkpoint::ListCommittedSteps(job, &store.storage);
        return steps.ok() && *steps == std::vector<int64_t>{5, 10};
      },
      absl::Seconds(30), absl::Milliseconds(50)));
  CHECK(*checkpoint::ReadLatest(job, &store.storage) == 10);
  REQUIRE_OK(checkpoint::VerifyStep(JoinPath(job, "step-00000010"), store.Io()).status());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("straight to the store, no run id: a part an earlier run left never completes a step "
          "written again") {
  const std::string dir = ShortTempDir("s3-norun");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);
  Store store(server);
  const std::string step5 = "/ckpt/itest/step-00000005";
  // An earlier run: rank 1 alone (rank 0 died first) wrote its part of step
  // 5, with 5 tensors; the step waits for rank 0 and never commits.
  auto earlier = Trainers(daemon, dir, root, {1}, 2, "earlier",
                          {"--steps=5", "--block", "--tensors=5", "--wait_commit=false"});
  WaitAll(earlier, daemon.Log());
  REQUIRE(storage::Exists(store.storage, JoinPath(step5, format::ManifestFileName(1))));
  // This run, 6 tensors a rank, no run id: rank 1 registers first (its
  // earlier part goes) and waits; rank 0 writes step 5.
  auto rank1 = Trainers(daemon, dir, root, {1}, 2, "run-b",
                        {"--steps=5", "--block", "--pause_before_train"});
  REQUIRE(rank1[0]->WaitForOutput("ready", absl::Seconds(60)));
  CHECK_FALSE(storage::Exists(store.storage, JoinPath(step5, format::ManifestFileName(1))));
  CHECK_THAT(daemon.Log(), Catch::Contains("removed 1 manifest(s) an earlier run left"));
  auto rank0 = Trainers(daemon, dir, root, {0}, 2, "run-b", {"--steps=5", "--block"});
  REQUIRE(Eventually(
      [&] { return storage::Exists(store.storage, JoinPath(step5, format::ManifestFileName(0))); },
      absl::Seconds(60)));
  // Rank 0's part alone does not commit it (the earlier run's part would
  // have, with 5 tensors that are not this run's).
  absl::SleepFor(absl::Seconds(1));
  CHECK_FALSE(storage::Exists(store.storage, JoinPath(step5, format::kCommittedFileName)));
  // Rank 1 writes its part: step 5 commits, this run's alone.
  rank1[0]->Signal(SIGUSR1);
  WaitAll(rank1, daemon.Log());
  WaitAll(rank0, daemon.Log());
  CHECK(rank0[0]->Values()["committed"] == "5");
  auto report = checkpoint::VerifyStep(step5, store.Io());
  REQUIRE_OK(report);
  CHECK(report->ranks == 2);
  auto restore = Trainers(daemon, dir, root, {0, 1}, 2, "restore",
                          {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  CHECK(restore[1]->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("two zccds with no shared file system commit one 4-rank job in the store") {
  const std::string dir = ShortTempDir("s3-two");
  S3TestServer server = StartedServer(dir);
  // Each node's zccd with its own local root, socket and shared memory.
  Daemon a(dir, StoreDaemon(dir, server, server.secret_key, "node-a"));
  Daemon b(dir, StoreDaemon(dir, server, server.secret_key, "node-b"));
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  REQUIRE(a.root() != b.root());
  const std::string root = RootUrl(server);

  auto on_a = Trainers(a, dir, root, {0, 1}, 4, "a-train", {"--steps=5", "--block"});
  auto on_b = Trainers(b, dir, root, {2, 3}, 4, "b-train", {"--steps=5", "--block"});
  WaitAll(on_b, b.Log());
  WaitAll(on_a, a.Log());
  CHECK(on_a[0]->Values()["committed"] == "5");

  Store store(server);
  auto report = checkpoint::VerifyStep("/ckpt/itest/step-00000005", store.Io());
  REQUIRE_OK(report);
  CHECK(report->ranks == 4);

  // Each rank restores on the other node: everything comes from the store.
  auto back_b = Trainers(b, dir, root, {0, 1}, 4, "b-restore",
                         {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  auto back_a = Trainers(a, dir, root, {2, 3}, 4, "a-restore",
                         {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  WaitAll(back_b, b.Log());
  WaitAll(back_a, a.Log());
  for (auto& t : back_a) CHECK(t->Values()["mismatched_tensors"] == "0");
  for (auto& t : back_b) CHECK(t->Values()["mismatched_tensors"] == "0");
  REQUIRE(a.Stop() == 0);
  REQUIRE(b.Stop() == 0);
}

TEST_CASE("tiered: checkpoints on the local root, uploaded in the background, each tier with "
          "its retention; a lost local root restores from the store") {
  const std::string dir = ShortTempDir("s3-tiered");
  S3TestServer server = StartedServer(dir);
  DaemonOptions options = StoreDaemon(dir, server, server.secret_key);
  options.extra_flags.push_back("--keep_last=2");  // the local root's
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  const std::string store_root = RootUrl(server);
  const std::vector<std::string> tiered = {"--upload_root=" + store_root, "--upload_keep_last=4"};

  std::vector<std::string> flags = {"--steps=30", "--block"};
  flags.insert(flags.end(), tiered.begin(), tiered.end());
  auto train = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "train", flags);
  WaitAll(train, daemon.Log());
  CHECK(train[0]->Values()["committed"] == "30");

  // The store catches up in the background: step 30 there, committed and
  // verified; at most 4 steps kept there, 2 here.
  Store store(server);
  const std::string job = "/ckpt/itest";
  const bool uploaded = Eventually(
      [&] {
        auto latest = checkpoint::ReadLatest(job, &store.storage);
        return latest.ok() && *latest == 30;
      },
      absl::Seconds(60), absl::Milliseconds(20));
  INFO(daemon.Log());
  REQUIRE(uploaded);
  REQUIRE_OK(checkpoint::VerifyStep(JoinPath(job, "step-00000030"), store.Io()).status());
  // (The store's retention runs once the upload is done: `latest` names
  // step 30 just before.)
  absl::StatusOr<std::vector<int64_t>> in_store;
  Eventually(
      [&] {
        in_store = checkpoint::ListCommittedSteps(job, &store.storage);
        return in_store.ok() && in_store->size() <= 4;
      },
      absl::Seconds(30), absl::Milliseconds(20));
  REQUIRE_OK(in_store);
  CHECK(in_store->back() == 30);
  CHECK(in_store->size() <= 4);
  const std::string local_job = JoinPath(daemon.root(), "itest");
  // Here keep_last 2, and a step still being uploaded when the last
  // retention ran is kept for the upload.
  auto local = checkpoint::ListCommittedSteps(local_job);
  REQUIRE_OK(local);
  CHECK(local->size() <= 3);
  CHECK(local->back() == 30);
  CHECK((*local)[local->size() - 2] == 25);
  CHECK(absl::StrContains(daemon.Log(), "upload job=itest step=30"));

  // A byte of rank 0's step 30 damaged on the local disk: step 30 is read
  // from the store's copy, not given up for step 25. First by ranks that
  // restore together (rank 0 finds the damage as it reads the step they
  // agreed on), then by each rank on its own (the copy here is known bad).
  REQUIRE(DamageTensorByte(JoinPath(local_job, "step-00000030/model-r00000.safetensors")));
  for (const bool together : {true, false}) {
    std::vector<std::string> same_step = {"--mode=restore", "--expect_step=30",
                                          "--expect_from=disk"};
    same_step.insert(same_step.end(), tiered.begin(), tiered.end());
    if (together) same_step.push_back(absl::StrCat("--collective=127.0.0.1:", FreeTcpPort()));
    auto repaired = Trainers(daemon, dir, daemon.root(), {0, 1}, 2,
                             together ? "together" : "alone", same_step);
    WaitAll(repaired, daemon.Log());
    CHECK(repaired[0]->Values()["mismatched_tensors"] == "0");
    CHECK(repaired[1]->Values()["mismatched_tensors"] == "0");
  }
  CHECK(absl::StrContains(daemon.Log(),
                          "reading the same step from " + store_root + "/itest/step-00000030"));

  // A lost local root (a replaced node's disk): the newest step comes back
  // from the store, bit-exact.
  REQUIRE_OK(RemoveTree(local_job));
  std::vector<std::string> restore_flags = {"--mode=restore", "--expect_step=30",
                                            "--expect_from=disk"};
  restore_flags.insert(restore_flags.end(), tiered.begin(), tiered.end());
  auto restore = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "restore", restore_flags);
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  CHECK(restore[1]->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(daemon.Log(), "restoring from " + RootUrl(server) + "/itest"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("tiered: a run that went back to an older step moves the store's latest back too; a "
          "lost local root then restores that step from the store, not the one left behind") {
  // Or the local root never held that step (its retention had removed it):
  // its latest names the step anyway, and the store serves it.
  bool local_held_it = true;
  SECTION("the local root lost") {}
  SECTION("the local root held no step up to it") { local_held_it = false; }
  const std::string dir = ShortTempDir("s3-back");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::vector<std::string> tiered = {"--upload_root=" + RootUrl(server),
                                           "--upload_keep_last=4"};
  auto with = [&tiered](std::vector<std::string> flags) {
    flags.insert(flags.end(), tiered.begin(), tiered.end());
    return flags;
  };
  auto train = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "train",
                        with({"--steps=20", "--block"}));
  WaitAll(train, daemon.Log());
  Store store(server);
  auto store_latest = [&](int64_t step) {
    return Eventually(
        [&] {
          auto latest = checkpoint::ReadLatest("/ckpt/itest", &store.storage);
          return latest.ok() && *latest == step;
        },
        absl::Seconds(60), absl::Milliseconds(20));
  };
  REQUIRE(store_latest(20));
  // Back to the newest step before 20 that the store holds (15, 10 or 5:
  // only the newest committed step is uploaded, one that commits meanwhile
  // supersedes it, so a loaded machine may skip some; 20 steps take well
  // under a second, and the store got only 5 and 20 once), three steps on,
  // no commit of its own yet.
  auto in_store = checkpoint::ListCommittedSteps("/ckpt/itest", &store.storage);
  REQUIRE_OK(in_store.status());
  int64_t to = -1;
  for (int64_t step : *in_store) {
    if (step < 20) to = std::max(to, step);
  }
  INFO("steps in the store: " << absl::StrJoin(*in_store, ", "));
  REQUIRE(to >= 5);
  const std::string local_job = JoinPath(daemon.root(), "itest");
  if (!local_held_it) {
    auto local = checkpoint::ListCommittedSteps(local_job);
    REQUIRE_OK(local.status());
    for (int64_t step : *local) {
      if (step <= to) REQUIRE_OK(RemoveTree(JoinPath(local_job, format::StepDirName(step))));
    }
  }
  auto back = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "back",
                       with({"--mode=resume", absl::StrCat("--restore_step=", to), "--steps=3",
                             "--block"}));
  WaitAll(back, daemon.Log());
  INFO(daemon.Log());
  CHECK(store_latest(to));
  CHECK(*checkpoint::ReadLatest(local_job) == to);
  if (local_held_it) {
    // The local root lost: the store serves that step, not step 20.
    REQUIRE_OK(RemoveTree(local_job));
  } else {
    // Step 20 is still here, committed, but not on the run's timeline.
    CHECK(checkpoint::ListCommittedSteps(local_job)->back() == 20);
    CHECK(absl::StrContains(daemon.Log(), "(not committed there"));
  }
  auto restore = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "restore",
                          with({"--mode=restore", absl::StrCat("--expect_step=", to),
                                "--expect_from=disk"}));
  WaitAll(restore, daemon.Log());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("tiered: the step a previous layout left in memory, written for the new one, goes "
          "to the store too") {
  const std::string dir = ShortTempDir("s3-relayout");
  S3TestServer server = StartedServer(dir);
  DaemonOptions options = StoreDaemon(dir, server, server.secret_key);
  options.extra_flags.back() = "--retain_snapshots_s=600";  // departed trainers' snapshots kept
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  const std::vector<std::string> tiered = {"--upload_root=" + RootUrl(server)};

  // Two ranks snapshot steps 1..7 (step 5 a checkpoint) and die after 7.
  std::vector<std::string> flags = {"--steps=7", "--save_every=5", "--block", "--pause_at=7"};
  flags.insert(flags.end(), tiered.begin(), tiered.end());
  auto train = Trainers(daemon, dir, daemon.root(), {0, 1}, 2, "train", flags);
  for (auto& t : train) REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 7, 2));
  for (auto& t : train) {
    t->Signal(SIGKILL);
    REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  }
  Store store(server);
  const std::string job = "/ckpt/itest";
  auto latest_is = [&](int64_t step) {
    return Eventually(
        [&] {
          auto latest = checkpoint::ReadLatest(job, &store.storage);
          return latest.ok() && *latest == step;
        },
        absl::Seconds(60), absl::Milliseconds(20));
  };
  REQUIRE(latest_is(5));

  // The job resumes on one rank: zccd writes step 7 from the two ranks'
  // memory into the job's directory for the new layout, which restores it,
  // and sends it to the store, where it commits.
  std::vector<std::string> restore_flags = {"--mode=restore", "--expect_step=7",
                                            "--expect_from=disk"};
  restore_flags.insert(restore_flags.end(), tiered.begin(), tiered.end());
  auto restore = Trainers(daemon, dir, daemon.root(), {0}, 1, "restore", restore_flags);
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  INFO(daemon.Log());
  CHECK(absl::StrContains(daemon.Log(), "from the memory of its previous layout"));
  REQUIRE(latest_is(7));
  REQUIRE_OK(checkpoint::VerifyStep(JoinPath(job, "step-00000007"), store.Io()).status());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("tiered: status shows the durability lag; list shows which step is where") {
  const std::string dir = ShortTempDir("s3-lag");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string store_root = RootUrl(server);
  // A trainer that stays registered after its last step, so that the job
  // (and its status) is there to be read.
  auto train = Trainers(daemon, dir, daemon.root(), {0}, 1, "train",
                        {"--steps=10", "--block", "--upload_root=" + store_root,
                         "--linger_ms=20000"});
  // Until zccd says step 10 is in the store, nothing waiting.
  std::string status;
  const bool shown = Eventually(
      [&] {
        auto [code, out] = Zccctl(dir, daemon, {"status", "itest"});
        status = out;
        return code == 0 &&
               absl::StrContains(out, "uploaded to " + store_root + "/itest: step 10\n");
      },
      absl::Seconds(60), absl::Milliseconds(100));
  INFO(status);
  REQUIRE(shown);
  Store store(server);
  CHECK(*checkpoint::ReadLatest("/ckpt/itest", &store.storage) == 10);
  auto [list_code, listed] = Zccctl(dir, daemon, {"list", "itest"});
  INFO(listed);
  CHECK(list_code == 0);
  CHECK(absl::StrContains(listed, "[local+store]"));
  auto [json_code, json] = Zccctl(dir, daemon, {"--json", "status", "itest"});
  CHECK(json_code == 0);
  CHECK(absl::StrContains(json, "\"last_uploaded_step\": 10"));
  train[0]->Signal(SIGTERM);
  train[0]->Wait(absl::Seconds(30));
  REQUIRE(daemon.Stop() == 0);
}

// zccctl without a daemon, with the store's endpoint and keys.
std::pair<int, std::string> OfflineZccctl(const std::string& dir, const S3TestServer& server,
                                          std::vector<std::string> args) {
  static int n = 0;
  std::vector<std::string> argv = {Runfile("tools/zccctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv, absl::StrCat(dir, "/zccctl-offline.", n++, ".log"), -1,
               {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_ACCESS_KEY_ID=" + server.access_key,
                "AWS_SECRET_ACCESS_KEY=" + server.secret_key, "AWS_REGION=us-east-1"});
  const int code = p.Wait(absl::Seconds(120)).value_or(-1);
  return {code, p.Output()};
}

TEST_CASE("zccd killed mid-upload: no step committed from it; gc aborts and removes what it left") {
  const std::string dir = ShortTempDir("s3-kill");
  S3TestServer server = StartedServer(dir);
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);
  // Step 5 commits; step 10 (256 MiB of shards) is cut by the kill.
  auto first = Trainers(daemon, dir, root, {0}, 1, "first", {"--steps=5", "--block"});
  WaitAll(first, daemon.Log());
  auto big = Trainers(daemon, dir, root, {0}, 1, "big",
                      {"--start=6", "--steps=5", "--block", "--tensors=8", "--kib=16384",
                       "--wait_commit=false"});
  Store store(server);
  const std::string job_key = "ckpt/itest/";
  // Until a multipart upload of step 10 is under way in the store.
  const bool uploading = Eventually(
      [&] {
        auto uploads = store.client.ListMultipart(server.bucket, job_key + "step-00000010/");
        return uploads.ok() && !uploads->empty();
      },
      absl::Seconds(60), absl::Milliseconds(5));
  INFO(daemon.Log() << big[0]->Output());
  REQUIRE(uploading);
  daemon.Kill();
  big[0]->Wait(absl::Seconds(30));

  // Nothing of step 10 is committed; step 5 is whole and latest.
  auto steps = checkpoint::ListCommittedSteps("/ckpt/itest", &store.storage);
  REQUIRE_OK(steps);
  CHECK(*steps == std::vector<int64_t>{5});
  CHECK(*checkpoint::ReadLatest("/ckpt/itest", &store.storage) == 5);
  REQUIRE_OK(checkpoint::VerifyStep("/ckpt/itest/step-00000005", store.Io()).status());

  // gc removes the uncommitted step and aborts the uploads it left.
  auto [code, out] = OfflineZccctl(dir, server, {"gc", root + "/itest", "--older-than", "0"});
  INFO(out);
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "removed " + root + "/itest/step-00000010"));
  auto left = store.client.ListMultipart(server.bucket, job_key);
  REQUIRE_OK(left);
  CHECK(left->empty());
  CHECK(*store.storage.List("/ckpt/itest") ==
        std::vector<std::string>{"OWNER", "latest", "step-00000005"});

  // A new zccd restores step 5 from the store.
  REQUIRE(daemon.Start());
  auto restore = Trainers(daemon, dir, root, {0}, 1, "restore",
                          {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a job's own credentials: used for its directory alone, never for another uid's job") {
  const std::string dir = ShortTempDir("s3-jobkeys");
  ::chmod(dir.c_str(), 0755);  // the other uid's trainer writes its log here
  S3TestServer server = StartedServer(dir);
  // zccd knows the store's endpoint but has no keys of its own.
  DaemonOptions options = StoreDaemon(dir, server, "");
  options.env = {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_REGION=us-east-1",
                 "AWS_SHARED_CREDENTIALS_FILE=" + JoinPath(dir, "no-such-file")};
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);
  CHECK(absl::StrContains(daemon.Log(), "zccd has no credentials of its own"));

  // Without keys of its own the job is refused, saying what to do.
  auto keyless = Trainers(daemon, dir, root, {0}, 1, "keyless", {"--steps=2"});
  CHECK(keyless[0]->Wait(absl::Seconds(60)) != 0);
  CHECK(absl::StrContains(keyless[0]->Output(), "pass the job's own (store_credentials)"));

  // With them, it checkpoints and restores through its own client.
  const std::vector<std::string> keys = {"--store_key_id=" + server.access_key,
                                         "--store_secret=" + server.secret_key};
  std::vector<std::string> train_flags = {"--steps=10", "--block"};
  train_flags.insert(train_flags.end(), keys.begin(), keys.end());
  auto train = Trainers(daemon, dir, root, {0, 1}, 2, "train", train_flags);
  WaitAll(train, daemon.Log());
  CHECK(train[0]->Values()["committed"] == "10");
  std::vector<std::string> restore_flags = {"--mode=restore", "--expect_step=10",
                                            "--expect_from=disk"};
  restore_flags.insert(restore_flags.end(), keys.begin(), keys.end());
  auto restore = Trainers(daemon, dir, root, {0, 1}, 2, "restore", restore_flags);
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  CHECK_FALSE(absl::StrContains(daemon.Log(), server.secret_key));

  // Another uid with the same keys cannot use this job's directory: its
  // OWNER names uid 0.
  // (The runfiles live under root's home: the binary goes where uid 4242
  // can run it.)
  const std::string trainer = JoinPath(dir, "test_trainer");
  REQUIRE(std::system(("cp " + Runfile("tests/test_trainer") + " " + trainer + " && chmod 0755 " +
                       trainer).c_str()) == 0);
  std::vector<std::string> argv = {trainer, "--socket=" + daemon.socket(),
                                   "--root=" + root, "--steps=2"};
  argv.insert(argv.end(), keys.begin(), keys.end());
  Subprocess other(argv, JoinPath(dir, "other-uid.log"), 4242);
  CHECK(other.Wait(absl::Seconds(60)) != 0);
  INFO(other.Output());
  CHECK(absl::StrContains(other.Output(), "belongs to another user"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("the store throttles and connections are cut mid-upload: zccd sends again, the step "
          "commits whole") {
  const std::string dir = ShortTempDir("s3-cut");
  S3TestServer server = StartedServer(dir);
  // Between zccd and the store: 3 SlowDowns, then 4 uploads cut halfway.
  auto proxy = StartS3FaultProxy(dir, server.endpoint, /*slowdown=*/3, /*cut=*/4);
  REQUIRE_OK(proxy);
  DaemonOptions options = StoreDaemon(dir, server, server.secret_key);
  options.env[0] = "AWS_ENDPOINT_URL=" + proxy->endpoint;
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);
  auto train = Trainers(daemon, dir, root, {0, 1}, 2, "train", {"--steps=5", "--block"});
  WaitAll(train, daemon.Log());
  CHECK(train[0]->Values()["committed"] == "5");
  const std::string injected = proxy->process->Output();
  INFO(injected);
  CHECK(absl::StrContains(injected, "injected 3\n"));
  CHECK(absl::StrContains(injected, "injected 7 (cut)"));
  Store store(server);
  REQUIRE_OK(checkpoint::VerifyStep("/ckpt/itest/step-00000005", store.Io()).status());
  auto restore = Trainers(daemon, dir, root, {0, 1}, 2, "restore",
                          {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("wrong credentials for the store: a clear refusal, no secret shown") {
  const std::string dir = ShortTempDir("s3-creds");
  S3TestServer server = StartedServer(dir);
  const std::string wrong = "wrongSecretKeyThatMustNeverBePrinted0000";
  Daemon daemon(dir, StoreDaemon(dir, server, wrong));
  REQUIRE(daemon.Start());
  auto train = Trainers(daemon, dir, RootUrl(server), {0}, 1, "train", {"--steps=2"});
  const auto code = train[0]->Wait(absl::Seconds(60));
  INFO(train[0]->Output() << daemon.Log());
  CHECK(code != 0);
  CHECK(absl::StrContains(train[0]->Output(), "403 Forbidden; check the credentials"));
  CHECK_FALSE(absl::StrContains(train[0]->Output(), wrong));
  CHECK_FALSE(absl::StrContains(daemon.Log(), wrong));

  // A root outside the configured ones is refused by name.
  auto elsewhere = Trainers(daemon, dir, absl::StrCat("s3://", server.bucket, "/other"), {0}, 1,
                            "elsewhere", {"--steps=2"});
  CHECK(elsewhere[0]->Wait(absl::Seconds(60)) != 0);
  CHECK(absl::StrContains(elsewhere[0]->Output(), "not under an object-store root"));
  // Nor may a root climb out of the configured one: "s3://bucket/ckpt/../x"
  // would reach "x" once an HTTP client squashes the path.
  auto climbing = Trainers(daemon, dir, RootUrl(server) + "/../other", {0}, 1, "climbing",
                           {"--steps=2"});
  CHECK(climbing[0]->Wait(absl::Seconds(60)) != 0);
  CHECK(absl::StrContains(climbing[0]->Output(), "may not hold an empty name, '.' or '..'"));
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
