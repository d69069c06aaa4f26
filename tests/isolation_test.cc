// Isolation between users (DESIGN.md section 7): a job belongs to the uid
// that registered it. Runs outside Bazel's sandbox (tag "local"): the sandbox's
// user namespace maps only root, so a second uid cannot exist inside it.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

constexpr int kOtherUid = 54321;

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

}  // namespace
}  // namespace zcc::testing
