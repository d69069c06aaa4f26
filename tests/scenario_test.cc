// The DP=4 x EP=2 scenario (TP 2, so 8 ranks) on two daemons sharing one
// checkpoint root, with EMA: every tensor is written once, by the member of
// its replica group the shard assigner picked; loading all shards gives back
// the full model, optimizer and EMA state exactly; and every rank restores
// all of its tensors, replicas included.
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "tests/process_harness.h"
#include "tests/test_model.h"

namespace zcc::testing {
namespace {

constexpr int kWorld = 8;
constexpr int kSteps = 6;
constexpr float kDecay = 0.9f;

TEST_CASE("DP=4 x EP=2 over two daemons: each tensor written once, full state restored") {
  const std::string dir = ShortTempDir("it-moe");
  const std::string shared = dir + "/shared-root";
  REQUIRE(MakeDirs(shared).ok());
  Daemon a(dir, {{}, shared, "node-a"});
  Daemon b(dir, {{}, shared, "node-b"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  const std::vector<std::string> common = {"--topology=moe", "--world=8", "--tensors=5", "--kib=64",
                                           "--ema_decay=0.9", "--save_every=6", "--block"};
  std::vector<std::unique_ptr<Subprocess>> trainers;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> flags = common;
    flags.push_back(absl::StrCat("--rank=", rank));
    flags.push_back(absl::StrCat("--steps=", kSteps));
    trainers.push_back(StartTrainer(rank < 4 ? a : b, dir, absl::StrCat("train", rank), flags));
  }
  for (auto& t : trainers) REQUIRE(t->Wait(absl::Seconds(120)) == 0);
  INFO(a.Log() << b.Log());
  const std::string step_dir = shared + "/itest/step-00000006";
  REQUIRE_OK(checkpoint::VerifyStep(step_dir));

  // Every distinct tensor of the job, and which ones keep an EMA.
  std::map<std::string, ModelTensor> all;
  uint64_t registered_bytes = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (const ModelTensor& t : BuildModel("moe", rank, kWorld, 5, 64)) {
      registered_bytes += t.nbytes;
      all.emplace(t.name, t);
    }
  }
  // Each (kind, name) is in exactly one rank's manifest.
  std::map<std::string, uint32_t> writer;
  std::map<std::string, uint32_t> ema_writer;
  uint64_t written_bytes = 0;
  for (uint32_t r = 0; r < kWorld; ++r) {
    auto text = ReadFileToString(step_dir + "/" + format::ManifestFileName(r), 1 << 24);
    REQUIRE_OK(text);
    auto m = format::DecodeRankManifest(*text);
    REQUIRE_OK(m);
    for (const format::ManifestTensor& t : m->tensors) {
      auto& map = t.kind == "ema" ? ema_writer : writer;
      INFO(t.kind << " " << t.name);
      CHECK(map.emplace(t.name, r).second);  // written once
      if (t.kind != "ema") written_bytes += t.nbytes;
    }
  }
  CHECK(writer.size() == all.size());
  size_t ema_tensors = 0;
  for (const auto& [name, t] : all) {
    INFO(name);
    CHECK(writer.count(name) == 1);
    if (t.ema_eligible) {
      ++ema_tensors;
      CHECK(ema_writer.count(name) == 1);
    }
  }
  CHECK(ema_writer.size() == ema_tensors);
  // Replication divides what is written: far less than every rank's registration.
  CHECK(written_bytes * 2 < registered_bytes);

  // Loading all shards gives back the exact state at step 6, EMA included.
  for (const auto& [name, t] : all) {
    INFO(name);
    std::vector<uint8_t> got(t.nbytes), want(t.nbytes);
    const char* kind = t.kind == TensorKind::kParam ? "param" : t.kind == TensorKind::kOptim ? "optim" : "extra";
    REQUIRE_OK(checkpoint::ReadRankTensors(step_dir, writer[name],
                                           {{name, kind, t.dtype, t.shape, got.data(), t.nbytes}}));
    FillTensor(t, kSteps, want.data());
    CHECK(got == want);
    if (!t.ema_eligible) continue;
    std::vector<float> ema(t.nbytes / 4);
    REQUIRE_OK(checkpoint::ReadRankTensors(
        step_dir, ema_writer[name],
        {{name, "ema", format::DType::kF32, t.shape, reinterpret_cast<uint8_t*>(ema.data()), t.nbytes}}));
    const std::vector<float> reference = ReferenceEma(t, kSteps, kDecay);
    CHECK(std::memcmp(ema.data(), reference.data(), t.nbytes) == 0);
  }
  auto ema_index = ReadFileToString(step_dir + "/ema.safetensors.index.json", 1 << 24);
  REQUIRE_OK(ema_index);
  CHECK(format::DecodeWeightMapIndex(*ema_index)->size() == ema_tensors);

  // Every rank restores all of its tensors, the ones other replicas wrote too.
  std::vector<std::unique_ptr<Subprocess>> restorers;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> flags = common;
    flags.push_back(absl::StrCat("--rank=", rank));
    flags.push_back("--mode=restore");
    flags.push_back("--expect_step=6");
    restorers.push_back(StartTrainer(rank < 4 ? a : b, dir, absl::StrCat("restore", rank), flags));
  }
  for (auto& r : restorers) {
    CHECK(r->Wait(absl::Seconds(120)) == 0);
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }
  REQUIRE(a.Stop() == 0);
  REQUIRE(b.Stop() == 0);
}

// Layout-free checkpoints: a sliced model saved by 8 ranks as DP2 x TP2 x EP2
// over two daemons (tensor-parallel row and column splits, experts by global
// id over EP, ZeRO-sharded optimizer state with uneven and empty pieces, an
// EMA) restores, EMA included, into TP4, into one rank, and into 8 ranks as
// TP2 x EP4; every element of every piece is compared.
TEST_CASE("a checkpoint saved as DP2 x TP2 x EP2 restores into TP4, one rank and TP2 x EP4") {
  const std::string dir = ShortTempDir("it-reshard");
  const std::string shared = dir + "/shared-root";
  REQUIRE(MakeDirs(shared).ok());
  Daemon a(dir, {{}, shared, "node-a"});
  Daemon b(dir, {{}, shared, "node-b"});
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  auto run = [&](const std::string& layout, const std::string& mode, const std::string& tag) {
    const int world = LayoutWorld(layout);
    std::vector<std::unique_ptr<Subprocess>> trainers;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<std::string> flags = {"--topology=" + layout, absl::StrCat("--world=", world),
                                        absl::StrCat("--rank=", rank), "--ema_decay=0.9",
                                        "--block", "--save_every=6"};
      if (mode == "train") {
        flags.push_back("--steps=6");
      } else {
        flags.push_back("--check_ema");
        flags.push_back("--mode=restore");
        flags.push_back("--expect_step=6");
      }
      trainers.push_back(StartTrainer(rank < 4 ? a : b, dir, absl::StrCat(tag, rank), flags));
    }
    int ema_checked = 0;
    for (auto& t : trainers) {
      INFO(t->Output() << a.Log() << b.Log());
      REQUIRE(t->Wait(absl::Seconds(120)) == 0);
      if (mode != "train") {
        CHECK(t->Values()["mismatched_tensors"] == "0");
        CHECK(t->Values()["ema_mismatches"] == "0");
        ema_checked += std::stoi(t->Values()["ema_checked"]);
      }
    }
    return ema_checked;
  };
  run("dp2.tp2.ep2", "train", "train");
  const std::string step_dir = shared + "/itest/step-00000006";
  REQUIRE_OK(checkpoint::VerifyStep(step_dir));
  // Sliced tensors are not in the Hugging Face weight map (a piece is not the
  // tensor); the step's global index lists every piece.
  auto weight_map = ReadFileToString(step_dir + "/model.safetensors.index.json", 1 << 24);
  REQUIRE_OK(weight_map);
  CHECK(format::DecodeWeightMapIndex(*weight_map)->empty());
  auto index_text = ReadFileToString(step_dir + "/zcc.index.json", 1 << 24);
  REQUIRE_OK(index_text);
  auto index = format::DecodeStepIndex(*index_text);
  REQUIRE_OK(index);
  CHECK(index->world_size == 8);

  // Each layout restores every piece of the model, the optimizer state and
  // the EMA of the pieces each rank keeps (one keeper per EMA piece).
  CHECK(run("dp1.tp4.ep1", "restore", "tp4-") > 0);
  CHECK(run("dp1.tp1.ep1", "restore", "one-") == 5);
  CHECK(run("dp1.tp2.ep4", "restore", "tp2ep4-") > 0);
  REQUIRE(a.Stop() == 0);
  REQUIRE(b.Stop() == 0);
}

TEST_CASE("the EMA resumes from a checkpoint: after a restart it equals the uninterrupted EMA") {
  const std::string dir = ShortTempDir("it-ema-resume");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::vector<std::string> common = {"--tensors=3", "--kib=64", "--ema_decay=0.9",
                                           "--save_every=6", "--block"};
  auto first = common;
  first.push_back("--steps=6");
  auto t = StartTrainer(daemon, dir, "first", first);
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  // A new trainer (and a fresh registration): restore step 6, then train 7..12.
  auto second = common;
  second.push_back("--mode=resume");
  second.push_back("--steps=6");
  second.push_back("--check_ema");
  auto u = StartTrainer(daemon, dir, "second", second);
  REQUIRE(u->Wait(absl::Seconds(60)) == 0);
  INFO(u->Output() << daemon.Log());
  CHECK(u->Values()["restored_step"] == "6");
  // The live EMA, read back from the daemon, matches too.
  CHECK(u->Values()["ema_step"] == "12");
  CHECK(u->Values()["ema_mismatches"] == "0");
  const std::string step_dir = JobDir(daemon) + "/step-00000012";
  REQUIRE_OK(checkpoint::VerifyStep(step_dir));
  for (const ModelTensor& t : BuildModel("plain", 0, 1, 3, 64)) {
    if (!t.ema_eligible) continue;
    INFO(t.name);
    std::vector<float> ema(t.nbytes / 4);
    REQUIRE_OK(checkpoint::ReadRankTensors(
        step_dir, 0,
        {{t.name, "ema", format::DType::kF32, t.shape, reinterpret_cast<uint8_t*>(ema.data()), t.nbytes}}));
    const std::vector<float> reference = ReferenceEma(t, 12, kDecay);
    CHECK(std::memcmp(ema.data(), reference.data(), t.nbytes) == 0);
  }
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a step found damaged takes its EMA with it: the restore that falls back never "
          "installs the newer step's EMA, though it was read intact beside the rest") {
  const std::string dir = ShortTempDir("it-ema-fallback");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::vector<std::string> common = {"--tensors=3", "--kib=64", "--save_every=6",
                                           "--block"};
  // Step 6 without an EMA; then a trainer that keeps one resumes from it
  // and commits step 12 with the EMA of steps 7 to 12.
  auto first = common;
  for (const char* f : {"--steps=6", "--ema_decay=0"}) first.push_back(f);
  REQUIRE(StartTrainer(daemon, dir, "first", first)->Wait(absl::Seconds(60)) == 0);
  auto second = common;
  for (const char* f : {"--mode=resume", "--steps=6", "--ema_decay=0.9"}) second.push_back(f);
  auto t = StartTrainer(daemon, dir, "second", second);
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  REQUIRE(t->Values()["restored_step"] == "6");
  // Nothing in zccd's memory after the restart: the restore reads the disk.
  REQUIRE(daemon.Stop() == 0);
  // Step 12's parameters are damaged; its EMA file is whole.
  REQUIRE(DamageTensorByte(JobDir(daemon) + "/step-00000012/model-r00000.safetensors"));
  REQUIRE(daemon.Start());
  auto restore = common;
  for (const char* f : {"--mode=restore", "--ema_decay=0.9"}) restore.push_back(f);
  auto u = StartTrainer(daemon, dir, "restore", restore);
  REQUIRE(u->Wait(absl::Seconds(60)) == 0);
  INFO(u->Output() << daemon.Log());
  CHECK(u->Values()["restored_step"] == "6");
  CHECK(u->Values()["restored_from"] == "disk");
  CHECK(u->Values()["mismatched_tensors"] == "0");
  // Step 6 holds no EMA: the EMA starts afresh, not from step 12's.
  CHECK(u->Values()["restored_ema_step"] == "-1");
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
