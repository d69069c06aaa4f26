// Isolation between users (DESIGN.md section 7): a job belongs to the uid
// that registered it. Runs outside Bazel's sandbox (tag "local"): the sandbox's
// user namespace maps only root, so a second uid cannot exist inside it.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

constexpr int kOtherUid = 54321;
constexpr int kThirdUid = 54322;

// Every entry under `dir` (the directory included, symlinks not followed)
// that does not belong to uid:gid, as "path uid:gid".
std::vector<std::string> NotOwnedBy(const std::string& dir, uid_t uid, gid_t gid) {
  std::vector<std::string> wrong;
  std::vector<std::string> todo = {dir};
  while (!todo.empty()) {
    const std::string path = todo.back();
    todo.pop_back();
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    if (st.st_uid != uid || st.st_gid != gid) {
      wrong.push_back(absl::StrCat(path, " ", st.st_uid, ":", st.st_gid));
    }
    if (!S_ISDIR(st.st_mode)) continue;
    if (DIR* d = opendir(path.c_str())) {
      while (struct dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") todo.push_back(path + "/" + name);
      }
      closedir(d);
    }
  }
  return wrong;
}

// Copies a built binary where another uid can run it (the runfiles live under
// root's home).
std::string Exposed(const std::string& dir, const std::string& runfile) {
  const std::string dst = dir + "/bin/" + runfile.substr(runfile.rfind('/') + 1);
  const std::string cmd = "mkdir -p " + dir + "/bin && cp " + Runfile(runfile) + " " + dst +
                          " && chmod 0755 " + dir + "/bin " + dst;
  REQUIRE(std::system(cmd.c_str()) == 0);
  return dst;
}

std::pair<int, std::string> ZccctlAs(int uid, const std::string& dir, const std::string& zccctl,
                                     const Daemon& d, std::vector<std::string> args) {
  return Zccctl(dir, d, std::move(args), uid, zccctl);
}

// Child process: becomes `uid` and tries to open the segment read-write.
int OpenSegmentAs(int uid, const std::string& name) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(2);
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    _exit(fd >= 0 ? 0 : (errno == EACCES ? 13 : 3));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string SegmentOf(const Daemon& d, const std::string& job) {
  for (const std::string& name : ShmSegments(d.shm_prefix())) {
    if (absl::StrContains(name, "." + job + ".r0.")) return name;
  }
  return "";
}

TEST_CASE("a trainer that cuts its staging segment short loses its registration; zccd and other "
          "jobs go on") {
  const std::string dir = ShortTempDir("it-cut");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto cutter = StartTrainer(daemon, dir, "cutter",
                             {"--job=cutter", "--steps=2", "--save_every=0", "--pause_at=2"});
  REQUIRE(cutter->WaitForOutput("paused", absl::Seconds(60)));
  // The trainer owns the object, so it can truncate it under zccd's
  // mapping; zccd's next heartbeat into it finds the cut.
  const std::vector<std::string> segments = ShmSegments(daemon.shm_prefix() + ".cutter.r0.");
  REQUIRE(segments.size() == 1);
  const int fd = shm_open(("/" + segments[0]).c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  close(fd);
  INFO(daemon.Log());
  REQUIRE(Eventually(
      [&] { return absl::StrContains(daemon.Log(), "cut its staging segment short (ftruncate)"); },
      absl::Seconds(30)));
  REQUIRE(daemon.process()->running());
  // Another job checkpoints and restores as ever.
  auto other = StartTrainer(daemon, dir, "other",
                            {"--job=other", "--steps=4", "--save_every=2", "--block"});
  INFO(other->Output());
  REQUIRE(other->Wait(absl::Seconds(60)) == 0);
  CHECK(other->Values()["committed"] == "4");
  auto restore = StartTrainer(daemon, dir, "restore",
                              {"--job=other", "--mode=restore", "--expect_step=4"});
  INFO(restore->Output());
  CHECK(restore->Wait(absl::Seconds(60)) == 0);
  CHECK(restore->Values()["mismatched_tensors"] == "0");
  // Nothing of the cut segment was kept for a restore from memory (zeros).
  CHECK_FALSE(absl::StrContains(daemon.Log(), "job cutter rank 0: keeping"));
  cutter->Signal(SIGKILL);
  cutter->Wait(absl::Seconds(10));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("another user cannot register into, attach to, query, save, list or collect a job") {
  if (geteuid() != 0) {
    WARN("skipped: the isolation test needs root to act as a second uid");
    return;
  }
  const std::string dir = ShortTempDir("it-iso");
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string trainer = Exposed(dir, "tests/test_trainer");
  const std::string zccctl = Exposed(dir, "tools/zccctl");

  // Root's job, kept registered while the other user tries things.
  auto alpha = StartTrainer(daemon, dir, "alpha", {"--job=alpha", "--steps=5", "--linger_ms=30000"});
  REQUIRE(alpha->WaitForOutput("published=", absl::Seconds(60)));
  const std::string alpha_segment = SegmentOf(daemon, "alpha");
  REQUIRE_FALSE(alpha_segment.empty());
  struct stat st;
  REQUIRE(stat(("/dev/shm/" + alpha_segment).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(OpenSegmentAs(kOtherUid, "/" + alpha_segment) == 13);  // EACCES

  Subprocess intruder({trainer, "--socket=" + daemon.socket(), "--root=" + daemon.root(), "--job=alpha",
                       "--steps=1"},
                      dir + "/intruder.log", kOtherUid);
  CHECK(intruder.Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(intruder.Output(), "PERMISSION_DENIED"));
  CHECK(absl::StrContains(intruder.Output(), "belongs to another user"));

  auto [code, out] = ZccctlAs(kOtherUid, dir, zccctl, daemon, {"--json", "status"});
  REQUIRE(code == 0);
  CHECK_FALSE(absl::StrContains(out, "alpha"));  // not even the job id
  std::tie(code, out) = ZccctlAs(kOtherUid, dir, zccctl, daemon, {"save", "alpha"});
  CHECK(code == 1);
  CHECK(absl::StrContains(out, "another user"));
  std::tie(code, out) = ZccctlAs(kOtherUid, dir, zccctl, daemon, {"list", "alpha"});
  CHECK(code == 1);
  std::tie(code, out) = ZccctlAs(kOtherUid, dir, zccctl, daemon, {"gc", "alpha"});
  CHECK(code == 1);
  // The checkpoint directory itself is closed to other users.
  REQUIRE(stat(JobDir(daemon, "alpha").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0750);
  CHECK(st.st_uid == 0);

  // The other user runs a job of their own: its segment and directory are theirs.
  auto beta = std::make_unique<Subprocess>(
      std::vector<std::string>{trainer, "--socket=" + daemon.socket(), "--root=" + daemon.root(),
                               "--job=beta", "--steps=5", "--linger_ms=3000"},
      dir + "/beta.log", kOtherUid);
  REQUIRE(beta->WaitForOutput("published=", absl::Seconds(60)));
  INFO(beta->Output() << daemon.Log());
  CHECK(beta->Values()["committed"] == "5");
  const std::string beta_segment = SegmentOf(daemon, "beta");
  REQUIRE(stat(("/dev/shm/" + beta_segment).c_str(), &st) == 0);
  CHECK(st.st_uid == static_cast<uid_t>(kOtherUid));
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(stat(JobDir(daemon, "beta").c_str(), &st) == 0);
  CHECK(st.st_uid == static_cast<uid_t>(kOtherUid));
  std::tie(code, out) = ZccctlAs(kOtherUid, dir, zccctl, daemon, {"list", "beta"});
  CHECK(code == 0);
  // Root sees both.
  std::tie(code, out) = Zccctl(dir, daemon, {"--json", "status"});
  CHECK(absl::StrContains(out, "alpha"));
  CHECK(absl::StrContains(out, "beta"));
  CHECK(beta->Wait(absl::Seconds(30)) == 0);
  alpha->Signal(SIGKILL);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("another user cannot place a job inside a user's job directory, by path or symlink") {
  if (geteuid() != 0) {
    WARN("skipped: the isolation test needs root to act as other uids");
    return;
  }
  const std::string dir = ShortTempDir("it-nest");
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string trainer = Exposed(dir, "tests/test_trainer");
  const std::string root = daemon.root();
  auto as = [&](int uid, const std::string& tag, std::vector<std::string> flags) {
    std::vector<std::string> argv = {trainer, "--socket=" + daemon.socket()};
    for (auto& f : flags) argv.push_back(std::move(f));
    return std::make_unique<Subprocess>(argv, dir + "/" + tag + ".log", uid);
  };

  // User A's job, registered and lingering, with nothing committed yet.
  auto a = as(kOtherUid, "a", {"--root=" + root, "--job=jobA", "--steps=3", "--save_every=100",
                               "--linger_ms=60000"});
  REQUIRE(a->WaitForOutput("published=", absl::Seconds(60)));
  const std::string job_a = root + "/jobA";

  // User B aims at A's directory directly, before and after A's first commit.
  auto b1 = as(kThirdUid, "b1", {"--root=" + job_a, "--job=latest", "--steps=1"});
  CHECK(b1->Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(b1->Output(), "reserved"));
  auto b2 = as(kThirdUid, "b2", {"--root=" + job_a, "--job=jobB", "--steps=1"});
  CHECK(b2->Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(b2->Output(), "PERMISSION_DENIED"));
  CHECK(absl::StrContains(b2->Output(), "inside the checkpoint directory of a job"));

  // Through a symlink in a directory B owns.
  const std::string b_dir = root + "/b-home";
  REQUIRE(mkdir(b_dir.c_str(), 0755) == 0);
  REQUIRE(chown(b_dir.c_str(), kThirdUid, kThirdUid) == 0);
  REQUIRE(symlink(job_a.c_str(), (b_dir + "/link").c_str()) == 0);
  REQUIRE(lchown((b_dir + "/link").c_str(), kThirdUid, kThirdUid) == 0);
  auto b3 = as(kThirdUid, "b3", {"--root=" + b_dir + "/link", "--job=jobB", "--steps=1"});
  CHECK(b3->Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(b3->Output(), "inside the checkpoint directory of a job"));

  // Into a directory of A's that is no job directory: B may not write there.
  const std::string a_dir = root + "/a-home";
  REQUIRE(mkdir(a_dir.c_str(), 0755) == 0);
  REQUIRE(chown(a_dir.c_str(), kOtherUid, kOtherUid) == 0);
  auto b4 = as(kThirdUid, "b4", {"--root=" + a_dir, "--job=jobB", "--steps=1"});
  CHECK(b4->Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(b4->Output(), "as uid 54322"));
  CHECK_FALSE(PathExists(a_dir + "/jobB"));
  // B's own directory works, and what zccd makes there is B's.
  auto b5 = as(kThirdUid, "b5", {"--root=" + b_dir, "--job=jobB", "--steps=5"});
  CHECK(b5->Wait(absl::Seconds(60)) == 0);
  CHECK(NotOwnedBy(b_dir + "/jobB", kThirdUid, kThirdUid).empty());

  // Nothing B did reached A's directory, and A's commits go on.
  a->Signal(SIGKILL);
  a->Wait(absl::Seconds(10));
  auto a2 = as(kOtherUid, "a2", {"--root=" + root, "--job=jobA", "--steps=10"});
  REQUIRE(a2->Wait(absl::Seconds(60)) == 0);
  INFO(a2->Output() << daemon.Log());
  CHECK(a2->Values()["committed"] == "10");
  CHECK_FALSE(PathExists(job_a + "/jobB"));
  // Everything under A's job directory is A's (uid and group), the directory 0750.
  struct stat st;
  REQUIRE(stat(job_a.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0750);
  const auto wrong = NotOwnedBy(job_a, kOtherUid, kOtherUid);
  CHECK(wrong.empty());
  for (const std::string& w : wrong) WARN(w);

  // A root of A's own inside A's job directory is refused too.
  auto a3 = as(kOtherUid, "a3", {"--root=" + job_a, "--job=nested", "--steps=1"});
  CHECK(a3->Wait(absl::Seconds(60)) == 1);
  CHECK(absl::StrContains(a3->Output(), "inside the checkpoint directory of a job"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a trainer of another uid snapshots, checkpoints, reads its EMA and restores under a root zccd") {
  if (geteuid() != 0) {
    WARN("skipped: the isolation test needs root to act as a second uid");
    return;
  }
  const std::string dir = ShortTempDir("it-uid");
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  const std::string trainer = Exposed(dir, "tests/test_trainer");
  auto run = [&](const std::string& tag, std::vector<std::string> flags) {
    std::vector<std::string> argv = {trainer, "--socket=" + daemon.socket(),
                                     "--root=" + daemon.root(), "--job=gamma",
                                     "--ema_decay=0.9"};
    for (auto& f : flags) argv.push_back(std::move(f));
    auto p = std::make_unique<Subprocess>(argv, dir + "/" + tag + ".log", kOtherUid);
    const auto code = p->Wait(absl::Seconds(90));
    INFO(tag << ": " << p->Output() << daemon.Log());
    CHECK(code == 0);
    return p->Values();
  };
  auto trained = run("train", {"--steps=10", "--check_ema"});
  CHECK(trained["committed"] == "10");
  CHECK(trained["ema_step"] == "10");
  CHECK(trained["ema_mismatches"] == "0");
  auto restored = run("restore", {"--mode=restore", "--expect_step=10"});
  CHECK(restored["restored_step"] == "10");
  CHECK(restored["mismatched_tensors"] == "0");
  // Resume: restore, train on, and read the EMA (restored from the checkpoint).
  auto resumed = run("resume", {"--mode=resume", "--steps=5", "--check_ema"});
  CHECK(resumed["restored_step"] == "10");
  CHECK(resumed["committed"] == "15");
  CHECK(resumed["ema_step"] == "15");
  CHECK(resumed["ema_mismatches"] == "0");
  CHECK(NotOwnedBy(JobDir(daemon, "gamma"), kOtherUid, kOtherUid).empty());
  REQUIRE(daemon.Stop() == 0);
}

// The peer tier (DESIGN.md 5c) through zccd's control path: another user
// sees nothing of a user's job there either (neither on the job's node nor on
// the buddy holding its replicas).
TEST_CASE("another user sees nothing of a job's peer tier on either node") {
  if (geteuid() != 0) {
    WARN("skipped: the isolation test needs root to act as a second uid");
    return;
  }
  const std::string dir = ShortTempDir("it-isopeer");
  REQUIRE(chmod(dir.c_str(), 0755) == 0);
  auto peer_flags = [](const std::string& node, const std::string& rack) {
    return std::vector<std::string>{"--peer_listen=127.0.0.1:0", "--peer_insecure",
                                    "--node_name=" + node, "--failure_domain=" + rack};
  };
  Daemon b(dir, {peer_flags("node-b", "rack-2"), "", "zccd-b"});
  REQUIRE(b.Start());
  const std::string addr_b = absl::StrCat(
      "127.0.0.1:", PortFromLog(b, R"(peer service on \S+ \(port (\d+), PLAINTEXT)"));
  std::vector<std::string> flags = peer_flags("node-a", "rack-1");
  flags.push_back("--replicate_every=2");
  flags.push_back("--peer_static=" + addr_b);
  Daemon a(dir, {flags, "", "zccd-a"});
  REQUIRE(a.Start());
  const std::string zccctl = Exposed(dir, "tools/zccctl");

  auto alpha = StartTrainer(a, dir, "alpha", {"--job=alpha", "--steps=4", "--save_every=0",
                                              "--block", "--linger_ms=60000"});
  REQUIRE(alpha->WaitForOutput("published=", absl::Seconds(60)));
  std::string out;
  REQUIRE(Eventually(
      [&] {
        out = Zccctl(dir, a, {"status"}).second;
        return absl::StrContains(out, "replication: step 4 at every buddy");
      },
      absl::Seconds(30)));
  // The buddy holds the job's replicas; the other user sees neither the job
  // nor its replication, on either node.
  CHECK_FALSE(absl::StrContains(Zccctl(dir, b, {"status"}).second, "GB: 0 piece(s)"));
  for (const Daemon* d : {&a, &b}) {
    auto [code, mine] = ZccctlAs(kOtherUid, dir, zccctl, *d, {"--json", "status"});
    INFO(mine);
    CHECK(code == 0);
    CHECK_FALSE(absl::StrContains(mine, "alpha"));
    CHECK_FALSE(absl::StrContains(mine, "replicat"));
    std::tie(code, mine) = ZccctlAs(kOtherUid, dir, zccctl, *d, {"status"});
    CHECK_FALSE(absl::StrContains(mine, "alpha"));
    CHECK_FALSE(absl::StrContains(mine, "replication:"));
  }
  alpha->Signal(SIGKILL);
  CHECK(a.Stop() == 0);
  CHECK(b.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
