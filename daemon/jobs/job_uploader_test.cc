// The uploader of the tiered mode on node-local disks, with a local disk and
// an object store modelled in memory (reached by URL as zccd reaches it): two
// nodes' uploaders send their ranks' parts and the last commits; a store
// slower than the checkpoints drops the oldest waiting step on a node; a
// failed send is tried again; a rank registered again forgets its earlier
// run's parts; a step committed on a node whole (a relayout) goes up whole.
#include "daemon/jobs/job_uploader.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/step_dirs.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "format/manifest.h"
#include "storage/fault_storage.h"
#include "storage/memory_storage.h"
#include "storage/routed_storage.h"
#include "storage/testing/object_store_model.h"

namespace zcc::daemon {
namespace {

using checkpoint::testing::SyntheticRank;
using checkpoint::testing::TensorSpec;

constexpr char kStore[] = "s3://bucket/ckpt/job";
constexpr char kJob[] = "job";
constexpr uint32_t kWorld = 2;

std::vector<TensorSpec> Specs() {
  return {{"w", format::DType::kF32, {64, 32}}, {"m", format::DType::kF32, {64, 32},
                                                 format::TensorKind::kOptim}};
}

// Node r holds rank r, on its own local root.
std::string NodeDir(uint32_t node) { return node == 0 ? "/node-a/job" : "/node-b/job"; }

struct Nodes {
  Nodes() : model(&store_memory), faults(&model), fs(&local) {
    fs.AddRoute("s3://bucket", &faults, "/");
    REQUIRE_OK(model.MakeDirs("/ckpt"));
  }
  void Write(uint32_t node, int64_t step) {
    SyntheticRank rank(node, kWorld, Specs(), 0, kJob);
    rank.Fill(step);
    checkpoint::IoOptions io;
    io.storage = &fs;
    REQUIRE_OK(checkpoint::WriteRankShards(NodeDir(node), step, rank.shards(), rank.slot(), io)
                   .status());
  }
  bool HasLocal(uint32_t node, int64_t step) {
    return fs.Stat(checkpoint::WritingStepDir(fs, NodeDir(node), step)).ok();
  }
  std::unique_ptr<JobUploader> Uploader(uint32_t node, std::atomic<int64_t>* seen,
                                        absl::Duration retry_after = absl::Milliseconds(50)) {
    UploaderOptions o;
    o.job_id = kJob;
    o.job_dir = NodeDir(node);
    o.upload_dir = kStore;
    o.retention.keep_last = 10;
    o.retry_after = retry_after;
    o.storage = &fs;
    o.node_local = true;
    o.world_size = kWorld;
    o.on_store_latest = [seen](int64_t step) { seen->store(step); };
    return std::make_unique<JobUploader>(std::move(o));
  }
  int64_t StoreLatest() { return checkpoint::ReadLatest(kStore, &fs).value_or(-1); }

  storage::MemoryStorage local;
  storage::MemoryStorage store_memory;
  storage::testing::ObjectStoreModel model;
  storage::FaultInjectingStorage faults;
  storage::RoutedStorage fs;
};

// Rank `rank`'s manifest in the store's step `step`.
std::string StorePart(int64_t step, uint32_t rank) {
  return JoinPath(JoinPath(kStore, format::StepDirName(step)), format::ManifestFileName(rank));
}

bool Soon(const std::function<bool()>& condition) {
  return testing::Eventually(condition, absl::Seconds(20), absl::Milliseconds(5));
}

v1::JobStatus StatusOf(const JobUploader& u) {
  v1::JobStatus s;
  u.FillStatus(&s);
  return s;
}

TEST_CASE("each node sends its part; the last commits; the other follows the store") {
  Nodes n;
  std::atomic<int64_t> seen_a{-1}, seen_b{-1};
  auto a = n.Uploader(0, &seen_a);
  auto b = n.Uploader(1, &seen_b);
  n.Write(0, 10);
  n.Write(1, 10);
  a->OnNodeWritten(10, absl::Now());
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 10; }));
  CHECK(n.StoreLatest() == -1);  // one part of two
  CHECK_FALSE(n.HasLocal(0, 10));  // sent: kept as step-N.sent (kept_copies_test)
  b->OnNodeWritten(10, absl::Now());
  REQUIRE(Soon([&] { return n.StoreLatest() == 10; }));
  CHECK(Soon([&] { return seen_b.load() == 10; }));  // b committed it
  CHECK(seen_a.load() == -1);
  // a learns of it at a housekeeping round.
  a->FollowStore();
  CHECK(Soon([&] { return seen_a.load() == 10; }));
  CHECK_FALSE(a->Busy());
  CHECK(StatusOf(*a).upload_node_local());
}

TEST_CASE("a store slower than the checkpoints: the oldest waiting step is dropped on the node") {
  Nodes n;
  std::atomic<int64_t> seen{-1};
  storage::FaultPlan slow;
  slow.op_delay = absl::Milliseconds(30);
  n.faults.SetPlan(slow);
  auto a = n.Uploader(0, &seen);
  for (int64_t step : {10, 20, 30, 40}) n.Write(0, step);
  a->OnNodeWritten(10, absl::Now());
  // (Its first write to the store: the thread has taken it from the queue.)
  REQUIRE(Soon([&] { return n.faults.write_requests() > 0; }));
  // 10 is on its way; 20, 30 and 40 come: 20 is dropped, with its local copy.
  for (int64_t step : {20, 30, 40}) a->OnNodeWritten(step, absl::Now());
  CHECK(StatusOf(*a).upload_pending_step() == 40);
  CHECK(a->Busy());
  CHECK(StatusOf(*a).upload_lag_seconds() > 0);
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 40 && !a->Busy(); }));
  CHECK_FALSE(n.HasLocal(0, 20));
  for (int64_t step : {10, 30, 40}) {
    INFO("step " << step);
    CHECK(n.fs.Stat(StorePart(step, 0)).ok());
    CHECK_FALSE(n.HasLocal(0, step));
  }
  CHECK_FALSE(
      n.fs.Stat(StorePart(20, 0)).ok());
  CHECK(StatusOf(*a).upload_lag_seconds() == 0);
}

TEST_CASE("a failed send is shown and tried again; the step stays here until it is sent") {
  Nodes n;
  std::atomic<int64_t> seen{-1};
  storage::FaultPlan failing;
  failing.eio_on_write = 1;
  n.faults.SetPlan(failing);
  // (Tried again a second later: the test sees the failure's state first.)
  auto a = n.Uploader(0, &seen, absl::Seconds(1));
  n.Write(0, 10);
  a->OnNodeWritten(10, absl::Now());
  REQUIRE(Soon([&] { return !StatusOf(*a).upload_error().empty(); }));
  CHECK(n.HasLocal(0, 10));
  // The store heals; the next try sends it.
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 10; }));
  CHECK(StatusOf(*a).upload_error().empty());
  CHECK_FALSE(n.HasLocal(0, 10));
}

// A store that answers the first `conflicts` writes with a conflict (S3's
// 409 OperationAborted, or a 412: FailedPrecondition), as a busy bucket may.
class ConflictingStore : public storage::StorageWrapper {
 public:
  ConflictingStore(storage::Storage* base, int conflicts)
      : StorageWrapper(base), conflicts_(conflicts) {}
  absl::StatusOr<std::unique_ptr<storage::File>> OpenForWrite(
      const std::string& path, const storage::OpenOptions& options) override {
    if (conflicts_.fetch_sub(1) > 0) {
      return absl::FailedPreconditionError("409 OperationAborted: try again");
    }
    return StorageWrapper::OpenForWrite(path, options);
  }
  void Conflicts(int n) { conflicts_ = n; }

 private:
  std::atomic<int> conflicts_;
};

TEST_CASE("a store's conflict is tried again, not taken for the local step gone") {
  storage::MemoryStorage local, store_memory;
  storage::testing::ObjectStoreModel model(&store_memory);
  ConflictingStore conflicting(&model, 1);
  storage::RoutedStorage fs(&local);
  fs.AddRoute("s3://bucket", &conflicting, "/");
  REQUIRE_OK(model.MakeDirs("/ckpt"));
  for (const bool node_local : {true, false}) {
    INFO("node_local " << node_local);
    const std::string dir = node_local ? "/node-a/job" : "/tiered/job";
    const int64_t step = node_local ? 10 : 20;
    checkpoint::IoOptions io;
    io.storage = &fs;
    for (uint32_t r = 0; r < (node_local ? 1u : kWorld); ++r) {
      SyntheticRank rank(r, kWorld, Specs(), 0, kJob);
      rank.Fill(step);
      REQUIRE_OK(checkpoint::WriteRankShards(dir, step, rank.shards(), rank.slot(), io).status());
    }
    UploaderOptions o;
    o.job_id = kJob;
    o.job_dir = dir;
    o.upload_dir = node_local ? std::string(kStore) : std::string("s3://bucket/ckpt/tiered");
    o.retention.keep_last = 10;
    o.retry_after = absl::Milliseconds(50);
    o.storage = &fs;
    o.node_local = node_local;
    o.world_size = kWorld;
    JobUploader u(std::move(o));
    if (node_local) {
      u.OnNodeWritten(step, absl::Now());
      REQUIRE(Soon([&] { return StatusOf(u).last_uploaded_step() == step; }));
    } else {
      auto done = checkpoint::TryCommit(dir, kJob, step, kWorld, &fs);
      REQUIRE_OK(done);
      REQUIRE(done->outcome == checkpoint::CommitOutcome::kCommitted);
      u.OnCommitted(step, absl::Now());
      REQUIRE(Soon([&] { return StatusOf(u).last_uploaded_step() == step; }));
      CHECK(checkpoint::ReadLatest("s3://bucket/ckpt/tiered", &fs).value_or(-1) == step);
    }
    conflicting.Conflicts(1);
  }
}

TEST_CASE("a rank registered again forgets its parts of uncommitted steps and the old run's "
          "waiting steps") {
  Nodes n;
  std::atomic<int64_t> seen{-1};
  auto a = n.Uploader(0, &seen);
  n.Write(0, 10);
  a->OnNodeWritten(10, absl::Now());
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 10; }));
  const std::string part = StorePart(10, 0);
  REQUIRE(n.fs.Stat(part).ok());
  // The run dies before node b sent its part; a new run's rank 0 registers.
  CHECK(a->OnRankRegistered(0, ""));
  CHECK(Soon([&] { return !n.fs.Stat(part).ok(); }));
  CHECK_FALSE(a->Busy());
}

TEST_CASE("a rank registered again in the same run keeps its waiting steps and sent parts") {
  Nodes n;
  std::atomic<int64_t> seen{-1};
  auto a = n.Uploader(0, &seen);
  CHECK(a->OnRankRegistered(0, "run-1"));  // the run's first registration here
  n.Write(0, 10);
  a->OnNodeWritten(10, absl::Now());
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 10; }));
  const std::string part = StorePart(10, 0);
  REQUIRE(n.fs.Stat(part).ok());
  // Its registration replaced in place (a state blob grew): nothing changes.
  CHECK_FALSE(a->OnRankRegistered(0, "run-1"));
  n.Write(0, 20);
  a->OnNodeWritten(20, absl::Now());
  REQUIRE(Soon([&] { return StatusOf(*a).last_uploaded_step() == 20; }));
  CHECK(n.fs.Stat(part).ok());
  // Another run: its registration forgets the parts of other runs (these
  // were written without a run id).
  CHECK(a->OnRankRegistered(0, "run-2"));
  CHECK(Soon([&] { return !n.fs.Stat(part).ok(); }));
}

TEST_CASE("a step committed here whole (a relayout, a peer recovery) is uploaded whole and "
          "committed in the store") {
  Nodes n;
  std::atomic<int64_t> seen{-1};
  // Both ranks' shards on node a, committed there (as a relayout writes the
  // previous layout's memory).
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    SyntheticRank r(rank, kWorld, Specs(), 0, kJob);
    r.Fill(12);
    checkpoint::IoOptions io;
    io.storage = &n.fs;
    REQUIRE_OK(checkpoint::WriteRankShards(NodeDir(0), 12, r.shards(), r.slot(), io).status());
  }
  auto committed = checkpoint::TryCommit(NodeDir(0), kJob, 12, kWorld, &n.fs);
  REQUIRE_OK(committed);
  REQUIRE(committed->outcome == checkpoint::CommitOutcome::kCommitted);
  storage::FaultPlan failing;  // the store's first write fails
  failing.eio_on_write = 1;
  n.faults.SetPlan(failing);
  // (Tried again a second later: the test sees the failure's state first.)
  auto a = n.Uploader(0, &seen, absl::Seconds(1));
  a->OnCommitted(12, absl::Now());
  REQUIRE(Soon([&] { return !StatusOf(*a).upload_error().empty(); }));
  CHECK(a->Uploading(12));  // local retention keeps it meanwhile
  CHECK(a->Busy() == false);  // (failed: shown, not busy)
  REQUIRE(Soon([&] { return n.StoreLatest() == 12; }));
  // Whole: every rank's manifest, read back checked.
  CHECK(n.fs.Stat(StorePart(12, 0)).ok());
  CHECK(n.fs.Stat(StorePart(12, 1)).ok());
  checkpoint::IoOptions io;
  io.storage = &n.fs;
  io.direct_io = false;
  CHECK_OK(checkpoint::VerifyStep(JoinPath(kStore, format::StepDirName(12)), io));
  // The node learns the store's latest; its own copy stays (restores read it).
  CHECK(Soon([&] { return seen.load() == 12; }));
  CHECK(n.fs.Stat(JoinPath(NodeDir(0), format::StepDirName(12))).ok());
  CHECK(Soon([&] { return !a->Busy(); }));
}

TEST_CASE("tiered: a step of a run left behind that commits in the store after the job went "
          "back leaves the store's latest at the run that went on") {
  Nodes n;
  // A step of both ranks, committed on the local root.
  auto commit = [&n](int64_t step) {
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      SyntheticRank r(rank, kWorld, Specs(), 0, kJob);
      r.Fill(step);
      checkpoint::IoOptions io;
      io.storage = &n.fs;
      REQUIRE_OK(
          checkpoint::WriteRankShards(NodeDir(0), step, r.shards(), r.slot(), io).status());
    }
    auto committed = checkpoint::TryCommit(NodeDir(0), kJob, step, kWorld, &n.fs);
    REQUIRE_OK(committed);
    REQUIRE(committed->outcome == checkpoint::CommitOutcome::kCommitted);
  };
  commit(10);
  UploaderOptions o;
  o.job_id = kJob;
  o.job_dir = NodeDir(0);
  o.upload_dir = kStore;
  o.retention.keep_last = 10;
  o.retry_after = absl::Milliseconds(50);
  o.storage = &n.fs;
  o.world_size = kWorld;
  JobUploader uploader(std::move(o));
  uploader.OnCommitted(10, absl::Now());
  REQUIRE(Soon([&] { return n.StoreLatest() == 10; }));
  // (Committed here only now: the uploader's catch-up at its start would
  // otherwise send step 20 first, and step 10's commit there come late.)
  commit(20);
  // Step 20's upload is slow; the job goes back to step 10 while it runs.
  storage::FaultPlan slow;
  slow.path_filter = "step-00000020";
  slow.op_delay = absl::Milliseconds(100);
  n.faults.SetPlan(slow);
  uploader.OnCommitted(20, absl::Now() - absl::Seconds(5));
  REQUIRE(Soon([&] {
    auto names = n.fs.List(kStore);
    if (!names.ok()) return false;
    for (const std::string& name : *names) {
      if (name.find("step-00000020") != std::string::npos) return true;
    }
    return false;
  }));
  uploader.WentBack(10, absl::Now());
  // Step 20 reaches the store, and `latest` there names step 10 again.
  REQUIRE(Soon([&] { return StatusOf(uploader).last_uploaded_step() == 20; }));
  CHECK(Soon([&] { return n.StoreLatest() == 10; }));
  auto in_store = checkpoint::ListCommittedSteps(kStore, &n.fs);
  REQUIRE_OK(in_store);
  CHECK(*in_store == std::vector<int64_t>{10, 20});
  n.faults.SetPlan(storage::FaultPlan());
  // A step of the run that went on goes up, and `latest` there follows it.
  commit(15);
  uploader.OnCommitted(15, absl::Now());
  CHECK(Soon([&] { return n.StoreLatest() == 15; }));
  // Step 20 of the run left behind stays above it, out of the timeline,
  // until a commit of the run that went on passes it: then it goes, there as
  // on the local root, and never comes back to the timeline.
  CHECK(*checkpoint::ListCommittedSteps(kStore, &n.fs) == std::vector<int64_t>{10, 15, 20});
  commit(25);
  uploader.OnCommitted(25, absl::Now());
  CHECK(Soon([&] { return n.StoreLatest() == 25; }));
  CHECK(Soon([&] {
    auto steps = checkpoint::ListCommittedSteps(kStore, &n.fs);
    return steps.ok() && *steps == std::vector<int64_t>{10, 15, 25};
  }));
}

}  // namespace
}  // namespace zcc::daemon
