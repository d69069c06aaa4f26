// JobTable::Admit's choices about a job whose ranks have all left, with a
// local root and an object store modelled in memory (reached by URL as zccd
// reaches it): a job whose upload fails is kept (its step would otherwise
// stay on the local disk, unsent), and a registration of the job in another
// layout replaces it all the same (the new job's uploader sends what the
// store lacks).
#include "daemon/jobs/job_table.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "daemon/jobs/job.h"
#include "daemon/peer/replica_store.h"
#include "storage/fault_storage.h"
#include "storage/memory_storage.h"
#include "storage/routed_storage.h"
#include "storage/testing/object_store_model.h"

namespace zcc::daemon {
namespace {

using checkpoint::testing::SyntheticRank;
using checkpoint::testing::TensorSpec;

constexpr char kJob[] = "job";
constexpr char kLocal[] = "/root/job";
constexpr char kStore[] = "s3://bucket/ckpt/job";

struct Tiers {
  Tiers() : model(&store_memory), faults(&model), fs(&local) {
    fs.AddRoute("s3://bucket", &faults, "/");
    REQUIRE_OK(model.MakeDirs("/ckpt"));
  }
  // Step `step` of a one-rank job, committed on the local root.
  void CommitLocally(int64_t step) {
    WriteLocally(step);
    auto commit = checkpoint::TryCommit(kLocal, kJob, step, 1, &fs);
    REQUIRE_OK(commit);
    REQUIRE(commit->outcome == checkpoint::CommitOutcome::kCommitted);
  }
  // Step `step` of rank 0 written on the local root, not committed (as a
  // node-local root holds its node's part until the store commits it).
  void WriteLocally(int64_t step) {
    SyntheticRank rank(0, 1, {{"w", format::DType::kF32, {64, 32}}}, 0, kJob);
    rank.Fill(step);
    checkpoint::IoOptions io;
    io.storage = &fs;
    REQUIRE_OK(checkpoint::WriteRankShards(kLocal, step, rank.shards(), rank.slot(), io).status());
  }
  // A registration of rank 0 of `world` ranks, uploading to the store (from
  // a node-local root with `node_local`).
  AdmitRequest Request(uint32_t world, bool node_local = false) {
    AdmitRequest r;
    r.job_id = kJob;
    r.rank = 0;
    r.world_size = world;
    r.job_dir = kLocal;
    r.upload_dir = kStore;
    r.node_local_root = node_local;
    r.uid = ::getuid();
    r.make_job = [this, world, node_local] {
      JobOptions o;
      o.job_id = kJob;
      o.world_size = world;
      o.job_dir = kLocal;
      o.owner = {::getuid(), ::getgid()};
      o.storage = &fs;
      o.upload_dir = kStore;
      o.node_local_root = node_local;
      o.upload_retention.keep_last = 10;
      o.upload_retry_after = absl::Milliseconds(100);
      return std::make_shared<Job>(std::move(o));
    };
    r.segment_bytes = 1 << 20;
    r.num_slots = 2;
    r.slot_bytes = 256 << 10;
    r.reserve_now_bytes = r.segment_bytes;
    r.alive = [](const RankSession&) { return false; };
    return r;
  }

  storage::MemoryStorage local;
  storage::MemoryStorage store_memory;
  storage::testing::ObjectStoreModel model;
  storage::FaultInjectingStorage faults;
  storage::RoutedStorage fs;
};

std::string UploadError(const Job& job) {
  v1::JobStatus status;
  job.FillStatus(&status);
  return status.upload_error();
}

TEST_CASE("a job whose upload fails is kept and tried again; another layout replaces it") {
  Tiers t;
  t.CommitLocally(5);
  storage::FaultPlan full;  // every write to the store fails
  full.enospc_after_bytes = 0;
  t.faults.SetPlan(full);
  JobTable table(absl::Now());
  std::shared_ptr<Job> job;
  {
    auto admitted = table.Admit(t.Request(1));
    REQUIRE_OK(admitted);
    job = admitted->job();
  }  // the registration goes: the job has no rank
  // The uploader finds step 5 missing from the store and fails to send it.
  REQUIRE(testing::Eventually([&] { return !UploadError(*job).empty(); }, absl::Seconds(20),
                              absl::Milliseconds(5)));
  // Not idle: housekeeping keeps it (dropped, step 5 would never be sent).
  CHECK_FALSE(job->idle());
  CHECK(table.DropIdle().empty());
  CHECK(table.Find(kJob) == job);
  // The job registered again on two ranks replaces it: its upload waiting
  // does not refuse another layout.
  t.faults.SetPlan(storage::FaultPlan());
  auto again = table.Admit(t.Request(2));
  REQUIRE_OK(again);
  CHECK(again->job() != job);
  CHECK(again->job()->options().world_size == 2);
  // And the new job's uploader sends what the store lacks: step 5.
  CHECK(testing::Eventually(
      [&] { return checkpoint::ReadLatest(kStore, &t.fs).value_or(-1) == 5; }, absl::Seconds(20),
      absl::Milliseconds(5)));
}

TEST_CASE("node-local roots: another layout waits (Unavailable, saying why) until this node's "
          "part of a step is sent, then replaces the job") {
  Tiers t;
  storage::FaultPlan full;  // every write to the store fails
  full.enospc_after_bytes = 0;
  t.faults.SetPlan(full);
  JobTable table(absl::Now());
  std::shared_ptr<Job> job;
  {
    auto admitted = table.Admit(t.Request(1, /*node_local=*/true));
    REQUIRE_OK(admitted);
    job = admitted->job();
  }  // the registration goes: the job has no rank
  // Rank 0 wrote its part of step 5 (the last of this node's ranks): the
  // uploader tries to send it and fails.
  t.WriteLocally(5);
  PersistEvent written;
  written.rank = 0;
  written.step = 5;
  job->OnPersisted(written);
  REQUIRE(testing::Eventually([&] { return !UploadError(*job).empty(); }, absl::Seconds(20),
                              absl::Milliseconds(5)));
  CHECK(job->sending_to_store());
  // Another layout is told to wait: this node's part is the only copy of it
  // the store can get, and the new job could not send it.
  auto waiting = table.Admit(t.Request(2, true));
  REQUIRE(absl::IsUnavailable(waiting.status()));
  CHECK_THAT(std::string(waiting.status().message()),
             Catch::Contains("still has steps to send from this node to " + std::string(kStore)));
  CHECK(table.Find(kJob) == job);
  // The store heals: the part is sent and commits step 5 there; then the new
  // layout replaces the job.
  t.faults.SetPlan(storage::FaultPlan());
  REQUIRE(testing::Eventually(
      [&] { return checkpoint::ReadLatest(kStore, &t.fs).value_or(-1) == 5; }, absl::Seconds(20),
      absl::Milliseconds(5)));
  REQUIRE(testing::Eventually([&] { return !job->sending_to_store(); }, absl::Seconds(20),
                              absl::Milliseconds(5)));
  auto again = table.Admit(t.Request(2, true));
  REQUIRE_OK(again);
  CHECK(again->job() != job);
  CHECK(again->job()->options().world_size == 2);
}

TEST_CASE("the staging budget counts the peer tier's replicas: they give way to a registration "
          "that needs the room, and stay when it could not be admitted anyway") {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  Tiers t;
  // Replicas of three steps of another node's rank, 1 MiB each (no step
  // whole here, so nothing but a registration can push them out).
  peer::ReplicaStore replicas(16 * kMiB);
  for (int64_t step = 1; step <= 3; ++step) {
    peer::Replica r;
    r.info.key = peer::ReplicaKey{"other", 1000, 0, step, "w"};
    r.bytes.assign(kMiB, 'x');
    REQUIRE_OK(replicas.Put(std::move(r)));
  }
  auto request = [&](uint64_t budget) {
    AdmitRequest r = t.Request(1);
    r.staging_budget_bytes = budget;  // the registration needs 1 MiB
    r.replica_bytes = [&replicas] { return replicas.bytes_held(); };
    r.shrink_replicas = [&replicas](uint64_t target, uint32_t owner_uid,
                                    std::vector<std::shared_ptr<const void>>* freed) {
      CHECK(owner_uid == ::getuid());  // the job's owner (make_job's), not the caller
      return replicas.ShrinkTo(target, kJob, owner_uid, freed);
    };
    return r;
  };
  SECTION("admitted: the oldest step's replica goes, no more") {
    JobTable table(absl::Now());
    auto admitted = table.Admit(request(3 * kMiB + kMiB / 2));
    REQUIRE_OK(admitted.status());
    CHECK(replicas.bytes_held() == 2 * kMiB);
    CHECK(replicas.Get(peer::ReplicaKey{"other", 1000, 0, 1, "w"}).status().code() ==
          absl::StatusCode::kNotFound);
    REQUIRE_OK(replicas.Get(peer::ReplicaKey{"other", 1000, 0, 3, "w"}).status());
  }
  SECTION("refused: the budget cannot hold the registration even without them; they stay") {
    JobTable table(absl::Now());
    auto refused = table.Admit(request(kMiB / 2));
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(replicas.bytes_held() == 3 * kMiB);
  }
}

TEST_CASE("the staging budget counts a registration's EMA beside its segment") {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  Tiers t;
  auto request = [&](uint64_t ema_bytes) {
    AdmitRequest r = t.Request(1);
    r.staging_budget_bytes = kMiB + kMiB / 2;  // the segment is 1 MiB
    r.ema_bytes = ema_bytes;
    return r;
  };
  SECTION("an EMA the budget cannot hold beside the segment: refused") {
    JobTable table(absl::Now());
    auto refused = table.Admit(request(kMiB));
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(table.StagingBytes() == 0);
  }
  SECTION("one it can hold: admitted, and counted while the registration is in flight") {
    JobTable table(absl::Now());
    auto admitted = table.Admit(request(kMiB / 4));
    REQUIRE_OK(admitted.status());
    CHECK(table.StagingBytes() == kMiB + kMiB / 4);
  }
}

}  // namespace
}  // namespace zcc::daemon
