// Test harness for integration tests that run the real zccd and real trainer
// processes: child processes with captured output, a zccd on a private socket,
// shm prefix and checkpoint root, and helpers to find the built binaries.
#ifndef ZCC_TESTS_PROCESS_HARNESS_H_
#define ZCC_TESTS_PROCESS_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace zcc::testing {

// Path of a binary built by this workspace (a data dependency of the test).
std::string Runfile(const std::string& workspace_relative);

// A child process with stdout and stderr captured to a file. Killed (SIGKILL)
// and reaped on destruction if still running.
class Subprocess {
 public:
  // `uid` >= 0 runs the child as that uid and gid (the test runs as root).
  Subprocess(std::vector<std::string> argv, std::string log_path, int uid = -1,
             std::vector<std::string> env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Exit code, or 128+signal; nullopt on timeout.
  std::optional<int> Wait(absl::Duration timeout);
  void Signal(int sig);
  bool running();
  std::string Output() const;
  // Waits until the output contains `text` (or the process exits / time runs out).
  bool WaitForOutput(const std::string& text, absl::Duration timeout);
  // "key=value" pairs from the last lines that contain them.
  std::map<std::string, std::string> Values() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> exit_code_;
};

struct DaemonOptions {
  std::vector<std::string> extra_flags;
  std::string root;  // checkpoint root; empty = <dir>/ckpt
  std::string name = "zccd";  // socket and log file names inside the directory
  std::vector<std::string> env;  // extra "NAME=value" environment entries
  std::string binary = "daemon/zccd";  // workspace-relative
  // Runs zccd under this argv prefix (a node's `ip netns exec`); empty: as is.
  std::vector<std::string> wrapper;
};

// A zccd with its own socket, shm prefix and checkpoint root.
class Daemon {
 public:
  explicit Daemon(const std::string& dir, DaemonOptions options = {});
  ~Daemon();

  // Starts zccd and waits until its socket accepts connections.
  bool Start();
  // SIGTERM and wait; returns the exit code.
  std::optional<int> Stop(absl::Duration timeout = absl::Seconds(30));
  void Kill();  // SIGKILL, no cleanup (a crash)

  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  const std::string& shm_prefix() const { return shm_prefix_; }
  std::string Log() const;        // every start's log, oldest first
  std::string LatestLog() const;  // the latest start's
  Subprocess* process() { return process_.get(); }

 private:
  std::string StartLog(int start) const;  // the log of start number `start`

  std::string dir_;
  std::string socket_;
  std::string root_;
  std::string shm_prefix_;
  DaemonOptions options_;
  std::unique_ptr<Subprocess> process_;
  int starts_ = 0;
};

// Runs the test trainer; flags are "--name=value" strings.
// `wrapper`: an argv prefix to run it under (a node's `ip netns exec`).
std::unique_ptr<Subprocess> StartTrainer(const Daemon& daemon, const std::string& log_dir,
                                         const std::string& tag, std::vector<std::string> flags,
                                         const std::vector<std::string>& wrapper = {});

// Names under /dev/shm that start with `prefix`.
std::vector<std::string> ShmSegments(const std::string& prefix);

// <root>/<job> of a daemon.
std::string JobDir(const Daemon& d, const std::string& job = "itest");

// Runs zccctl against `d` (as `uid` when >= 0); returns (exit code, output).
std::pair<int, std::string> Zccctl(const std::string& dir, const Daemon& d,
                                   std::vector<std::string> args, int uid = -1,
                                   const std::string& binary = "");

bool WaitForPath(const std::string& path, absl::Duration timeout);

// Flips a byte of the first tensor of safetensors file `path` (its size
// stays), so that its checksum no longer matches; false if it cannot.
bool DamageTensorByte(const std::string& path);

// Waits up to 30 s until `ranks` ranks of job `job` on `d` have `step` as
// their newest snapshot zccd took in (zccctl status); false if they do not.
bool WaitSnapshotted(const std::string& dir, const Daemon& d, const std::string& job,
                     int64_t step, int ranks = 1);

// The number `pattern`'s group 1 captures in the log of `d`'s latest start,
// waiting up to 5 s for it to appear (a listener's port zccd logs as it
// starts); 0 if none.
int PortFromLog(const Daemon& d, const std::string& pattern);

// A plain HTTP/1.1 GET of `path` from 127.0.0.1:`port`: the whole response,
// headers included ("" if nothing answers).
std::string HttpGet(int port, const std::string& path);

// The value of counter or gauge `name` (unlabelled) in zccd's Prometheus
// metrics on `port`, or -1 if it is not there.
double MetricValue(int port, const std::string& name);

}  // namespace zcc::testing

#endif  // ZCC_TESTS_PROCESS_HARNESS_H_
