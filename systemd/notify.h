// systemd service notifications (sd_notify(3)) for a Type=notify unit: start
// and stop state, a status line, and the watchdog keep-alive. Outside systemd
// (NOTIFY_SOCKET unset) every call is a no-op that returns OK.
#ifndef ZCC_SYSTEMD_NOTIFY_H_
#define ZCC_SYSTEMD_NOTIFY_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zcc::systemd {

// "READY=1": the service is up (socket listening); systemd starts dependent
// units and `systemctl start` returns.
absl::Status NotifyReady();
// "STOPPING=1": shutdown has begun.
absl::Status NotifyStopping();
// "STATUS=<text>": shown by `systemctl status`. Newlines are replaced by
// spaces (the protocol is one assignment per line).
absl::Status NotifyStatus(absl::string_view text);

// Keeps systemd's watchdog (WatchdogSec=) fed from its own thread: pings
// "WATCHDOG=1" at half the interval systemd asked for, but only while
// `healthy` returns true, so a wedged daemon stops pinging and is restarted
// (Restart=on-failure). `healthy` runs on the watchdog thread; it must be
// thread-safe, quick, and outlive the handle.
//
// A move-only handle. When the watchdog is not enabled for this process
// (WATCHDOG_USEC unset, or WATCHDOG_PID names another process), Start returns
// an inactive handle and nothing runs. Stop (and the destructor) ends the
// thread and joins it, promptly unless a health check is running, which it
// waits for; it is thread-safe and idempotent.
class Watchdog {
 public:
  using HealthCheck = std::function<bool()>;

  static absl::StatusOr<Watchdog> Start(HealthCheck healthy);

  Watchdog(Watchdog&&) noexcept;
  Watchdog& operator=(Watchdog&&) noexcept;
  ~Watchdog();

  void Stop();
  bool active() const;
  // Time between pings (half of WATCHDOG_USEC); zero when inactive.
  absl::Duration ping_interval() const;

 private:
  struct Impl;
  explicit Watchdog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zcc::systemd

#endif  // ZCC_SYSTEMD_NOTIFY_H_
