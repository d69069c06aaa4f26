// A node-local job's restore from the store reads this node's ranks' files
// from the copy of the step its node kept after sending it (a local disk and
// an object store modelled in memory, the store reached by URL as zccd
// reaches it): only a copy that is the store's step is read, a damaged one
// is dropped, and everything else comes from the store.
#include "daemon/restore/kept_copies.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "daemon/jobs/job_uploader.h"
#include "format/manifest.h"
#include "storage/fault_storage.h"
#include "storage/memory_storage.h"
#include "storage/routed_storage.h"
#include "storage/testing/object_store_model.h"
#include "storage/whole_file.h"

namespace zcc::daemon {
namespace {

using checkpoint::testing::SyntheticRank;
using checkpoint::testing::TensorSpec;

constexpr char kStore[] = "s3://bucket/ckpt/job";
constexpr uint32_t kWorld = 2;

std::string NodeDir(uint32_t node) { return node == 0 ? "/node-a/job" : "/node-b/job"; }
std::string StoreStep(int64_t step) { return JoinPath(kStore, format::StepDirName(step)); }
std::string Kept(uint32_t node, int64_t step) {
  return JoinPath(NodeDir(node), format::SentStepDirName(step));
}

// Two nodes of one rank each; every step they write is sent, and committed
// in the store by the last.
struct Cluster {
  Cluster() : model(&store_memory), counted(&model), fs(&local) {
    fs.AddRoute("s3://bucket", &counted, "/");
    REQUIRE_OK(model.MakeDirs("/ckpt"));
    for (uint32_t node = 0; node < kWorld; ++node) {
      UploaderOptions o;
      o.job_id = "job";
      o.job_dir = NodeDir(node);
      o.upload_dir = kStore;
      o.retention.keep_last = 10;
      o.storage = &fs;
      o.node_local = true;
      o.world_size = kWorld;
      uploaders.push_back(std::make_unique<JobUploader>(std::move(o)));
    }
  }
  void WriteAndSend(int64_t step) {
    for (uint32_t node = 0; node < kWorld; ++node) {
      SyntheticRank rank(node, kWorld, {{"w", format::DType::kF32, {64, 32}},
                                        {"m", format::DType::kF32, {64, 32},
                                         format::TensorKind::kOptim}},
                         0, "job");
      rank.Fill(step);
      checkpoint::IoOptions io;
      io.storage = &fs;
      REQUIRE_OK(
          checkpoint::WriteRankShards(NodeDir(node), step, rank.shards(), rank.slot(), io).status());
      uploaders[node]->OnNodeWritten(step, absl::Now());
    }
    REQUIRE(testing::Eventually(
        [&] { return checkpoint::ReadLatest(kStore, &fs).value_or(-1) == step; },
        absl::Seconds(20), absl::Milliseconds(5)));
    for (auto& u : uploaders) {
      REQUIRE(testing::Eventually([&] { return !u->Busy(); }, absl::Seconds(20),
                                  absl::Milliseconds(5)));
    }
  }
  // Every byte of the store's step read and checked, through `kept`.
  absl::Status Verify(KeptCopies& kept, int64_t step) {
    checkpoint::IoOptions io;
    io.storage = &kept;
    return checkpoint::VerifyStep(StoreStep(step), io).status();
  }
  std::string OpenedAt(KeptCopies& kept, const std::string& path) {
    auto file = kept.OpenForRead(path, storage::OpenOptions());
    REQUIRE_OK(file.status());
    return (*file)->path();
  }

  storage::MemoryStorage local;
  storage::MemoryStorage store_memory;
  storage::testing::ObjectStoreModel model;
  storage::FaultInjectingStorage counted;
  storage::RoutedStorage fs;
  std::vector<std::unique_ptr<JobUploader>> uploaders;
};

TEST_CASE("each node keeps its copy of the newest step it sent, and only that one") {
  Cluster c;
  c.WriteAndSend(10);
  for (uint32_t node = 0; node < kWorld; ++node) {
    CHECK(c.fs.Stat(Kept(node, 10)).ok());
    CHECK_FALSE(c.fs.Stat(JoinPath(NodeDir(node), format::PartialStepDirName(10))).ok());
  }
  c.WriteAndSend(20);
  for (uint32_t node = 0; node < kWorld; ++node) {
    CHECK(c.fs.Stat(Kept(node, 20)).ok());
    CHECK_FALSE(c.fs.Stat(Kept(node, 10)).ok());
  }
}

TEST_CASE("a restore reads this node's ranks' files from its kept copy, the rest from the store") {
  Cluster c;
  c.WriteAndSend(10);
  KeptCopies kept(&c.fs);
  const std::string mine = format::ShardFileName("model", 0);
  const std::string theirs = format::ShardFileName("model", 1);
  // Not watched: the store's.
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(StoreStep(10), mine));
  kept.Watch(kStore, NodeDir(0));
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(Kept(0, 10), mine));
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), theirs)) == JoinPath(StoreStep(10), theirs));
  CHECK(kept.Served(StoreStep(10)));
  // Every byte checked, the same as the store's.
  const uint64_t store_reads = c.counted.read_requests();
  REQUIRE_OK(c.Verify(kept, 10));
  const uint64_t with_kept = c.counted.read_requests() - store_reads;
  KeptCopies store_only(&c.fs);
  REQUIRE_OK(c.Verify(store_only, 10));
  const uint64_t without = c.counted.read_requests() - store_reads - with_kept;
  CHECK(with_kept < without);
}

TEST_CASE("a restore that reads for longer than what was found is remembered is still told it "
          "read from a kept copy") {
  Cluster c;
  c.WriteAndSend(10);
  KeptCopies kept(&c.fs, absl::ZeroDuration());  // looked up again at every open
  kept.Watch(kStore, NodeDir(0));
  const std::string mine = format::ShardFileName("model", 0);
  const std::string theirs = format::ShardFileName("model", 1);
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(Kept(0, 10), mine));
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), theirs)) == JoinPath(StoreStep(10), theirs));
  // (Its damage found at the end: read again from the store, not called
  // damaged.)
  CHECK(kept.Served(StoreStep(10)));
  CHECK_FALSE(kept.Served(StoreStep(20)));
}

TEST_CASE("a kept copy that is not the store's step is not read") {
  Cluster c;
  c.WriteAndSend(10);
  const std::string mine = format::ShardFileName("model", 0);
  SECTION("another run's manifest") {
    const std::string manifest = JoinPath(Kept(0, 10), format::ManifestFileName(0));
    auto text = storage::ReadWholeFile(c.fs, manifest, format::kMaxManifestBytes);
    REQUIRE_OK(text.status());
    REQUIRE_OK(storage::WriteFileAtomic(c.fs, manifest, *text + " "));
  }
  SECTION("a file of another size") {
    const std::string shard = JoinPath(Kept(0, 10), mine);
    auto bytes = storage::ReadWholeFile(c.fs, shard, uint64_t{1} << 30);
    REQUIRE_OK(bytes.status());
    REQUIRE_OK(storage::WriteFileAtomic(c.fs, shard, bytes->substr(1)));
  }
  KeptCopies kept(&c.fs);
  kept.Watch(kStore, NodeDir(0));
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(StoreStep(10), mine));
  REQUIRE_OK(c.Verify(kept, 10));
  CHECK_FALSE(kept.Served(StoreStep(10)));
}

TEST_CASE("a damaged kept copy fails its checks; once forgotten the store's step reads intact") {
  Cluster c;
  c.WriteAndSend(10);
  const std::string shard = JoinPath(Kept(0, 10), format::ShardFileName("model", 0));
  auto bytes = storage::ReadWholeFile(c.fs, shard, uint64_t{1} << 30);
  REQUIRE_OK(bytes.status());
  std::string damaged = *bytes;
  damaged[damaged.size() - 5] ^= 0x40;  // a tensor byte, the same size
  REQUIRE_OK(storage::WriteFileAtomic(c.fs, shard, damaged));
  KeptCopies kept(&c.fs);
  kept.Watch(kStore, NodeDir(0));
  const absl::Status first = c.Verify(kept, 10);
  CHECK(first.code() == absl::StatusCode::kDataLoss);
  CHECK(kept.Served(StoreStep(10)));
  kept.Forget(StoreStep(10));
  CHECK_FALSE(c.fs.Stat(Kept(0, 10)).ok());  // removed
  const std::string mine = format::ShardFileName("model", 0);
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(StoreStep(10), mine));
  REQUIRE_OK(c.Verify(kept, 10));
  // (Still "served": a restore that read the copy before it was dropped
  // reads the step again from the store rather than call it damaged.)
  CHECK(kept.Served(StoreStep(10)));

  // A later run writes step 10 again: the copy kept anew is read.
  c.WriteAndSend(10);
  REQUIRE(c.fs.Stat(Kept(0, 10)).ok());
  CHECK(c.OpenedAt(kept, JoinPath(StoreStep(10), mine)) == JoinPath(Kept(0, 10), mine));
  REQUIRE_OK(c.Verify(kept, 10));
}

}  // namespace
}  // namespace zcc::daemon
