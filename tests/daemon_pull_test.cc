// Daemon-pull (copy_backend cuda_ipc) end to end, on the CPU: a real zccd and
// real trainer processes, both over the fake CUDA runtime (cuda/fake_cudart),
// whose IPC memory and event handles work across processes. The trainer's
// tensors live in (fake) device memory; zccd copies them into the staging
// slots through the trainer's IPC handles.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "shm/control_block.h"
#include "shm/pull_channel.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

std::unique_ptr<Subprocess> Trainer(const Daemon& d, const std::string& dir, const std::string& tag,
                                    std::vector<std::string> flags) {
  std::vector<std::string> argv = {Runfile("tests/test_trainer_on_fake_cudart"),
                                   "--socket=" + d.socket(),
                                   "--root=" + d.root(),
                                   "--device_tensors",
                                   "--kib=64",
                                   "--tensors=3"};
  for (auto& f : flags) argv.push_back(std::move(f));
  return std::make_unique<Subprocess>(argv, absl::StrCat(dir, "/", tag, ".log"));
}

DaemonOptions FakeCudaDaemon(bool daemon_pull) {
  DaemonOptions o;
  o.binary = "daemon/zccd_on_fake_cudart";
  if (daemon_pull) o.extra_flags.push_back("--daemon_pull");
  return o;
}

std::string Status(const std::string& dir, const Daemon& d) {
  return Zccctl(dir, d, {"status"}).second;
}

// A rank's staging segment, mapped read-write (the test runs as its owner).
class MappedSegment {
 public:
  explicit MappedSegment(const std::string& name) {
    const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    bytes_ = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
  }
  ~MappedSegment() { munmap(base_, bytes_); }

  shm::PullChannel* channel() const {
    const auto* cb = reinterpret_cast<const shm::ControlBlock*>(base_);
    const uint64_t offset = cb->slots_offset + uint64_t{cb->num_slots} * cb->slot_bytes;
    REQUIRE(offset + sizeof(shm::PullChannel) <= bytes_);
    auto* ch = reinterpret_cast<shm::PullChannel*>(base_ + offset);
    REQUIRE(ch->magic == shm::kPullMagic);
    return ch;
  }
  shm::PullSource* sources() const {
    shm::PullChannel* ch = channel();
    return reinterpret_cast<shm::PullSource*>(reinterpret_cast<uint8_t*>(ch) + ch->sources_offset);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

// The segment of `job`'s rank 0 under the daemon's prefix.
std::string SegmentOf(const Daemon& d, const std::string& job) {
  for (const std::string& name : ShmSegments(d.shm_prefix() + "." + job + ".r0.")) return name;
  return "";
}

TEST_CASE("zccd copies a trainer's device tensors; they checkpoint and restore bit-exact") {
  const std::string dir = ShortTempDir("it-pull");
  Daemon daemon(dir, FakeCudaDaemon(true));
  REQUIRE(daemon.Start());
  auto train = Trainer(
      daemon, dir, "train",
      {"--copy_backend=cuda_ipc", "--steps=10", "--save_every=5", "--block", "--linger_ms=300"});
  INFO(train->Output() << daemon.Log());
  REQUIRE(train->Wait(absl::Seconds(90)) == 0);
  CHECK(train->Values()["published"] == "10");
  CHECK(train->Values()["committed"] == "10");
  CHECK(absl::StrContains(daemon.Log(), "daemon-pull on CUDA device 0"));

  const std::string status = Status(dir, daemon);
  INFO(status);
  CHECK(absl::StrContains(status, "daemon-pull: on"));
  CHECK(absl::StrContains(status, "cuda device 0:"));

  // From zccd's memory, then (zccd restarted, its memory gone) from disk,
  // into fresh device tensors.
  for (const char* from : {"memory", "disk"}) {
    if (std::string(from) == "disk") {
      REQUIRE(daemon.Stop() == 0);
      REQUIRE(daemon.Start());
    }
    auto restore = Trainer(daemon, dir, absl::StrCat("restore-", from),
                           {"--mode=restore", "--copy_backend=cuda_ipc", "--expect_step=10",
                            absl::StrCat("--expect_from=", from)});
    INFO(restore->Output());
    CHECK(restore->Wait(absl::Seconds(60)) == 0);
    CHECK(restore->Values()["mismatched_tensors"] == "0");
  }
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("daemon-pull is refused unless zccd enables it; auto copies on the trainer's side") {
  const std::string dir = ShortTempDir("it-pull-off");
  Daemon daemon(dir, FakeCudaDaemon(false));
  REQUIRE(daemon.Start());
  auto required = Trainer(daemon, dir, "required", {"--copy_backend=cuda_ipc", "--steps=2"});
  INFO(required->Output());
  CHECK(required->Wait(absl::Seconds(60)) != 0);
  CHECK(absl::StrContains(required->Output(), "daemon_pull is off in its config"));

  auto automatic = Trainer(daemon, dir, "auto",
                           {"--copy_backend=auto", "--steps=5", "--save_every=5", "--block"});
  INFO(automatic->Output());
  REQUIRE(automatic->Wait(absl::Seconds(60)) == 0);
  CHECK(automatic->Values()["published"] == "5");
  auto restore = Trainer(daemon, dir, "auto-restore",
                         {"--mode=restore", "--copy_backend=auto", "--expect_step=5"});
  INFO(restore->Output());
  CHECK(restore->Wait(absl::Seconds(60)) == 0);
  CHECK(restore->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a trainer killed between ready and copied: zccd drops that snapshot and serves on") {
  const std::string dir = ShortTempDir("it-pull-kill");
  Daemon daemon(dir, FakeCudaDaemon(true));
  REQUIRE(daemon.Start());
  // Step 3's snapshot waits behind a 5 s "kernel": zccd's copy stream waits
  // on the ready event when the trainer dies.
  auto victim = Trainer(daemon, dir, "victim",
                        {"--copy_backend=cuda_ipc", "--steps=6", "--save_every=2", "--block",
                         "--stall_at_step=3", "--stall_ms=5000"});
  REQUIRE(victim->WaitForOutput("stalled", absl::Seconds(60)));
  absl::SleepFor(absl::Milliseconds(500));
  victim->Signal(SIGKILL);
  victim->Wait(absl::Seconds(10));

  INFO(daemon.Log());
  REQUIRE(Eventually([&] { return absl::StrContains(daemon.Log(), "failed and was dropped"); },
                     absl::Seconds(30)));
  REQUIRE(daemon.process()->running());
  const std::string status = Status(dir, daemon);
  INFO(status);
  CHECK(absl::StrContains(status, "1 context reset(s)"));

  // A restarted trainer of the same rank pulls, checkpoints and restores.
  auto again =
      Trainer(daemon, dir, "again",
              {"--copy_backend=cuda_ipc", "--start=3", "--steps=4", "--save_every=2", "--block"});
  INFO(again->Output());
  REQUIRE(again->Wait(absl::Seconds(90)) == 0);
  CHECK(again->Values()["published"] == "4");
  CHECK(again->Values()["committed"] == "6");
  auto restore =
      Trainer(daemon, dir, "restore",
              {"--mode=restore", "--copy_backend=cuda_ipc", "--restore_step=6", "--expect_step=6"});
  INFO(restore->Output());
  CHECK(restore->Wait(absl::Seconds(60)) == 0);
  CHECK(restore->Values()["mismatched_tensors"] == "0");
  REQUIRE(daemon.Stop() == 0);
}

// Job A snapshots (zccd maps its allocations) and stays; job B registers
// and, before its first snapshot, names A's allocation in place of each of its
// own. `uid_a` / `uid_b`: the trainers' uids (-1: the test's own).
void ForeignHandleIsRefused(const std::string& tag, int uid_a, int uid_b) {
  const std::string dir = ShortTempDir(tag);
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  Daemon daemon(dir, FakeCudaDaemon(true));
  REQUIRE(daemon.Start());
  // Other uids run a copy outside root's runfiles.
  std::string trainer = Runfile("tests/test_trainer_on_fake_cudart");
  if (uid_a >= 0 || uid_b >= 0) {
    const std::string copy = dir + "/bin/test_trainer_on_fake_cudart";
    const std::string cmd = "mkdir -p " + dir + "/bin && cp " + trainer + " " + copy +
                            " && chmod 0755 " + dir + "/bin " + copy;
    REQUIRE(std::system(cmd.c_str()) == 0);
    trainer = copy;
  }
  auto run = [&](int uid, const std::string& name, std::vector<std::string> flags) {
    std::vector<std::string> argv = {trainer,
                                     "--socket=" + daemon.socket(),
                                     "--root=" + daemon.root(),
                                     "--device_tensors",
                                     "--kib=64",
                                     "--tensors=3",
                                     "--copy_backend=cuda_ipc"};
    for (auto& f : flags) argv.push_back(std::move(f));
    return std::make_unique<Subprocess>(argv, dir + "/" + name + ".log", uid);
  };
  auto a =
      run(uid_a, "a", {"--job=joba", "--steps=2", "--save_every=0", "--block", "--pause_at=2"});
  REQUIRE(a->WaitForOutput("paused", absl::Seconds(60)));
  auto b = run(uid_b, "b", {"--job=jobb", "--steps=1", "--save_every=0", "--pause_before_train"});
  REQUIRE(b->WaitForOutput("ready", absl::Seconds(60)));
  {
    MappedSegment seg_a(SegmentOf(daemon, "joba"));
    MappedSegment seg_b(SegmentOf(daemon, "jobb"));
    const uint32_t n = seg_b.channel()->num_sources.load();
    REQUIRE(n > 0);
    REQUIRE(seg_a.channel()->num_sources.load() > 0);
    for (uint32_t i = 0; i < n; ++i) {
      std::memcpy(seg_b.sources()[i].handle, seg_a.sources()[0].handle, shm::kIpcHandleBytes);
    }
  }
  b->Signal(SIGUSR1);
  INFO(b->Output() << daemon.Log());
  REQUIRE(b->Wait(absl::Seconds(60)) == 0);
  CHECK(b->Values()["published"] == "0");
  CHECK(absl::StrContains(b->Output(), "already mapped for job joba rank 0"));
  if (uid_a >= 0) CHECK(absl::StrContains(b->Output(), absl::StrCat("(uid ", uid_a, ")")));
  a->Signal(SIGUSR1);
  CHECK(a->Wait(absl::Seconds(60)) == 0);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a trainer's pull counter run far ahead of its requests is refused once, not served "
          "one failing request at a time") {
  const std::string dir = ShortTempDir("it-pull-counter");
  Daemon daemon(dir, FakeCudaDaemon(true));
  REQUIRE(daemon.Start());
  auto a = Trainer(daemon, dir, "a",
                   {"--job=counter", "--copy_backend=cuda_ipc", "--steps=2", "--save_every=0",
                    "--block", "--pause_at=2"});
  REQUIRE(a->WaitForOutput("paused", absl::Seconds(60)));
  {
    // What a trainer that writes its channel wrongly (or on purpose) does.
    MappedSegment seg(SegmentOf(daemon, "counter"));
    shm::PullChannel* ch = seg.channel();
    ch->requested.store(ch->requested.load() + (uint64_t{1} << 40));
    ch->doorbell.fetch_add(1);
    FutexWakeAll(&ch->doorbell);
  }
  INFO(daemon.Log());
  REQUIRE(Eventually([&] { return absl::StrContains(daemon.Log(), "pull request counter"); },
                     absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(500));
  const std::string log = daemon.Log();
  size_t lines = 0;
  for (size_t at = log.find("pull request counter"); at != std::string::npos;
       at = log.find("pull request counter", at + 1)) {
    ++lines;
  }
  CHECK(lines == 1);
  CHECK(daemon.process()->running());
  a->Signal(SIGKILL);
  a->Wait(absl::Seconds(10));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a source that claims more bytes than its allocation maps is refused; zccd serves on") {
  const std::string dir = ShortTempDir("it-pull-size");
  Daemon daemon(dir, FakeCudaDaemon(true));
  REQUIRE(daemon.Start());
  auto b = Trainer(daemon, dir, "b",
                   {"--job=liar", "--copy_backend=cuda_ipc", "--steps=1", "--save_every=0",
                    "--pause_before_train"});
  REQUIRE(b->WaitForOutput("ready", absl::Seconds(60)));
  {
    // Written before the first pull, which is when zccd opens the sources.
    MappedSegment seg(SegmentOf(daemon, "liar"));
    const uint32_t n = seg.channel()->num_sources.load();
    REQUIRE(n > 0);
    for (uint32_t i = 0; i < n; ++i) seg.sources()[i].bytes *= 1024;
  }
  b->Signal(SIGUSR1);
  INFO(b->Output() << daemon.Log());
  REQUIRE(b->Wait(absl::Seconds(60)) == 0);
  CHECK(b->Values()["published"] == "0");
  CHECK(absl::StrContains(b->Output(), "bytes; the allocation its handle maps holds"));
  // Its own snapshot failed, nothing else: another job pulls on.
  auto c = Trainer(daemon, dir, "c",
                   {"--job=honest", "--copy_backend=cuda_ipc", "--steps=2", "--save_every=2",
                    "--block"});
  INFO(c->Output());
  REQUIRE(c->Wait(absl::Seconds(60)) == 0);
  CHECK(c->Values()["published"] == "2");
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a handle of another job's memory is refused") {
  ForeignHandleIsRefused("it-pull-foreign", -1, -1);
}

TEST_CASE("a handle of another user's memory is refused") {
  if (geteuid() != 0) {
    WARN("skipped: needs root to run trainers as two other uids");
    return;
  }
  ForeignHandleIsRefused("it-pull-uid", 54321, 54322);
}

}  // namespace
}  // namespace zcc::testing
