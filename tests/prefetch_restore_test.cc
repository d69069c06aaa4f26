// A trainer that registers with prefetch_restore: zccd begins reading the
// newest committed step into a staging slot as the registration arrives
// (daemon/restore/restore_prefetch.h). Real zccd and trainer processes: the restore
// that follows is served by that read, bit-exact; a damaged piece it finds
// makes the restore fall back like its own read would; a read the trainer
// does not use (another step asked for, training without a restore, a job
// with nothing to restore) is dropped and its slot goes back to the trainer.
// Counted by zcc_restore_prefetches_total{outcome}.
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

// A zccd whose restores read the disk (it keeps no departed trainer's
// snapshots), with its metrics on a port of its own (and `flags`); trains 15
// steps (checkpoints at 5, 10 and 15) when `train`.
struct Setup {
  // `pool_bytes`: the staging pool holds that much before the training
  // registers (made in the background from zccd's start).
  explicit Setup(const std::string& name, bool train = true,
                 std::vector<std::string> flags = {}, double pool_bytes = 0)
      : dir(ShortTempDir(name)), daemon(dir, DaemonOptions{WithDefaults(std::move(flags))}) {
    REQUIRE(daemon.Start());
    port = PortFromLog(daemon, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
    REQUIRE(port > 0);
    if (pool_bytes > 0) {
      INFO(daemon.Log());
      REQUIRE(Eventually([&] { return MetricValue(port, "zcc_staging_pool_bytes") >= pool_bytes; },
                         absl::Seconds(30)));
    }
    if (train) {
      auto t = StartTrainer(daemon, dir, "train", {"--steps=15"});
      REQUIRE(t->Wait(absl::Seconds(60)) == 0);
    }
  }
  static std::vector<std::string> WithDefaults(std::vector<std::string> flags) {
    flags.push_back("--retain_snapshots_s=0");
    flags.push_back("--metrics_listen=127.0.0.1:0");
    return flags;
  }
  double Prefetches(const std::string& outcome) const {
    return MetricValue(port,
                       absl::StrCat("zcc_restore_prefetches_total{outcome=\"", outcome, "\"}"));
  }

  std::string dir;
  Daemon daemon;
  int port = 0;
};

// One byte of step 15's `file` changes on disk, its last: its metadata still
// checks out, so the step is chosen and the damage found while it is read,
// after the file's other tensors were read and checked.
void DamageLastByte(const Setup& s, const std::string& file) {
  std::fstream f(JobDir(s.daemon) + "/step-00000015/" + file,
                 std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x5a);
  f.seekp(-1, std::ios::end);
  f.put(c);
}

TEST_CASE("a restarted trainer restores the step zccd began reading as it registered") {
  Setup s("pf-used");
  auto r = StartTrainer(s.daemon, s.dir, "restore",
                        {"--mode=restore", "--prefetch_restore", "--expect_step=15",
                         "--expect_from=disk"});
  REQUIRE(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output() << s.daemon.Log());
  CHECK(r->Values()["restored_step"] == "15");
  CHECK(r->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(s.daemon.Log(), "read ahead from the registration on"));
  CHECK(s.Prefetches("used") == 1);
  CHECK(s.Prefetches("discarded") == 0);
  // Without the flag nothing is read ahead.
  auto plain = StartTrainer(s.daemon, s.dir, "plain", {"--mode=restore", "--expect_step=15"});
  REQUIRE(plain->Wait(absl::Seconds(60)) == 0);
  CHECK(plain->Values()["mismatched_tensors"] == "0");
  CHECK(s.Prefetches("used") == 1);
  REQUIRE(s.daemon.Stop() == 0);
}

TEST_CASE("a damaged piece found by the read ahead: the restore falls back to the older step") {
  // The restoring trainer's staging comes from zccd's staging pool, made
  // ready after the training's registration took the first piece: the read
  // ahead goes into memory made before, and its damage is found all the same.
  Setup s("pf-dmg", true, {"--staging_pool_mb=64", "--staging_pool_entry_mb=16"},
          /*pool_bytes=*/64 << 20);
  DamageLastByte(s, "model-r00000.safetensors");
  auto r = StartTrainer(s.daemon, s.dir, "restore",
                        {"--mode=restore", "--prefetch_restore", "--expect_step=10"});
  REQUIRE(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output() << s.daemon.Log());
  // Every tensor holds step 10, bit for bit: nothing of step 15 reached it.
  CHECK(r->Values()["restored_step"] == "10");
  CHECK(r->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(r->Output(), "restore skipped step-00000015: damaged, found while "
                                       "reading it: checksum mismatch"));
  CHECK(absl::StrContains(s.daemon.Log(), "falling back to an older step"));
  CHECK(absl::StrContains(s.daemon.Log(), "came from the staging pool"));
  CHECK(s.Prefetches("used") == 1);
  REQUIRE(s.daemon.Stop() == 0);
}

TEST_CASE("tensors copied as they are checked: a step damaged near its end falls back, and "
          "nothing of it stays") {
  Setup s("pf-early");
  DamageLastByte(s, "optim-r00000.safetensors");
  SECTION("read ahead") {
    auto r = StartTrainer(s.daemon, s.dir, "restore",
                          {"--mode=restore", "--prefetch_restore", "--early_copy",
                           "--expect_step=10"});
    REQUIRE(r->Wait(absl::Seconds(60)) == 0);
    INFO(r->Output() << s.daemon.Log());
    // Every tensor holds step 10, bit for bit, the early copies of step
    // 15's optimizer tensors overwritten.
    CHECK(r->Values()["restored_step"] == "10");
    CHECK(r->Values()["mismatched_tensors"] == "0");
    CHECK(absl::StrContains(s.daemon.Log(), "falling back to an older step"));
  }
  SECTION("read by the restore") {
    auto r = StartTrainer(s.daemon, s.dir, "restore",
                          {"--mode=restore", "--early_copy", "--expect_step=10"});
    REQUIRE(r->Wait(absl::Seconds(60)) == 0);
    INFO(r->Output() << s.daemon.Log());
    CHECK(r->Values()["restored_step"] == "10");
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }
  SECTION("no fallback: the restore fails, and only the early-copy tensors were written") {
    auto r = StartTrainer(s.daemon, s.dir, "restore",
                          {"--mode=restore", "--early_copy", "--restore_step=15"});
    CHECK(r->Wait(absl::Seconds(60)) != 0);
    INFO(r->Output() << s.daemon.Log());
    CHECK(r->Values()["changed_tensors_not_early"] == "0");
    CHECK(absl::StrContains(r->Output(), "checksum mismatch"));
  }
  REQUIRE(s.daemon.Stop() == 0);
}

TEST_CASE("a read ahead the trainer does not use is dropped and its slot given back") {
  Setup s("pf-drop");
  SECTION("the trainer asks for an older step") {
    auto r = StartTrainer(s.daemon, s.dir, "older",
                          {"--mode=restore", "--prefetch_restore", "--restore_step=10",
                           "--expect_step=10"});
    REQUIRE(r->Wait(absl::Seconds(60)) == 0);
    INFO(r->Output() << s.daemon.Log());
    CHECK(r->Values()["mismatched_tensors"] == "0");
    CHECK(s.Prefetches("used") == 0);
    CHECK(s.Prefetches("discarded") == 1);
  }
  SECTION("the trainer trains on without restoring, with two slots and no skipping") {
    // Had the read kept its slot, a blocking snapshot would wait for it
    // forever; the trainer's snapshots all go through and step 25 commits.
    auto t = StartTrainer(s.daemon, s.dir, "on",
                          {"--prefetch_restore", "--start=16", "--steps=10", "--slots=2",
                           "--block", "--step_ms=50"});
    REQUIRE(t->Wait(absl::Seconds(60)) == 0);
    INFO(t->Output() << s.daemon.Log());
    CHECK(t->Values()["published"] == "10");
    CHECK(absl::StrContains(s.daemon.Log(), "snapshotted without restoring"));
    CHECK(s.Prefetches("used") == 0);
    CHECK(s.Prefetches("discarded") == 1);
    auto r = StartTrainer(s.daemon, s.dir, "check", {"--mode=restore", "--expect_step=25"});
    REQUIRE(r->Wait(absl::Seconds(60)) == 0);
    CHECK(r->Values()["mismatched_tensors"] == "0");
  }
  REQUIRE(s.daemon.Stop() == 0);
}

TEST_CASE("a job with nothing to restore: the read ahead gives its slot back at once") {
  Setup s("pf-none", /*train=*/false);
  auto t = StartTrainer(s.daemon, s.dir, "fresh",
                        {"--prefetch_restore", "--steps=10", "--slots=2", "--block"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  INFO(t->Output() << s.daemon.Log());
  CHECK(t->Values()["published"] == "10");
  CHECK(s.Prefetches("used") == 0);
  CHECK(s.Prefetches("discarded") == 0);
  REQUIRE(s.daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
