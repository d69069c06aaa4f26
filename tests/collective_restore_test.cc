// Four real trainer processes (tests/test_trainer, layout dp4.tp1.ep1: dense
// pieces replicated over all four ranks, optimizer state ZeRO-sharded) restore
// together through a TcpCollective (RestoreOptions::collective) from a real
// zccd: one agreed step, every piece bit-exact on every rank, and each
// replicated piece read from zccd by exactly one rank (the others receive it).
// A rank that cannot restore fails the restore on every rank, naming itself.
// Without a collective, the four ranks restoring the step from disk at once
// are served by zccd from one read of each piece (daemon/restore/shared_reads.h),
// counted by its zcc_restore_bytes_read_total.
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "common/testing/free_port.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "tests/process_harness.h"
#include "tests/test_model.h"

namespace zcc::testing {
namespace {

constexpr char kLayout[] = "dp4.tp1.ep1";
constexpr int kWorld = 4;

std::vector<std::string> Flags(int rank, std::vector<std::string> more) {
  std::vector<std::string> flags = {absl::StrCat("--rank=", rank),
                                    absl::StrCat("--world=", kWorld),
                                    absl::StrCat("--topology=", kLayout), "--kib=64"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// All four ranks train `steps` steps (a checkpoint every 5) and exit.
void TrainTenSteps(const Daemon& daemon, const std::string& dir, int steps = 10) {
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank = 0; rank < kWorld; ++rank) {
    trainers.push_back(StartTrainer(daemon, dir, absl::StrCat("train", rank),
                                    Flags(rank, {absl::StrCat("--steps=", steps), "--block"})));
  }
  for (auto& t : trainers) REQUIRE(t->Wait(absl::Seconds(90)) == 0);
}

// All four ranks restore together through a TcpCollective (with `more`
// flags) and get step `expect`, every byte as written.
void RestoreStepTogether(const Daemon& daemon, const std::string& dir, const std::string& tag,
                         int64_t expect, std::vector<std::string> more = {}) {
  const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
  more.insert(more.end(), {"--mode=restore", "--collective=" + address,
                           absl::StrCat("--expect_step=", expect)});
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < kWorld; ++rank) {
    restorers.push_back(StartTrainer(daemon, dir, absl::StrCat(tag, rank), Flags(rank, more)));
  }
  for (auto& r : restorers) {
    INFO(r->Output() << daemon.Log());
    REQUIRE(r->Wait(absl::Seconds(90)) == 0);
    CHECK(r->Values()["restored_step"] == absl::StrCat(expect));
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }
}

// Flips the last byte of `path` (its size stays).
void DamageLastByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x5a);
  f.seekp(-1, std::ios::end);
  f.put(c);
}

TEST_CASE("ranks restore together through a collective: each replicated piece read once") {
  const std::string dir = ShortTempDir("it-coll");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  TrainTenSteps(daemon, dir);

  // The distinct pieces of the model (name and offset), over all ranks.
  std::set<std::pair<std::string, std::vector<int64_t>>> distinct;
  int registered = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (const ModelTensor& t : BuildModel(kLayout, rank, kWorld, 6, 64)) {
      if (t.kind == TensorKind::kExtra) continue;
      distinct.insert({t.name, t.box_offset});
      ++registered;
    }
  }
  REQUIRE(registered > static_cast<int>(distinct.size()));  // the layout has replicas

  // From disk (step 10, by its number) and from zccd's memory (the newest).
  for (const bool disk : {true, false}) {
    const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
    std::vector<std::unique_ptr<Subprocess>> restorers;
    for (int rank = 0; rank < kWorld; ++rank) {
      std::vector<std::string> more = {"--mode=restore", "--collective=" + address,
                                       "--expect_step=10"};
      // From disk, the optimizer tensors copied as zccd checks them.
      if (disk) more.insert(more.end(), {"--restore_step=10", "--early_copy"});
      restorers.push_back(StartTrainer(daemon, dir, absl::StrCat(disk ? "disk" : "mem", rank),
                                       Flags(rank, more)));
    }
    int read = 0, received = 0;
    for (auto& r : restorers) {
      INFO(r->Output() << daemon.Log());
      REQUIRE(r->Wait(absl::Seconds(90)) == 0);
      CHECK(r->Values()["mismatched_tensors"] == "0");
      read += std::stoi(r->Values()["read_pieces"]);
      received += std::stoi(r->Values()["received_pieces"]);
    }
    INFO((disk ? "disk" : "memory") << ": " << read << " pieces read, " << received
                                     << " received");
    CHECK(read == static_cast<int>(distinct.size()));
    CHECK(read + received == registered);
  }

  // Rank 3 cannot reach zccd: every rank's restore fails, and says which rank.
  const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> more = {"--mode=restore", "--collective=" + address};
    if (rank == 3) more.push_back("--socket=" + dir + "/no-such-zccd.sock");
    restorers.push_back(StartTrainer(daemon, dir, absl::StrCat("broken", rank), Flags(rank, more)));
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO(restorers[rank]->Output());
    CHECK(restorers[rank]->Wait(absl::Seconds(90)) != 0);
    if (rank != 3) CHECK(absl::StrContains(restorers[rank]->Output(), "rank 3 failed"));
  }
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("ranks that go back together write the steps after it on one new timeline, which every "
          "rank's manifest names") {
  const std::string dir = ShortTempDir("it-coll-tl");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  // Tensor-parallel only: every rank writes all it holds, so a rank that
  // restores alone can restore from memory too.
  auto flags = [](int rank, std::vector<std::string> more) {
    std::vector<std::string> f = {absl::StrCat("--rank=", rank), absl::StrCat("--world=", kWorld),
                                  "--topology=dp1.tp4.ep1", "--kib=64"};
    f.insert(f.end(), more.begin(), more.end());
    return f;
  };
  {
    std::vector<std::unique_ptr<Subprocess>> trainers;
    for (int rank = 0; rank < kWorld; ++rank) {
      trainers.push_back(StartTrainer(daemon, dir, absl::StrCat("train", rank),
                                      flags(rank, {"--steps=10", "--block"})));
    }
    for (auto& t : trainers) REQUIRE(t->Wait(absl::Seconds(90)) == 0);
  }
  // The timeline each rank's manifest of a committed step names.
  auto timelines = [&](int64_t step) {
    std::set<std::string> seen;
    for (int rank = 0; rank < kWorld; ++rank) {
      const std::string path = absl::StrCat(JobDir(daemon), "/step-",
                                            absl::Dec(step, absl::kZeroPad8), "/r0000", rank,
                                            ".manifest.json");
      std::ifstream in(path);
      REQUIRE(in.good());
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      auto manifest = format::DecodeRankManifest(text);
      REQUIRE(manifest.ok());
      seen.insert(manifest->timeline);
    }
    return seen;
  };
  REQUIRE(timelines(5) == std::set<std::string>{""});
  REQUIRE(timelines(10) == std::set<std::string>{""});

  // Back to step 5 together, and on to step 10 again: it commits anew, every
  // rank's manifest on the timeline the restore drew; step 5 keeps its own.
  const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank = 0; rank < kWorld; ++rank) {
    trainers.push_back(StartTrainer(
        daemon, dir, absl::StrCat("back", rank),
        flags(rank, {"--mode=resume", "--restore_step=5", "--steps=5", "--block",
                     "--collective=" + address, "--pause_at=7"})));
  }
  for (auto& t : trainers) {
    INFO(t->Output());
    REQUIRE(t->WaitForOutput("paused", absl::Seconds(90)));
  }
  // zccctl status names the ranks' one timeline while they train.
  const auto [status_code, status] = Zccctl(dir, daemon, {"status"});
  INFO(status);
  CHECK(status_code == 0);
  CHECK_FALSE(absl::StrContains(status, "DIFFERENT RUNS OR TIMELINES"));
  for (auto& t : trainers) t->Signal(SIGUSR1);
  for (auto& t : trainers) {
    INFO(t->Output() << daemon.Log());
    REQUIRE(t->Wait(absl::Seconds(90)) == 0);
    CHECK(t->Values()["restored_step"] == "5");
  }
  CHECK(timelines(5) == std::set<std::string>{""});
  const std::set<std::string> after = timelines(10);
  REQUIRE(after.size() == 1);
  CHECK_FALSE(after.begin()->empty());
  CHECK(absl::StrContains(status, absl::StrCat("  run none  timeline '", *after.begin(), "'\n")));

  // Restarted as a new run (another run id), each rank restoring alone:
  // from its previous trainer's snapshot in memory (the snapshot's
  // timeline with it), then, after zccd restarted too, from disk (the
  // step's): the steps they write go on in it and commit.
  auto alone = [&](const std::string& name, const std::string& expect_step,
                   const std::string& expect_from) {
    std::vector<std::unique_ptr<Subprocess>> ranks;
    for (int rank = 0; rank < kWorld; ++rank) {
      ranks.push_back(StartTrainer(
          daemon, dir, absl::StrCat(name, rank),
          flags(rank, {"--mode=resume", "--steps=5", "--block", "--run_id=run-" + name})));
    }
    for (auto& t : ranks) {
      INFO(t->Output() << daemon.Log());
      REQUIRE(t->Wait(absl::Seconds(90)) == 0);
      CHECK(t->Values()["restored_step"] == expect_step);
      CHECK(t->Values()["restored_from"] == expect_from);
    }
  };
  alone("mem", "10", "memory");
  CHECK(timelines(15) == after);
  // zccctl list names each step's run and timeline (its commit record's):
  // none for the steps before the going back.
  const auto [list_code, listed] = Zccctl(dir, daemon, {"list", "itest"});
  INFO(listed);
  CHECK(list_code == 0);
  CHECK(absl::StrContains(listed, "/step-00000005\n"));
  CHECK(absl::StrContains(listed,
                          absl::StrCat("/step-00000010  timeline '", *after.begin(), "'\n")));
  CHECK(absl::StrContains(listed, absl::StrCat("/step-00000015  (latest)  run 'run-mem'  "
                                               "timeline '", *after.begin(), "'\n")));
  REQUIRE(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  alone("disk", "15", "disk");
  CHECK(timelines(20) == after);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("zccctl status names the ranks of a job that write on different runs, whose steps do "
          "not commit together") {
  const std::string dir = ShortTempDir("it-coll-runs");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank = 0; rank < kWorld; ++rank) {
    trainers.push_back(StartTrainer(
        daemon, dir, absl::StrCat("train", rank),
        {absl::StrCat("--rank=", rank), absl::StrCat("--world=", kWorld), "--kib=64",
         "--steps=3", "--pause_at=2", rank < 2 ? "--run_id=first" : "--run_id=second"}));
  }
  for (auto& t : trainers) {
    INFO(t->Output());
    REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  }
  const auto [code, status] = Zccctl(dir, daemon, {"status"});
  INFO(status);
  CHECK(code == 0);
  CHECK(absl::StrContains(status, "RANKS ON DIFFERENT RUNS OR TIMELINES (their steps do not "
                                  "commit together):\n"
                                  "    run 'first'  timeline none  ranks 0,1\n"
                                  "    run 'second'  timeline none  ranks 2,3\n"));
  for (auto& t : trainers) t->Signal(SIGKILL);
  for (auto& t : trainers) REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("ranks restoring together copy as zccd checks; one rank's damaged step makes all fall "
          "back, and nothing of it stays") {
  const std::string dir = ShortTempDir("it-coll-early");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});
  REQUIRE(daemon.Start());
  TrainTenSteps(daemon, dir);
  // The last byte of rank 0's optimizer file of step 10: the other ranks
  // read and copy their step 10 pieces, rank 0 finds the damage at the end.
  DamageLastByte(JobDir(daemon) + "/step-00000010/optim-r00000.safetensors");
  RestoreStepTogether(daemon, dir, "early", 5, {"--early_copy", "--prefetch_restore"});
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("ranks restoring together fall back past a step damaged on one rank to one damaged on "
          "another, to a step every rank reads whole") {
  const std::string dir = ShortTempDir("it-coll-twice");
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});
  REQUIRE(daemon.Start());
  TrainTenSteps(daemon, dir, 15);  // steps 5, 10 and 15
  // Rank 0's step 15 and rank 1's step 10 are damaged: the first round
  // agrees on nothing (rank 0 got 10), the second finds 10 damaged on rank 1.
  DamageLastByte(JobDir(daemon) + "/step-00000015/optim-r00000.safetensors");
  DamageLastByte(JobDir(daemon) + "/step-00000010/optim-r00001.safetensors");
  RestoreStepTogether(daemon, dir, "twice", 5);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("ranks restoring together that ask for different steps fail together, naming what each "
          "asked for") {
  const std::string dir = ShortTempDir("it-coll-asked");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  TrainTenSteps(daemon, dir);
  const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> flags = {"--mode=restore", "--collective=" + address};
    if (rank == 2) flags.push_back("--restore_step=5");
    restorers.push_back(StartTrainer(daemon, dir, absl::StrCat("asked", rank), Flags(rank, flags)));
  }
  for (auto& r : restorers) {
    INFO(r->Output());
    CHECK(r->Wait(absl::Seconds(90)) == 1);
    CHECK(absl::StrContains(r->Output(), "FAILED_PRECONDITION: the ranks restoring together asked "
                                         "for different steps (rank 0: the newest; rank 1: the "
                                         "newest; rank 2: 5; rank 3: the newest)"));
  }
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("ranks that restore one step at once without a collective: zccd reads each piece once") {
  const std::string dir = ShortTempDir("it-shared");
  Daemon daemon(dir, {{"--metrics_listen=127.0.0.1:0"}});
  REQUIRE(daemon.Start());
  TrainTenSteps(daemon, dir);
  // A restarted zccd holds no snapshot: the restores read the disk.
  REQUIRE(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  const int port = PortFromLog(daemon, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  REQUIRE(port > 0);
  REQUIRE(MetricValue(port, "zcc_restore_bytes_read_total") == 0);

  // Every rank restores its whole state: the replicated pieces it did not
  // write too, which the other ranks need as well.
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < kWorld; ++rank) {
    restorers.push_back(StartTrainer(daemon, dir, absl::StrCat("alone", rank),
                                     Flags(rank, {"--mode=restore", "--expect_step=10"})));
  }
  for (auto& r : restorers) {
    INFO(r->Output() << daemon.Log());
    REQUIRE(r->Wait(absl::Seconds(90)) == 0);
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }

  // Each piece of the step once (every piece is written by exactly one rank),
  // where the ranks between them restore more than that.
  auto index = checkpoint::LoadStepIndex(JobDir(daemon) + "/step-00000010");
  REQUIRE(index.ok());
  uint64_t step_bytes = 0;
  for (const format::ManifestTensor& piece : index->pieces) step_bytes += piece.nbytes;
  uint64_t restored_bytes = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (const ModelTensor& t : BuildModel(kLayout, rank, kWorld, 6, 64)) restored_bytes += t.nbytes;
  }
  REQUIRE(restored_bytes > step_bytes);
  const double read = MetricValue(port, "zcc_restore_bytes_read_total");
  INFO("zccd read " << read << " bytes; the step holds " << step_bytes << ", the ranks restored "
                    << restored_bytes << "\n" << daemon.Log());
  CHECK(read == static_cast<double>(step_bytes));
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
