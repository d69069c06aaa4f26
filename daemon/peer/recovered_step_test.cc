#include "daemon/peer/recovered_step.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/testing/status_matchers.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/recovered_steps.h"
#include "daemon/peer/testing/peer_fixtures.h"
#include "storage/memory_storage.h"
#include "storage/whole_file.h"

namespace zcc::daemon::peer {
namespace {

using testing::Hold;
using testing::PeerServer;
using testing::StepFiles;

constexpr char kJobDir[] = "/ckpt/job";
constexpr char kStepDir[] = "/ckpt/job/step-00000004";

// Rank 0's steps 2 and 4 in this zccd's replica memory, rank 1's on two
// peers: the one tried first holds step 4's shard files damaged.
struct Tier {
  PeerConfig insecure = [] {
    PeerConfig c;
    c.insecure = true;
    return c;
  }();
  PeerServer x{insecure}, y{insecure};
  PeerServer& bad = x.target() < y.target() ? x : y;
  PeerServer& good = &bad == &x ? y : x;
  const checkpoint::RankStepBytes r0 = StepFiles(0, 4), r1 = StepFiles(1, 4);
  ReplicaStore own{64 << 20};
  std::unique_ptr<PeerDirectory> directory;
  RecoverySources sources;

  Tier() {
    Hold(own, r0, false);
    Hold(own, StepFiles(0, 2), false);
    Hold(bad.store, r1, true);
    Hold(good.store, r1, false);
    Hold(good.store, StepFiles(1, 2), false);
    auto creds = LoadPeerCredentials(insecure);
    REQUIRE_OK(creds.status());
    directory = std::make_unique<PeerDirectory>(PeerDirectory::Options(), creds->channel);
    sources.own = &own;
    sources.directory = directory.get();
    sources.timeout = absl::Seconds(20);
  }
};

TEST_CASE("a step of the peer tier read in place: committed under the job directory, each "
          "range from a holder whose copy checks out") {
  Tier tier;
  tier.sources.peers = {tier.bad.target(), tier.good.target()};
  storage::MemoryStorage disk;
  RecoveredSteps shown(&disk);
  std::shared_ptr<RecoveredStep> step = RecoverInPlace("job", 1000, kJobDir, -1, tier.sources);
  REQUIRE(step != nullptr);
  CHECK(step->step() == 4);
  CHECK(step->dir() == kStepDir);
  uint64_t shard_bytes = 0;
  for (const auto* files : {&tier.r0, &tier.r1}) {
    for (const auto& f : files->files) {
      if (f.name.find("manifest") == std::string::npos) shard_bytes += f.bytes.size();
    }
  }
  CHECK(step->remote_bytes() == shard_bytes);

  // Not there until shown.
  CHECK(absl::IsNotFound(checkpoint::ListCommittedSteps(kJobDir, &shown).status()));
  shown.Add(step);
  CHECK(shown.Find(kJobDir) == step);
  auto committed = checkpoint::ListCommittedSteps(kJobDir, &shown);
  REQUIRE_OK(committed.status());
  CHECK(*committed == std::vector<int64_t>{4});
  auto latest = checkpoint::ReadLatest(kJobDir, &shown);
  REQUIRE_OK(latest.status());
  CHECK(*latest == 4);

  // Every file as written, rank 1's shards from the good holder; every
  // tensor checks out against its manifest (what a restore reads).
  for (const auto* files : {&tier.r0, &tier.r1}) {
    for (const auto& f : files->files) {
      auto bytes = storage::ReadWholeFile(shown, std::string(kStepDir) + "/" + f.name, 1 << 30);
      REQUIRE_OK(bytes.status());
      CHECK(*bytes == f.bytes);
    }
  }
  checkpoint::IoOptions io;
  io.storage = &shown;
  auto verified = checkpoint::VerifyStep(kStepDir, io);
  REQUIRE_OK(verified.status());
  // Nothing of it was written to the disk.
  CHECK(absl::IsNotFound(disk.Stat(kJobDir).status()));
  // Read only.
  CHECK(absl::IsPermissionDenied(step->Remove(std::string(kStepDir) + "/" + tier.r1.files[0].name)));

  SECTION("the disk's `latest` once the job has committed a newer step there") {
    REQUIRE_OK(disk.MakeDirs(kJobDir));
    REQUIRE_OK(storage::WriteFileAtomic(disk, std::string(kJobDir) + "/latest", "step-00000006\n"));
    auto now = checkpoint::ReadLatest(kJobDir, &shown);
    REQUIRE_OK(now.status());
    CHECK(*now == 6);
  }
  SECTION("written into the job directory, committed there; not when no longer wanted") {
    MaterializeOptions refused;
    refused.in_turn = [](const std::function<absl::Status()>&) {
      return absl::AbortedError("a newer step is committed");
    };
    const absl::Status unwanted =
        MaterializeStep("job", 1000, kJobDir, step->plan(), disk, tier.sources, refused);
    CHECK(absl::IsAborted(unwanted));
    auto none = checkpoint::ListCommittedSteps(kJobDir, &disk);
    CHECK((!none.ok() || none->empty()));
    CHECK_FALSE(disk.Stat(std::string(kJobDir) + "/step-00000004.partial").ok());

    REQUIRE_OK(MaterializeStep("job", 1000, kJobDir, step->plan(), disk, tier.sources));
    auto on_disk = checkpoint::ListCommittedSteps(kJobDir, &disk);
    REQUIRE_OK(on_disk.status());
    CHECK(*on_disk == std::vector<int64_t>{4});
    checkpoint::IoOptions from_disk;
    from_disk.storage = &disk;
    REQUIRE_OK(checkpoint::VerifyStep(kStepDir, from_disk).status());
    shown.Remove(step.get());
    CHECK(shown.Find(kJobDir) == nullptr);
  }
}

TEST_CASE("a step of the peer tier whose only holder's copy is damaged: shown, and its read "
          "fails naming the file (the restore falls back to an older step)") {
  Tier tier;
  tier.sources.peers = {tier.bad.target()};
  storage::MemoryStorage disk;
  RecoveredSteps shown(&disk);
  std::shared_ptr<RecoveredStep> step = RecoverInPlace("job", 1000, kJobDir, -1, tier.sources);
  REQUIRE(step != nullptr);  // the manifests are intact: the damage is in the shards
  shown.Add(step);
  checkpoint::IoOptions io;
  io.storage = &shown;
  const auto verified = checkpoint::VerifyStep(kStepDir, io);
  CHECK(verified.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(verified.status().message()), Catch::Contains("peer tier"));
  CHECK_THAT(std::string(verified.status().message()), Catch::Contains("checksum"));
}

TEST_CASE("a holder of another run's step of the same number: its files are not read") {
  Tier tier;
  PeerServer other(tier.insecure);
  Hold(other.store, StepFiles(1, 4, /*fill=*/104), false);  // intact, another run's
  tier.sources.peers = {tier.good.target(), other.target()};
  std::shared_ptr<RecoveredStep> step = RecoverInPlace("job", 1000, kJobDir, -1, tier.sources);
  REQUIRE(step != nullptr);
  const RankHolders& rank1 = step->plan().ranks.at(1);
  REQUIRE(rank1.size() == 1);  // the first holder asked, whichever it is; not both
  const std::string first = rank1.front().first;
  CHECK((first == tier.good.target() || first == other.target()));
  // What is read is that holder's step, whole and consistent.
  storage::MemoryStorage disk;
  RecoveredSteps shown(&disk);
  shown.Add(step);
  checkpoint::IoOptions io;
  io.storage = &shown;
  REQUIRE_OK(checkpoint::VerifyStep(kStepDir, io).status());
}

TEST_CASE("a step of the peer tier whose holder went away: its read fails with DataLoss, so "
          "the restore falls back to an older step") {
  Tier tier;
  tier.sources.peers = {tier.good.target()};
  tier.sources.timeout = absl::Seconds(5);
  storage::MemoryStorage disk;
  RecoveredSteps shown(&disk);
  std::shared_ptr<RecoveredStep> step = RecoverInPlace("job", 1000, kJobDir, -1, tier.sources);
  REQUIRE(step != nullptr);
  shown.Add(step);
  tier.good.server->Shutdown();
  checkpoint::IoOptions io;
  io.storage = &shown;
  const auto verified = checkpoint::VerifyStep(kStepDir, io);
  CHECK(verified.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(verified.status().message()), Catch::Contains("no holder served"));
}

TEST_CASE("the peer tier's newest step is read in place only when newer than the disk's, and "
          "whole") {
  Tier tier;
  SECTION("nothing newer than the job directory's step 4") {
    tier.sources.peers = {tier.good.target()};
    CHECK(RecoverInPlace("job", 1000, kJobDir, 4, tier.sources) == nullptr);
  }
  SECTION("rank 1 held nowhere: no whole step") {
    tier.sources.peers = {};
    CHECK(RecoverInPlace("job", 1000, kJobDir, -1, tier.sources) == nullptr);
  }
  SECTION("another uid's replicas are not this job's") {
    tier.sources.peers = {tier.good.target()};
    CHECK(RecoverInPlace("job", 1001, kJobDir, -1, tier.sources) == nullptr);
  }
}

}  // namespace
}  // namespace zcc::daemon::peer
