// The commit protocol cut at each of its steps. A commit runs on a
// MemoryStorage that dies after k changes, for every k from 0 to the number
// the whole commit makes; then the power cut drops whatever was not synced,
// and what is left is checked: `latest` names the older step or the new one,
// never anything else; every step directory with COMMITTED holds one whole
// step (never a mix of two, never a part); and recovery at start leaves only
// committed steps and a `latest` that names one.
//
// The same cuts run on an object store's model (no rename; a step is written
// and committed in place, in step-N/): every step with COMMITTED is one whole
// step there too, and `latest` names the older step or the new one.
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/recovery.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "format/manifest.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_storage.h"
#include "storage/memory_storage.h"
#include "storage/storage_wrapper.h"
#include "storage/testing/object_store_model.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

using testing::SyntheticRank;
using testing::TensorSpec;

constexpr char kJobDir[] = "/ckpt/job";
constexpr char kJob[] = "job";
constexpr uint32_t kWorld = 2;

std::vector<TensorSpec> Specs() {
  return {{"w", format::DType::kF32, {64, 32}},
          {"b", format::DType::kBF16, {128}},
          {"m", format::DType::kF32, {64, 32}, format::TensorKind::kOptim}};
}

IoOptions On(storage::Storage& fs) {
  IoOptions o;
  o.storage = &fs;
  return o;
}

// Every rank's shards and manifest of `step`, with the bytes of `seed`.
void WritePartial(storage::Storage& fs, int64_t step, int64_t seed) {
  for (uint32_t r = 0; r < kWorld; ++r) {
    SyntheticRank rank(r, kWorld, Specs(), 0, kJob);
    rank.Fill(seed);
    REQUIRE_OK(WriteRankShards(kJobDir, step, rank.shards(), rank.slot(), On(fs)).status());
  }
}

// Whether step directory `dir` reads back, whole and verified, as the bytes
// of `seed`.
bool Holds(storage::MemoryStorage& fs, const std::string& dir, int64_t seed) {
  for (uint32_t r = 0; r < kWorld; ++r) {
    SyntheticRank expect(r, kWorld, Specs(), 0, kJob);
    expect.Fill(seed);
    storage::AlignedBuffer got(expect.slot_bytes());
    if (!ReadRankTensors(dir, r, expect.Targets(got.data()), On(fs)).ok()) return false;
    if (!expect.SameTensors(got.data())) return false;
  }
  return VerifyStep(dir, On(fs)).ok();
}

struct Scenario {
  std::string name;
  std::optional<std::pair<int64_t, int64_t>> committed;  // step, seed before the commit
  int64_t step = 0;                                     // the commit cut short
  int64_t seed = 0;
  // On an object store's model: written and committed in place.
  bool in_place = false;
  // On a file system without the exchange (NFS): a step replaced with two
  // renames, step-N/ absent between them.
  bool no_exchange = false;
};

// A file system without renameat2's exchange.
class WithoutExchange : public storage::StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  absl::Status Exchange(const std::string&, const std::string&) override {
    return absl::UnimplementedError("no exchange here");
  }
};

// The storage the commit goes through: `fs` itself, an object store's
// model over it, or `fs` without the exchange.
class Through {
 public:
  Through(storage::MemoryStorage& fs, bool in_place, bool no_exchange = false)
      : fs_(fs), model_(&fs), plain_(&fs), in_place_(in_place), no_exchange_(no_exchange) {}
  storage::Storage& operator*() {
    if (in_place_) return model_;
    if (no_exchange_) return plain_;
    return fs_;
  }
  storage::Storage* get() { return &**this; }

 private:
  storage::MemoryStorage& fs_;
  storage::testing::ObjectStoreModel model_;
  WithoutExchange plain_;
  const bool in_place_;
  const bool no_exchange_;
};

// The state before the commit: the older step committed, the new one's
// files all written and synced.
void Prepare(storage::MemoryStorage& fs, const Scenario& s) {
  REQUIRE_OK(fs.MakeDirs(kJobDir));
  REQUIRE_OK(fs.SyncDir("/"));
  REQUIRE_OK(fs.SyncDir("/ckpt"));
  Through via(fs, s.in_place, s.no_exchange);
  if (s.committed.has_value()) {
    WritePartial(*via, s.committed->first, s.committed->second);
    auto done = TryCommit(kJobDir, kJob, s.committed->first, kWorld, via.get());
    REQUIRE_OK(done);
    REQUIRE(done->outcome == CommitOutcome::kCommitted);
  }
  WritePartial(*via, s.step, s.seed);
}

void CheckAfterCrash(storage::MemoryStorage& fs, const Scenario& s, bool commit_returned_ok) {
  // `latest` names the older step or the new one.
  auto latest = ReadLatest(kJobDir, &fs);
  if (s.committed.has_value()) {
    REQUIRE_OK(latest);
    CHECK((*latest == s.committed->first || *latest == s.step));
  } else {
    CHECK((absl::IsNotFound(latest.status()) || (latest.ok() && *latest == s.step)));
  }
  if (commit_returned_ok) {
    // A commit that returned is durable.
    REQUIRE_OK(latest);
    CHECK(*latest == s.step);
  }
  // Every committed step directory is one whole step.
  auto steps = ListCommittedSteps(kJobDir, &fs);
  REQUIRE_OK(steps);
  for (int64_t step : *steps) {
    INFO("step " << step);
    const std::string dir = JoinPath(kJobDir, format::StepDirName(step));
    const bool old_one = s.committed.has_value() && step == s.committed->first &&
                         Holds(fs, dir, s.committed->second);
    const bool new_one = step == s.step && Holds(fs, dir, s.seed);
    CHECK((old_one || new_one));
  }
  // What `latest` names is there and whole. In place, a step committed
  // again is uncommitted from its first rank's write until COMMITTED is
  // back: restores fall back to an older step meanwhile.
  const bool recommit = s.committed.has_value() && s.committed->first == s.step;
  if (latest.ok() && !(s.in_place && recommit)) {
    CHECK(std::find(steps->begin(), steps->end(), *latest) != steps->end());
  }
  if (s.in_place) {
    // zccd recovers nothing at start in a store (gc and retention remove
    // steps left without COMMITTED once old): the cut leaves the step to
    // retry, as the retry below shows.
    return;
  }
  // Recovery at start: nothing but committed steps and `latest` is left.
  auto recovered = RecoverJobDir(kJobDir, absl::ZeroDuration(), &fs);
  REQUIRE_OK(recovered);
  auto names = fs.List(kJobDir);
  REQUIRE_OK(names);
  for (const std::string& name : *names) {
    INFO(name);
    CHECK((name == format::kLatestFileName || format::ParseStepDirName(name).ok()));
  }
  auto after = ListCommittedSteps(kJobDir, &fs);
  REQUIRE_OK(after);
  auto latest_after = ReadLatest(kJobDir, &fs);
  if (!after->empty()) {
    REQUIRE_OK(latest_after);
    CHECK(std::find(after->begin(), after->end(), *latest_after) != after->end());
  }
  // A `latest` that named a step names one that is there.
  if (latest_after.ok()) {
    CHECK(std::find(after->begin(), after->end(), *latest_after) != after->end());
  }
  if (latest.ok()) CHECK(*latest_after == *latest);
}

void CutAtEveryChange(const Scenario& s) {
  // How many changes the whole commit makes.
  uint64_t total = 0;
  {
    storage::MemoryStorage fs;
    Prepare(fs, s);
    Through via(fs, s.in_place, s.no_exchange);
    const uint64_t before = fs.changes();
    auto done = TryCommit(kJobDir, kJob, s.step, kWorld, via.get());
    REQUIRE_OK(done);
    REQUIRE(done->outcome == CommitOutcome::kCommitted);
    total = fs.changes() - before;
  }
  REQUIRE(total > 5);
  WARN(s.name << ": " << total << " changes, each a place to die");
  for (uint64_t k = 0; k <= total; ++k) {
    INFO(s.name << ": the storage died after " << k << " of the commit's " << total << " changes");
    storage::MemoryStorage fs;
    Prepare(fs, s);
    Through via(fs, s.in_place, s.no_exchange);
    fs.CrashAfter(k);
    const auto result = TryCommit(kJobDir, kJob, s.step, kWorld, via.get());
    CHECK(result.ok() == (k == total));
    fs.Crash();
    CheckAfterCrash(fs, s, result.ok());
    if (s.in_place && !result.ok()) {
      // The rank files survived the cut: the commit tried again completes.
      auto retried = TryCommit(kJobDir, kJob, s.step, kWorld, via.get());
      REQUIRE_OK(retried);
      CHECK(retried->outcome == CommitOutcome::kCommitted);
      CHECK(*ReadLatest(kJobDir, &fs) == s.step);
      CHECK(Holds(fs, JoinPath(kJobDir, format::StepDirName(s.step)), s.seed));
    }
  }
}

TEST_CASE("a commit cut at any change leaves the older step latest or the new one whole") {
  CutAtEveryChange({"step 20 after step 10", std::make_pair(10, 10), 20, 20});
}

TEST_CASE("the same step committed again (a resumed run) is old or new at every cut, never gone") {
  CutAtEveryChange({"step 10 replaced", std::make_pair(10, 10), 10, 11});
}

TEST_CASE("without the exchange (NFS): the same step committed again is old or new at every "
          "power cut, never gone") {
  Scenario s{"step 10 replaced, two renames", std::make_pair(10, 10), 10, 11};
  s.no_exchange = true;
  CutAtEveryChange(s);
}

TEST_CASE("a job's first commit cut at any change: no latest, or the step whole") {
  CutAtEveryChange({"first commit", std::nullopt, 10, 10});
}

TEST_CASE("in place (an object store): a commit cut at any change leaves latest old or new") {
  CutAtEveryChange({"in place: step 20 after step 10", std::make_pair(10, 10), 20, 20, true});
}

TEST_CASE("in place: the same step committed again is uncommitted, never mixed, until done") {
  CutAtEveryChange({"in place: step 10 replaced", std::make_pair(10, 10), 10, 11, true});
}

TEST_CASE("in place: a job's first commit cut at any change: no latest, or the step whole") {
  CutAtEveryChange({"in place: first commit", std::nullopt, 10, 10, true});
}

TEST_CASE("in place: retention leaves a step being written, and removes it once abandoned") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20, true});
  storage::testing::ObjectStoreModel store(&memory);
  // step-20/ holds every rank's files but no COMMITTED yet: young, it stays.
  auto young = ApplyRetention(kJobDir, RetentionPolicy{}, std::set<int64_t>{}, absl::Hours(1),
                              &store);
  REQUIRE_OK(young);
  CHECK(young->removed_partials.empty());
  CHECK(storage::Exists(memory, JoinPath(kJobDir, "step-00000020")));
  auto committed = TryCommit(kJobDir, kJob, 20, kWorld, &store);
  REQUIRE_OK(committed);
  CHECK(committed->outcome == CommitOutcome::kCommitted);
  CHECK(memory.List(JoinPath(kJobDir, "step-00000020"))->size() > 2 * kWorld);
  // A step never committed is removed once older than a commit may take.
  WritePartial(store, 30, 30);
  auto old = ApplyRetention(kJobDir, RetentionPolicy{}, std::set<int64_t>{}, absl::ZeroDuration(),
                            &store);
  REQUIRE_OK(old);
  CHECK(old->removed_partials == std::vector<std::string>{"step-00000030"});
  CHECK(*ListCommittedSteps(kJobDir, &store) == std::vector<int64_t>{10, 20});
}

TEST_CASE("in place: a late commit never moves latest back, an abandoned timeline is superseded, "
          "a racing commit is seen") {
  storage::MemoryStorage memory;
  REQUIRE_OK(memory.MakeDirs(kJobDir));
  storage::testing::ObjectStoreModel store(&memory);
  auto commit = [&](int64_t step, absl::Time write_began) {
    auto done = TryCommit(kJobDir, kJob, step, kWorld, &store, write_began);
    REQUIRE_OK(done);
    CHECK(done->outcome == CommitOutcome::kCommitted);
  };
  WritePartial(store, 20, 20);
  commit(20, absl::Now());
  CHECK(*ReadLatest(kJobDir, &store) == 20);

  // Step 10 began before step 20 was committed and finishes now: committed,
  // but `latest` stays at 20.
  WritePartial(store, 10, 10);
  commit(10, absl::Now() - absl::Hours(1));
  CHECK(*ReadLatest(kJobDir, &store) == 20);
  CHECK(*ListCommittedSteps(kJobDir, &store) == std::vector<int64_t>{10, 20});

  // Training resumed from step 10 after step 20 was committed: step 15
  // supersedes the abandoned step 20.
  WritePartial(store, 15, 15);
  commit(15, absl::Now() + absl::Hours(1));
  CHECK(*ReadLatest(kJobDir, &store) == 15);

  // Another committer swaps in step 30 between this commit's read of
  // `latest` and its conditional write: the write fails, the commit reads
  // again and leaves the newer step.
  WritePartial(store, 30, 30);
  WritePartial(store, 25, 25);
  bool raced = false;
  store.BeforeConditionalWrite([&] {
    if (raced) return;
    raced = true;
    commit(30, absl::InfiniteFuture());
  });
  commit(25, absl::Now() - absl::Hours(1));
  CHECK(raced);
  CHECK(*ReadLatest(kJobDir, &store) == 30);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000030"), 30));
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000025"), 25));
}

TEST_CASE("a commit whose rename fails (EIO) leaves the older step latest; retried, it commits") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20});
  storage::FaultPlan plan;
  // Renames of a commit (no EMA here): the step index, the weight map,
  // COMMITTED, then the step directory (#4), then `latest`.
  plan.eio_on_rename = 4;
  storage::FaultInjectingStorage faulty(&memory, plan);
  auto failed = TryCommit(kJobDir, kJob, 20, kWorld, &faulty);
  CHECK_FALSE(failed.ok());
  CHECK(*ReadLatest(kJobDir, &memory) == 10);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000010"), 10));
  CHECK(absl::IsNotFound(memory.Stat(JoinPath(kJobDir, "step-00000020")).status()));
  // The partial stays whole: the next attempt commits it.
  faulty.SetPlan({});
  auto retried = TryCommit(kJobDir, kJob, 20, kWorld, &faulty);
  REQUIRE_OK(retried);
  CHECK(retried->outcome == CommitOutcome::kCommitted);
  CHECK(*ReadLatest(kJobDir, &memory) == 20);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 20));
}

TEST_CASE("a commit whose write of latest fails is finished by the retry, never moved back") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20});
  storage::FaultPlan plan;
  plan.eio_on_rename = 5;  // after the step directory's rename (#4): `latest`
  storage::FaultInjectingStorage faulty(&memory, plan);
  CHECK_FALSE(TryCommit(kJobDir, kJob, 20, kWorld, &faulty).ok());
  CHECK(*ReadLatest(kJobDir, &memory) == 10);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 20));
  // Above `latest`, but committed after it was written: not a run left
  // behind's, never removed as one.
  CHECK(LeftBehindSteps(kJobDir, &memory)->empty());

  // Tried again, the commit finds step-20/ committed and no partial: it
  // writes `latest` and reports the step committed with its bytes.
  faulty.SetPlan({});
  auto retried = TryCommit(kJobDir, kJob, 20, kWorld, &faulty);
  REQUIRE_OK(retried);
  CHECK(retried->outcome == CommitOutcome::kCommitted);
  CHECK(retried->total_bytes > 0);
  CHECK(*ReadLatest(kJobDir, &memory) == 20);
  // Once `latest` is there, a late attempt is a no-op: nothing to commit.
  auto again = TryCommit(kJobDir, kJob, 20, kWorld, &faulty);
  REQUIRE_OK(again);
  CHECK(again->outcome == CommitOutcome::kWaiting);
  // An older committed step never moves `latest` back.
  auto older = TryCommit(kJobDir, kJob, 10, kWorld, &faulty);
  REQUIRE_OK(older);
  CHECK(older->outcome == CommitOutcome::kWaiting);
  CHECK(*ReadLatest(kJobDir, &memory) == 20);
  // Nor does a step directory another job (or world size) committed.
  auto other_world = TryCommit(kJobDir, kJob, 20, kWorld + 1, &faulty);
  REQUIRE_OK(other_world);
  CHECK(other_world->outcome == CommitOutcome::kWaiting);
}

TEST_CASE("a committed step of the run left behind is not made latest again by a late "
          "attempt of its commit") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20});
  auto committed = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
  REQUIRE_OK(committed);
  REQUIRE(committed->outcome == CommitOutcome::kCommitted);
  // Training went on from step 10, after step 20's commit.
  absl::SleepFor(absl::Milliseconds(20));
  auto back = PointLatestBack(memory, kJobDir, 10, std::nullopt, absl::InfiniteFuture());
  REQUIRE_OK(back);
  REQUIRE(*ReadLatest(kJobDir, &memory) == 10);
  auto left = LeftBehindSteps(kJobDir, &memory);
  REQUIRE_OK(left);
  REQUIRE(left->size() == 1);
  CHECK(left->front().step == 20);
  // A late attempt of step 20's commit (a report of the run left behind,
  // its partial gone) finds step-20/ committed: it leaves `latest` on 10.
  auto late = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
  REQUIRE_OK(late);
  CHECK(late->outcome == CommitOutcome::kWaiting);
  CHECK(*ReadLatest(kJobDir, &memory) == 10);
}

TEST_CASE("a step of the run left behind goes once latest passes it, unless this run committed "
          "it again since it was listed") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20});
  auto committed = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
  REQUIRE_OK(committed);
  REQUIRE(committed->outcome == CommitOutcome::kCommitted);
  absl::SleepFor(absl::Milliseconds(20));
  REQUIRE_OK(PointLatestBack(memory, kJobDir, 10, std::nullopt, absl::InfiniteFuture()));
  // Listed before this run's commit of step 30 (as a commit lists them).
  auto left = LeftBehindSteps(kJobDir, &memory);
  REQUIRE_OK(left);
  REQUIRE(left->size() == 1);
  bool again = false;
  SECTION("not committed again: it goes") {}
  SECTION("committed again by this run meanwhile (another node's commit): it stays") {
    again = true;
    absl::SleepFor(absl::Milliseconds(20));
    WritePartial(memory, 20, 21);
    auto rewritten = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
    REQUIRE_OK(rewritten);
    REQUIRE(rewritten->outcome == CommitOutcome::kCommitted);
  }
  WritePartial(memory, 30, 30);
  auto passing = TryCommit(kJobDir, kJob, 30, kWorld, &memory);
  REQUIRE_OK(passing);
  REQUIRE(passing->outcome == CommitOutcome::kCommitted);
  auto removed = RemovePassedSteps(kJobDir, *left, RetentionGuard(), &memory);
  REQUIRE_OK(removed);
  if (again) {
    CHECK(removed->empty());
    CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 21));
  } else {
    CHECK(*removed == std::vector<int64_t>{20});
    CHECK_FALSE(memory.Stat(JoinPath(kJobDir, "step-00000020")).ok());
  }
  CHECK(*ListCommittedSteps(kJobDir, &memory) ==
        (again ? std::vector<int64_t>{10, 20, 30} : std::vector<int64_t>{10, 30}));
}

TEST_CASE("a step committed again whose replaced contents could not be moved away is "
          "committed; recovery removes those contents at any age") {
  storage::MemoryStorage memory;
  Prepare(memory, {"", std::make_pair(20, 20), 20, 21});
  absl::SleepFor(absl::Milliseconds(20));
  storage::FaultPlan plan;
  // Renames of a commit: the step index, the weight map, COMMITTED, the
  // exchange with step-20/ (#4), then the replaced contents' move (#5).
  plan.eio_on_rename = 5;
  storage::FaultInjectingStorage faulty(&memory, plan);
  auto committed = TryCommit(kJobDir, kJob, 20, kWorld, &faulty);
  REQUIRE_OK(committed);
  CHECK(committed->outcome == CommitOutcome::kCommitted);
  CHECK(*ReadLatest(kJobDir, &memory) == 20);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 21));
  // The replaced contents, with their manifests and COMMITTED, are still
  // where the next write of step 20 goes.
  const std::string partial = JoinPath(kJobDir, "step-00000020.partial");
  REQUIRE(memory.Stat(JoinPath(partial, "COMMITTED")).ok());
  SECTION("recovery removes their COMMITTED and manifests, young as they are") {
    WritePartial(memory, 30, 30);
    REQUIRE_OK(RecoverJobDir(kJobDir, absl::Minutes(10), &memory).status());
    CHECK(memory.Stat(JoinPath(kJobDir, "step-00000030.partial/" +
                                            format::ManifestFileName(0))).ok());
  }
  SECTION("a late attempt of the commit removes them rather than put them back") {
    auto again = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
    REQUIRE_OK(again);
    CHECK(again->outcome == CommitOutcome::kWaiting);
  }
  SECTION("a write of step 20 since keeps its part; the replaced step's go") {
    absl::SleepFor(absl::Milliseconds(20));
    SyntheticRank rank(0, kWorld, Specs(), 0, kJob);
    rank.Fill(22);
    REQUIRE_OK(WriteRankShards(kJobDir, 20, rank.shards(), rank.slot(), On(memory)).status());
    auto again = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
    REQUIRE_OK(again);
    CHECK(again->outcome == CommitOutcome::kWaiting);
    CHECK(again->manifests_present == 1);
    CHECK(memory.Stat(JoinPath(partial, format::ManifestFileName(0))).ok());
  }
  CHECK(absl::IsNotFound(memory.Stat(JoinPath(partial, "COMMITTED")).status()));
  CHECK(absl::IsNotFound(
      memory.Stat(JoinPath(partial, format::ManifestFileName(kWorld - 1))).status()));
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 21));
  CHECK(*ReadLatest(kJobDir, &memory) == 20);
}

TEST_CASE("the steps left behind a run took up (it went on from one, read from disk) and those "
          "below it are not passed steps; the others are") {
  const auto at = absl::FromUnixSeconds(1000);
  const std::vector<LeftBehindStep> above = {{15, at}, {20, at}, {30, at}};
  auto steps = [](const std::vector<LeftBehindStep>& left) {
    std::vector<int64_t> out;
    for (const LeftBehindStep& s : left) out.push_back(s.step);
    return out;
  };
  // Went on from step 20, one of them: 15 and 20 are that run's past.
  CHECK(steps(WithoutTakenUp(above, 20)) == std::vector<int64_t>{30});
  // A step below it committed after it is a later run's: not its past.
  const std::vector<LeftBehindStep> mixed = {
      {15, at + absl::Seconds(5)}, {18, at - absl::Seconds(5)}, {20, at}, {30, at}};
  CHECK(steps(WithoutTakenUp(mixed, 20)) == std::vector<int64_t>{15, 30});
  // From a step that is not one of them (this run's own, or one read from
  // memory: -1): every one stays listed.
  CHECK(steps(WithoutTakenUp(above, 25)) == std::vector<int64_t>{15, 20, 30});
  CHECK(steps(WithoutTakenUp(above, 10)) == std::vector<int64_t>{15, 20, 30});
  CHECK(steps(WithoutTakenUp(above, -1)) == std::vector<int64_t>{15, 20, 30});
  CHECK(WithoutTakenUp({}, 20).empty());
}

TEST_CASE("after training went on from an older step, the parts of later steps the run left "
          "behind wrote go; those written since stay") {
  storage::MemoryStorage memory;
  // Step 10 committed; both ranks of the run left behind wrote step 20.
  Prepare(memory, {"", std::make_pair(10, 10), 20, 20});
  WritePartial(memory, 5, 5);  // (a step at or before the one gone back to: not touched)
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time went_on = absl::Now();
  absl::SleepFor(absl::Milliseconds(20));
  // The run that went on from step 10 writes rank 0's part of step 20 again.
  auto write_rank = [&memory](uint32_t r, int64_t seed) {
    SyntheticRank rank(r, kWorld, Specs(), 0, kJob);
    rank.Fill(seed);
    REQUIRE_OK(WriteRankShards(kJobDir, 20, rank.shards(), rank.slot(), On(memory)).status());
  };
  write_rank(0, 21);
  auto forgot = ForgetLeftBehindParts(memory, kJobDir, 10, went_on);
  REQUIRE_OK(forgot);
  CHECK(*forgot == kWorld - 1);
  CHECK(memory.Stat(JoinPath(kJobDir, "step-00000005.partial/" +
                                          format::ManifestFileName(1))).ok());
  // Rank 0's new part alone does not commit step 20 (rank 1's old one would
  // have, with the bytes of the run left behind).
  auto waiting = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
  REQUIRE_OK(waiting);
  CHECK(waiting->outcome == CommitOutcome::kWaiting);
  for (uint32_t r = 1; r < kWorld; ++r) write_rank(r, 21);
  auto committed = TryCommit(kJobDir, kJob, 20, kWorld, &memory);
  REQUIRE_OK(committed);
  CHECK(committed->outcome == CommitOutcome::kCommitted);
  CHECK(Holds(memory, JoinPath(kJobDir, "step-00000020"), 21));
}

TEST_CASE("recovery removes the debris a real file system may keep: temporaries, partials, "
          "removals cut short") {
  storage::MemoryStorage fs;
  Prepare(fs, {"", std::make_pair(10, 10), 30, 30});  // step 10 committed, step 30 partial
  REQUIRE_OK(storage::WriteFileAtomic(fs, JoinPath(kJobDir, "latest.tmp.4242.7"), "step-0000"));
  REQUIRE_OK(fs.MakeDirs(JoinPath(kJobDir, "step-00000040")));  // a removal cut short
  REQUIRE_OK(fs.MakeDirs(JoinPath(kJobDir, "step-00000010.superseded")));
  REQUIRE_OK(fs.MakeDirs(JoinPath(kJobDir, "notes")));  // not ours: left alone

  // Young debris may be another daemon's commit in progress: only the
  // removal cut short goes.
  auto young = RecoverJobDir(kJobDir, absl::Hours(1), &fs);
  REQUIRE_OK(young);
  CHECK(young->removed == std::vector<std::string>{"step-00000040"});
  CHECK_FALSE(young->latest_repaired.has_value());

  auto old = RecoverJobDir(kJobDir, absl::ZeroDuration(), &fs);
  REQUIRE_OK(old);
  CHECK(old->removed == std::vector<std::string>{"latest.tmp.4242.7", "step-00000010.superseded",
                                                 "step-00000030.partial"});
  CHECK(*fs.List(kJobDir) == std::vector<std::string>{"latest", "notes", "step-00000010"});
  CHECK(*ReadLatest(kJobDir, &fs) == 10);
  CHECK(Holds(fs, JoinPath(kJobDir, "step-00000010"), 10));
}

TEST_CASE("recovery points a missing latest at the newest whole step") {
  storage::MemoryStorage fs;
  Prepare(fs, {"", std::make_pair(10, 10), 20, 20});
  REQUIRE_OK(TryCommit(kJobDir, kJob, 20, kWorld, &fs).status());
  REQUIRE_OK(fs.Remove(JoinPath(kJobDir, "latest")));
  auto recovered = RecoverJobDir(kJobDir, absl::ZeroDuration(), &fs);
  REQUIRE_OK(recovered);
  CHECK(recovered->latest_repaired == std::optional<int64_t>(20));
  CHECK(*ReadLatest(kJobDir, &fs) == 20);
}

}  // namespace
}  // namespace zcc::checkpoint
