// Integration tests: a real zccd and real trainer processes (tests/test_trainer)
// talking over the unix socket and shared memory, checkpoints on a real disk.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <catch2/catch.hpp>
#include <fstream>
#include <future>
#include <random>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/futex.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

using checkpoint::ListCommittedSteps;
using checkpoint::ReadLatest;

// Until `latest` names `step`: a commit swaps it last, after step-N/ (with
// COMMITTED) appeared.
bool WaitLatest(const std::string& job_dir, int64_t step) {
  return Eventually(
      [&] {
        auto latest = ReadLatest(job_dir);
        return latest.ok() && *latest == step;
      },
      absl::Seconds(30), absl::Milliseconds(10));
}

TEST_CASE("two ranks snapshot and checkpoint; restore is bit-exact; SIGTERM cleans up") {
  const std::string dir = ShortTempDir("it-two");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto r0 = StartTrainer(daemon, dir, "train0", {"--rank=0", "--world=2", "--steps=12", "--block"});
  auto r1 = StartTrainer(daemon, dir, "train1", {"--rank=1", "--world=2", "--steps=12", "--block"});
  REQUIRE(r1->Wait(absl::Seconds(60)) == 0);
  REQUIRE(r0->Wait(absl::Seconds(60)) == 0);
  INFO(r0->Output() << daemon.Log());
  CHECK(r0->Values()["committed"] == "10");
  CHECK(std::stoi(r0->Values()["published"]) + std::stoi(r0->Values()["skipped_no_slot"]) == 12);

  const std::string job_dir = JobDir(daemon);
  REQUIRE(*ListCommittedSteps(job_dir) == std::vector<int64_t>{5, 10});
  REQUIRE(*ReadLatest(job_dir) == 10);
  const std::string step_dir = job_dir + "/step-00000010";
  auto report = checkpoint::VerifyStep(step_dir);
  REQUIRE_OK(report);
  CHECK(report->ranks == 2);
  CHECK(report->tensors == 2 * 13);
  auto index = ReadFileToString(step_dir + "/model.safetensors.index.json", 1 << 20);
  REQUIRE_OK(index);
  auto map = nlohmann::json::parse(*index)["weight_map"];
  CHECK(map.size() == 12);
  CHECK(map["rank1.layers.3.weight"] == "model-r00001.safetensors");

  // The trainers exited after step 12: zccd kept their snapshots, and the
  // newest step comes back from its memory (newer than the commit)...
  auto m0 = StartTrainer(daemon, dir, "memory0", {"--mode=restore", "--rank=0", "--world=2",
                                                   "--expect_step=12", "--expect_from=memory"});
  auto m1 = StartTrainer(daemon, dir, "memory1", {"--mode=restore", "--rank=1", "--world=2",
                                                   "--expect_step=12", "--expect_from=memory"});
  CHECK(m0->Wait(absl::Seconds(60)) == 0);
  CHECK(m1->Wait(absl::Seconds(60)) == 0);
  CHECK(m0->Values()["mismatched_tensors"] == "0");
  // ...and the commit, asked for by its step, from disk (zccd holds only
  // the newest snapshots).
  auto q0 = StartTrainer(daemon, dir, "restore0", {"--mode=restore", "--rank=0", "--world=2",
                                                    "--restore_step=10", "--expect_step=10",
                                                    "--expect_from=disk"});
  auto q1 = StartTrainer(daemon, dir, "restore1", {"--mode=restore", "--rank=1", "--world=2",
                                                    "--restore_step=10", "--expect_step=10",
                                                    "--expect_from=disk"});
  CHECK(q0->Wait(absl::Seconds(60)) == 0);
  CHECK(q1->Wait(absl::Seconds(60)) == 0);
  CHECK(q0->Values()["mismatched_tensors"] == "0");
  CHECK(q1->Values()["restored_step"] == "10");

  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix()).empty());
  CHECK_FALSE(PathExists(daemon.socket()));
  CHECK(absl::StrContains(daemon.Log(), "checkpoint job=itest step=10"));
}

TEST_CASE("a step that not every rank wrote is never committed nor restored") {
  const std::string dir = ShortTempDir("it-partial");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});  // restores read the disk
  REQUIRE(daemon.Start());
  // Rank 1 stops after step 10; rank 0 goes on to write step 15 alone.
  auto r0 = StartTrainer(daemon, dir, "train0",
                         {"--rank=0", "--world=2", "--steps=15", "--wait_commit=false", "--block"});
  auto r1 = StartTrainer(daemon, dir, "train1",
                         {"--rank=1", "--world=2", "--steps=10", "--wait_commit=false", "--block"});
  REQUIRE(r0->Wait(absl::Seconds(60)) == 0);
  REQUIRE(r1->Wait(absl::Seconds(60)) == 0);
  const std::string job_dir = JobDir(daemon);
  REQUIRE(WaitLatest(job_dir, 10));
  REQUIRE(WaitForPath(job_dir + "/step-00000015.partial/r00000.manifest.json", absl::Seconds(30)));
  CHECK_FALSE(PathExists(job_dir + "/step-00000015.partial/r00001.manifest.json"));
  CHECK_FALSE(PathExists(job_dir + "/step-00000015"));
  CHECK(*ListCommittedSteps(job_dir) == std::vector<int64_t>{5, 10});
  CHECK(*ReadLatest(job_dir) == 10);

  auto q0 = StartTrainer(daemon, dir, "restore0", {"--mode=restore", "--rank=0", "--world=2",
                                                    "--expect_step=10"});
  REQUIRE(q0->Wait(absl::Seconds(60)) == 0);
  CHECK(q0->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a trainer that closes releases its staging memory at once; one that asks keeps its "
          "snapshots for the next") {
  const std::string dir = ShortTempDir("it-close");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string prefix = daemon.shm_prefix();
  auto released = StartTrainer(daemon, dir, "released",
                               {"--job=released", "--steps=4", "--save_every=0", "--close=release"});
  REQUIRE(released->Wait(absl::Seconds(60)) == 0);
  CHECK(absl::StrContains(released->Output(), "close=ok"));
  // Gone when Close returned, not after retain_snapshots_s.
  CHECK(ShmSegments(prefix + ".released.").empty());
  CHECK(absl::StrContains(daemon.LatestLog(), "job released rank 0: closed; releasing"));

  auto kept = StartTrainer(daemon, dir, "kept",
                           {"--job=kept", "--steps=4", "--save_every=0", "--close=keep"});
  REQUIRE(kept->Wait(absl::Seconds(60)) == 0);
  CHECK(absl::StrContains(kept->Output(), "close=ok"));
  CHECK(!ShmSegments(prefix + ".kept.").empty());
  // Status shows what the job holds: nothing staged for live ranks, its
  // retained segment's bytes.
  {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "kept"});
    REQUIRE(code == 0);
    const auto job = nlohmann::json::parse(out)["jobs"][0];
    CHECK(job["staging_bytes"] == 0);
    CHECK(job["retained_bytes"].get<uint64_t>() > 0);
    CHECK(job["retained_bytes"] == job["retained"][0]["bytes"]);
    std::tie(code, out) = Zccctl(dir, daemon, {"status", "kept"});
    CHECK(absl::StrContains(out, "retained for restarted trainers"));
  }
  auto restore = StartTrainer(daemon, dir, "restore", {"--mode=restore", "--job=kept",
                                                       "--expect_step=4", "--expect_from=memory"});
  REQUIRE(restore->Wait(absl::Seconds(60)) == 0);
  CHECK(restore->Values()["mismatched_tensors"] == "0");

  // Without Close (its destructor: a trainer unwinding from an error) the
  // snapshots are kept too, as for one that died.
  auto unclosed = StartTrainer(daemon, dir, "unclosed",
                               {"--job=unclosed", "--steps=4", "--save_every=0"});
  REQUIRE(unclosed->Wait(absl::Seconds(60)) == 0);
  CHECK(!ShmSegments(prefix + ".unclosed.").empty());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a restore says which step the EMA is at: ahead after one from memory, the step's own "
          "from disk") {
  const std::string dir = ShortTempDir("it-emastep");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  // Steps 1-4, step 2 and 4 committed with their EMA; the snapshots of steps
  // 2-4 are kept in memory when the trainer closes.
  auto trained = StartTrainer(daemon, dir, "train",
                              {"--job=emastep", "--steps=4", "--save_every=2", "--ema_decay=0.9",
                               "--close=keep"});
  REQUIRE(trained->Wait(absl::Seconds(60)) == 0);
  // Step 3 from memory: the previous trainer's EMA has folded in step 4.
  auto from_memory = StartTrainer(daemon, dir, "memory",
                                  {"--mode=restore", "--job=emastep", "--ema_decay=0.9",
                                   "--restore_step=3", "--expect_step=3", "--expect_from=memory"});
  REQUIRE(from_memory->Wait(absl::Seconds(60)) == 0);
  INFO(from_memory->Output());
  CHECK(from_memory->Values()["restored_ema_step"] == "4");
  // Step 2 from disk: its own EMA.
  auto from_disk = StartTrainer(daemon, dir, "disk",
                                {"--mode=restore", "--job=emastep", "--ema_decay=0.9",
                                 "--restore_step=2", "--expect_step=2", "--expect_from=disk"});
  REQUIRE(from_disk->Wait(absl::Seconds(60)) == 0);
  INFO(from_disk->Output());
  CHECK(from_disk->Values()["restored_ema_step"] == "2");
  // Without an EMA: -1.
  auto plain = StartTrainer(daemon, dir, "plain",
                            {"--mode=restore", "--job=emastep", "--restore_step=2",
                             "--expect_step=2"});
  REQUIRE(plain->Wait(absl::Seconds(60)) == 0);
  CHECK(plain->Values()["restored_ema_step"] == "-1");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a step between EMA updates is restored with the EMA of the update before it, at that "
          "update's step") {
  const std::string dir = ShortTempDir("it-emagap");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});  // restores read the disk
  REQUIRE(daemon.Start());
  // The EMA folds in steps 4 and 8; steps 5 and 10 are committed.
  const std::vector<std::string> ema = {"--job=emagap", "--ema_decay=0.9", "--ema_interval=4"};
  std::vector<std::string> train = {"--steps=10", "--save_every=5", "--block"};
  train.insert(train.end(), ema.begin(), ema.end());
  auto trained = StartTrainer(daemon, dir, "train", train);
  INFO(trained->Output());
  REQUIRE(trained->Wait(absl::Seconds(60)) == 0);
  for (const auto& [step, ema_step] : {std::pair<int, int>{10, 8}, {5, 4}}) {
    std::vector<std::string> restore = {"--mode=restore", absl::StrCat("--restore_step=", step),
                                        absl::StrCat("--expect_step=", step),
                                        "--expect_from=disk"};
    restore.insert(restore.end(), ema.begin(), ema.end());
    auto restored = StartTrainer(daemon, dir, absl::StrCat("restore", step), restore);
    INFO(restored->Output());
    REQUIRE(restored->Wait(absl::Seconds(60)) == 0);
    CHECK(restored->Values()["restored_ema_step"] == absl::StrCat(ema_step));
  }
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a checkpoint step takes over a slot whose ordinary snapshot is not ingested yet") {
  const std::string dir = ShortTempDir("it-takeover");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=6", "--save_every=5", "--pause_at=1", "--daemon_timeout_s=30",
                         "--step_ms=5", "--wait_commit=false", "--slots=2"});
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(30)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 1));
  daemon.process()->Signal(SIGSTOP);
  t->Signal(SIGUSR1);
  REQUIRE(t->WaitForOutput("step=6 ", absl::Seconds(30)));
  daemon.process()->Signal(SIGCONT);
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  const std::string out = t->Output();
  INFO(out);
  // zccd is stopped: nothing is ingested from step 2 on.
  CHECK(absl::StrContains(out, "step=2 result=0"));  // a free slot (none is held back)
  CHECK(absl::StrContains(out, "step=3 result=0"));  // the other free slot
  CHECK(absl::StrContains(out, "step=4 result=1"));  // none free: skipped
  CHECK(absl::StrContains(out, "step=5 result=0"));  // due: takes over step 2's slot
  CHECK(absl::StrContains(out, "step=6 result=1"));
  CHECK(t->Values()["replaced"] == "1");
  REQUIRE(WaitForPath(JobDir(daemon) + "/step-00000005/COMMITTED", absl::Seconds(30)));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("snapshots are skipped and counted while the daemon cannot keep up") {
  const std::string dir = ShortTempDir("it-skip");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=8", "--save_every=0", "--pause_at=1", "--daemon_timeout_s=30",
                         "--linger_ms=3000", "--step_ms=5", "--slots=2"});
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(30)));
  daemon.process()->Signal(SIGSTOP);  // the daemon stops ingesting
  t->Signal(SIGUSR1);
  REQUIRE(t->WaitForOutput("step=8 ", absl::Seconds(30)));
  daemon.process()->Signal(SIGCONT);
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(30)));
  auto v = t->Values();
  INFO(t->Output());
  // Two slots: steps 2 and 3 take them, steps 4..8 find none.
  CHECK(std::stoi(v["skipped_no_slot"]) >= 5);
  CHECK(std::stoi(v["published"]) + std::stoi(v["skipped_no_slot"]) == 8);
  CHECK(v["skipped_disconnected"] == "0");

  auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "itest"});
  REQUIRE(code == 0);
  auto status = nlohmann::json::parse(out);
  CHECK(status["jobs"][0]["ranks"][0]["snapshots_skipped"].get<int64_t>() ==
        std::stoi(v["skipped_no_slot"]));
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("with Backpressure::kBlock the trainer waits for a slot instead of skipping") {
  const std::string dir = ShortTempDir("it-block");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=8", "--save_every=0", "--pause_at=1", "--daemon_timeout_s=30",
                         "--block", "--step_ms=5", "--slots=2"});
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(30)));
  // Let the daemon take step 1 first, so both slots are free when it stops.
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 1));
  daemon.process()->Signal(SIGSTOP);
  t->Signal(SIGUSR1);
  REQUIRE(t->WaitForOutput("step=3 ", absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(500));
  CHECK_FALSE(absl::StrContains(t->Output(), "step=4 "));  // blocked for a slot
  daemon.process()->Signal(SIGCONT);
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  auto v = t->Values();
  CHECK(v["published"] == "8");
  CHECK(v["skipped_no_slot"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("the trainer survives zccd being killed and re-registers with a new one") {
  const std::string dir = ShortTempDir("it-kill");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=100", "--save_every=5", "--step_ms=40", "--daemon_timeout_s=1",
                         "--block"});
  REQUIRE(t->WaitForOutput("step=10 ", absl::Seconds(30)));
  daemon.Kill();
  CHECK_FALSE(ShmSegments(daemon.shm_prefix()).empty());  // a crash leaves its segment behind
  REQUIRE(t->WaitForOutput("step=30 ", absl::Seconds(30)));
  CHECK(t->running());
  REQUIRE(daemon.Start());  // the restarted daemon removes the stale segment
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  auto v = t->Values();
  INFO(t->Output() << daemon.Log());
  CHECK(v["registrations"] == "2");
  CHECK(std::stoi(v["skipped_disconnected"]) > 0);
  CHECK(v["committed"] == "100");
  CHECK(absl::StrContains(daemon.Log(), "stale staging segment"));
  CHECK(*ReadLatest(JobDir(daemon)) == 100);
  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix()).empty());
}

TEST_CASE("a trainer stalled past its heartbeat timeout whose rank another trainer took "
          "never registers again") {
  const std::string dir = ShortTempDir("it-takeover");
  Daemon daemon(dir, {{"--client_timeout_s=2"}});
  REQUIRE(daemon.Start());
  auto a = StartTrainer(daemon, dir, "a",
                        {"--steps=6", "--pause_at=3", "--wait_commit=false", "--linger_ms=5000"});
  REQUIRE(a->WaitForOutput("paused", absl::Seconds(30)));
  // Stalled (no heartbeat) past zccd's client timeout: taken for dead.
  a->Signal(SIGSTOP);
  absl::SleepFor(absl::Seconds(3));
  auto b = StartTrainer(daemon, dir, "b",
                        {"--steps=10", "--wait_commit=false", "--linger_ms=1500"});
  REQUIRE(b->WaitForOutput("step=2 ", absl::Seconds(30)));
  a->Signal(SIGCONT);
  a->Signal(SIGUSR1);
  INFO(a->Output() << b->Output() << daemon.Log());
  REQUIRE(b->Wait(absl::Seconds(60)) == 0);
  // `a` lingers on after `b` left: the rank is free, and still `a` does not
  // take it back.
  REQUIRE(a->Wait(absl::Seconds(60)) == 0);
  auto va = a->Values();
  auto vb = b->Values();
  CHECK(absl::StrContains(a->Output(), "last_error=zccd gave this rank's shared memory"));
  CHECK(absl::StrContains(a->Output(), "does not register again"));
  CHECK(va["registrations"] == "1");
  CHECK(va["connected"] == "0");
  CHECK(vb["registrations"] == "1");
  CHECK(vb["skipped_disconnected"] == "0");
  CHECK(vb["published"] == "10");
  // Two registrations of the rank in all: `a`'s and `b`'s.
  const std::string log = daemon.Log();
  size_t registered = 0;
  for (size_t at = log.find("registered job itest rank 0/1"); at != std::string::npos;
       at = log.find("registered job itest rank 0/1", at + 1)) {
    ++registered;
  }
  CHECK(registered == 2);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("the demo trainer reports a zccd restart and finishes with a verified restore") {
  const std::string dir = ShortTempDir("it-demo");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  Subprocess demo({Runfile("tools/demo_trainer"), "--socket=" + daemon.socket(),
                   "--root=" + daemon.root(), "--steps=200", "--save_every=5", "--step_ms=50",
                   "--size_mb=8", "--tensors=18"},
                  dir + "/demo.log");
  // Killed mid-run: the demo goes on and registers with the new zccd.
  REQUIRE(demo.WaitForOutput("committed step 5", absl::Seconds(60)));
  daemon.Kill();
  REQUIRE(demo.WaitForOutput("daemon unavailable", absl::Seconds(30)));
  REQUIRE(daemon.Start());
  // Killed again as training ends: the final wait for the last commit sees
  // no zccd, says so and waits for the next one.
  REQUIRE(demo.WaitForOutput("step 195 ", absl::Seconds(60)));
  daemon.Kill();
  REQUIRE(demo.WaitForOutput("demo: zccd is not answering", absl::Seconds(30)));
  REQUIRE(daemon.Start());
  const auto code = demo.Wait(absl::Seconds(120));
  INFO(demo.Output() << daemon.Log());
  CHECK(code == 0);
  CHECK(absl::StrContains(demo.Output(), "demo: zccd restarted; the client registered again"));
  CHECK(absl::StrContains(demo.Output(), "zccd restarts survived: 2"));
  CHECK(absl::StrContains(demo.Output(), "restore check: all 18 tensors bit-identical"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("zccctl status, list and verify against a live daemon") {
  const std::string dir = ShortTempDir("it-ctl");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=10", "--linger_ms=5000"});
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));

  auto [code, out] = Zccctl(dir, daemon, {"--json", "status"});
  REQUIRE(code == 0);
  auto status = nlohmann::json::parse(out);
  REQUIRE(status["jobs"].size() == 1);
  CHECK(status["jobs"][0]["job_id"] == "itest");
  CHECK(status["jobs"][0]["last_committed_step"] == 10);  // numbers, not strings
  CHECK(status["jobs"][0]["ranks"][0]["last_persisted_step"] == 10);
  // The live job's staging memory: its ranks' segments.
  CHECK(status["jobs"][0]["staging_bytes"].get<uint64_t>() > 0);
  CHECK(status["jobs"][0]["staging_bytes"] == status["jobs"][0]["ranks"][0]["staging_bytes"]);
  std::tie(code, out) = Zccctl(dir, daemon, {"status"});
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "job itest"));
  CHECK(absl::StrContains(out, "staging memory "));

  std::tie(code, out) = Zccctl(dir, daemon, {"--json", "list", "itest"});
  REQUIRE(code == 0);
  auto list = nlohmann::json::parse(out);
  REQUIRE(list["checkpoints"].size() == 2);
  CHECK(list["checkpoints"][1]["step"] == 10);
  CHECK(list["checkpoints"][1]["total_bytes"].is_number());
  CHECK(list["checkpoints"][1]["is_latest"] == true);
  std::tie(code, out) = Zccctl(dir, daemon, {"list", "itest"});
  CHECK(absl::StrContains(out, "(latest)"));
  std::tie(code, out) = Zccctl(dir, daemon, {"list", "no-such-job"});
  CHECK(code == 1);

  std::tie(code, out) = Zccctl(dir, daemon, {"watch", "itest", "--interval", "0.1", "--count", "3"});
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "job itest"));

  std::tie(code, out) = Zccctl(dir, daemon, {"save", "itest"});
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "1 rank(s)"));

  const std::string step_dir = JobDir(daemon) + "/step-00000005";
  std::tie(code, out) = Zccctl(dir, daemon, {"verify", step_dir});
  CHECK(code == 0);
  {
    std::fstream f(step_dir + "/model-r00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 1000);
    f.put('\x7f');
  }
  std::tie(code, out) = Zccctl(dir, daemon, {"verify", step_dir});
  CHECK(code == 1);
  CHECK(absl::StrContains(out, "checksum mismatch"));

  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  REQUIRE(daemon.Stop() == 0);
  std::tie(code, out) = Zccctl(dir, daemon, {"status"});
  CHECK(code == 3);
  std::tie(code, out) = Zccctl(dir, daemon, {"frobnicate"});
  CHECK(code == 2);
  CHECK(absl::StrContains(out, "unknown command 'frobnicate'"));
  // Usage errors say what was wrong, before any daemon is contacted.
  std::tie(code, out) = Zccctl(dir, daemon, {"list"});
  CHECK(code == 2);
  CHECK(absl::StrContains(out, "list takes a job id"));
  std::tie(code, out) = Zccctl(dir, daemon, {"watch", "a", "b"});
  CHECK(code == 2);
  CHECK(absl::StrContains(out, "watch takes at most one job id"));
  std::tie(code, out) = Zccctl(dir, daemon, {"--interval", "0", "watch"});
  CHECK(code == 2);
  CHECK(absl::StrContains(out, "--interval must be a positive number"));
  std::tie(code, out) = Zccctl(dir, daemon, {"verify"});
  CHECK(code == 2);
  CHECK(absl::StrContains(out, "verify takes a step directory"));
}

// Direct gRPC access for malformed requests.
struct Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Control::Stub> control;
  std::unique_ptr<v1::Status::Stub> status;
  explicit Rpc(const Daemon& d)
      : channel(grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials())),
        control(v1::Control::NewStub(channel)),
        status(v1::Status::NewStub(channel)) {}

  grpc::Status Register(const v1::RegisterRequest& req, v1::RegisterResponse* resp = nullptr) {
    v1::RegisterResponse unused;
    grpc::ClientContext ctx;
    return control->Register(&ctx, req, resp ? resp : &unused);
  }
};

v1::RegisterRequest GoodRequest(const std::string& job) {
  v1::RegisterRequest req;
  req.set_job_id(job);
  req.set_rank(0);
  req.set_world_size(1);
  req.set_pid(getpid());
  auto* t = req.add_tensors();
  t->set_name("model.layers.0/attn.q_proj.weight");
  t->set_dtype(v1::BF16);
  t->add_shape(16);
  t->add_shape(16);
  t->set_kind(v1::PARAM);
  return req;
}

TEST_CASE("a checkpoint that cannot be written shows in the trainer's stats and zccctl status") {
  const std::string dir = ShortTempDir("it-fail");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  // A plain file where step 5's partial directory must go: that write fails,
  // step 10's succeeds.
  REQUIRE(MakeDirs(JobDir(daemon)).ok());
  REQUIRE(std::ofstream(JobDir(daemon) + "/step-00000005.partial").good());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=10", "--await_checkpoint_failure", "--linger_ms=5000"});
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  INFO(t->Output() << daemon.Log());
  auto values = t->Values();
  CHECK(values["checkpoint_failures"] == "1");
  CHECK(values["last_failed_step"] == "5");
  CHECK(values["committed"] == "10");
  CHECK(absl::StrContains(t->Output(), "could not write the checkpoint of step 5"));
  CHECK(absl::StrContains(t->Output(), "step-00000005.partial"));  // zccd's reason

  auto [code, out] = Zccctl(dir, daemon, {"status"});
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "CHECKPOINTS FAILING: rank 0, 1 failed write(s)"));
  std::tie(code, out) = Zccctl(dir, daemon, {"--json", "status"});
  CHECK(nlohmann::json::parse(out)["jobs"][0]["ranks"][0]["persist_failures"] == 1);
  CHECK(t->Wait(absl::Seconds(30)) == 0);
  REQUIRE(daemon.Stop() == 0);
}

// Flips a byte in the middle of the largest piece of `step_dir` (inside
// tensor data: the headers and manifests stay as committed); returns the
// piece's name.
std::string DamageTensorData(const std::string& step_dir) {
  auto index = checkpoint::LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  const format::ManifestTensor* piece = &index->pieces.front();
  for (const auto& p : index->pieces) {
    if (p.nbytes > piece->nbytes) piece = &p;
  }
  std::fstream f(JoinPath(step_dir, piece->file), std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  const std::streamoff at = static_cast<std::streamoff>(piece->offset + piece->nbytes / 2);
  f.seekg(at);
  const char c = static_cast<char>(f.get() ^ 0x5a);
  f.seekp(at);
  f.put(c);
  return piece->name;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("a step damaged after zccd checked it falls back to the next older step") {
  const std::string dir = ShortTempDir("it-dmg");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});  // restores read the disk
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=15"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  // The first restore checks step 15 (and zccd remembers that it did).
  auto first = StartTrainer(daemon, dir, "restore1", {"--mode=restore", "--expect_step=15"});
  REQUIRE(first->Wait(absl::Seconds(60)) == 0);
  // Then one byte of a tensor in step 15 changes on disk.
  const std::string shard = JobDir(daemon) + "/step-00000015/model-r00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.put(c);
  }
  auto second = StartTrainer(daemon, dir, "restore2", {"--mode=restore", "--expect_step=10"});
  CHECK(second->Wait(absl::Seconds(60)) == 0);
  INFO(second->Output() << daemon.Log());
  CHECK(second->Values()["restored_step"] == "10");
  CHECK(second->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(second->Output(), "restore skipped step-00000015: damaged"));
  CHECK(absl::StrContains(daemon.Log(), "falling back to an older step"));
  // And it stays rejected: the next restore does not try step 15 again.
  auto third = StartTrainer(daemon, dir, "restore3", {"--mode=restore", "--expect_step=10"});
  CHECK(third->Wait(absl::Seconds(60)) == 0);
  CHECK(Count(daemon.Log(), "falling back to an older step") == 1);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("tensor data damaged before any restore: the metadata check passes, the one read "
          "finds it, and the restore falls back to the older step") {
  const std::string dir = ShortTempDir("it-dmg1");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});  // restores read the disk
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=15"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  const std::string step15 = JobDir(daemon) + "/step-00000015";
  const std::string damaged = DamageTensorData(step15);
  // Only the data is damaged: what zccd checks before reading lets it through.
  REQUIRE_OK(checkpoint::CheckStepMetadata(step15, checkpoint::IoOptions(), nullptr));
  REQUIRE(checkpoint::VerifyStep(step15).status().code() == absl::StatusCode::kDataLoss);

  auto restore = StartTrainer(daemon, dir, "restore", {"--mode=restore", "--expect_step=10"});
  CHECK(restore->Wait(absl::Seconds(60)) == 0);
  INFO(restore->Output() << daemon.Log());
  // Every tensor holds step 10, bit for bit: nothing of step 15 reached it.
  CHECK(restore->Values()["restored_step"] == "10");
  CHECK(restore->Values()["mismatched_tensors"] == "0");
  // The reply named the skipped step and why; zccd logged it.
  const std::string out = restore->Output();
  CHECK(absl::StrContains(out, "restore skipped step-00000015: damaged, found while reading it: "
                               "checksum mismatch for tensor '" + damaged + "'"));
  CHECK(absl::StrContains(daemon.Log(), "checked the metadata of " + step15));
  CHECK(absl::StrContains(daemon.Log(), "falling back to an older step"));
  // Remembered as bad: the next restore of the latest reads step 10 only.
  auto again = StartTrainer(daemon, dir, "again", {"--mode=restore", "--expect_step=10"});
  CHECK(again->Wait(absl::Seconds(60)) == 0);
  CHECK(absl::StrContains(again->Output(), "restore skipped step-00000015: damaged"));
  CHECK(Count(daemon.Log(), "falling back to an older step") == 1);
  REQUIRE(daemon.Stop() == 0);
}

// A FIFO stands for a disk that stops answering: opening it for reading
// blocks until someone opens it for writing, which nobody does.
void PlantStuckFile(const std::string& path) {
  ::unlink(path.c_str());
  REQUIRE(mkfifo(path.c_str(), 0644) == 0);
}

TEST_CASE("status answers while a commit and a restore hang on the disk; SIGTERM still stops zccd") {
  const std::string dir = ShortTempDir("it-stuck");
  Daemon daemon(dir, {{"--stop_timeout_s=10", "--retain_snapshots_s=0"}});
  REQUIRE(daemon.Start());

  // A commit stuck reading rank 1's manifest (rank 0 of two is the trainer).
  const std::string partial = JobDir(daemon, "stuckc") + "/step-00000005.partial";
  REQUIRE(MakeDirs(partial).ok());
  PlantStuckFile(partial + "/r00001.manifest.json");
  auto committer = StartTrainer(daemon, dir, "stuckc",
                                {"--job=stuckc", "--world=2", "--rank=0", "--steps=5",
                                 "--wait_commit=false", "--linger_ms=60000"});
  REQUIRE(committer->WaitForOutput("published=", absl::Seconds(60)));
  // Rank 0 wrote step 5; its commit now waits on the manifest that never comes.
  nlohmann::json job;
  REQUIRE(Eventually([&] {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "stuckc"});
    if (code != 0) return false;
    job = nlohmann::json::parse(out)["jobs"][0];
    return job["ranks"][0]["last_persisted_step"] == 5;
  }, absl::Seconds(30)));

  // A restore stuck reading a shard of a committed step.
  auto trained = StartTrainer(daemon, dir, "stuckr-train", {"--job=stuckr", "--steps=5"});
  REQUIRE(trained->Wait(absl::Seconds(60)) == 0);
  PlantStuckFile(JobDir(daemon, "stuckr") + "/step-00000005/model-r00000.safetensors");
  auto restorer = StartTrainer(daemon, dir, "stuckr-restore", {"--job=stuckr", "--mode=restore"});
  REQUIRE(restorer->WaitForOutput("registered=1", absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(500));  // the restore request is in zccd by now
  CHECK(restorer->running());

  // Status, list and a new job's registration all answer meanwhile.
  for (int i = 0; i < 3; ++i) {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status"});
    INFO(out << daemon.Log());
    REQUIRE(code == 0);
    CHECK(absl::StrContains(out, "stuckc"));
    CHECK(absl::StrContains(out, "step-00000005"));  // pending commit
  }
  auto [code, out] = Zccctl(dir, daemon, {"list", "stuckr"});
  CHECK(code == 0);
  auto other = StartTrainer(daemon, dir, "other", {"--job=other", "--steps=5"});
  CHECK(other->Wait(absl::Seconds(60)) == 0);

  // SIGTERM: what hangs is abandoned after the stop timeout, not waited for.
  const auto stopped = daemon.Stop(absl::Seconds(60));
  INFO(daemon.Log());
  REQUIRE(stopped.has_value());  // exited, rather than waiting forever
  CHECK(absl::StrContains(daemon.Log(), "did not stop within 10s"));
}

TEST_CASE("a commit that hangs longer than the client's daemon timeout costs no registration") {
  const std::string dir = ShortTempDir("it-beat");
  Daemon daemon(dir, {{"--stop_timeout_s=10"}});
  REQUIRE(daemon.Start());
  // Step 5's commit hangs reading rank 1's manifest for the rest of the run
  // (5 s, five times the trainer's 1 s daemon timeout): the rank's writer and
  // the housekeeper's commit retries wait on it, heartbeats must not.
  const std::string partial = JobDir(daemon, "beat") + "/step-00000005.partial";
  REQUIRE(MakeDirs(partial).ok());
  PlantStuckFile(partial + "/r00001.manifest.json");
  auto t = StartTrainer(daemon, dir, "beat",
                        {"--job=beat", "--world=2", "--rank=0", "--steps=100", "--step_ms=50",
                         "--daemon_timeout_s=1", "--wait_commit=false"});
  REQUIRE(t->WaitForOutput("step=50 ", absl::Seconds(60)));
  auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "beat"});
  CHECK(code == 0);
  CHECK(absl::StrContains(out, "step-00000005"));  // still pending
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  INFO(t->Output() << daemon.Log());
  auto v = t->Values();
  CHECK(v["registrations"] == "1");
  CHECK(v["skipped_disconnected"] == "0");
  CHECK(v["connected"] == "1");
  CHECK_FALSE(absl::StrContains(t->Output(), "has not answered"));
  REQUIRE(daemon.Stop(absl::Seconds(60)).has_value());
}

TEST_CASE("a shard write stalled longer than the client's daemon timeout costs no registration") {
  const std::string dir = ShortTempDir("it-stall");
  // Every request on a model shard file waits 1 s: a write takes about 3 s
  // (open, data, fdatasync), three times the trainer's 1 s daemon timeout,
  // while the trainer goes on stepping every 50 ms. A checkpoint every 100
  // steps (5 s) is one the disk can keep up with, so no snapshot is lost.
  DaemonOptions options;
  options.env = {"ZCCD_INJECT_STORAGE_FAULTS=path=model-,op_delay_ms=1000"};
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "stall",
                        {"--job=stall", "--steps=210", "--step_ms=50", "--save_every=100",
                         "--daemon_timeout_s=1", "--wait_commit=false"});
  REQUIRE(t->WaitForOutput("step=120 ", absl::Seconds(60)));
  // Step 100's write is still stalled (1 s of steps have passed, less than
  // the write's 3 s); status answers meanwhile, and ingest (EMA, free slots)
  // goes on past the stalled step.
  auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "stall"});
  INFO(out << daemon.Log());
  REQUIRE(code == 0);
  const nlohmann::json rank = nlohmann::json::parse(out)["jobs"][0]["ranks"][0];
  CHECK(rank["last_persisted_step"] == -1);
  CHECK(rank["last_snapshot_step"].get<int64_t>() >= 115);
  REQUIRE(t->Wait(absl::Seconds(120)) == 0);
  INFO(t->Output() << daemon.Log());
  auto v = t->Values();
  CHECK(v["registrations"] == "1");
  CHECK(v["skipped_disconnected"] == "0");
  CHECK(v["skipped_no_slot"] == "0");
  CHECK(v["connected"] == "1");
  CHECK_FALSE(absl::StrContains(t->Output(), "has not answered"));
  CHECK(absl::StrContains(daemon.Log(), "storage fault injection is ON"));
  // The stalled write did land: the stall delays, it does not lose.
  REQUIRE(Eventually([&] {
    auto [c, o] = Zccctl(dir, daemon, {"--json", "status", "stall"});
    return c == 0 && nlohmann::json::parse(o)["jobs"][0]["ranks"][0]["last_persisted_step"] != "-1";
  }, absl::Seconds(60)));
  REQUIRE(daemon.Stop(absl::Seconds(90)).has_value());
}

TEST_CASE("a failed write of the previous layout's snapshots is tried again; the step is not "
          "lost") {
  const std::string dir = ShortTempDir("it-relayout");
  // The first write request into step 7's directory fails (EIO): the write
  // of step 7 from the old layout's memory fails once.
  DaemonOptions options;
  options.env = {"ZCCD_INJECT_STORAGE_FAULTS=path=itest/step-00000007,eio_on_write=1"};
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  // Two ranks snapshot steps 1..7 (step 5 a checkpoint) and die after 7.
  std::vector<std::unique_ptr<Subprocess>> train;
  for (int rank = 0; rank < 2; ++rank) {
    train.push_back(StartTrainer(daemon, dir, absl::StrCat("train", rank),
                                 {"--steps=7", "--save_every=5", "--block", "--pause_at=7",
                                  absl::StrCat("--rank=", rank), "--world=2"}));
  }
  for (auto& t : train) REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 7, 2));
  REQUIRE(WaitForPath(JobDir(daemon, "itest") + "/step-00000005/COMMITTED", absl::Seconds(30)));
  for (auto& t : train) {
    t->Signal(SIGKILL);
    REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  }
  // The job resumes on one rank: step 7 is written from the two ranks'
  // memory (the second try) and restored, not step 5.
  auto r = StartTrainer(daemon, dir, "restore",
                        {"--mode=restore", "--expect_step=7", "--expect_from=disk"});
  REQUIRE(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output() << daemon.Log());
  CHECK(r->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(daemon.Log(), "trying again in 1s"));
  CHECK(absl::StrContains(daemon.Log(), "written from memory and committed"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("bad requests get clear errors and committed checkpoints stay intact") {
  const std::string dir = ShortTempDir("it-bad");
  Daemon daemon(dir, {{"--staging_budget_mb=64", "--config=" + dir + "/limits.conf"}});
  {
    std::FILE* f = std::fopen((dir + "/limits.conf").c_str(), "w");
    std::fputs("max_tensors_per_rank: 1000\n", f);
    std::fclose(f);
  }
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=5"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  const std::string step_dir = JobDir(daemon) + "/step-00000005";
  REQUIRE_OK(checkpoint::VerifyStep(step_dir));

  Rpc rpc(daemon);
  struct Case {
    std::string what;
    std::function<void(v1::RegisterRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"job id ..", [](auto& r) { r.set_job_id(".."); }, grpc::INVALID_ARGUMENT, "job id"},
      {"job id with /", [](auto& r) { r.set_job_id("a/../../b"); }, grpc::INVALID_ARGUMENT, "job id"},
      {"job id with NUL", [](auto& r) { r.set_job_id(std::string("a\0b", 3)); }, grpc::INVALID_ARGUMENT, "job id"},
      {"empty job id", [](auto& r) { r.set_job_id(""); }, grpc::INVALID_ARGUMENT, "empty"},
      {"rank >= world", [](auto& r) { r.set_rank(3); }, grpc::INVALID_ARGUMENT, "world_size"},
      {"zero world", [](auto& r) { r.set_world_size(0); }, grpc::INVALID_ARGUMENT, "world_size"},
      {"one slot", [](auto& r) { r.set_num_slots(1); }, grpc::INVALID_ARGUMENT, "num_slots"},
      {"empty name", [](auto& r) { r.mutable_tensors(0)->set_name(""); }, grpc::INVALID_ARGUMENT, "empty"},
      {"metadata key as a name", [](auto& r) { r.mutable_tensors(0)->set_name("__metadata__"); },
       grpc::INVALID_ARGUMENT, "reserved"},
      {"job id latest", [](auto& r) { r.set_job_id("latest"); }, grpc::INVALID_ARGUMENT, "reserved"},
      {"job id step-N", [](auto& r) { r.set_job_id("step-00000010"); }, grpc::INVALID_ARGUMENT,
       "reserved"},
      {"NUL in name", [](auto& r) { r.mutable_tensors(0)->set_name(std::string("w\0x", 3)); },
       grpc::INVALID_ARGUMENT, "forbidden byte"},
      {"control char", [](auto& r) { r.mutable_tensors(0)->set_name("w\x01x"); }, grpc::INVALID_ARGUMENT,
       "forbidden byte"},
      {"over-long name", [](auto& r) { r.mutable_tensors(0)->set_name(std::string(600, 'n')); },
       grpc::INVALID_ARGUMENT, "limit"},
      {"duplicate name", [](auto& r) { *r.add_tensors() = r.tensors(0); }, grpc::INVALID_ARGUMENT,
       "registered twice"},
      {"negative dim", [](auto& r) { r.mutable_tensors(0)->set_shape(0, -4); }, grpc::INVALID_ARGUMENT,
       "negative"},
      {"no dtype", [](auto& r) { r.mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::INVALID_ARGUMENT, "dtype"},
      {"no kind", [](auto& r) { r.mutable_tensors(0)->set_kind(v1::TENSOR_KIND_UNSPECIFIED); },
       grpc::INVALID_ARGUMENT, "kind"},
      {"optional parameter",
       [](auto& r) {
         r.mutable_tensors(0)->set_kind(v1::PARAM);
         r.mutable_tensors(0)->set_optional(true);
       },
       grpc::INVALID_ARGUMENT, "only EXTRA tensors may be optional"},
      {"absurd shape",
       [](auto& r) {
         r.mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
         r.mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
       },
       grpc::INVALID_ARGUMENT, ""},
      {"too many tensors",
       [](auto& r) {
         for (int i = 0; i < 5000; ++i) *r.add_tensors() = r.tensors(0);
       },
       grpc::INVALID_ARGUMENT, "limit is 1000"},
      {"over the staging budget", [](auto& r) { r.mutable_tensors(0)->set_shape(0, 40 << 20); },
       grpc::RESOURCE_EXHAUSTED, "budget"},
      {"root outside allowed", [](auto& r) { r.set_checkpoint_root("/etc"); }, grpc::PERMISSION_DENIED,
       "allowed root"},
      {"relative root", [](auto& r) { r.set_checkpoint_root("ckpt"); }, grpc::INVALID_ARGUMENT,
       "absolute"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::RegisterRequest req = GoodRequest("bad-input");
    c.mutate(req);
    const grpc::Status st = rpc.Register(req);
    CHECK(st.error_code() == c.code);
    CHECK(absl::StrContains(st.error_message(), c.message));
  }

  // A job directory planted as a symlink out of the root.
  REQUIRE(symlink("/tmp", (daemon.root() + "/escape").c_str()) == 0);
  CHECK(rpc.Register(GoodRequest("escape")).error_code() == grpc::PERMISSION_DENIED);

  // Duplicate registration while the first registrant (this process) lives.
  v1::RegisterResponse first;
  REQUIRE(rpc.Register(GoodRequest("dup"), &first).ok());
  const grpc::Status dup = rpc.Register(GoodRequest("dup"));
  CHECK(dup.error_code() == grpc::ALREADY_EXISTS);
  CHECK(absl::StrContains(dup.error_message(), "already registered"));
  // A registration replaced in place (RegisterRequest.replaces_generation,
  // a state blob that grew): only EXTRA blobs may change, only in size, and
  // only the live registration of that generation is replaced.
  {
    auto with_blob = [](int64_t bytes) {
      v1::RegisterRequest r = GoodRequest("replace");
      auto* blob = r.add_tensors();
      blob->set_name("zcc.r00000.rank_state");
      blob->set_dtype(v1::U8);
      blob->add_shape(bytes);
      blob->set_kind(v1::EXTRA);
      return r;
    };
    v1::RegisterResponse registered;
    REQUIRE(rpc.Register(with_blob(4096), &registered).ok());
    v1::RegisterRequest wrong = with_blob(8192);
    wrong.set_replaces_generation(registered.generation() + 1000);
    grpc::Status st = rpc.Register(wrong);
    CHECK(st.error_code() == grpc::FAILED_PRECONDITION);
    CHECK(absl::StrContains(st.error_message(), "no registration of generation"));
    v1::RegisterRequest param = with_blob(8192);
    param.set_replaces_generation(registered.generation());
    param.mutable_tensors(0)->set_shape(0, 32);
    st = rpc.Register(param);
    CHECK(st.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(absl::StrContains(st.error_message(), "more than an EXTRA blob's size"));
    v1::RegisterRequest fewer = GoodRequest("replace");
    fewer.set_replaces_generation(registered.generation());
    CHECK(rpc.Register(fewer).error_code() == grpc::INVALID_ARGUMENT);
    v1::RegisterRequest nowhere = with_blob(8192);
    nowhere.set_job_id("never-registered");
    nowhere.set_replaces_generation(registered.generation());
    CHECK(rpc.Register(nowhere).error_code() == grpc::FAILED_PRECONDITION);
    // A larger blob replaces it: a new generation; the old one is gone.
    v1::RegisterRequest grown = with_blob(8192);
    grown.set_replaces_generation(registered.generation());
    v1::RegisterResponse replaced;
    REQUIRE(rpc.Register(grown, &replaced).ok());
    CHECK(replaced.generation() != registered.generation());
    CHECK(rpc.Register(grown).error_code() == grpc::FAILED_PRECONDITION);
  }
  // Same id, different world size: two jobs cannot share an id.
  v1::RegisterRequest other = GoodRequest("dup");
  other.set_world_size(2);
  other.set_rank(1);
  CHECK(rpc.Register(other).error_code() == grpc::FAILED_PRECONDITION);

  // Restore for unknown jobs, ranks and stale generations.
  v1::RestoreRequest rreq;
  v1::RestoreResponse rresp;
  rreq.set_job_id("nobody");
  {
    grpc::ClientContext ctx;
    CHECK(rpc.control->Restore(&ctx, rreq, &rresp).error_code() == grpc::NOT_FOUND);
  }
  rreq.set_job_id("dup");
  rreq.set_generation(first.generation() + 1000);
  {
    grpc::ClientContext ctx;
    CHECK(rpc.control->Restore(&ctx, rreq, &rresp).error_code() == grpc::FAILED_PRECONDITION);
  }
  rreq.set_generation(first.generation());
  {
    grpc::ClientContext ctx;  // registered, but nothing committed for this job
    CHECK(rpc.control->Restore(&ctx, rreq, &rresp).error_code() == grpc::NOT_FOUND);
  }

  // Garbage in the shared-memory control block: reported, not fatal.
  auto segment = shm::Segment::Open(first.shm_name(), first.segment_bytes());
  REQUIRE_OK(segment);
  shm::ControlBlock* cb = segment->control();
  cb->slots[0].state.store(77);
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);
  std::string last_error;
  for (int i = 0; i < 200 && last_error.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    v1::StatusRequest sreq;
    sreq.set_job_id("dup");
    v1::StatusResponse sresp;
    grpc::ClientContext ctx;
    REQUIRE(rpc.status->GetStatus(&ctx, sreq, &sresp).ok());
    last_error = sresp.jobs(0).ranks(0).last_error();
  }
  CHECK(absl::StrContains(last_error, "out of range"));
  cb->slots[0].state.store(static_cast<uint32_t>(shm::SlotState::kReady));
  cb->slots[0].step.store(-7);
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);

  // A client that never releases its buffers is cut off after a few.
  v1::RegisterRequest cap = GoodRequest("cap");
  cap.set_ema_decay(0.9f);
  cap.mutable_tensors(0)->set_ema_eligible(true);
  v1::RegisterResponse capped;
  REQUIRE(rpc.Register(cap, &capped).ok());
  v1::ReadEmaRequest ema_req;
  ema_req.set_job_id("cap");
  ema_req.set_generation(capped.generation());
  for (int i = 0; i < 4; ++i) {
    v1::ReadEmaResponse ema_resp;
    grpc::ClientContext ctx;
    REQUIRE(rpc.control->ReadEma(&ctx, ema_req, &ema_resp).ok());
  }
  {
    v1::ReadEmaResponse ema_resp;
    grpc::ClientContext ctx;
    const grpc::Status refused = rpc.control->ReadEma(&ctx, ema_req, &ema_resp);
    CHECK(refused.error_code() == grpc::RESOURCE_EXHAUSTED);
    CHECK(absl::StrContains(refused.error_message(), "RestoreDone"));
  }

  // The daemon still serves, and the committed checkpoint is untouched.
  v1::RegisterResponse fine;
  REQUIRE(rpc.Register(GoodRequest("still-serving"), &fine).ok());
  CHECK(fine.placements(0).name() == "model.layers.0/attn.q_proj.weight");
  CHECK_OK(checkpoint::VerifyStep(step_dir));
  CHECK(*ReadLatest(JobDir(daemon)) == 5);
  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix()).empty());
}

// zccd's peak resident memory (VmHWM), in bytes.
int64_t PeakRss(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmHWM:")) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// One call of `method` with `body` as the request's encoding, as any local
// user can send it.
grpc::Status RawCall(const Daemon& d, const std::string& method, const std::string& body) {
  auto channel = grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status st) { done.set_value(st); });
  return done.get_future().get();
}

std::string Repeated(absl::string_view piece, size_t times) {
  std::string out;
  out.reserve(piece.size() * times);
  for (size_t i = 0; i < times; ++i) out.append(piece.data(), piece.size());
  return out;
}

TEST_CASE("hostile encodings on the control socket are refused before they are parsed; zccd's "
          "memory stays put and it serves on") {
  const std::string dir = ShortTempDir("it-hostile");
  Daemon daemon(dir, {{"--config=" + dir + "/limits.conf"}});
  {
    std::FILE* f = std::fopen((dir + "/limits.conf").c_str(), "w");
    std::fputs("max_tensors_per_rank: 1000\n", f);
    std::fclose(f);
  }
  REQUIRE(daemon.Start());
  const pid_t pid = daemon.process()->pid();
  Rpc rpc(daemon);
  REQUIRE(rpc.Register(GoodRequest("before")).ok());
  const int64_t peak_before = PeakRss(pid);
  REQUIRE(peak_before > 0);

  struct Case {
    std::string what;
    std::string method;
    std::string body;
    grpc::StatusCode code;
    std::string message;
  };
  // Field 4 of RegisterRequest (tensors), empty, over and over: 2 bytes each
  // on the wire, a TensorSpec object each once parsed (about 65 times the
  // size: 64 MiB of them would take zccd about 4 GiB).
  const std::string empty_specs = std::string("\x22\x00", 2);
  const Case cases[] = {
      {"64 MiB of empty tensors, over Register's size for 1000 tensors", "/zcc.v1.Control/Register",
       Repeated(empty_specs, 32 << 20), grpc::RESOURCE_EXHAUSTED, "Register takes at most"},
      {"1 MiB of empty tensors, within its size but not its parse cost",
       "/zcc.v1.Control/Register", Repeated(empty_specs, 512 << 10), grpc::RESOURCE_EXHAUSTED,
       "parsing it would take more than"},
      {"8 MiB of unknown fields in a status request", "/zcc.v1.Status/GetStatus",
       Repeated(std::string("\xc0\x3e\x00", 3), (8 << 20) / 3), grpc::RESOURCE_EXHAUSTED,
       "GetStatus takes at most 65536"},
      {"a group in a restore request", "/zcc.v1.Control/Restore", std::string("\x0b\x0c", 2),
       grpc::INVALID_ARGUMENT, "group"},
      {"a truncated save request", "/zcc.v1.Control/SaveNow", std::string("\x0a\x05" "ab", 4),
       grpc::INVALID_ARGUMENT, "past the end"},
      {"a job file past 16 MiB", "/zcc.v1.Control/PutJobFile",
       std::string("\x1a\x80\x80\x80\x09", 5) + std::string(18 << 20, 'x'),
       grpc::RESOURCE_EXHAUSTED, "PutJobFile takes at most"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const grpc::Status st = RawCall(daemon, c.method, c.body);
    CHECK(st.error_code() == c.code);
    CHECK(absl::StrContains(st.error_message(), c.message));
  }
  const int64_t peak_after = PeakRss(pid);
  INFO("zccd's peak RSS went from " << peak_before << " to " << peak_after << " bytes");
  // The largest request (64 MiB) is held once by gRPC; nothing is parsed.
  CHECK(peak_after - peak_before < int64_t{256} << 20);

  // It serves on: a registration, a status and a well-formed raw call.
  v1::RegisterResponse fine;
  REQUIRE(rpc.Register(GoodRequest("after"), &fine).ok());
  CHECK(fine.placements(0).name() == "model.layers.0/attn.q_proj.weight");
  v1::StatusRequest sreq;
  CHECK(RawCall(daemon, "/zcc.v1.Status/GetStatus", sreq.SerializeAsString()).ok());
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing

namespace zcc::testing {
namespace {

TEST_CASE("multi-node: two daemons, four ranks, one shared root commit and restore together") {
  const std::string dir = ShortTempDir("it-multi");
  const std::string shared = dir + "/shared-root";
  REQUIRE(mkdir(shared.c_str(), 0755) == 0);
  Daemon a(dir, {{}, shared, "node-a"});
  Daemon b(dir, {{}, shared, "node-b"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank = 0; rank < 4; ++rank) {
    trainers.push_back(StartTrainer(rank < 2 ? a : b, dir, absl::StrCat("train", rank),
                                    {absl::StrCat("--rank=", rank), "--world=4", "--steps=10",
                                     "--tensors=3", "--kib=128"}));
  }
  for (auto& t : trainers) REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  INFO(a.Log() << b.Log());
  const std::string job_dir = shared + "/itest";
  CHECK(*ListCommittedSteps(job_dir) == std::vector<int64_t>{5, 10});
  auto report = checkpoint::VerifyStep(job_dir + "/step-00000010");
  REQUIRE_OK(report);
  CHECK(report->ranks == 4);
  // Only the daemon serving rank 0 commits.
  CHECK(absl::StrContains(a.Log(), "checkpoint job=itest step=10"));
  CHECK_FALSE(absl::StrContains(b.Log(), "checkpoint job=itest step=10"));

  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < 4; ++rank) {
    restorers.push_back(StartTrainer(rank < 2 ? a : b, dir, absl::StrCat("restore", rank),
                                     {"--mode=restore", absl::StrCat("--rank=", rank), "--world=4",
                                      "--expect_step=10", "--tensors=3", "--kib=128"}));
  }
  for (auto& r : restorers) {
    CHECK(r->Wait(absl::Seconds(60)) == 0);
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }
  REQUIRE(a.Stop() == 0);
  REQUIRE(b.Stop() == 0);
}

TEST_CASE("a commit that times out is reported and its partial directory removed") {
  const std::string dir = ShortTempDir("it-timeout");
  Daemon daemon(dir, {{"--commit_timeout_s=1"}});
  REQUIRE(daemon.Start());
  // World of 2, but rank 1 never comes: step 5 waits for its manifest.
  auto t = StartTrainer(daemon, dir, "train0",
                        {"--rank=0", "--world=2", "--steps=5", "--wait_commit=false", "--linger_ms=4000"});
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(30)));
  const std::string partial = JobDir(daemon) + "/step-00000005.partial";
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string last_error;
  while (absl::Now() < deadline) {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "itest"});
    if (code == 0) {
      auto status = nlohmann::json::parse(out);
      if (!status["jobs"].empty()) last_error = status["jobs"][0]["last_error"].get<std::string>();
    }
    if (absl::StrContains(last_error, "timed out") && !PathExists(partial)) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(absl::StrContains(last_error, "commit of step 5 timed out"));
  CHECK_FALSE(PathExists(partial));
  CHECK(ListCommittedSteps(JobDir(daemon))->empty());
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("zccctl gc drops a step whose commit timed out without waiting for housekeeping") {
  const std::string dir = ShortTempDir("it-gc-pending");
  // Housekeeping rounds a minute apart: only gc can drop the step in time.
  {
    std::FILE* f = std::fopen((dir + "/slow.conf").c_str(), "w");
    std::fputs("heartbeat_interval_ms: 60000\n", f);
    std::fclose(f);
  }
  Daemon daemon(dir, {{"--config=" + dir + "/slow.conf", "--commit_timeout_s=3", "--client_timeout_s=120"}});
  REQUIRE(daemon.Start());
  // World of 2, rank 1 never comes: step 4 waits for its manifest while
  // rank 0 stays registered.
  auto t = StartTrainer(daemon, dir, "train0",
                        {"--rank=0", "--world=2", "--steps=4", "--save_every=4",
                         "--wait_commit=false", "--linger_ms=10000"});
  const std::string partial = JobDir(daemon) + "/step-00000004.partial";
  REQUIRE(Eventually([&] { return PathExists(partial + "/r00000.manifest.json"); },
                     absl::Seconds(30), absl::Milliseconds(10)));
  // Before its timeout the step may still commit: gc leaves it.
  auto [early_code, early] = Zccctl(dir, daemon, {"--json", "gc", "itest"});
  REQUIRE(early_code == 0);
  CHECK(PathExists(partial));
  absl::SleepFor(absl::Milliseconds(3500));
  // The job's root named (as an operator may): still the job's own
  // retention, which drops the step it waits for, not the daemon's over it.
  const std::string root = JobDir(daemon).substr(0, JobDir(daemon).rfind('/'));
  auto [code, out] = Zccctl(dir, daemon, {"--json", "gc", "itest", "--root", root});
  REQUIRE(code == 0);
  CHECK_FALSE(PathExists(partial));
  auto [status_code, status] = Zccctl(dir, daemon, {"--json", "status", "itest"});
  REQUIRE(status_code == 0);
  CHECK(absl::StrContains(status, "commit of step 4 timed out"));
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  // zccd beats once a minute, which the trainer learnt when it registered:
  // ten seconds without a beat are no reason to take zccd for gone.
  CHECK_FALSE(absl::StrContains(t->Output(), "has not answered"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("zccctl gc applies retention and removes abandoned partials") {
  const std::string dir = ShortTempDir("it-gc");
  Daemon daemon(dir, {{"--keep_last=2", "--commit_timeout_s=1"}});
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=20", "--save_every=2", "--tensors=2", "--kib=16", "--block"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  const std::string job_dir = JobDir(daemon);
  // Retention ran after every commit: only the newest two remain.
  CHECK(*ListCommittedSteps(job_dir) == std::vector<int64_t>{18, 20});
  // An abandoned partial from a crashed run, older than the commit timeout.
  REQUIRE(MakeDirs(job_dir + "/step-00000022.partial").ok());
  absl::SleepFor(absl::Milliseconds(2100));
  auto [code, out] = Zccctl(dir, daemon, {"--json", "gc", "itest"});
  REQUIRE(code == 0);
  auto gc = nlohmann::json::parse(out);
  CHECK(gc["removed_partials"][0] == "step-00000022.partial");
  CHECK(gc["kept_steps"].size() == 2);
  CHECK_FALSE(PathExists(job_dir + "/step-00000022.partial"));
  CHECK(*ListCommittedSteps(job_dir) == std::vector<int64_t>{18, 20});
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing


namespace zcc::testing {
namespace {

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("a trainer killed at a random step restores that step from zccd's memory, EMA "
          "included, after two more that died at start-up; after zccd restarts, the last "
          "commit from disk") {
  const std::string dir = ShortTempDir("it-mem");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const int killed_at = std::uniform_int_distribution<int>(3, 29)(rng);
  INFO("seed " << seed << ": killed after step " << killed_at);
  const std::vector<std::string> model = {"--save_every=10", "--ema_decay=0.9", "--block"};
  auto t = StartTrainer(daemon, dir, "train", Concat({"--steps=30", absl::StrCat("--pause_at=", killed_at)}, model));
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", killed_at));
  t->Signal(SIGKILL);
  REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  // Twice a trainer registers and dies before it restores or snapshots (a
  // crash loop at start-up): the snapshots go on to the next, and so does
  // the EMA that folded them in.
  for (int i = 0; i < 2; ++i) {
    auto crashed = StartTrainer(daemon, dir, absl::StrCat("crashed", i),
                                Concat({"--steps=30", "--pause_before_train"}, model));
    REQUIRE(crashed->WaitForOutput("ready", absl::Seconds(60)));
    crashed->Signal(SIGKILL);
    REQUIRE(crashed->Wait(absl::Seconds(10)).has_value());
  }
  // The restarted trainer gets the step it died after, bit-exact, with the
  // EMA as of that step, from zccd's memory.
  auto r = StartTrainer(daemon, dir, "restore",
                        Concat({"--mode=restore", "--check_ema",
                                absl::StrCat("--expect_step=", killed_at), "--expect_from=memory"},
                               model));
  CHECK(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output() << daemon.Log());
  CHECK(r->Values()["mismatched_tensors"] == "0");
  CHECK(r->Values()["ema_mismatches"] == "0");
  CHECK(r->Values()["ema_checked"] != "0");

  // Another job killed the same way, but zccd restarts before the trainer
  // does: its memory is gone and the restore reads the last commit.
  const int killed2_at = std::uniform_int_distribution<int>(12, 29)(rng);
  const int64_t committed = killed2_at / 10 * 10;
  INFO("second job killed after step " << killed2_at);
  auto t2 = StartTrainer(daemon, dir, "train2",
                         Concat({"--job=second", "--steps=30", absl::StrCat("--pause_at=", killed2_at)},
                                model));
  REQUIRE(t2->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitForPath(JobDir(daemon, "second") + absl::StrFormat("/step-%08d/COMMITTED", committed),
                      absl::Seconds(30)));
  t2->Signal(SIGKILL);
  REQUIRE(t2->Wait(absl::Seconds(10)).has_value());
  REQUIRE(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  auto d = StartTrainer(daemon, dir, "restore2",
                        Concat({"--job=second", "--mode=restore", "--check_ema",
                                absl::StrCat("--expect_step=", committed), "--expect_from=disk"},
                               model));
  CHECK(d->Wait(absl::Seconds(60)) == 0);
  INFO(d->Output());
  CHECK(d->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("retained snapshots show in status and give way to a registration that needs the "
          "staging budget") {
  const std::string dir = ShortTempDir("it-retain");
  // Each rank below: 2 slots of 9 MB (6 parameters of 1 MiB and their
  // optimizer state), 18.9 MB; two do not fit in 30 MiB.
  Daemon daemon(dir, {{"--staging_budget_mb=30"}});
  REQUIRE(daemon.Start());
  const std::vector<std::string> model = {"--kib=1024", "--tensors=6", "--slots=2"};
  auto a = StartTrainer(daemon, dir, "a", Concat({"--job=a", "--steps=5"}, model));
  REQUIRE(a->Wait(absl::Seconds(60)) == 0);
  nlohmann::json status;
  REQUIRE(Eventually([&] {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status", "a"});
    if (code != 0) return false;
    status = nlohmann::json::parse(out);
    return status["jobs"].size() == 1 && status["jobs"][0].contains("retained");
  }, absl::Seconds(30)));
  INFO(status.dump() << daemon.Log());
  const nlohmann::json& kept = status["jobs"][0]["retained"][0];
  CHECK(kept["steps"][0] == 5);
  CHECK(kept["bytes"].get<uint64_t>() > (15u << 20));
  {
    auto [code, text] = Zccctl(dir, daemon, {"status", "a"});
    CHECK(code == 0);
    CHECK(absl::StrContains(text, "in memory for rank 0: step(s) 5 4"));
  }
  // Another job's rank needs the room: the retained snapshots go, not the
  // registration.
  auto b = StartTrainer(daemon, dir, "b", Concat({"--job=b", "--steps=3"}, model));
  CHECK(b->Wait(absl::Seconds(60)) == 0);
  INFO(b->Output());
  CHECK(b->Values()["registered"] == "1");
  CHECK(absl::StrContains(daemon.Log(), "dropped a rank's retained snapshots to make room"));
  // Job a's rank restarts: its memory is gone, so it restores from disk.
  auto r = StartTrainer(daemon, dir, "a-restore",
                        Concat({"--job=a", "--mode=restore", "--expect_step=5",
                                "--expect_from=disk"}, model));
  CHECK(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("the staging pool makes memory ready within the budget, a registration takes it, "
          "and it gives way to a registration that needs the budget") {
  const std::string dir = ShortTempDir("it-pool");
  // Each rank below: 2 slots of 9 MB, 18.9 MB. The pool: 3 pieces of 8 MiB,
  // within the 40 MiB budget; a second rank needs all of what the pool holds.
  Daemon daemon(dir, {{"--staging_budget_mb=40", "--staging_pool_mb=24",
                       "--staging_pool_entry_mb=8"}});
  REQUIRE(daemon.Start());
  auto pool_status = [&] {
    auto [code, out] = Zccctl(dir, daemon, {"--json", "status"});
    REQUIRE(code == 0);
    const nlohmann::json s = nlohmann::json::parse(out);
    auto field = [&s](const char* name) -> uint64_t {
      return s.contains(name) ? s[name].get<uint64_t>() : 0;
    };
    return std::pair<uint64_t, uint64_t>{field("staging_pool_bytes"), field("staging_pool_taken")};
  };
  REQUIRE(Eventually([&] { return pool_status().first == (24u << 20); }, absl::Seconds(30)));
  {
    auto [code, text] = Zccctl(dir, daemon, {"status"});
    CHECK(code == 0);
    CHECK_THAT(text, Catch::Contains("staging pool: 0.03 of 0.03 GB ready for the next "
                                     "registrations (0 taken)"));
  }
  const std::vector<std::string> model = {"--kib=1024", "--tensors=6", "--slots=2"};
  auto a = StartTrainer(daemon, dir, "a", Concat({"--job=a", "--steps=6", "--save_every=3", "--pause_at=3"}, model));
  REQUIRE(a->WaitForOutput("paused", absl::Seconds(60)));
  INFO(daemon.Log());
  CHECK(absl::StrContains(daemon.Log(), "bytes it needs at once came from the staging pool"));
  // One piece taken; none made again so soon after (the restores that
  // follow registrations come first).
  CHECK(pool_status() == std::pair<uint64_t, uint64_t>{16u << 20, 1});

  // 18.9 + 18.9 MB of segments and the pool's 16 MiB do not fit in 40 MiB:
  // the pool gives way, the registration is not refused.
  auto b = StartTrainer(daemon, dir, "b", Concat({"--job=b", "--steps=3", "--save_every=3"}, model));
  CHECK(b->Wait(absl::Seconds(60)) == 0);
  INFO(b->Output());
  CHECK(b->Values()["registered"] == "1");
  CHECK(pool_status() == std::pair<uint64_t, uint64_t>{0, 2});
  a->Signal(SIGUSR1);
  CHECK(a->Wait(absl::Seconds(60)) == 0);
  INFO(a->Output());
  // Both trained and checkpointed from the pool's memory.
  REQUIRE(WaitLatest(JobDir(daemon, "a"), 6));
  REQUIRE_OK(checkpoint::VerifyStep(JobDir(daemon, "a") + "/step-00000006"));
  REQUIRE_OK(checkpoint::VerifyStep(JobDir(daemon, "b") + "/step-00000003"));
  REQUIRE(daemon.Stop() == 0);
  // Nothing of the pool is left behind.
  CHECK(shm::Segment::ListWithPrefix(daemon.shm_prefix() + ".pool").empty());
}

TEST_CASE("checkpoint-on-failure: a killed trainer's newest snapshot is persisted and committed") {
  const std::string dir = ShortTempDir("it-onfail");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  // Checkpoints every 5 steps; the trainer dies after step 7.
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=20", "--save_every=5", "--pause_at=7", "--block",
                         "--persist_on_failure"});
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 7));
  t->Signal(SIGKILL);
  REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  const std::string job_dir = JobDir(daemon);
  REQUIRE(WaitLatest(job_dir, 7));
  CHECK(PathExists(job_dir + "/step-00000007/COMMITTED"));
  bool logged = false;
  for (int i = 0; i < 500 && !logged; ++i) {
    logged = absl::StrContains(daemon.Log(), "(checkpoint-on-failure)");
    if (!logged) absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(daemon.Log());
  CHECK(logged);
  CHECK(*ReadLatest(job_dir) == 7);
  auto r = StartTrainer(daemon, dir, "restore", {"--mode=restore", "--expect_step=7"});
  CHECK(r->Wait(absl::Seconds(60)) == 0);
  CHECK(r->Values()["mismatched_tensors"] == "0");

  // Without the option, the same death loses the snapshot (step 5 stays newest).
  auto u = StartTrainer(daemon, dir, "train2",
                        {"--job=nofail", "--steps=20", "--save_every=5", "--pause_at=7", "--block"});
  REQUIRE(u->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitForPath(JobDir(daemon, "nofail") + "/step-00000005/COMMITTED", absl::Seconds(30)));
  u->Signal(SIGKILL);
  REQUIRE(u->Wait(absl::Seconds(10)).has_value());
  absl::SleepFor(absl::Seconds(2));  // well past the daemon's pid check
  CHECK(*ReadLatest(JobDir(daemon, "nofail")) == 5);
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing

namespace zcc::testing {
namespace {

TEST_CASE("a restarted daemon removes abandoned partial steps, leaves fresh ones and commits, "
          "and restores a latest lost in the first commit") {
  const std::string dir = ShortTempDir("it-sweep");
  Daemon daemon(dir, {{"--commit_timeout_s=60"}});
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=5", "--block"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  daemon.Kill();
  const std::string job_dir = JobDir(daemon);
  REQUIRE(MakeDirs(job_dir + "/step-00000007.partial").ok());
  REQUIRE(MakeDirs(job_dir + "/step-00000008.partial").ok());
  // Step 7's partial is two hours old: abandoned. Step 8's is fresh.
  const std::string old_dir = job_dir + "/step-00000007.partial";
  struct timespec times[2] = {{time(nullptr) - 7200, 0}, {time(nullptr) - 7200, 0}};
  REQUIRE(utimensat(AT_FDCWD, old_dir.c_str(), times, 0) == 0);
  // As after a SIGKILL between step 5's rename and the write of latest.
  REQUIRE(unlink((job_dir + "/latest").c_str()) == 0);
  REQUIRE(daemon.Start());
  CHECK_FALSE(PathExists(old_dir));
  CHECK(PathExists(job_dir + "/step-00000008.partial"));
  CHECK(*ListCommittedSteps(job_dir) == std::vector<int64_t>{5});
  CHECK(absl::StrContains(daemon.Log(), "abandoned partial checkpoint"));
  CHECK(ReadLatest(job_dir).value_or(-1) == 5);
  CHECK(absl::StrContains(daemon.Log(), "at step-00000005 (a commit was cut short"));
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
