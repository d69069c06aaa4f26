// Crash matrix (DESIGN.md section 7, "Trainer dies" and "Daemon dies"): real
// zccd and trainer processes (tests/test_trainer) killed with SIGKILL at
// seeded random moments, then the invariants checked on what they leave.
//
//  * zccd killed while serving 1-2 trainers (ingest, shard writes, commit,
//    retention, idle), restarted on the same socket, root and shm prefix:
//    `latest` always names a committed step; every committed step verifies;
//    the restarted daemon removes its predecessor's segments; the trainers
//    keep training and register again; a restore by fresh trainer processes
//    returns the step ChooseRestoreStep picks, bit-exact, never a .partial;
//    after `zccctl gc` no partial directory is left; after a clean stop no
//    segment with the prefix is left.
//  * A trainer killed mid-snapshot: zccd drops the registration (pid check /
//    heartbeat timeout) and its segment, keeps serving, and a restarted
//    trainer registers again, restores bit-exact and trains on.
//  * A trainer killed mid-restore: zccd drops the restore buffer with the
//    registration (no segment leaks) and the next restore works.
//
// Deterministic seeds: trial i of a kind uses seed ZCC_CRASH_SEED (default
// 0x5eed) + i. Trial counts: ZCC_CRASH_TRIALS (daemon kills, default 50) and
// ZCC_CRASH_TRAINER_TRIALS (each trainer-kill kind, default 6);
// tests/crash_soak.sh runs more. Each test case prints the faults it injected,
// by kind and by the phase the kill landed in.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

const char kJob[] = "itest";  // test_trainer's default job id

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) && n >= 0 ? n : fallback;
}

uint64_t SeedBase() {
  const char* v = std::getenv("ZCC_CRASH_SEED");
  uint64_t n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) ? n : 0x5eed;
}

std::string Tail(const std::string& text, size_t n = 2500) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// Faults injected, by kind, printed at the end of each test case.
using Tally = std::map<std::string, int>;

void PrintTally(const std::string& title, const Tally& tally) {
  std::printf("%s\n", title.c_str());
  for (const auto& [kind, n] : tally) std::printf("  %-58s %5d\n", kind.c_str(), n);
  std::fflush(stdout);
}

// Problems found in one trial; reported together so that one bad trial does
// not hide what the others show.
struct Problems {
  std::string trial;
  std::vector<std::string> list;
  void Expect(bool ok, const std::string& what) {
    if (!ok) list.push_back(what);
  }
};

void Report(const Problems& p, const Daemon* daemon) {
  INFO(p.trial);
  INFO(absl::StrJoin(p.list, "\n"));
  // INFO is scoped to its block: the log's message is made here, not inside an if.
  const std::string log =
      !p.list.empty() && daemon != nullptr ? "zccd log (tail):\n" + Tail(daemon->Log(), 6000) : "";
  INFO(log);
  CHECK(p.list.empty());
}


// --------------------------------------------------------- on-disk state

struct DirState {
  std::vector<int64_t> committed;         // step-N/ holding COMMITTED
  std::vector<std::string> partials;      // step-N.partial/
  std::vector<std::string> superseded;    // step-N.superseded/
  std::vector<std::string> uncommitted;   // step-N/ without COMMITTED
  std::vector<std::string> complete_partials;  // every rank's manifest, or COMMITTED, inside
  std::optional<int64_t> latest;
  std::string latest_error;
};

DirState Inspect(const std::string& job_dir, uint32_t world) {
  DirState s;
  auto names = ListDir(job_dir);
  if (!names.ok()) return s;
  for (const std::string& name : *names) {
    const std::string path = JoinPath(job_dir, name);
    if (format::ParseStepDirName(name).ok()) {
      if (PathExists(JoinPath(path, format::kCommittedFileName))) {
        s.committed.push_back(*format::ParseStepDirName(name));
      } else {
        s.uncommitted.push_back(name);
      }
    } else if (absl::EndsWith(name, ".partial")) {
      s.partials.push_back(name);
      uint32_t manifests = 0;
      for (uint32_t r = 0; r < world; ++r) {
        manifests += PathExists(JoinPath(path, format::ManifestFileName(r))) ? 1 : 0;
      }
      if (manifests == world || PathExists(JoinPath(path, format::kCommittedFileName))) {
        s.complete_partials.push_back(name);
      }
    } else if (absl::EndsWith(name, ".superseded")) {
      s.superseded.push_back(name);
    }
  }
  std::sort(s.committed.begin(), s.committed.end());
  auto latest = checkpoint::ReadLatest(job_dir);
  if (latest.ok()) {
    s.latest = *latest;
  } else if (latest.status().code() != absl::StatusCode::kNotFound) {
    s.latest_error = std::string(latest.status().message());
  }
  return s;
}

// Where in the checkpoint pipeline the daemon was, judged from what it left.
std::string Phase(const DirState& s, uint32_t keep_last, bool segments, bool training) {
  if (!s.complete_partials.empty()) return "commit (all manifests in, not renamed)";
  if (!s.uncommitted.empty() || !s.superseded.empty()) return "retention (removal cut short)";
  if (s.committed.size() > keep_last) return "retention (not yet run after a commit)";
  if (!s.partials.empty()) return "write (rank shards or manifests missing)";
  if (!training) return "idle (trainers finished)";
  if (s.committed.empty()) return segments ? "ingest (registered, nothing persisted)"
                                           : "startup (before registration)";
  return "ingest (between checkpoints)";
}

// What must hold at every instant, a SIGKILL included: `latest` names a
// committed step directory (never a .partial) and every committed step
// verifies.
void CheckCommittedState(const std::string& job_dir, const DirState& s, Problems* p) {
  p->Expect(s.latest_error.empty(), "latest is unreadable: " + s.latest_error);
  if (s.latest.has_value()) {
    p->Expect(std::count(s.committed.begin(), s.committed.end(), *s.latest) == 1,
              absl::StrCat("latest names ", format::StepDirName(*s.latest),
                           ", which is not a committed step directory"));
  }
  for (int64_t step : s.committed) {
    const auto report = checkpoint::VerifyStep(JoinPath(job_dir, format::StepDirName(step)));
    p->Expect(report.ok(), absl::StrCat("committed ", format::StepDirName(step),
                                        " does not verify: ", report.status().ToString()));
  }
}

// ------------------------------------------------------------ trainers

std::vector<std::string> ModelFlags(int tensors, int kib) {
  return {absl::StrCat("--tensors=", tensors), absl::StrCat("--kib=", kib)};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Restores every rank with fresh trainer processes; expects `step` back
// bit-exact, or nothing to restore when `step` is empty.
void CheckRestore(const std::string& dir, const Daemon& daemon, uint32_t world,
                  const std::vector<std::string>& model, std::optional<int64_t> step,
                  const std::string& tag, Problems* p) {
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (uint32_t rank = 0; rank < world; ++rank) {
    restorers.push_back(StartTrainer(
        daemon, dir, absl::StrCat(tag, ".restore", rank),
        Concat({"--mode=restore", absl::StrCat("--rank=", rank), absl::StrCat("--world=", world),
                absl::StrCat("--expect_step=", step.value_or(-1))},
               model)));
  }
  for (uint32_t rank = 0; rank < world; ++rank) {
    Subprocess& r = *restorers[rank];
    const auto code = r.Wait(absl::Seconds(60));
    auto values = r.Values();
    const std::string where = absl::StrCat("restore of rank ", rank, ": ", Tail(r.Output(), 600));
    if (step.has_value()) {
      p->Expect(code == 0, "exit " + std::to_string(code.value_or(-1)) + " " + where);
      p->Expect(values["restored_step"] == std::to_string(*step),
                absl::StrCat("expected step ", *step, "; ", where));
      p->Expect(values["mismatched_tensors"] == "0", "tensors differ; " + where);
    } else {
      p->Expect(code == 1 && absl::StrContains(r.Output(), "NOT_FOUND"),
                "nothing is committed, but " + where);
    }
  }
}

// ------------------------------------------------------- daemon SIGKILL

struct DaemonKillTrial {
  uint64_t seed = 0;
  uint32_t world = 1;
  int save_every = 1;
  uint32_t keep_last = 1;
  int steps = 30;
  int step_ms = 10;
  int tensors = 2;
  int kib = 32;
  int kill_after_ms = 0;   // after the trainers start
  int restart_after_ms = 0;

  std::string Describe() const {
    return absl::StrCat("daemon-kill trial seed=", seed, " world=", world,
                        " save_every=", save_every, " keep_last=", keep_last, " steps=", steps,
                        " step_ms=", step_ms, " tensors=", tensors, " kib=", kib,
                        " kill_after_ms=", kill_after_ms, " restart_after_ms=", restart_after_ms);
  }
};

DaemonKillTrial MakeDaemonKillTrial(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  DaemonKillTrial t;
  t.seed = seed;
  t.world = static_cast<uint32_t>(uniform(1, 2));
  t.save_every = uniform(1, 3);
  t.keep_last = static_cast<uint32_t>(uniform(1, 2));
  t.steps = uniform(20, 36);
  t.step_ms = uniform(5, 12);
  t.tensors = uniform(1, 3);
  t.kib = 16 << uniform(0, 3);  // 16..128 KiB per parameter
  // From before the trainers register to just after they finish.
  t.kill_after_ms = uniform(0, t.steps * t.step_ms + 100);
  t.restart_after_ms = uniform(0, 300);
  return t;
}

void RunDaemonKillTrial(const DaemonKillTrial& t, Tally* tally) {
  Problems p{t.Describe(), {}};
  const std::string dir = ShortTempDir("crash");
  // Restores read the disk: what these trials check is what survives there.
  Daemon daemon(dir, {{"--retain_snapshots_s=0", absl::StrCat("--keep_last=", t.keep_last), "--commit_timeout_s=1",
                       "--client_timeout_s=3"}});
  if (!daemon.Start()) {
    p.Expect(false, "zccd did not start");
    Report(p, &daemon);
    return;
  }
  const std::string job_dir = JoinPath(daemon.root(), kJob);
  const std::vector<std::string> model = ModelFlags(t.tensors, t.kib);
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (uint32_t rank = 0; rank < t.world; ++rank) {
    trainers.push_back(StartTrainer(
        daemon, dir, absl::StrCat("train", rank),
        Concat({absl::StrCat("--rank=", rank), absl::StrCat("--world=", t.world),
                absl::StrCat("--steps=", t.steps), absl::StrCat("--step_ms=", t.step_ms),
                absl::StrCat("--save_every=", t.save_every), "--block", "--wait_commit=false",
                "--daemon_timeout_s=1"},
               model)));
  }
  absl::SleepFor(absl::Milliseconds(t.kill_after_ms));
  daemon.Kill();
  bool training = false;
  for (auto& tr : trainers) training |= tr->running();

  // The state the crash left, before anything else touches it.
  const std::vector<std::string> stale = ShmSegments(daemon.shm_prefix() + ".");
  const DirState at_kill = Inspect(job_dir, t.world);
  const std::string phase = Phase(at_kill, t.keep_last, !stale.empty(), training);
  ++(*tally)["zccd SIGKILL, phase: " + phase];
  CheckCommittedState(job_dir, at_kill, &p);

  absl::SleepFor(absl::Milliseconds(t.restart_after_ms));
  if (!daemon.Start()) {
    p.Expect(false, "zccd did not restart after SIGKILL");
    Report(p, &daemon);
    return;
  }
  ++(*tally)["zccd restarts on the same socket/root/prefix"];
  // The restarted daemon removed every segment of its predecessor before it
  // started listening (its own new segments have new generations).
  for (const std::string& name : ShmSegments(daemon.shm_prefix() + ".")) {
    p.Expect(std::find(stale.begin(), stale.end(), name) == stale.end(),
             "stale segment left after restart: " + name);
  }

  // The trainers never stop training and finish their steps.
  for (uint32_t rank = 0; rank < t.world; ++rank) {
    Subprocess& tr = *trainers[rank];
    const auto code = tr.Wait(absl::Seconds(90));
    p.Expect(code == 0, absl::StrCat("trainer ", rank, " exit ", code.value_or(-1), ": ",
                                     Tail(tr.Output(), 600)));
    p.Expect(absl::StrContains(tr.Output(), absl::StrCat("step=", t.steps, " ")),
             absl::StrCat("trainer ", rank, " did not reach its last step"));
  }
  const absl::Time trainers_done = absl::Now();

  const DirState after = Inspect(job_dir, t.world);
  CheckCommittedState(job_dir, after, &p);
  auto choice = checkpoint::ChooseRestoreStep(job_dir, -1, [](const std::string& step_dir) {
    return checkpoint::VerifyStep(step_dir).status();
  });
  std::optional<int64_t> expected;
  if (choice.ok()) {
    expected = choice->step;
    p.Expect(choice->rejected.empty(),
             "restore had to skip steps: " + absl::StrJoin(choice->rejected, "; "));
    p.Expect(after.latest == choice->step,
             absl::StrCat("ChooseRestoreStep picked ", choice->step, ", latest names ",
                          after.latest.value_or(-1)));
    const std::string chosen = JoinPath(job_dir, format::StepDirName(choice->step));
    p.Expect(PathExists(JoinPath(chosen, format::kCommittedFileName)),
             "the chosen step has no COMMITTED: " + chosen);
  } else {
    p.Expect(choice.status().code() == absl::StatusCode::kNotFound, choice.status().ToString());
    p.Expect(after.committed.empty(), "committed steps exist but none can be restored");
  }
  CheckRestore(dir, daemon, t.world, model, expected, "t", &p);
  ++(*tally)["restores by fresh trainers after the restart"];

  // Partial directories of steps that will never commit are older than the
  // commit timeout (1 s) once the trainers are gone for that long.
  const absl::Duration idle = absl::Now() - trainers_done;
  if (idle < absl::Milliseconds(1200)) absl::SleepFor(absl::Milliseconds(1200) - idle);
  const auto [gc_code, gc_out] = Zccctl(dir, daemon, {"gc", kJob});
  p.Expect(gc_code == 0 || (gc_code == 1 && at_kill.committed.empty() && after.committed.empty()),
           absl::StrCat("zccctl gc exit ", gc_code, ": ", gc_out));
  const DirState after_gc = Inspect(job_dir, t.world);
  p.Expect(after_gc.partials.empty() && after_gc.superseded.empty() && after_gc.uncommitted.empty(),
           absl::StrCat("left after zccctl gc: ", absl::StrJoin(after_gc.partials, " "), " ",
                        absl::StrJoin(after_gc.superseded, " "), " ",
                        absl::StrJoin(after_gc.uncommitted, " "), "\nzccctl gc: ", gc_out));
  p.Expect(after_gc.latest == after.latest, "gc changed latest");
  p.Expect(after_gc.committed.size() <= t.keep_last + 1 || after_gc.committed.empty(),
           absl::StrCat(after_gc.committed.size(), " committed steps kept with keep_last=",
                        t.keep_last));

  const auto stopped = daemon.Stop();
  p.Expect(stopped == 0, absl::StrCat("zccd exit ", stopped.value_or(-1), " on SIGTERM"));
  const auto leaked = ShmSegments(daemon.shm_prefix() + ".");
  p.Expect(leaked.empty(), "segments left after a clean stop: " + absl::StrJoin(leaked, " "));
  Report(p, &daemon);
  // Each trial's directory goes as soon as it passed (temp_dir.h would keep
  // all of a test case's trials until its end).
  if (p.list.empty()) RemoveTree(dir).IgnoreError();
}

TEST_CASE("zccd killed at random moments: committed state survives, restarts clean up") {
  const int trials = EnvInt("ZCC_CRASH_TRIALS", 50);
  const uint64_t base = SeedBase();
  Tally tally;
  const absl::Time start = absl::Now();
  for (int i = 0; i < trials; ++i) {
    const DaemonKillTrial t = MakeDaemonKillTrial(base + static_cast<uint64_t>(i));
    RunDaemonKillTrial(t, &tally);
  }
  PrintTally(absl::StrCat("daemon-kill trials: ", trials, " (seeds ", base, "..",
                          base + trials - 1, ") in ",
                          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1)))),
             tally);
}

// ------------------------------------------------------- trainer SIGKILL

// The slot states of a live segment, read through a private read-only mapping
// (the control block's words are atomics that both sides update).
std::string SlotStates(const std::string& shm_name) {
  const int fd = ::open(("/dev/shm/" + shm_name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "gone";
  struct stat st;
  std::string out = "unreadable";
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(shm::ControlBlock)) {
    void* m = ::mmap(nullptr, sizeof(shm::ControlBlock), PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      const auto* cb = static_cast<const shm::ControlBlock*>(m);
      static const char* kNames[] = {"free", "filling", "ready", "ingesting", "restore"};
      std::vector<std::string> states;
      for (uint32_t i = 0; i < std::min(cb->num_slots, shm::kMaxSlots); ++i) {
        const uint32_t w = cb->slots[i].state.load();
        states.push_back(w < shm::kNumSlotStates ? kNames[w] : "bad");
      }
      std::sort(states.begin(), states.end());
      states.erase(std::unique(states.begin(), states.end()), states.end());
      out = absl::StrJoin(states, "+");
      ::munmap(m, sizeof(shm::ControlBlock));
    }
  }
  ::close(fd);
  return out;
}

std::vector<std::string> SegmentsOfRank(const Daemon& d, uint32_t rank) {
  std::vector<std::string> out;
  for (const std::string& name : ShmSegments(absl::StrCat(d.shm_prefix(), ".", kJob, ".r", rank, "."))) {
    out.push_back(name);
  }
  return out;
}

// Ranks of the test job in `zccctl --json status` output.
size_t RegisteredRanks(const std::string& status_json) {
  const auto status = nlohmann::json::parse(status_json, nullptr, /*allow_exceptions=*/false);
  if (!status.is_object() || !status.contains("jobs")) return 0;
  size_t ranks = 0;
  for (const auto& job : status["jobs"]) {
    if (job.value("job_id", "") == kJob && job.contains("ranks")) ranks += job["ranks"].size();
  }
  return ranks;
}

int64_t ChooseStep(const std::string& job_dir) {
  auto choice = checkpoint::ChooseRestoreStep(
      job_dir, -1, [](const std::string& d) { return checkpoint::VerifyStep(d).status(); });
  return choice.ok() ? choice->step : -1;
}

TEST_CASE("a trainer killed mid-snapshot loses its registration; a new one restores and trains on") {
  const int trials = EnvInt("ZCC_CRASH_TRAINER_TRIALS", 6);
  const uint64_t base = SeedBase() + 1000;
  const std::string dir = ShortTempDir("crash-snap");
  Daemon daemon(dir, {{"--retain_snapshots_s=0", "--keep_last=2", "--commit_timeout_s=1", "--client_timeout_s=2"}});
  REQUIRE(daemon.Start());
  const std::string job_dir = JoinPath(daemon.root(), kJob);
  Tally tally;
  int64_t next_step = 1;
  for (int i = 0; i < trials; ++i) {
    std::mt19937_64 rng(base + i);
    const int kill_after_ms = std::uniform_int_distribution<int>(0, 300)(rng);
    const int save_every = std::uniform_int_distribution<int>(1, 3)(rng);
    Problems p{absl::StrCat("trainer-kill (snapshot) trial seed=", base + i,
                            " kill_after_ms=", kill_after_ms, " save_every=", save_every),
               {}};
    const std::vector<std::string> model = ModelFlags(3, 1024);
    auto trainer = StartTrainer(
        daemon, dir, absl::StrCat("snap", i),
        Concat({absl::StrCat("--start=", next_step), "--steps=100000", "--step_ms=2",
                absl::StrCat("--save_every=", save_every), "--block", "--wait_commit=false"},
               model));
    // Kill only once a checkpoint exists and snapshots are flowing.
    const bool flowing = Eventually(
        [&] {
          return ChooseStep(job_dir) >= next_step &&
                 absl::StrContains(trainer->Output(), absl::StrCat("step=", next_step + 3, " "));
        },
        absl::Seconds(30));
    p.Expect(flowing, "no checkpoint committed: " + Tail(trainer->Output(), 600));
    absl::SleepFor(absl::Milliseconds(kill_after_ms));
    const std::vector<std::string> segments = SegmentsOfRank(daemon, 0);
    const std::string states = segments.empty() ? "none" : SlotStates(segments.front());
    trainer->Signal(SIGKILL);
    trainer->Wait(absl::Seconds(10));
    ++tally["trainer SIGKILL mid-snapshot, slots: " + states];

    // The daemon notices (pid gone, or heartbeats stop) and drops the
    // registration with its segment.
    const bool dropped = Eventually([&] { return SegmentsOfRank(daemon, 0).empty(); },
                                   absl::Seconds(10));
    p.Expect(dropped, "the killed trainer's segment was not removed: " +
                          absl::StrJoin(SegmentsOfRank(daemon, 0), " "));
    const auto [code, status] = Zccctl(dir, daemon, {"--json", "status"});
    p.Expect(code == 0, "zccd does not answer after a trainer died: " + status);
    p.Expect(code != 0 || RegisteredRanks(status) == 0,
             "the dead trainer is still registered: " + status);

    // A restarted trainer registers again, restores the newest committed
    // step bit-exact, and trains on from it.
    const int64_t step = ChooseStep(job_dir);
    p.Expect(step >= 1, "nothing to restore");
    CheckRestore(dir, daemon, 1, model, step, absl::StrCat("snap", i), &p);
    auto resumed = StartTrainer(
        daemon, dir, absl::StrCat("resume", i),
        Concat({absl::StrCat("--start=", step + 1), "--steps=4", "--save_every=2", "--block"},
               model));
    const auto resumed_code = resumed->Wait(absl::Seconds(60));
    p.Expect(resumed_code == 0, "resumed trainer: " + Tail(resumed->Output(), 600));
    p.Expect(ChooseStep(job_dir) > step, "no newer checkpoint after resuming");
    next_step = ChooseStep(job_dir) + 1;
    Report(p, &daemon);
  }
  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix() + ".").empty());
  PrintTally(absl::StrCat("trainer-kill (mid-snapshot) trials: ", trials), tally);
}

TEST_CASE("a trainer killed mid-restore leaks no restore buffer; the next restore works") {
  const int trials = EnvInt("ZCC_CRASH_TRAINER_TRIALS", 6);
  const uint64_t base = SeedBase() + 2000;
  const std::string dir = ShortTempDir("crash-restore");
  Daemon daemon(dir, {{"--retain_snapshots_s=0", "--commit_timeout_s=1", "--client_timeout_s=2"}});
  REQUIRE(daemon.Start());
  const std::string job_dir = JoinPath(daemon.root(), kJob);
  // Restores of 8 x 6 MiB take long enough to be hit.
  const std::vector<std::string> model = ModelFlags(8, 4096);
  auto writer = StartTrainer(daemon, dir, "write",
                             Concat({"--steps=2", "--save_every=2", "--block"}, model));
  REQUIRE(writer->Wait(absl::Seconds(60)) == 0);
  REQUIRE(ChooseStep(job_dir) == 2);

  Tally tally;
  for (int i = 0; i < trials; ++i) {
    std::mt19937_64 rng(base + i);
    const int kill_after_ms = std::uniform_int_distribution<int>(0, 60)(rng);
    Problems p{absl::StrCat("trainer-kill (restore) trial seed=", base + i,
                            i % 2 == 0 ? absl::StrCat(" kill ", kill_after_ms, " ms after registering")
                                       : std::string(" kill once the restore buffer exists")),
               {}};
    auto restorer = StartTrainer(daemon, dir, absl::StrCat("rest", i),
                                 Concat({"--mode=restore", "--expect_step=2"}, model));
    // Even trials: a random delay from the registration (the Restore RPC
    // follows at once). Odd trials: as soon as the restore buffer exists.
    auto has_segment = [&](bool restore_buffer) {
      for (const std::string& name : SegmentsOfRank(daemon, 0)) {
        if (!restore_buffer || absl::StrContains(name, ".restore.")) return true;
      }
      return false;
    };
    Eventually([&] { return has_segment(i % 2 == 1) || !restorer->running(); }, absl::Seconds(30),
              absl::Milliseconds(1));
    if (i % 2 == 0) absl::SleepFor(absl::Milliseconds(kill_after_ms));
    bool buffer_live = false;
    for (const std::string& name : SegmentsOfRank(daemon, 0)) {
      buffer_live |= absl::StrContains(name, ".restore.");
    }
    const bool registered = !SegmentsOfRank(daemon, 0).empty();
    restorer->Signal(SIGKILL);
    const auto code = restorer->Wait(absl::Seconds(10));
    const bool finished = code.has_value() && *code != 128 + SIGKILL;
    ++tally[finished ? "trainer SIGKILL after its restore finished"
             : buffer_live ? "trainer SIGKILL mid-restore, restore buffer live"
             : registered  ? "trainer SIGKILL registered, restore buffer not yet/no longer live"
                           : "trainer SIGKILL before registering"];

    const bool clean = Eventually([&] { return ShmSegments(daemon.shm_prefix() + ".").empty(); },
                                 absl::Seconds(10));
    p.Expect(clean, "segments leaked after the restoring trainer died: " +
                        absl::StrJoin(ShmSegments(daemon.shm_prefix() + "."), " "));
    if (i % 2 == 1 || i == trials - 1) {
      CheckRestore(dir, daemon, 1, model, 2, absl::StrCat("rest", i, ".check"), &p);
      const bool clean_again = Eventually(
          [&] { return ShmSegments(daemon.shm_prefix() + ".").empty(); }, absl::Seconds(10));
      p.Expect(clean_again, "segments left after a completed restore");
    }
    Report(p, &daemon);
  }
  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix() + ".").empty());
  PrintTally(absl::StrCat("trainer-kill (mid-restore) trials: ", trials), tally);
}

}  // namespace
}  // namespace zcc::testing
