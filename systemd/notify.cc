#include "systemd/notify.h"

#include <systemd/sd-daemon.h>

#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace zcc::systemd {
namespace {

// sd_notify: > 0 sent, 0 not under systemd, < 0 -errno.
absl::Status Notify(const std::string& state) {
  const int r = ::sd_notify(/*unset_environment=*/0, state.c_str());
  if (r < 0) return zcc::ErrnoToStatus(-r, absl::StrCat("sd_notify ", state));
  return absl::OkStatus();
}

}  // namespace

absl::Status NotifyReady() { return Notify("READY=1"); }

absl::Status NotifyStopping() { return Notify("STOPPING=1"); }

absl::Status NotifyStatus(absl::string_view text) {
  return Notify(absl::StrCat("STATUS=", absl::StrReplaceAll(text, {{"\n", " "}})));
}

struct Watchdog::Impl {
  HealthCheck healthy;
  absl::Duration interval;

  zcc::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  zcc::Mutex stop_mu;  // serializes Stop callers
  std::thread thread ABSL_GUARDED_BY(stop_mu);

  ~Impl() { Stop(); }

  void Run() {
    bool was_healthy = true;
    absl::Time next = absl::Now();
    for (;;) {
      {
        zcc::MutexLock lock(&mu);
        if (mu.AwaitWithDeadline(absl::Condition(&stop), next)) return;
      }
      const bool ok = healthy();
      if (ok) {
        if (absl::Status st = Notify("WATCHDOG=1"); !st.ok()) {
          ZCC_LOG(WARNING) << "watchdog: " << st.message();
        }
      }
      if (ok != was_healthy) {
        if (ok) {
          ZCC_LOG(INFO) << "watchdog: healthy again, pinging systemd";
        } else {
          ZCC_LOG(ERROR) << "watchdog: health check failed; no longer pinging systemd, which "
                            "restarts the service when the watchdog interval runs out";
        }
        was_healthy = ok;
      }
      next += interval;
      if (const absl::Time now = absl::Now(); next <= now) next = now + interval;
    }
  }

  void Stop() {
    zcc::MutexLock stop_lock(&stop_mu);
    if (!thread.joinable()) return;
    {
      zcc::MutexLock lock(&mu);
      stop = true;
    }
    thread.join();
  }
};

absl::StatusOr<Watchdog> Watchdog::Start(HealthCheck healthy) {
  if (!healthy) return absl::InvalidArgumentError("watchdog needs a health check");
  auto impl = std::make_unique<Impl>();
  uint64_t usec = 0;
  const int r = ::sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) return zcc::ErrnoToStatus(-r, "sd_watchdog_enabled (WATCHDOG_USEC/WATCHDOG_PID)");
  if (r == 0 || usec == 0) return Watchdog(std::move(impl));  // inactive
  impl->healthy = std::move(healthy);
  impl->interval = absl::Microseconds(usec) / 2;
  Impl* raw = impl.get();
  {
    zcc::MutexLock lock(&raw->stop_mu);
    raw->thread = std::thread([raw] { raw->Run(); });
  }
  ZCC_LOG(INFO) << "watchdog: pinging systemd every " << absl::FormatDuration(raw->interval);
  return Watchdog(std::move(impl));
}

Watchdog::Watchdog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Watchdog::Watchdog(Watchdog&&) noexcept = default;
Watchdog& Watchdog::operator=(Watchdog&&) noexcept = default;
Watchdog::~Watchdog() = default;

void Watchdog::Stop() {
  if (impl_ != nullptr) impl_->Stop();
}

bool Watchdog::active() const { return impl_ != nullptr && impl_->interval > absl::ZeroDuration(); }

absl::Duration Watchdog::ping_interval() const {
  return impl_ != nullptr ? impl_->interval : absl::ZeroDuration();
}

}  // namespace zcc::systemd
