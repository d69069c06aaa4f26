#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/committer.h"
#include "checkpoint/recovery.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "checkpoint/retention.h"
#include "checkpoint/shard_writer.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

using format::DType;

using ::zcc::testing::TempDir;

// A rank's registration and a slot full of deterministic bytes for a step.
struct FakeRank {
  RankShards shards;
  std::vector<uint8_t> slot;

  FakeRank(uint32_t rank, uint32_t world) {
    shards.job_id = "job";
    shards.rank = rank;
    shards.world_size = world;
    shards.manifest_hash = 0x1234;
    auto add = [&](std::string name, DType dt, std::vector<int64_t> shape, format::TensorKind g) {
      RankTensor t;
      t.name = absl::StrCat("r", rank, "/", name);
      t.dtype = dt;
      t.shape = shape;
      t.kind = g;
      t.nbytes = *format::TensorBytes(dt, shape);
      shards.tensors.push_back(t);
    };
    add("layers.0.weight", DType::kBF16, {64, 33}, format::TensorKind::kParam);
    add("layers.0.bias", DType::kF32, {33}, format::TensorKind::kParam);
    add("empty", DType::kF32, {0, 4}, format::TensorKind::kParam);
    add("layers.0.weight.exp_avg", DType::kF32, {64, 33}, format::TensorKind::kOptim);
    add("rng", DType::kU8, {17}, format::TensorKind::kExtra);
    std::vector<shm::LayoutInput> in;
    for (const auto& t : shards.tensors) in.push_back({t.name, t.nbytes, t.kind});
    shards.layout = *shm::ComputeSlotLayout(in, 1 << 30);
    for (size_t i = 0; i < shards.tensors.size(); ++i) {
      shards.tensors[i].slot_offset = shards.layout.placements[i].offset;
    }
    slot.resize(shards.layout.slot_bytes);
  }

  void Fill(int64_t step) {
    std::mt19937_64 rng(step * 1000 + shards.rank);
    for (auto& b : slot) b = static_cast<uint8_t>(rng());
  }

  std::vector<ReadTarget> Targets(std::vector<uint8_t>* out) const {
    out->assign(slot.size(), 0);
    std::vector<ReadTarget> targets;
    for (const auto& t : shards.tensors) {
      targets.push_back({t.name, std::string(format::TensorKindName(t.kind)), t.dtype, t.shape,
                         out->data() + t.slot_offset, t.nbytes});
    }
    return targets;
  }

  bool SameTensors(const std::vector<uint8_t>& other) const {
    for (const auto& t : shards.tensors) {
      if (std::memcmp(slot.data() + t.slot_offset, other.data() + t.slot_offset, t.nbytes) != 0) {
        return false;
      }
    }
    return true;
  }
};

void WriteAndCommit(const std::string& job_dir, std::vector<FakeRank>& ranks, int64_t step) {
  for (auto& r : ranks) {
    r.Fill(step);
    REQUIRE_OK(WriteRankShards(job_dir, step, r.shards, r.slot.data()));
  }
  auto result = TryCommit(job_dir, "job", step, ranks.size());
  REQUIRE_OK(result);
  REQUIRE(result->outcome == CommitOutcome::kCommitted);
}

void FlipByte(const std::string& path, off_t offset) {
  const int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(pread(fd, &b, 1, offset) == 1);
  b ^= 0x01;
  REQUIRE(pwrite(fd, &b, 1, offset) == 1);
  close(fd);
}

auto Verify = [](const std::string& dir) { return VerifyStep(dir).status(); };

TEST_CASE("two ranks write a step; it becomes visible only when both manifests are in") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 2), FakeRank(1, 2)};
  ranks[0].Fill(10);
  auto stats = WriteRankShards(root, 10, ranks[0].shards, ranks[0].slot.data());
  REQUIRE_OK(stats);
  CHECK(stats->bytes > ranks[0].slot.size() / 2);

  auto waiting = TryCommit(root, "job", 10, 2);
  REQUIRE_OK(waiting);
  CHECK(waiting->outcome == CommitOutcome::kWaiting);
  CHECK(waiting->manifests_present == 1);
  CHECK(ListCommittedSteps(root)->empty());
  CHECK(ChooseRestoreStep(root, -1, Verify).status().code() == absl::StatusCode::kNotFound);

  ranks[1].Fill(10);
  REQUIRE_OK(WriteRankShards(root, 10, ranks[1].shards, ranks[1].slot.data()));
  auto done = TryCommit(root, "job", 10, 2);
  REQUIRE_OK(done);
  CHECK(done->outcome == CommitOutcome::kCommitted);
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{10});
  CHECK(*ReadLatest(root) == 10);
  CHECK_FALSE(PathExists(JoinPath(root, "step-00000010.partial")));

  const std::string step_dir = JoinPath(root, "step-00000010");
  auto report = VerifyStep(step_dir);
  REQUIRE_OK(report);
  CHECK(report->ranks == 2);
  CHECK(report->tensors == 10);

  auto index = format::DecodeWeightMapIndex(
      *ReadFileToString(JoinPath(step_dir, format::kModelIndexFileName), 1 << 20));
  REQUIRE_OK(index);
  CHECK(index->size() == 6);  // 3 params per rank
  CHECK(index->at("r1/layers.0.bias") == "model-r00001.safetensors");

  for (auto& r : ranks) {
    std::vector<uint8_t> back;
    REQUIRE_OK(ReadRankTensors(step_dir, r.shards.rank, r.Targets(&back)));
    CHECK(r.SameTensors(back));
  }
}

TEST_CASE("a step commits only from manifests of one timeline: a rank's manifest left by the "
          "steps its run went back from waits to be replaced") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 2), FakeRank(1, 2)};
  for (FakeRank& r : ranks) r.shards.run_id = "run-a";
  // Rank 1 wrote step 20 before the run went back to step 10 (its write
  // outlived the going back); rank 0 writes step 20 again after it.
  ranks[1].Fill(20);
  REQUIRE_OK(WriteRankShards(root, 20, ranks[1].shards, ranks[1].slot.data(), IoOptions(), {}));
  ranks[0].Fill(21);
  REQUIRE_OK(WriteRankShards(root, 20, ranks[0].shards, ranks[0].slot.data(), IoOptions(), {},
                             "went-on-from-10"));
  auto mixed = TryCommit(root, "job", 20, 2);
  REQUIRE_OK(mixed);
  CHECK(mixed->outcome == CommitOutcome::kWaiting);
  CHECK(mixed->manifests_present == 2);
  CHECK(mixed->mixed_runs);
  CHECK(mixed->mixed ==
        "rank 1: run 'run-a' timeline ''; rank 0: run 'run-a' timeline 'went-on-from-10'");
  CHECK(ListCommittedSteps(root)->empty());

  // Rank 1 writes it again on the same timeline: the step commits, whole.
  ranks[1].Fill(21);
  REQUIRE_OK(WriteRankShards(root, 20, ranks[1].shards, ranks[1].slot.data(), IoOptions(), {},
                             "went-on-from-10"));
  auto done = TryCommit(root, "job", 20, 2);
  REQUIRE_OK(done);
  CHECK(done->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000020");
  // The step's index says it too (what a restore reads the step by).
  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  CHECK(index->timeline == "went-on-from-10");
  // So does its commit record (what zccctl list shows).
  auto record = ReadCommitRecord(step_dir);
  REQUIRE_OK(record);
  CHECK(record->timeline == "went-on-from-10");
  for (FakeRank& r : ranks) {
    std::vector<uint8_t> back;
    REQUIRE_OK(ReadRankTensors(step_dir, r.shards.rank, r.Targets(&back)));
    CHECK(r.SameTensors(back));
    auto manifest = format::DecodeRankManifest(
        *ReadFileToString(JoinPath(step_dir, format::ManifestFileName(r.shards.rank)), 1 << 20));
    REQUIRE_OK(manifest);
    CHECK(manifest->timeline == "went-on-from-10");
  }
}

TEST_CASE("restore falls back past a corrupt, truncated or unlisted step") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 2), FakeRank(1, 2)};
  for (int64_t step : {10, 20, 30, 40}) WriteAndCommit(root, ranks, step);
  auto choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 40);

  // A flipped bit in the newest step's data.
  const std::string s40 = JoinPath(root, "step-00000040");
  FlipByte(JoinPath(s40, "optim-r00001.safetensors"), 4096 + 100);
  CHECK(VerifyStep(s40).status().code() == absl::StatusCode::kDataLoss);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 30);
  REQUIRE(choice->rejected.size() == 1);
  CHECK(choice->rejected[0].find("checksum mismatch") != std::string::npos);

  // A truncated shard in step 30.
  REQUIRE(truncate(JoinPath(JoinPath(root, "step-00000030"), "model-r00000.safetensors").c_str(),
                   5000) == 0);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 20);

  // A missing manifest in step 20.
  REQUIRE(unlink(JoinPath(JoinPath(root, "step-00000020"), "r00001.manifest.json").c_str()) == 0);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 10);

  // A latest file pointing at garbage: every committed step is a candidate.
  REQUIRE_OK(WriteFileAtomic(JoinPath(root, "latest"), "../../etc/passwd"));
  CHECK(ReadLatest(root).status().code() == absl::StatusCode::kDataLoss);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 10);

  // An explicit request for a bad step is refused, not silently replaced.
  CHECK(ChooseRestoreStep(root, 40, Verify).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a partial step is never chosen, and steps past latest are ignored") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  WriteAndCommit(root, ranks, 5);
  ranks[0].Fill(6);
  REQUIRE_OK(WriteRankShards(root, 6, ranks[0].shards, ranks[0].slot.data()));
  // A partial that even has a COMMITTED file (crash between COMMITTED and rename).
  REQUIRE_OK(WriteFileAtomic(JoinPath(JoinPath(root, "step-00000006.partial"), "COMMITTED"), "{}"));
  auto choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 5);

  WriteAndCommit(root, ranks, 9);
  // Resume from 5 and commit 7: latest says 7, step 9 is an abandoned timeline.
  WriteAndCommit(root, ranks, 7);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 7);

  // `latest` cannot be read (not missing, not garbage: here a directory in
  // its place, as an I/O error or a store's outage would): which steps were
  // left behind is not known, so no choice is made, rather than step 9.
  REQUIRE(rename(JoinPath(root, "latest").c_str(), JoinPath(root, "latest.kept").c_str()) == 0);
  REQUIRE(mkdir(JoinPath(root, "latest").c_str(), 0755) == 0);
  choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE(!choice.ok());
  CHECK(!absl::IsNotFound(choice.status()));
  CHECK(absl::StrContains(choice.status().message(), "latest"));
  CHECK(!CommittedOnTimeline(root).ok());
  CHECK(!NewestOnTimeline(root).ok());
  // An explicit step needs no `latest`.
  choice = ChooseRestoreStep(root, 5, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 5);
  REQUIRE(rmdir(JoinPath(root, "latest").c_str()) == 0);
  REQUIRE(rename(JoinPath(root, "latest.kept").c_str(), JoinPath(root, "latest").c_str()) == 0);
  CHECK(ChooseRestoreStep(root, -1, Verify)->step == 7);
}

TEST_CASE("after a run went back to an older step, the steps it left behind are neither "
          "candidates nor counted by retention; its own older steps stay to fall back to") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  for (int64_t step : {10, 20, 30, 40}) WriteAndCommit(root, ranks, step);
  // The run resumed from step 20 and committed step 25: 30 and 40 are left
  // behind (above latest).
  WriteAndCommit(root, ranks, 25);
  REQUIRE(*ReadLatest(root) == 25);
  CHECK(*CommittedOnTimeline(root) == std::vector<int64_t>{10, 20, 25});
  CHECK(*NewestOnTimeline(root) == 25);

  RetentionPolicy policy;
  policy.keep_last = 2;
  auto removed = ApplyRetention(root, policy, RetentionGuard(), absl::Hours(1));
  REQUIRE_OK(removed);
  // The newest two of this run's steps (20, 25) stay; the left-behind ones
  // are not this policy's to count or remove.
  CHECK(removed->removed_steps == std::vector<int64_t>{10});
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{20, 25, 30, 40});
  // Step 25 damaged: the restore falls back to this run's step 20, never to
  // the steps left behind.
  FlipByte(JoinPath(JoinPath(root, "step-00000025"), "model-r00000.safetensors"), 4096 + 100);
  auto choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 20);

  // Without a latest, every committed step is on the timeline.
  REQUIRE(unlink(JoinPath(root, "latest").c_str()) == 0);
  CHECK(*NewestOnTimeline(root) == 40);
  // Nothing committed: -1.
  CHECK(*NewestOnTimeline(TempDir()) == -1);
}

TEST_CASE("latest goes back to the newest committed step up to the one a run went on from") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  for (int64_t step : {10, 20, 30, 40}) WriteAndCommit(root, ranks, step);
  storage::Storage& fs = *storage::DefaultStorage();
  // Only from a named step: latest names 40, not 30, so nothing moves.
  auto back = PointLatestBack(fs, root, 25, /*only_from=*/30);
  REQUIRE_OK(back);
  CHECK(back->named == 40);
  CHECK(back->back_to == -1);
  CHECK(*ReadLatest(root) == 40);
  back = PointLatestBack(fs, root, 25);
  REQUIRE_OK(back);
  CHECK(back->named == 40);
  CHECK(back->back_to == 20);
  CHECK(*ReadLatest(root) == 20);
  // Nothing newer named: nothing to move.
  back = PointLatestBack(fs, root, 25);
  REQUIRE_OK(back);
  CHECK(back->back_to == -1);
  // Nothing committed up to the step (it came from another tier, or from
  // memory): latest names the step itself, and no step of the run left
  // behind is on the timeline.
  REQUIRE_OK(WriteFileAtomic(JoinPath(root, "latest"), "step-00000040\n"));
  back = PointLatestBack(fs, root, 5);
  REQUIRE_OK(back);
  CHECK(back->back_to == 5);
  CHECK_FALSE(back->committed);
  CHECK(*ReadLatest(root) == 5);
  CHECK(*NewestOnTimeline(root) == -1);
  CHECK(ChooseRestoreStep(root, -1, Verify).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a latest lost in the first commit is repaired; a latest naming a step is kept") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  // Nothing committed: nothing to repair.
  REQUIRE_OK(MakeDirs(root));
  auto repaired = RepairLatest(root);
  REQUIRE_OK(repaired);
  CHECK_FALSE(repaired->has_value());

  // A crash between the first step's rename and the write of latest.
  WriteAndCommit(root, ranks, 2);
  WriteAndCommit(root, ranks, 4);
  REQUIRE(unlink(JoinPath(root, "latest").c_str()) == 0);
  repaired = RepairLatest(root);
  REQUIRE_OK(repaired);
  CHECK(*repaired == std::optional<int64_t>(4));
  CHECK(*ReadLatest(root) == 4);

  // latest naming a step, with a newer step above it (an abandoned timeline,
  // or a commit cut short before its swap): unchanged.
  WriteAndCommit(root, ranks, 6);
  REQUIRE_OK(WriteFileAtomic(JoinPath(root, "latest"), "step-00000004\n"));
  repaired = RepairLatest(root);
  REQUIRE_OK(repaired);
  CHECK_FALSE(repaired->has_value());
  CHECK(*ReadLatest(root) == 4);

  // Garbage in latest, and a newest step whose COMMITTED is unreadable: the
  // newest step with a readable COMMITTED is named.
  REQUIRE_OK(WriteFileAtomic(JoinPath(root, "latest"), "../../etc/passwd"));
  REQUIRE_OK(WriteFileAtomic(JoinPath(JoinPath(root, "step-00000006"), "COMMITTED"), "{"));
  repaired = RepairLatest(root);
  REQUIRE_OK(repaired);
  CHECK(*repaired == std::optional<int64_t>(4));
  CHECK(*ReadLatest(root) == 4);
}

TEST_CASE("recommitting an existing step replaces it") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  WriteAndCommit(root, ranks, 3);
  ranks[0].slot.assign(ranks[0].slot.size(), 0x5a);
  REQUIRE_OK(WriteRankShards(root, 3, ranks[0].shards, ranks[0].slot.data()));
  auto result = TryCommit(root, "job", 3, 1);
  REQUIRE_OK(result);
  std::vector<uint8_t> back;
  REQUIRE_OK(ReadRankTensors(JoinPath(root, "step-00000003"), 0, ranks[0].Targets(&back)));
  CHECK(ranks[0].SameTensors(back));
  CHECK_FALSE(PathExists(JoinPath(root, "step-00000003.superseded")));
}

TEST_CASE("reading into a registration that does not match is refused before any byte moves") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  WriteAndCommit(root, ranks, 1);
  std::vector<uint8_t> back;
  auto targets = ranks[0].Targets(&back);
  targets[1].shape = {34};
  targets[1].nbytes = 34 * 4;
  std::fill(back.begin(), back.end(), 0xee);
  CHECK(ReadRankTensors(JoinPath(root, "step-00000001"), 0, targets).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(std::all_of(back.begin(), back.end(), [](uint8_t b) { return b == 0xee; }));
  targets = ranks[0].Targets(&back);
  targets[0].name = "not/there";
  CHECK(ReadRankTensors(JoinPath(root, "step-00000001"), 0, targets).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("retention keeps the newest K and milestones, and drops stale partials") {
  const std::string root = TempDir();
  std::vector<FakeRank> ranks = {FakeRank(0, 1)};
  for (int64_t step = 1; step <= 6; ++step) WriteAndCommit(root, ranks, step);
  ranks[0].Fill(7);
  REQUIRE_OK(WriteRankShards(root, 7, ranks[0].shards, ranks[0].slot.data()));

  RetentionPolicy policy;
  policy.keep_last = 2;
  policy.keep_every = 4;
  auto kept_young = ApplyRetention(root, policy, {1}, absl::Hours(1));
  REQUIRE_OK(kept_young);
  CHECK(kept_young->removed_steps == std::vector<int64_t>{2, 3});
  CHECK(kept_young->removed_partials.empty());
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{1, 4, 5, 6});

  auto old = ApplyRetention(root, policy, RetentionGuard(), absl::ZeroDuration());
  REQUIRE_OK(old);
  CHECK(old->removed_steps == std::vector<int64_t>{1});
  CHECK(old->removed_partials == std::vector<std::string>{"step-00000007.partial"});
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{4, 5, 6});
  CHECK(ChooseRestoreStep(root, -1, Verify)->step == 6);

  // `latest` unreadable: which steps it leaves out is not known; nothing goes.
  {
    std::FILE* f = std::fopen(JoinPath(root, format::kLatestFileName).c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("garbled\n", f);
    std::fclose(f);
  }
  policy.keep_last = 1;
  auto unknown = ApplyRetention(root, policy, RetentionGuard(), absl::ZeroDuration());
  CHECK(unknown.status().code() == absl::StatusCode::kDataLoss);
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{4, 5, 6});
}

}  // namespace
}  // namespace zcc::checkpoint
