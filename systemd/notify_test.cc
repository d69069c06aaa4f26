#include "systemd/notify.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <vector>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/mutex.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"

namespace zcc::systemd {
namespace {

// Plays systemd's side: a unix datagram socket named by NOTIFY_SOCKET.
class NotifyListener {
 public:
  NotifyListener() {
    dir_ = testing::ShortTempDir("notify_test");
    path_ = dir_ + "/notify.sock";
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd_.valid());
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(fd_.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::setenv("NOTIFY_SOCKET", path_.c_str(), 1) == 0);
  }
  ~NotifyListener() {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // The next datagram, or nullopt after `timeout`.
  std::optional<std::string> Receive(absl::Duration timeout) {
    struct pollfd p = {fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

  // Datagrams already queued.
  std::vector<std::string> Drain() {
    std::vector<std::string> out;
    while (auto m = Receive(absl::ZeroDuration())) out.push_back(*m);
    return out;
  }

 private:
  std::string dir_;
  std::string path_;
  UniqueFd fd_;
};

// A health check the test switches, counting calls.
class Health {
 public:
  bool Check() {
    zcc::MutexLock lock(&mu_);
    ++calls_;
    if (!healthy_) ++unhealthy_calls_;
    return healthy_;
  }
  void Set(bool healthy) {
    zcc::MutexLock lock(&mu_);
    healthy_ = healthy;
  }
  // Waits until Check has returned false `n` times in all.
  bool WaitUnhealthyCalls(int n) {
    zcc::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return unhealthy_calls_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
  }
  int calls() {
    zcc::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  zcc::Mutex mu_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = true;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int unhealthy_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_CASE("outside systemd every call is a no-op") {
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  CHECK_OK(NotifyReady());
  CHECK_OK(NotifyStatus("idle"));
  CHECK_OK(NotifyStopping());
  Health health;
  absl::StatusOr<Watchdog> w = Watchdog::Start([&] { return health.Check(); });
  REQUIRE_OK(w);
  CHECK_FALSE(w->active());
  CHECK(w->ping_interval() == absl::ZeroDuration());
  w->Stop();
  CHECK(health.calls() == 0);
}

TEST_CASE("READY, STATUS and STOPPING reach NOTIFY_SOCKET") {
  NotifyListener systemd;
  REQUIRE_OK(NotifyReady());
  CHECK(systemd.Receive(absl::Seconds(5)) == "READY=1");
  REQUIRE_OK(NotifyStatus("2 jobs, 16 ranks\nlast checkpoint: step 1200"));
  CHECK(systemd.Receive(absl::Seconds(5)) == "STATUS=2 jobs, 16 ranks last checkpoint: step 1200");
  REQUIRE_OK(NotifyStopping());
  CHECK(systemd.Receive(absl::Seconds(5)) == "STOPPING=1");
}

TEST_CASE("a NOTIFY_SOCKET nobody listens on is an error, not a crash") {
  ::setenv("NOTIFY_SOCKET", "/tmp/zcc_notify_test_missing/notify.sock", 1);
  CHECK_FALSE(NotifyReady().ok());
  ::unsetenv("NOTIFY_SOCKET");
}

TEST_CASE("the watchdog pings at half the interval only while healthy") {
  NotifyListener systemd;
  REQUIRE(::setenv("WATCHDOG_USEC", "100000", 1) == 0);  // 100 ms
  REQUIRE(::setenv("WATCHDOG_PID", absl::StrCat(::getpid()).c_str(), 1) == 0);
  Health health;
  absl::StatusOr<Watchdog> w = Watchdog::Start([&] { return health.Check(); });
  REQUIRE_OK(w);
  REQUIRE(w->active());
  CHECK(w->ping_interval() == absl::Milliseconds(50));

  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) CHECK(systemd.Receive(absl::Seconds(5)) == "WATCHDOG=1");
  // The first ping is immediate, then one per 50 ms.
  CHECK(absl::Now() - start >= absl::Milliseconds(140));

  // Wedged: once the check has said "no", pings already sent are queued;
  // after that none may come.
  health.Set(false);
  REQUIRE(health.WaitUnhealthyCalls(1));
  systemd.Drain();
  REQUIRE(health.WaitUnhealthyCalls(4));
  CHECK(systemd.Drain().empty());

  health.Set(true);
  CHECK(systemd.Receive(absl::Seconds(5)) == "WATCHDOG=1");

  const absl::Time stop_start = absl::Now();
  w->Stop();
  CHECK(absl::Now() - stop_start < absl::Seconds(1));
  systemd.Drain();
  const int calls = health.calls();
  CHECK_FALSE(systemd.Receive(absl::Milliseconds(200)).has_value());
  CHECK(health.calls() == calls);
}

TEST_CASE("a watchdog meant for another process stays inactive") {
  NotifyListener systemd;
  REQUIRE(::setenv("WATCHDOG_USEC", "100000", 1) == 0);
  REQUIRE(::setenv("WATCHDOG_PID", "1", 1) == 0);  // not us
  Health health;
  absl::StatusOr<Watchdog> w = Watchdog::Start([&] { return health.Check(); });
  REQUIRE_OK(w);
  CHECK_FALSE(w->active());
  CHECK_FALSE(systemd.Receive(absl::Milliseconds(200)).has_value());
  CHECK(health.calls() == 0);
}

}  // namespace
}  // namespace zcc::systemd
