#include "common/instance_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"

namespace zcc {
namespace {

TEST_CASE("an instance lock has one holder, which a second claim names") {
  const std::string path = testing::TempDir() + "/x.lock";
  CHECK_FALSE(InstanceLock::IsHeld(path));  // no file yet
  std::optional<InstanceLock> first;
  {
    auto acquired = InstanceLock::Acquire(path, "shared-memory prefix 'p'");
    REQUIRE_OK(acquired.status());
    first.emplace(*std::move(acquired));
  }
  CHECK(InstanceLock::IsHeld(path));
  auto second = InstanceLock::Acquire(path, "shared-memory prefix 'p'");
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(second.status().message());
  INFO(message);
  CHECK(absl::StrContains(message, absl::StrCat("pid ", ::getpid())));
  CHECK(absl::StrContains(message, "shared-memory prefix 'p'"));
  CHECK(absl::StrContains(message, path));

  first.reset();  // released with the holder, which removes its file
  CHECK(::access(path.c_str(), F_OK) != 0);
  CHECK_FALSE(InstanceLock::IsHeld(path));
  REQUIRE_OK(InstanceLock::Acquire(path, "p").status());
}

TEST_CASE("an instance lock dies with its process: a killed holder leaves no claim") {
  const std::string path = testing::TempDir() + "/y.lock";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto lock = InstanceLock::Acquire(path, "test");
    const char ok = lock.ok() ? '1' : '0';
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);
  ::close(ready[0]);
  REQUIRE(ok == '1');
  CHECK(InstanceLock::IsHeld(path));
  auto refused = InstanceLock::Acquire(path, "test");
  CHECK(absl::StrContains(refused.status().message(), absl::StrCat("pid ", child)));

  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(::access(path.c_str(), F_OK) == 0);  // left behind, unlocked
  CHECK_FALSE(InstanceLock::IsHeld(path));
  REQUIRE_OK(InstanceLock::Acquire(path, "test").status());
}

TEST_CASE("the lock file of a shared-memory prefix cannot be taken for one of its segments") {
  const std::string lock = ShmPrefixLockPath("zcc");
  CHECK(absl::StartsWith(lock, "/dev/shm/"));
  // Segments are listed as "<prefix>." under /dev/shm; prefixes never start
  // with a dot.
  CHECK_FALSE(absl::StartsWith(lock.substr(9), "zcc."));
}

}  // namespace
}  // namespace zcc
