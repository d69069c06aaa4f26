// Helpers shared by the benchmarks that run a real zccd: starting and stopping
// it on a private socket, shm prefix and checkpoint root; its memory as the
// kernel accounts it; the scratch directory; row selection (--only) and
// percentiles.
#ifndef ZCC_BENCH_HARNESS_H_
#define ZCC_BENCH_HARNESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zcc::bench {

// $ZCC_BENCH_DIR/<tag>-<pid> (or /tmp/...), created. Empty on failure.
std::string MakeScratchDir(const std::string& tag);

// Removes a directory tree (best effort).
void RemoveScratchDir(const std::string& dir);

// A zccd child process ($ZCC_ZCCD) with its own socket, checkpoint root and
// shm prefix inside `dir`; its output goes to <dir>/<tag>.log. SIGTERM and
// reaped on destruction.
class ZccdProcess {
 public:
  // Starts zccd and waits until its socket accepts connections.
  static absl::StatusOr<std::unique_ptr<ZccdProcess>> Start(
      const std::string& dir, const std::string& tag, std::vector<std::string> extra_flags = {});
  ~ZccdProcess();
  ZccdProcess(const ZccdProcess&) = delete;
  ZccdProcess& operator=(const ZccdProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  const std::string& shm_prefix() const { return shm_prefix_; }
  const std::string& log_path() const { return log_; }

  // VmHWM (peak resident set) and VmRSS from /proc/<pid>/status, in bytes;
  // 0 when unreadable.
  uint64_t PeakRssBytes() const;
  uint64_t RssBytes() const;
  // Sum of the sizes of this daemon's shared-memory segments in /dev/shm
  // (the staging slots and their control blocks).
  uint64_t StagingBytes() const;

  // SIGTERM, wait up to 60 s (then SIGKILL). Returns the exit status.
  int Stop();

 private:
  ZccdProcess() = default;
  pid_t pid_ = -1;
  std::string socket_, root_, shm_prefix_, log_;
};

// A field of /proc/<pid>/status in bytes ("VmHWM", "VmRSS", ...); 0 if absent.
uint64_t ProcStatusBytes(pid_t pid, const std::string& field);

// Row selection from --only=PATTERN (an extended regex): a row is wanted when
// there is no pattern, or the pattern matches the binary's name, or
// "<binary>:<row>".
class RowFilter {
 public:
  RowFilter(const std::string& binary, int argc, char** argv);
  bool Wants(const std::string& row) const;

 private:
  std::string binary_;
  bool all_ = true;
  std::unique_ptr<std::regex> pattern_;
};

// The p-quantile (0..1) by nearest rank; 0 for an empty vector.
double Percentile(std::vector<double> v, double p);
double Mean(const std::vector<double>& v);

// 1-minute load average from /proc/loadavg (-1 when unreadable).
double LoadAverage1();

}  // namespace zcc::bench

#endif  // ZCC_BENCH_HARNESS_H_
