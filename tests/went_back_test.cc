// A job that goes back to an older step (a loss spike, a bad data shard: the
// trainers restore step N explicitly and train on) must be the run a later
// restart resumes, from every tier, even before its first commit: never the
// newer steps of the run it left, which stay on disk. Real zccd and trainer
// processes (tests/test_trainer), two ranks; the restore after zccd's
// restart goes through a collective, whose agreement lists the steps.
#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/testing/eventually.h"
#include "common/testing/free_port.h"
#include "common/testing/temp_dir.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

constexpr int kWorld = 2;

std::vector<std::string> Flags(int rank, std::vector<std::string> more) {
  std::vector<std::string> flags = {absl::StrCat("--rank=", rank), absl::StrCat("--world=", kWorld),
                                    "--save_every=5", "--block", "--kib=64"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// Starts one process per rank with `more` flags.
std::vector<std::unique_ptr<Subprocess>> StartRanks(const Daemon& daemon, const std::string& dir,
                                                    const std::string& name,
                                                    const std::vector<std::string>& more) {
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.push_back(StartTrainer(daemon, dir, absl::StrCat(name, rank), Flags(rank, more)));
  }
  return ranks;
}

// Runs one process per rank with `more` flags; each must exit 0.
std::vector<std::unique_ptr<Subprocess>> RunRanks(const Daemon& daemon, const std::string& dir,
                                                  const std::string& name,
                                                  const std::vector<std::string>& more) {
  std::vector<std::unique_ptr<Subprocess>> ranks = StartRanks(daemon, dir, name, more);
  for (auto& r : ranks) {
    INFO(name << ": " << r->Output() << daemon.Log());
    REQUIRE(r->Wait(absl::Seconds(90)) == 0);
  }
  return ranks;
}

// Starts one process per rank that restores `restore_step` (each checks it
// got it), trains on and pauses after step `pause_at`; returns them once
// zccd has taken in that step from every rank.
std::vector<std::unique_ptr<Subprocess>> PausedAfterRestore(const Daemon& daemon,
                                                            const std::string& dir,
                                                            const std::string& name,
                                                            int restore_step, int pause_at) {
  std::vector<std::unique_ptr<Subprocess>> ranks =
      StartRanks(daemon, dir, name,
                 {"--mode=resume", absl::StrCat("--restore_step=", restore_step), "--steps=10",
                  absl::StrCat("--pause_at=", pause_at)});
  for (auto& t : ranks) {
    INFO(t->Output());
    REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
    CHECK(t->Values()["restored_step"] == absl::StrCat(restore_step));
  }
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", pause_at, kWorld));
  return ranks;
}

// How many times `text` is in `log`.
size_t Count(const std::string& log, const std::string& text) {
  size_t found = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) {
    ++found;
  }
  return found;
}

// How many times zccd's log says step `step` of job itest was committed.
size_t Commits(const std::string& log, int64_t step) {
  return Count(log, absl::StrCat("checkpoint job=itest step=", step, " "));
}

bool LatestIs(const std::string& job_dir, int64_t step) {
  return Eventually(
      [&] {
        auto latest = checkpoint::ReadLatest(job_dir);
        return latest.ok() && *latest == step;
      },
      absl::Seconds(30), absl::Milliseconds(20));
}

TEST_CASE("a run that went back to an older step is the one a restart resumes: from memory "
          "before its first commit, from disk after zccd restarts") {
  const std::string dir = ShortTempDir("it-back");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  // The first run: steps 1..20, committed every 5th.
  RunRanks(daemon, dir, "first", {"--steps=20"});
  REQUIRE(LatestIs(job_dir, 20));

  // The second run goes back to step 10 and is killed after step 13, before
  // its first commit (step 15).
  std::vector<std::unique_ptr<Subprocess>> back =
      PausedAfterRestore(daemon, dir, "back", /*restore_step=*/10, /*pause_at=*/13);
  // `latest` went back with the run, and zccd says why; step 20 stays.
  INFO(daemon.Log());
  CHECK(LatestIs(job_dir, 10));
  CHECK(absl::StrContains(daemon.Log(), "training went on from step 10, older than step 20"));
  CHECK(*checkpoint::ListCommittedSteps(job_dir) == std::vector<int64_t>{10, 15, 20});
  CHECK(*checkpoint::NewestOnTimeline(job_dir) == 10);
  // zccctl list shows them as left behind.
  auto [code, listed] = Zccctl(dir, daemon, {"list", "itest"});
  INFO(listed);
  CHECK(code == 0);
  CHECK(absl::StrContains(listed, "step-00000010  (latest)"));
  CHECK(absl::StrContains(listed, "step-00000020  (left behind: above latest)"));
  for (auto& t : back) t->Signal(SIGKILL);
  for (auto& t : back) REQUIRE(t->Wait(absl::Seconds(10)).has_value());

  // The restart gets the step the run that went back died after, from
  // zccd's memory: not step 20 of the run it left.
  RunRanks(daemon, dir, "memory", {"--mode=restore", "--expect_step=13", "--expect_from=memory"});

  // zccd restarts, its memory gone: the ranks agree on step 10 from disk.
  REQUIRE(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  const std::string address = absl::StrCat("127.0.0.1:", FreeTcpPort());
  RunRanks(daemon, dir, "disk",
           {"--mode=restore", "--collective=" + address, "--expect_step=10", "--expect_from=disk"});

  // The run goes on from there and commits step 15 of its own, in place of
  // the one left behind; step 20 is still not restored.
  RunRanks(daemon, dir, "again", {"--mode=resume", "--steps=7"});
  REQUIRE(LatestIs(job_dir, 15));
  RunRanks(daemon, dir, "last", {"--mode=restore", "--expect_step=17", "--expect_from=memory"});
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a run that goes back within one zccd's life commits the step numbers the run it "
          "left committed, anew") {
  const std::string dir = ShortTempDir("it-back2");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  RunRanks(daemon, dir, "first", {"--steps=20"});
  REQUIRE(LatestIs(job_dir, 20));
  // Back to step 10, and on to step 20 again: steps 15 and 20 commit again
  // (each trainer waits for its last due step's commit before it exits).
  auto back = RunRanks(daemon, dir, "back", {"--mode=resume", "--restore_step=10", "--steps=10"});
  CHECK(back[0]->Values()["committed"] == "20");  // (rank 0 waits for it)
  CHECK(LatestIs(job_dir, 20));
  const std::string log = daemon.Log();
  CHECK(Commits(log, 15) == 2);
  CHECK(Commits(log, 20) == 2);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("the steps a run left behind go once the run that went on commits past them; they "
          "never come back to its timeline") {
  const std::string dir = ShortTempDir("it-back-pass");
  Daemon daemon(dir);  // keep_last 3
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  RunRanks(daemon, dir, "first", {"--steps=20"});  // steps 5, 10, 15, 20
  REQUIRE(LatestIs(job_dir, 20));
  // Back to step 10, and on to 20 committing every 4th step: 12, 16, 20.
  // The first run's 15 lies between this run's 12 and 16.
  auto back = RunRanks(daemon, dir, "back",
                       {"--mode=resume", "--restore_step=10", "--steps=10", "--save_every=4"});
  CHECK(back[0]->Values()["committed"] == "20");
  CHECK(LatestIs(job_dir, 20));
  INFO(daemon.Log());
  // Step 15 went when step 16 passed it: it is neither restored nor counted
  // by keep_last (which keeps this run's 12, 16 and 20).
  CHECK(absl::StrContains(daemon.Log(), "step(s) of a run left behind that this run's commits "
                                        "passed (the first step-00000015)"));
  CHECK(*checkpoint::ListCommittedSteps(job_dir) == std::vector<int64_t>{12, 16, 20});
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a step a going back left behind, restored from disk on purpose by a later run that "
          "trains on, is taken up: it stays when that run, resumed from memory, commits past it") {
  const std::string dir = ShortTempDir("it-back-up");
  Daemon daemon(dir);  // keep_last 3
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  RunRanks(daemon, dir, "first", {"--steps=20"});  // steps 5, 10, 15, 20
  REQUIRE(LatestIs(job_dir, 20));
  // Back to step 10, on to 16: this run's own step 15; step 20 left behind.
  RunRanks(daemon, dir, "back", {"--mode=resume", "--restore_step=10", "--steps=6"});
  REQUIRE(LatestIs(job_dir, 15));
  // A later run restores step 20 after all (the loss spike was not one),
  // trains on to 23 and is killed before its first commit.
  std::vector<std::unique_ptr<Subprocess>> up =
      PausedAfterRestore(daemon, dir, "up", /*restore_step=*/20, /*pause_at=*/23);
  for (auto& t : up) t->Signal(SIGKILL);
  for (auto& t : up) REQUIRE(t->Wait(absl::Seconds(10)).has_value());
  // Its restart resumes step 23 from memory and commits step 25.
  auto on = RunRanks(daemon, dir, "on", {"--mode=resume", "--steps=2"});
  INFO(on[0]->Output() << daemon.Log());
  CHECK(on[0]->Values()["restored_step"] == "23");
  CHECK(LatestIs(job_dir, 25));
  // Step 20 is that run's past, not a step left behind that it passed: it
  // stays (keep_last counts 15, 20 and 25).
  // (Said once, not at each rank's report of step 25.)
  CHECK(Count(daemon.Log(), "keeps 1 step(s) of a run left behind up to step 20") == 1);
  CHECK_FALSE(absl::StrContains(daemon.Log(), "step(s) of a run left behind that this run's "
                                              "commits passed"));
  CHECK(*checkpoint::ListCommittedSteps(job_dir) == std::vector<int64_t>{15, 20, 25});
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a going back told by a rank that trained on before rank 0 registered is done when "
          "rank 0 registers") {
  const std::string dir = ShortTempDir("it-back-late0");
  // (Nothing retained: the first run's job is forgotten, and the second's
  // has no committer until its rank 0 registers.)
  Daemon daemon(dir, {{"--retain_snapshots_s=0"}});
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  RunRanks(daemon, dir, "first", {"--steps=20"});
  REQUIRE(LatestIs(job_dir, 20));
  // Rank 1 goes back to step 10 and trains on alone (staying registered);
  // rank 0, which makes this zccd the job's committer, registers after it.
  auto rank1 = StartTrainer(daemon, dir, "back1",
                            Flags(1, {"--mode=resume", "--restore_step=10", "--steps=3",
                                      "--linger_ms=4000"}));
  REQUIRE(rank1->WaitForOutput("step=13 ", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "itest", 13, 1));
  auto rank0 = StartTrainer(daemon, dir, "back0",
                            Flags(0, {"--mode=resume", "--restore_step=10", "--steps=3"}));
  INFO(rank0->Output() << rank1->Output() << daemon.Log());
  REQUIRE(rank0->Wait(absl::Seconds(60)) == 0);
  REQUIRE(rank1->Wait(absl::Seconds(60)) == 0);
  CHECK(LatestIs(job_dir, 10));
  CHECK(absl::StrContains(daemon.Log(), "training went on from step 10, older than step 20"));
  REQUIRE(daemon.Stop() == 0);
}

// One process per rank trains steps 1..20 and, after step 20, goes back to
// `go_back_to` and trains on to step 20 again, while zccd still writes the
// first step 20 (its files are written slowly); each waits for its last due
// step's commit. That first step 20 is never committed: step 20 commits once,
// the run that went on's.
void GoBackWhileWriting(int go_back_to) {
  const std::string dir = ShortTempDir("it-back3");
  DaemonOptions options;
  options.env = {"ZCCD_INJECT_STORAGE_FAULTS=path=step-00000020,op_delay_ms=300"};
  Daemon daemon(dir, options);
  REQUIRE(daemon.Start());
  const std::string job_dir = JobDir(daemon);
  RunRanks(daemon, dir, "run",
           {"--steps=20", "--go_back_at=20", absl::StrCat("--go_back_to=", go_back_to)});
  REQUIRE(LatestIs(job_dir, 20));
  // (zccd's log is kept with the test's directory when a check fails.)
  const std::string log = daemon.Log();
  // Given up by the ranks' writers as they finished, or dropped while it
  // waited for its commit.
  const bool refused =
      absl::StrContains(log, "'s write of step 20, of the state its trainer went back from, is "
                             "not committed") ||
      absl::StrContains(log, "step 20 of the run left behind is not committed");
  CHECK(refused);
  CHECK(Commits(log, 20) == 1);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a write of the run left behind that finishes after the going back is never "
          "committed (one trainer goes back mid-run, behind its last commit)") {
  GoBackWhileWriting(10);
}

TEST_CASE("a write of the state a trainer went back from is never committed, though its first "
          "step after the restore is past the last commit (back to step 15, on to 16)") {
  GoBackWhileWriting(15);
}

}  // namespace
}  // namespace zcc::testing
