#include "bench/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zcc::bench {

std::string MakeScratchDir(const std::string& tag) {
  const char* env = std::getenv("ZCC_BENCH_DIR");
  const std::string dir = absl::StrCat(env != nullptr && *env ? env : "/tmp", "/", tag, "-", ::getpid());
  if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0) return "";
  return dir;
}

void RemoveScratchDir(const std::string& dir) {
  if (dir.empty() || dir == "/") return;
  if (const char* keep = std::getenv("ZCC_BENCH_KEEP"); keep != nullptr && *keep == '1') {
    std::fprintf(stderr, "bench: kept %s (ZCC_BENCH_KEEP=1)\n", dir.c_str());
    return;
  }
  if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) {
    std::fprintf(stderr, "bench: could not remove %s\n", dir.c_str());
  }
}

namespace {

bool SocketAccepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZccdProcess>> ZccdProcess::Start(
    const std::string& dir, const std::string& tag, std::vector<std::string> extra_flags) {
  static std::atomic<int> counter{0};
  const char* zccd = std::getenv("ZCC_ZCCD");
  if (zccd == nullptr || *zccd == '\0') {
    return absl::FailedPreconditionError("set ZCC_ZCCD to the zccd binary (bench/run.sh does)");
  }
  std::unique_ptr<ZccdProcess> d(new ZccdProcess());
  d->socket_ = absl::StrCat(dir, "/", tag, ".sock");
  d->root_ = absl::StrCat(dir, "/", tag, "-ckpt");
  d->log_ = absl::StrCat(dir, "/", tag, ".log");
  d->shm_prefix_ = absl::StrCat("zccbench", ::getpid(), "x", counter++);
  if (d->socket_.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError("socket path too long: " + d->socket_);
  }
  std::vector<std::string> args = {zccd,
                                   "--socket=" + d->socket_,
                                   "--root=" + d->root_,
                                   "--shm_prefix=" + d->shm_prefix_,
                                   "--log_level=INFO"};
  for (std::string& f : extra_flags) args.push_back(std::move(f));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // no orphaned zccd if the benchmark is killed
    const int fd = ::open(d->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  d->pid_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      d->pid_ = -1;
      return absl::InternalError(
          absl::StrCat("zccd exited during start-up; its log ends:\n", Tail(d->log_, 2000)));
    }
    if (SocketAccepts(d->socket_)) return d;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("zccd did not accept connections within 30 s");
}

int ZccdProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

ZccdProcess::~ZccdProcess() { Stop(); }

uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) * 1024;  // kB
    }
  }
  return 0;
}

uint64_t ZccdProcess::PeakRssBytes() const { return pid_ > 0 ? ProcStatusBytes(pid_, "VmHWM") : 0; }
uint64_t ZccdProcess::RssBytes() const { return pid_ > 0 ? ProcStatusBytes(pid_, "VmRSS") : 0; }

uint64_t ZccdProcess::StagingBytes() const {
  uint64_t total = 0;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return 0;
  const std::string prefix = shm_prefix_ + ".";
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    struct stat st;
    if (::stat(absl::StrCat("/dev/shm/", e->d_name).c_str(), &st) == 0) total += st.st_size;
  }
  ::closedir(d);
  return total;
}

RowFilter::RowFilter(const std::string& binary, int argc, char** argv) : binary_(binary) {
  for (int i = 1; i < argc; ++i) {
    const char* flag = "--only=";
    if (std::strncmp(argv[i], flag, std::strlen(flag)) != 0) continue;
    const std::string pattern = argv[i] + std::strlen(flag);
    if (pattern.empty()) continue;
    try {
      pattern_ = std::make_unique<std::regex>(pattern, std::regex::extended);
      all_ = std::regex_search(binary_, *pattern_);
    } catch (const std::regex_error&) {
      std::fprintf(stderr, "%s: --only=%s is not a valid pattern; running every row\n",
                   binary_.c_str(), pattern.c_str());
      pattern_.reset();
      all_ = true;
    }
  }
}

bool RowFilter::Wants(const std::string& row) const {
  return all_ || pattern_ == nullptr || std::regex_search(binary_ + ":" + row, *pattern_);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(p * v.size());
  return v[std::min(v.size() - 1, rank)];
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

double LoadAverage1() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

}  // namespace zcc::bench
