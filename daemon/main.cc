// zccd: the per-node zcc daemon. Parses flags, starts the server, and shuts it
// down cleanly on SIGTERM or SIGINT.
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "daemon/config.h"
#include "daemon/server.h"

ABSL_FLAG(std::string, socket, "", "unix socket path (default: /run/zcc/zccd.sock as root, "
                                   "else $XDG_RUNTIME_DIR/zcc/zccd.sock or /tmp/zcc-<uid>/zccd.sock)");
ABSL_FLAG(std::string, root, "", "default checkpoint root (default: /var/lib/zcc/checkpoints "
                                 "as root, else ~/.local/share/zcc/checkpoints)");
ABSL_FLAG(std::string, allowed_roots, "",
          "comma-separated roots jobs may checkpoint under (default: the default root)");
ABSL_FLAG(std::string, shm_prefix, "zcc", "prefix of this daemon's shared-memory segment names");
ABSL_FLAG(uint32_t, slots, 2, "default staging slots per rank (2..8)");
ABSL_FLAG(uint32_t, keep_last, 3, "committed steps kept per job");
ABSL_FLAG(uint32_t, keep_every, 0, "also keep every N-th step (0 = off)");
ABSL_FLAG(uint64_t, staging_budget_mb, 0, "staging memory limit for all ranks (0 = none)");
ABSL_FLAG(double, commit_timeout_s, 600, "seconds a commit may wait for all ranks");
ABSL_FLAG(double, client_timeout_s, 30, "seconds without a trainer heartbeat before its "
                                         "registration is dropped");
ABSL_FLAG(std::string, log_level, "INFO", "DEBUG, INFO, WARNING or ERROR");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("zccd: zero-cost checkpointing daemon (one per node)");
  absl::ParseCommandLine(argc, argv);

  const std::string level = absl::GetFlag(FLAGS_log_level);
  zcc::SetLogLevel(level == "DEBUG"     ? zcc::LogLevel::kDebug
                   : level == "WARNING" ? zcc::LogLevel::kWarning
                   : level == "ERROR"   ? zcc::LogLevel::kError
                                        : zcc::LogLevel::kInfo);

  zcc::daemon::DaemonConfig config;
  config.socket_path = absl::GetFlag(FLAGS_socket);
  config.default_root = absl::GetFlag(FLAGS_root);
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_allowed_roots), ',', absl::SkipEmpty())) {
    config.allowed_roots.emplace_back(r);
  }
  config.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  config.default_num_slots = absl::GetFlag(FLAGS_slots);
  config.keep_last = absl::GetFlag(FLAGS_keep_last);
  config.keep_every = absl::GetFlag(FLAGS_keep_every);
  config.staging_budget_bytes = absl::GetFlag(FLAGS_staging_budget_mb) << 20;
  config.commit_timeout = absl::Seconds(absl::GetFlag(FLAGS_commit_timeout_s));
  config.client_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_timeout_s));

  // Signals are taken by one thread with sigwait; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = zcc::daemon::Server::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "zccd: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    ZCC_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server->Shutdown();
  });
  server->Wait();
  signal_thread.join();
  ZCC_LOG(INFO) << "zccd stopped";
  return 0;
}
