// The tiered mode's upload: a step committed on the local root, copied to an
// object store (its model over memory, reached by URL as zccd reaches it)
// and committed there; cut at every change the store sees, it leaves the
// store's earlier state or the new step whole, and the upload tried again
// completes. In the node-local mode each node uploads its own ranks' files
// and the last one to finish commits the step.
#include "checkpoint/step_upload.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "format/manifest.h"
#include "storage/aligned_buffer.h"
#include "storage/memory_storage.h"
#include "storage/routed_storage.h"
#include "storage/storage_wrapper.h"
#include "storage/testing/object_store_model.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

using testing::SyntheticRank;
using testing::TensorSpec;

constexpr char kLocal[] = "/local/job";
constexpr char kStore[] = "s3://bucket/ckpt/job";
constexpr char kJob[] = "job";
constexpr uint32_t kWorld = 2;

std::vector<TensorSpec> Specs() {
  return {{"w", format::DType::kF32, {256, 96}},
          {"b", format::DType::kBF16, {1000}},
          {"m", format::DType::kF32, {256, 96}, format::TensorKind::kOptim}};
}

// A local disk and a store, one storage over both as in zccd.
struct Tiers {
  Tiers() : model(&store_memory), fs(&local) {
    fs.AddRoute("s3://bucket", &model, "/");
    REQUIRE_OK(local.MakeDirs(kLocal));
    REQUIRE_OK(model.MakeDirs("/ckpt"));
  }
  IoOptions Io() {
    IoOptions io;
    io.storage = &fs;
    return io;
  }
  void Commit(int64_t step, int64_t seed) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      SyntheticRank rank(r, kWorld, Specs(), 0, kJob);
      rank.Fill(seed);
      REQUIRE_OK(WriteRankShards(kLocal, step, rank.shards(), rank.slot(), Io()).status());
    }
    auto done = TryCommit(kLocal, kJob, step, kWorld, &fs);
    REQUIRE_OK(done);
    REQUIRE(done->outcome == CommitOutcome::kCommitted);
  }
  // Whether `dir` reads back, whole and verified, as the bytes of `seed`.
  bool Holds(const std::string& dir, int64_t seed) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      SyntheticRank expect(r, kWorld, Specs(), 0, kJob);
      expect.Fill(seed);
      storage::AlignedBuffer got(expect.slot_bytes());
      if (!ReadRankTensors(dir, r, expect.Targets(got.data()), Io()).ok()) return false;
      if (!expect.SameTensors(got.data())) return false;
    }
    return VerifyStep(dir, Io()).ok();
  }

  // Node `node`'s ranks (rank r is on node r) write `step` into that node's
  // own local root, uncommitted: no node sees the others' files.
  void WriteOnNode(uint32_t node, int64_t step, int64_t seed, const std::string& run = "") {
    SyntheticRank rank(node, kWorld, Specs(), 0, kJob);
    rank.Fill(seed);
    RankShards shards = rank.shards();
    shards.run_id = run;
    REQUIRE_OK(WriteRankShards(NodeDir(node), step, shards, rank.slot(), Io()).status());
  }
  static std::string NodeDir(uint32_t node) { return node == 0 ? "/node-a/job" : "/node-b/job"; }
  absl::StatusOr<NodeUploadResult> UploadNode(uint32_t node, int64_t step) {
    return UploadNodeStep(fs, NodeDir(node), step, kStore, kJob, kWorld);
  }
  // Both nodes write `step` and send their parts: committed in the store.
  void CommitFromNodes(int64_t step, int64_t seed) {
    WriteOnNode(0, step, seed);
    WriteOnNode(1, step, seed);
    REQUIRE_OK(UploadNode(0, step).status());
    auto last = UploadNode(1, step);
    REQUIRE_OK(last);
    REQUIRE(last->committed);
  }

  storage::MemoryStorage local;
  storage::MemoryStorage store_memory;
  storage::testing::ObjectStoreModel model;
  storage::RoutedStorage fs;
};

TEST_CASE("a committed local step is uploaded and committed in the store") {
  Tiers t;
  t.Commit(10, 10);
  auto up = UploadStep(t.fs, kLocal, 10, kStore);
  REQUIRE_OK(up);
  CHECK(up->files == 2 * 2 + 2 + 3);  // model and optim shards, manifests, index files, COMMITTED
  CHECK(up->bytes > 2 * 256 * 96 * 4 * 2);
  CHECK(*ReadLatest(kStore, &t.fs) == 10);
  CHECK(*ListCommittedSteps(kStore, &t.fs) == std::vector<int64_t>{10});
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 10));

  // A step not committed locally is refused; nothing changes in the store.
  SyntheticRank rank(0, kWorld, Specs(), 0, kJob);
  rank.Fill(20);
  REQUIRE_OK(WriteRankShards(kLocal, 20, rank.shards(), rank.slot(), t.Io()).status());
  CHECK(absl::IsFailedPrecondition(UploadStep(t.fs, kLocal, 20, kStore).status()));
  CHECK(*ListCommittedSteps(kStore, &t.fs) == std::vector<int64_t>{10});

  // Uploaded again as it is (a retry, or a catch-up after the store could
  // not be read): nothing is copied, and the store's step stays committed
  // throughout (a copy cut half way would have lost it there).
  const uint64_t before = t.store_memory.changes();
  auto again = UploadStep(t.fs, kLocal, 10, kStore);
  REQUIRE_OK(again);
  CHECK(again->files == 0);
  CHECK(t.store_memory.changes() == before);
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 10));

  // The step committed again locally (a resumed run): the store's copy is
  // replaced by the new one.
  t.Commit(10, 11);
  REQUIRE_OK(UploadStep(t.fs, kLocal, 10, kStore).status());
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 11));
}

TEST_CASE("an upload cut at any change leaves the store's older state or the new step whole") {
  uint64_t total = 0;
  {
    Tiers t;
    t.Commit(10, 10);
    REQUIRE_OK(UploadStep(t.fs, kLocal, 10, kStore).status());
    t.Commit(20, 20);
    const uint64_t before = t.store_memory.changes();
    REQUIRE_OK(UploadStep(t.fs, kLocal, 20, kStore).status());
    total = t.store_memory.changes() - before;
  }
  REQUIRE(total > 10);
  for (uint64_t k = 0; k < total; ++k) {
    INFO("the store died after " << k << " of the upload's " << total << " changes");
    Tiers t;
    t.Commit(10, 10);
    REQUIRE_OK(UploadStep(t.fs, kLocal, 10, kStore).status());
    t.Commit(20, 20);
    t.store_memory.CrashAfter(k);
    CHECK_FALSE(UploadStep(t.fs, kLocal, 20, kStore).ok());
    t.store_memory.Crash();
    auto latest = ReadLatest(kStore, &t.fs);
    REQUIRE_OK(latest);
    CHECK((*latest == 10 || *latest == 20));
    auto steps = ListCommittedSteps(kStore, &t.fs);
    REQUIRE_OK(steps);
    for (int64_t step : *steps) {
      CHECK(t.Holds(JoinPath(kStore, format::StepDirName(step)), step));
    }
    // Tried again, the upload completes.
    REQUIRE_OK(UploadStep(t.fs, kLocal, 20, kStore).status());
    CHECK(*ReadLatest(kStore, &t.fs) == 20);
    CHECK(t.Holds(JoinPath(kStore, "step-00000020"), 20));
  }
}

TEST_CASE("an upload stops when cancelled, committing nothing") {
  Tiers t;
  t.Commit(10, 10);
  const std::function<bool()> cancelled = [] { return true; };
  UploadOptions options;
  options.cancelled = &cancelled;
  CHECK(absl::IsCancelled(UploadStep(t.fs, kLocal, 10, kStore, options).status()));
  CHECK(ListCommittedSteps(kStore, &t.fs).value_or(std::vector<int64_t>{-1}).empty());
}

TEST_CASE("node-local roots: each node uploads its own ranks' files; the last one commits") {
  Tiers t;
  t.WriteOnNode(0, 10, 10);
  t.WriteOnNode(1, 10, 10);
  auto a = t.UploadNode(0, 10);
  REQUIRE_OK(a);
  CHECK_FALSE(a->committed);
  CHECK(a->manifests_present == 1);
  CHECK(a->stats.files == 2 + 1);  // its model and optim shards, its manifest
  CHECK(ListCommittedSteps(kStore, &t.fs).value_or(std::vector<int64_t>{-1}).empty());
  auto b = t.UploadNode(1, 10);
  REQUIRE_OK(b);
  CHECK(b->committed);
  CHECK(b->manifests_present == 2);
  CHECK(*ReadLatest(kStore, &t.fs) == 10);
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 10));
  // Neither local root ever held a committed step.
  CHECK(ListCommittedSteps(Tiers::NodeDir(0), &t.fs).value_or(std::vector<int64_t>{}).empty());

  // A node that finished no rank of the step has nothing to send.
  CHECK(absl::IsFailedPrecondition(t.UploadNode(0, 20).status()));

  // The step written again (a run resumed from an older one): the first
  // node's upload uncommits it; the second's commits the new bytes.
  t.WriteOnNode(0, 10, 11);
  t.WriteOnNode(1, 10, 11);
  REQUIRE_OK(t.UploadNode(1, 10).status());
  CHECK(ListCommittedSteps(kStore, &t.fs).value_or(std::vector<int64_t>{-1}).empty());
  auto again = t.UploadNode(0, 10);
  REQUIRE_OK(again);
  CHECK(again->committed);
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 11));
}

TEST_CASE("node-local roots: a new run forgets its ranks' parts of uncommitted steps, so an "
          "earlier run's part never completes a step written again") {
  Tiers t;
  t.CommitFromNodes(10, 10);
  // A run sends node 0's part of step 20 and dies before node 1 sends its.
  t.WriteOnNode(0, 20, 20);
  REQUIRE_OK(t.UploadNode(0, 20).status());
  // The new run's rank 0 registers: its part of step 20 is forgotten; the
  // committed step 10 keeps every manifest.
  auto forgot = ForgetRankParts(t.fs, kStore, {0});
  REQUIRE_OK(forgot);
  CHECK(*forgot == 1);
  CHECK(t.Holds(JoinPath(kStore, "step-00000010"), 10));
  // Step 20 written again: node 1's new part alone does not commit it...
  t.WriteOnNode(0, 20, 21);
  t.WriteOnNode(1, 20, 21);
  auto b = t.UploadNode(1, 20);
  REQUIRE_OK(b);
  CHECK_FALSE(b->committed);
  CHECK(*ReadLatest(kStore, &t.fs) == 10);
  // ...node 0's new part does, with the new run's bytes only.
  auto a = t.UploadNode(0, 20);
  REQUIRE_OK(a);
  CHECK(a->committed);
  CHECK(t.Holds(JoinPath(kStore, "step-00000020"), 21));
  // A store with nothing yet has nothing to forget.
  CHECK(*ForgetRankParts(t.fs, "s3://bucket/ckpt/other", {0}) == 0);
}

TEST_CASE("node-local roots: a rank registered again in the same run keeps the parts that run "
          "sent; an earlier run's go") {
  Tiers t;
  t.WriteOnNode(0, 20, 20, "a");
  REQUIRE_OK(t.UploadNode(0, 20).status());
  t.WriteOnNode(0, 30, 30, "b");
  REQUIRE_OK(t.UploadNode(0, 30).status());
  // Run "b" registers rank 0 again (a reconnect): run "a"'s part of step 20
  // goes, run "b"'s of step 30 stays, and node 1's part completes step 30.
  auto forgot = ForgetRankParts(t.fs, kStore, {0}, "b");
  REQUIRE_OK(forgot);
  CHECK(*forgot == 1);
  CHECK_FALSE(t.fs.Stat(JoinPath(kStore, "step-00000020/" + format::ManifestFileName(0))).ok());
  CHECK(t.fs.Stat(JoinPath(kStore, "step-00000030/" + format::ManifestFileName(0))).ok());
  t.WriteOnNode(1, 30, 30, "b");
  auto b = t.UploadNode(1, 30);
  REQUIRE_OK(b);
  CHECK(b->committed);
  CHECK(t.Holds(JoinPath(kStore, "step-00000030"), 30));
  // A manifest that cannot be read is no run's: removed.
  t.WriteOnNode(0, 40, 40, "b");
  REQUIRE_OK(t.UploadNode(0, 40).status());
  const std::string bad = JoinPath(kStore, "step-00000040/" + format::ManifestFileName(0));
  REQUIRE_OK(storage::WriteFileAtomic(t.fs, bad, "{not json"));
  CHECK(*ForgetRankParts(t.fs, kStore, {0}, "b") == 1);
}

// The store as `base` has it, except that removing a file first runs
// `before_remove` once (another node's upload landing at that moment).
class RemoveRacingStorage : public storage::StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  std::function<void()> before_remove;
  absl::Status Remove(const std::string& path) override {
    if (before_remove) std::exchange(before_remove, nullptr)();
    return StorageWrapper::Remove(path);
  }
};

TEST_CASE("node-local roots: a step another node commits while a rank's earlier-run part is "
          "being forgotten keeps that part") {
  Tiers t;
  // Run "a": node 0 sent its part of step 20; node 1 wrote its part and is
  // about to send it. Run "b" registers rank 0 on node 0.
  t.WriteOnNode(0, 20, 20, "a");
  REQUIRE_OK(t.UploadNode(0, 20).status());
  t.WriteOnNode(1, 20, 20, "a");
  RemoveRacingStorage racing(&t.fs);
  bool committed = false;
  // Node 1's part lands after the check for COMMITTED, before the removal.
  racing.before_remove = [&] {
    auto up = t.UploadNode(1, 20);
    REQUIRE_OK(up);
    committed = up->committed;
  };
  auto forgot = ForgetRankParts(racing, kStore, {0}, "b");
  REQUIRE_OK(forgot);
  REQUIRE(committed);
  CHECK(*forgot == 0);
  CHECK(t.Holds(JoinPath(kStore, "step-00000020"), 20));
  CHECK(*ReadLatest(kStore, &t.fs) == 20);
  // Without a race, the same forgetting removes the part of an uncommitted step.
  t.WriteOnNode(0, 30, 30, "a");
  REQUIRE_OK(t.UploadNode(0, 30).status());
  CHECK(*ForgetRankParts(racing, kStore, {0}, "b") == 1);
}

TEST_CASE("a step commits only from manifests of one run: an earlier run's part left in the "
          "store waits to be replaced") {
  Tiers t;
  // Run "a" sent node 1's part of step 20 and died; its ranks' forgetting
  // never ran (node 1 cut off when run "b" began).
  t.WriteOnNode(1, 20, 20, "a");
  REQUIRE_OK(t.UploadNode(1, 20).status());
  // Run "b": node 0's part is there with it, every rank's manifest present,
  // and yet nothing commits.
  t.WriteOnNode(0, 20, 21, "b");
  auto a = t.UploadNode(0, 20);
  REQUIRE_OK(a);
  CHECK_FALSE(a->committed);
  CHECK(a->mixed_runs);
  CHECK(ReadLatest(kStore, &t.fs).status().code() == absl::StatusCode::kNotFound);
  // Node 1 sends run "b"'s part: the step commits, of run "b" alone.
  t.WriteOnNode(1, 20, 21, "b");
  auto b = t.UploadNode(1, 20);
  REQUIRE_OK(b);
  CHECK(b->committed);
  CHECK(t.Holds(JoinPath(kStore, "step-00000020"), 21));
}

TEST_CASE("node-local roots: the last node's upload cut at any change leaves the older step or "
          "the new one whole") {
  auto prepare = [](Tiers& t) {
    t.CommitFromNodes(10, 10);
    t.WriteOnNode(0, 20, 20);
    t.WriteOnNode(1, 20, 20);
    REQUIRE_OK(t.UploadNode(0, 20).status());
  };
  uint64_t total = 0;
  {
    Tiers t;
    prepare(t);
    const uint64_t before = t.store_memory.changes();
    REQUIRE_OK(t.UploadNode(1, 20).status());
    total = t.store_memory.changes() - before;
  }
  REQUIRE(total > 5);
  for (uint64_t k = 0; k < total; ++k) {
    INFO("the store died after " << k << " of the last upload's " << total << " changes");
    Tiers t;
    prepare(t);
    t.store_memory.CrashAfter(k);
    CHECK_FALSE(t.UploadNode(1, 20).ok());
    t.store_memory.Crash();
    auto latest = ReadLatest(kStore, &t.fs);
    REQUIRE_OK(latest);
    CHECK((*latest == 10 || *latest == 20));
    auto steps = ListCommittedSteps(kStore, &t.fs);
    REQUIRE_OK(steps);
    for (int64_t step : *steps) {
      CHECK(t.Holds(JoinPath(kStore, format::StepDirName(step)), step));
    }
    auto retried = t.UploadNode(1, 20);
    REQUIRE_OK(retried);
    CHECK(retried->committed);
    CHECK(*ReadLatest(kStore, &t.fs) == 20);
    CHECK(t.Holds(JoinPath(kStore, "step-00000020"), 20));
  }
}

}  // namespace
}  // namespace zcc::checkpoint
