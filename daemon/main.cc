// zccd: the per-node zcc daemon. Reads the config file (--config), applies
// the flags given on the command line over it, starts the server, and shuts
// down cleanly on SIGTERM or SIGINT.
#include <signal.h>

#include <cstdio>
#include <set>
#include <string>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "config/config_file.h"
#include "config/daemon_config.h"
#include "cuda/ipc_puller.h"
#include "common/status.h"
#include "daemon/control/fault_drills.h"
#include "daemon/control/server.h"
#include "shm/truncation_guard.h"

ABSL_FLAG(std::string, config, "", "text-format config file (schema: config/zccd_config.proto); "
                                   "flags given on the command line override it");
ABSL_FLAG(bool, print_default_config, false, "print a commented default config file and exit");
ABSL_FLAG(std::string, socket, "", "unix socket path (default: /run/zcc/zccd.sock as root, "
                                   "else $XDG_RUNTIME_DIR/zcc/zccd.sock or /tmp/zcc-<uid>/zccd.sock)");
ABSL_FLAG(std::string, root, "", "default checkpoint root (default: /var/lib/zcc/checkpoints "
                                 "as root, else ~/.local/share/zcc/checkpoints)");
ABSL_FLAG(std::string, allowed_roots, "",
          "comma-separated roots jobs may checkpoint under (default: the default root); "
          "s3://bucket/prefix names an object-store root, with its endpoint, region and "
          "credentials from the AWS_* environment");
ABSL_FLAG(std::string, shm_prefix, "zcc", "prefix of this daemon's shared-memory segment names");
ABSL_FLAG(uint32_t, slots, 3, "default staging slots per rank (2..8; 3 lets snapshots and the "
          "EMA go on while a checkpoint is written)");
ABSL_FLAG(uint32_t, keep_last, 3, "committed steps kept per job");
ABSL_FLAG(uint32_t, keep_every, 0, "also keep every N-th step (0 = off)");
ABSL_FLAG(uint64_t, staging_budget_mb, 0,
          "staging memory limit for all ranks, the peer tier's replicas counted (0 = none)");
ABSL_FLAG(uint64_t, staging_pool_mb, 0, "staging memory made ready before trainers register "
          "(within the budget; 0 = none)");
ABSL_FLAG(uint64_t, staging_pool_entry_mb, 0, "size of each piece of the staging pool "
          "(0 = sized by the registrations)");
ABSL_FLAG(double, commit_timeout_s, 600, "seconds a commit may wait for all ranks");
ABSL_FLAG(double, stop_timeout_s, 90, "seconds zccd may take to stop after SIGTERM before it "
          "abandons requests or writes that do not finish (keep below TimeoutStopSec)");
ABSL_FLAG(double, client_timeout_s, 30, "seconds without a trainer heartbeat before its "
                                         "registration is dropped");
ABSL_FLAG(double, retain_snapshots_s, 600, "seconds a dead or departed rank's newest snapshots "
          "stay in memory for a restore from memory (0 = off)");
ABSL_FLAG(bool, daemon_pull, false, "copy trainers' GPU tensors into the staging slots in zccd "
          "(their copy_backend cuda_ipc or auto) over CUDA IPC; one CUDA context per GPU");
ABSL_FLAG(std::string, status_listen, "", "host:port of a read-only TCP status + gRPC health "
                                          "listener (empty = off)");
ABSL_FLAG(std::string, metrics_listen, "", "host:port serving Prometheus metrics at /metrics "
                                           "(empty = off)");
ABSL_FLAG(std::string, metrics_textfile_dir, "", "node_exporter textfile collector directory "
                                                 "(empty = off)");
ABSL_FLAG(std::string, peer_listen, "", "host:port of the peer service (zccd to zccd: replicas of "
                                        "other nodes' snapshots; empty = off)");
ABSL_FLAG(std::string, peer_cert, "", "PEM file of this zccd's peer certificate (chain)");
ABSL_FLAG(std::string, peer_key, "", "PEM file of the peer certificate's private key");
ABSL_FLAG(std::string, peer_ca, "", "PEM file of the CA that signs every peer's certificate");
ABSL_FLAG(bool, peer_insecure, false, "peer service in plaintext without authentication instead "
          "of mutual TLS (tests only)");
ABSL_FLAG(std::string, node_name, "", "this zccd's name among its peers (empty = the host name)");
ABSL_FLAG(std::string, failure_domain, "", "this node's failure domain (a rack, a power feed); "
          "replicas go to other domains (empty = a domain of its own)");
ABSL_FLAG(uint64_t, replica_budget_mb, 8192, "memory for replicas held for other nodes");
ABSL_FLAG(uint32_t, replicate_every, 0, "replicate a rank's step to its buddies every this many "
          "snapshots (0 = at each step the job checkpoints, 1 = every step)");
ABSL_FLAG(uint32_t, replicas, 1, "buddies each node's replicas go to (1..8)");
ABSL_FLAG(uint64_t, replicate_mb_s, 0, "the most MB per second replication sends from this zccd "
          "(0 = no cap)");
ABSL_FLAG(double, check_buddies_s, 30, "every how many seconds the buddies are asked whether they "
          "still hold this node's newest replicated steps; what one dropped (its memory went to a "
          "trainer there) is pushed again (0 = never)");
ABSL_FLAG(uint32_t, push_connections, 8, "files sent to a buddy at a time, of one rank's step or "
          "of several ranks' (up to 8), each on a TCP connection of its own (1..64)");
ABSL_FLAG(std::string, peer_static, "", "comma-separated host:port of other zccds' peer services "
          "(a Kubernetes headless service's members, a Slurm host list); they count as nodes of "
          "every job, for the buddies and for recovery (empty = none)");
ABSL_FLAG(std::string, log_level, "INFO", "DEBUG, INFO, WARNING or ERROR");

namespace {

// Names of the flags given on the command line (this Abseil does not expose
// that), from "--name", "--name=value", "-name" and "--noname" arguments.
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}

void RecordGivenFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    a.remove_prefix(a[1] == '-' ? 2 : 1);
    a = a.substr(0, a.find('='));
    GivenFlags().emplace(a);
    if (a.size() > 2 && a.substr(0, 2) == "no") GivenFlags().emplace(a.substr(2));
  }
}

bool Given(const char* name) { return GivenFlags().count(name) > 0; }

// Flags given on the command line, over `c` (the config file's values).
void ApplyFlags(zcc::config::FullConfig& c) {
  zcc::daemon::DaemonConfig& d = c.daemon;
  if (Given("socket")) d.socket_path = absl::GetFlag(FLAGS_socket);
  if (Given("root")) d.default_root = absl::GetFlag(FLAGS_root);
  if (Given("allowed_roots")) {
    d.allowed_roots.clear();
    d.object_store_roots.clear();
    for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_allowed_roots), ',', absl::SkipEmpty())) {
      zcc::daemon::AddAllowedRoot(d, std::string(r));
    }
  }
  if (Given("shm_prefix")) d.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  if (Given("slots")) d.default_num_slots = absl::GetFlag(FLAGS_slots);
  if (Given("keep_last")) d.keep_last = absl::GetFlag(FLAGS_keep_last);
  if (Given("keep_every")) d.keep_every = absl::GetFlag(FLAGS_keep_every);
  if (Given("staging_budget_mb")) d.staging_budget_bytes = absl::GetFlag(FLAGS_staging_budget_mb) << 20;
  if (Given("staging_pool_mb")) d.staging_pool_bytes = absl::GetFlag(FLAGS_staging_pool_mb) << 20;
  if (Given("staging_pool_entry_mb")) {
    d.staging_pool_entry_bytes = absl::GetFlag(FLAGS_staging_pool_entry_mb) << 20;
  }
  if (Given("commit_timeout_s")) d.commit_timeout = absl::Seconds(absl::GetFlag(FLAGS_commit_timeout_s));
  if (Given("stop_timeout_s")) d.stop_timeout = absl::Seconds(absl::GetFlag(FLAGS_stop_timeout_s));
  if (Given("client_timeout_s")) d.client_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_timeout_s));
  if (Given("daemon_pull")) d.daemon_pull = absl::GetFlag(FLAGS_daemon_pull);
  if (Given("retain_snapshots_s")) {
    d.retain_snapshots = absl::Seconds(absl::GetFlag(FLAGS_retain_snapshots_s));
  }
  if (Given("status_listen")) c.ops.status_tcp_listen = absl::GetFlag(FLAGS_status_listen);
  if (Given("metrics_listen")) c.ops.metrics_http_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (Given("metrics_textfile_dir")) c.ops.metrics_textfile_dir = absl::GetFlag(FLAGS_metrics_textfile_dir);
  if (Given("peer_listen")) d.peer.listen = absl::GetFlag(FLAGS_peer_listen);
  if (Given("peer_cert")) d.peer.cert_file = absl::GetFlag(FLAGS_peer_cert);
  if (Given("peer_key")) d.peer.key_file = absl::GetFlag(FLAGS_peer_key);
  if (Given("peer_ca")) d.peer.ca_file = absl::GetFlag(FLAGS_peer_ca);
  if (Given("peer_insecure")) d.peer.insecure = absl::GetFlag(FLAGS_peer_insecure);
  if (Given("node_name")) d.peer.node_name = absl::GetFlag(FLAGS_node_name);
  if (Given("failure_domain")) d.peer.failure_domain = absl::GetFlag(FLAGS_failure_domain);
  if (Given("replica_budget_mb")) {
    d.peer.replica_budget_bytes = absl::GetFlag(FLAGS_replica_budget_mb) << 20;
  }
  if (Given("replicate_every")) d.peer.replicate_every = absl::GetFlag(FLAGS_replicate_every);
  if (Given("replicas")) d.peer.replicas = absl::GetFlag(FLAGS_replicas);
  if (Given("replicate_mb_s")) {
    d.peer.replicate_bytes_per_s = absl::GetFlag(FLAGS_replicate_mb_s) << 20;
  }
  if (Given("check_buddies_s")) {
    d.peer.check_buddies_every = absl::Seconds(absl::GetFlag(FLAGS_check_buddies_s));
  }
  if (Given("push_connections")) d.peer.push_connections = absl::GetFlag(FLAGS_push_connections);
  if (Given("peer_static")) {
    d.peer.static_peers.clear();
    for (absl::string_view address :
         absl::StrSplit(absl::GetFlag(FLAGS_peer_static), ',', absl::SkipEmpty())) {
      d.peer.static_peers.emplace_back(address);
    }
  }
  if (Given("log_level")) c.ops.log_level = absl::GetFlag(FLAGS_log_level);
}

// The configuration zccd runs with: the file (--config), the flags given on
// the command line over it, defaults filled in, every field checked.
absl::StatusOr<zcc::config::FullConfig> LoadConfig() {
  zcc::config::FullConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    // Flags win over the file; the file's checks see them applied.
    ZCC_ASSIGN_OR_RETURN(config,
                         zcc::config::LoadConfigFile(absl::GetFlag(FLAGS_config), config, ApplyFlags));
  }
  ApplyFlags(config);
  config.daemon.ema_threads = config.ops.ema_threads;
  config.daemon.writer_threads = config.ops.writer_threads;
  config.daemon = zcc::daemon::WithDefaults(config.daemon);
  ZCC_RETURN_IF_ERROR(zcc::config::ValidateFullConfig(config));
  return config;
}

// Serves until SIGTERM or SIGINT (blocked in every thread: `signals`), then
// shuts down, exiting regardless once `stop_timeout` has passed.
void ServeUntilSignalled(zcc::daemon::Server& server, const sigset_t& signals,
                         absl::Duration stop_timeout) {
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    ZCC_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT");
    // A disk that stops answering must not keep zccd from stopping: what has
    // not finished by the deadline is abandoned. Committed checkpoints are
    // intact (commits are atomic); the next start removes stale segments and
    // abandoned partial steps.
    std::thread([stop_timeout] {
      absl::SleepFor(stop_timeout);
      ZCC_LOG(ERROR) << "zccd did not stop within " << absl::FormatDuration(stop_timeout)
                     << " (a request or disk write that does not finish); exiting without it";
      std::_Exit(1);
    }).detach();
    server.Shutdown();
  });
  server.Wait();
  signal_thread.join();
}

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "zccd: %s\n", std::string(status.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "zccd: zero-cost checkpointing daemon (one per node)\n"
      "  zccd [--config FILE] [flags]    flags override the file\n"
      "  zccd --print_default_config     a commented config file to start from");
  // --help lists the flags defined in this file (Abseil's default looks for
  // a file named after the program, zccd.cc, and found none).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "daemon/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  RecordGivenFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_print_default_config)) {
    std::printf("%s", zcc::config::DefaultConfigText(zcc::config::FullConfig()).c_str());
    return 0;
  }
  absl::StatusOr<zcc::config::FullConfig> config = LoadConfig();
  if (!config.ok()) return Fail(2, config.status());
  if (auto level = zcc::config::ParseLogLevel(config->ops.log_level); level.ok()) {
    zcc::SetLogLevel(*level);
  }
  for (const std::string& ignored : config->ignored) ZCC_LOG(WARNING) << ignored;

  // Signals are taken by one thread with sigwait; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Trainers own their segments and can cut them short under zccd's
  // mappings: that costs their registration, not zccd.
  if (absl::Status guarded = zcc::shm::InstallTruncationGuard(); !guarded.ok()) {
    return Fail(1, guarded);
  }

  absl::StatusOr<zcc::daemon::FaultDrills> drills = zcc::daemon::FaultDrillsFromEnvironment();
  if (!drills.ok()) return Fail(2, drills.status());
  zcc::daemon::ServerOptions options;
  options.shard_storage = drills->storage.get();
  options.before_reserve = drills->before_reserve;
  options.pull_engine = zcc::NewPullEngine;
  options.status_tcp_listen = config->ops.status_tcp_listen;
  options.metrics_http_listen = config->ops.metrics_http_listen;
  options.metrics_textfile_dir = config->ops.metrics_textfile_dir;
  options.metrics_textfile_interval = config->ops.metrics_textfile_interval;
  auto server = zcc::daemon::Server::Start(config->daemon, options);
  if (!server.ok()) return Fail(1, server.status());
  ServeUntilSignalled(*server, signals, config->daemon.stop_timeout);
  ZCC_LOG(INFO) << "zccd stopped";
  return 0;
}
