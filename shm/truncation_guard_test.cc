// A segment cut short by another process (its ftruncate) under zccd's
// mapping: with the guard installed, the access that finds it reads zeros
// and the segment says it was cut, instead of the process ending in SIGBUS.
// A SIGBUS anywhere else still ends the process.
#include "shm/truncation_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "shm/segment.h"

namespace zcc::shm {
namespace {

std::string UniqueName(const char* tag) { return absl::StrCat("zcctest.", tag, ".", getpid()); }

// What a trainer that owns the object can do to it.
void CutShort(const std::string& name, off_t bytes) {
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, bytes) == 0);
  ::close(fd);
}

// How a child process ended: the signal that ended it, or 0.
int EndedBy(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

TEST_CASE("a segment cut short under a guarded mapping reads zeros and says it was cut") {
  REQUIRE_OK(InstallTruncationGuard());
  REQUIRE_OK(InstallTruncationGuard());  // (idempotent)
  constexpr uint64_t kBytes = 1 << 20;
  const std::string name = UniqueName("cut");
  auto created = Segment::Create(name, kBytes);
  REQUIRE_OK(created.status());
  auto opened = Segment::Open(name, kBytes);  // a second mapping of it
  REQUIRE_OK(opened.status());
  auto other = Segment::Create(UniqueName("whole"), kBytes);
  REQUIRE_OK(other.status());
  std::memset(created->base(), 0x5a, kBytes);
  std::memset(other->base(), 0x5a, kBytes);
  CHECK_FALSE(created->cut());

  CutShort(name, 4096);
  // The first page is still the object's; past it, zeros.
  volatile uint8_t* data = created->base();
  CHECK(data[100] == 0x5a);
  CHECK(data[kBytes / 2] == 0);
  CHECK(created->cut());
  // The whole mapping is zeros now (the first page too), and writable.
  CHECK(data[100] == 0);
  data[kBytes - 1] = 7;
  CHECK(data[kBytes - 1] == 7);
  // Another mapping of the same object knows it too (the object is shorter
  // than the mapping), and reads zeros at its own access.
  CHECK(opened->cut());
  CHECK(static_cast<volatile uint8_t*>(opened->base())[kBytes - 1] == 0);
  CHECK(opened->cut());
  // Other segments are untouched.
  CHECK_FALSE(other->cut());
  CHECK(other->base()[kBytes / 2] == 0x5a);

  // A segment resized (the staging pool's) is guarded where it is now.
  const std::string pooled = UniqueName("resized");
  auto resized = Segment::Create(pooled, kBytes);
  REQUIRE_OK(resized.status());
  REQUIRE_OK(resized->Resize(4 * kBytes, 4 * kBytes));
  REQUIRE_OK(resized->Resize(2 * kBytes, 2 * kBytes));
  std::memset(resized->base(), 1, 2 * kBytes);
  CutShort(pooled, 0);
  CHECK(static_cast<volatile uint8_t*>(resized->base())[2 * kBytes - 1] == 0);
  CHECK(resized->cut());
}

// In a child: SIGBUS as a process starts with it (the test framework puts
// its own handler in place for each test case), then the guard.
bool GuardAfter(void (*disposition)(int)) {
  ::signal(SIGBUS, disposition);
  return !TruncationGuardInstalled() && InstallTruncationGuard().ok() &&
         TruncationGuardInstalled();
}

TEST_CASE("a SIGBUS outside the guarded segments is what it was without the guard") {
  SECTION("a file mapping cut short ends the process") {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!GuardAfter(SIG_DFL)) ::_exit(2);
      char path[] = "/tmp/zcc-guard-XXXXXX";
      const int fd = ::mkstemp(path);
      if (fd < 0 || ::ftruncate(fd, 1 << 16) != 0) ::_exit(2);
      ::unlink(path);
      auto* p = static_cast<volatile uint8_t*>(
          ::mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      if (p == MAP_FAILED || ::ftruncate(fd, 0) != 0) ::_exit(2);
      const uint8_t read = p[8192];
      ::_exit(read == 0 ? 0 : 1);  // (not reached)
    }
    CHECK(EndedBy(pid) == SIGBUS);
  }
  SECTION("a SIGBUS sent ends the process") {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!GuardAfter(SIG_DFL)) ::_exit(2);
      ::kill(::getpid(), SIGBUS);
      ::_exit(0);
    }
    CHECK(EndedBy(pid) == SIGBUS);
  }
  SECTION("a SIGBUS sent to a process that ignores it is ignored") {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!GuardAfter(SIG_IGN)) ::_exit(2);
      ::kill(::getpid(), SIGBUS);
      ::_exit(3);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
  }
}

}  // namespace
}  // namespace zcc::shm
