#include "tests/process_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/eventually.h"

namespace zcc::testing {

std::string Runfile(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir != nullptr) return absl::StrCat(srcdir, "/zcc/", workspace_relative);
  return workspace_relative;
}

Subprocess::Subprocess(std::vector<std::string> argv, std::string log_path, int uid,
                       std::vector<std::string> env)
    : log_path_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    if (uid >= 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) {
      std::fprintf(stderr, "cannot become uid %d: %s\n", uid, std::strerror(errno));
      _exit(126);
    }
    for (std::string& e : env) putenv(e.data());
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exit_code_.has_value()) kill(pid_, sig);
}

bool Subprocess::running() { return !Wait(absl::ZeroDuration()).has_value(); }

std::string Subprocess::Output() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Subprocess::WaitForOutput(const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (absl::StrContains(Output(), text)) return true;
    if (!running()) return absl::StrContains(Output(), text);
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

std::map<std::string, std::string> Subprocess::Values() const {
  std::map<std::string, std::string> values;
  for (absl::string_view line : absl::StrSplit(Output(), '\n')) {
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t eq = word.find('=');
      if (eq == absl::string_view::npos || eq == 0) continue;
      values[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
    }
  }
  return values;
}

namespace {

// A shared-memory prefix no other Daemon uses, in this process or another:
// tests run side by side in sandboxes of their own, each with its own pid
// namespace (so the same pids) and the same /dev/shm.
std::string UniqueShmPrefix() {
  std::random_device random;
  const uint64_t bits = (uint64_t{random()} << 32) | random();
  return absl::StrCat("zccit", getpid(), "x", absl::Hex(bits));
}

}  // namespace

Daemon::Daemon(const std::string& dir, DaemonOptions options)
    : dir_(dir),
      socket_(dir + "/" + options.name + ".sock"),
      root_(options.root.empty() ? dir + "/ckpt" : options.root),
      shm_prefix_(UniqueShmPrefix()),
      options_(std::move(options)) {}

Daemon::~Daemon() {
  if (process_ != nullptr && process_->running()) Kill();
  // What a zccd killed last (a crash test, or a test that failed midway)
  // left under its prefix: staging segments and its unlocked lock file.
  // Nothing else uses the prefix, which is this object's own.
  if (process_ != nullptr) {
    for (const std::string& name : ShmSegments(shm_prefix_ + ".")) shm_unlink(name.c_str());
    ::unlink(absl::StrCat("/dev/shm/.zccd.", shm_prefix_, ".lock").c_str());
  }
}

bool Daemon::Start() {
  std::vector<std::string> argv = options_.wrapper;
  for (std::string a : {Runfile(options_.binary), "--socket=" + socket_, "--root=" + root_,
                        "--shm_prefix=" + shm_prefix_, std::string("--client_timeout_s=5"),
                        std::string("--commit_timeout_s=60")}) {
    argv.push_back(std::move(a));
  }
  for (const auto& f : options_.extra_flags) argv.push_back(f);
  process_ = std::make_unique<Subprocess>(
      argv, absl::StrCat(dir_, "/", options_.name, ".", starts_++, ".log"), -1, options_.env);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (!process_->running()) return false;
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    const bool ok = ::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

std::optional<int> Daemon::Stop(absl::Duration timeout) {
  const absl::Time began = absl::Now();
  process_->Signal(SIGTERM);
  const std::optional<int> code = process_->Wait(timeout);
  if (code != 0) {
    // What the test's check cannot say: how it ended, and what zccd was
    // doing meanwhile.
    const std::string log = LatestLog();
    const size_t tail = log.size() > 6000 ? log.size() - 6000 : 0;
    std::fprintf(stderr, "%s %s after SIGTERM (%s); the end of its log:\n%s\n",
                 options_.name.c_str(),
                 code.has_value() ? absl::StrCat("exited with ", *code).c_str()
                                  : "still running",
                 absl::FormatDuration(absl::Now() - began).c_str(), log.substr(tail).c_str());
  }
  return code;
}

void Daemon::Kill() {
  process_->Signal(SIGKILL);
  process_->Wait(absl::Seconds(10));
}

std::string Daemon::StartLog(int start) const {
  std::ifstream in(absl::StrCat(dir_, "/", options_.name, ".", start, ".log"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Daemon::LatestLog() const { return starts_ == 0 ? "" : StartLog(starts_ - 1); }

std::string Daemon::Log() const {
  std::string all;
  for (int i = 0; i < starts_; ++i) all += StartLog(i);
  return all;
}

std::unique_ptr<Subprocess> StartTrainer(const Daemon& daemon, const std::string& log_dir,
                                         const std::string& tag, std::vector<std::string> flags,
                                         const std::vector<std::string>& wrapper) {
  std::vector<std::string> argv = wrapper;
  for (std::string a : {Runfile("tests/test_trainer"), "--socket=" + daemon.socket(),
                        "--root=" + daemon.root()}) {
    argv.push_back(std::move(a));
  }
  for (auto& f : flags) argv.push_back(std::move(f));
  return std::make_unique<Subprocess>(argv, absl::StrCat(log_dir, "/", tag, ".log"));
}

std::vector<std::string> ShmSegments(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (struct dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) names.emplace_back(e->d_name);
  }
  closedir(dir);
  return names;
}

std::string JobDir(const Daemon& d, const std::string& job) { return d.root() + "/" + job; }

std::pair<int, std::string> Zccctl(const std::string& dir, const Daemon& d,
                                   std::vector<std::string> args, int uid,
                                   const std::string& binary) {
  static std::atomic<int> n{0};
  std::vector<std::string> argv = {binary.empty() ? Runfile("tools/zccctl") : binary, "--socket",
                                   d.socket()};
  for (auto& a : args) argv.push_back(a);
  Subprocess p(argv, absl::StrCat(dir, "/zccctl.", n++, ".log"), uid);
  auto code = p.Wait(absl::Seconds(60));
  return {code.value_or(-1), p.Output()};
}

bool WaitSnapshotted(const std::string& dir, const Daemon& d, const std::string& job,
                     int64_t step, int ranks) {
  return zcc::testing::Eventually(
      [&] {
        auto [code, out] = Zccctl(dir, d, {"--json", "status", job});
        const auto status = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
        if (code != 0 || !status.is_object()) return false;
        int at_step = 0;
        for (const auto& j : status.value("jobs", nlohmann::json::array())) {
          for (const auto& rank : j.value("ranks", nlohmann::json::array())) {
            at_step += rank.value("last_snapshot_step", int64_t{-2}) == step ? 1 : 0;
          }
        }
        return at_step >= ranks;
      },
      absl::Seconds(30), absl::Milliseconds(20));
}

bool DamageTensorByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  if (!f.read(reinterpret_cast<char*>(&header), sizeof(header))) return false;
  const std::streamoff at = static_cast<std::streamoff>(sizeof(header) + header + 3);
  char c = 0;
  if (!f.seekg(at) || !f.read(&c, 1)) return false;
  c ^= 0x40;
  return static_cast<bool>(f.seekp(at) && f.write(&c, 1) && f.flush());
}

bool WaitForPath(const std::string& path, absl::Duration timeout) {
  return Eventually([&] { return access(path.c_str(), F_OK) == 0; }, timeout);
}

int PortFromLog(const Daemon& d, const std::string& pattern) {
  std::smatch m;
  const std::regex re(pattern);
  for (int i = 0; i < 500; ++i) {
    const std::string log = d.LatestLog();
    if (std::regex_search(log, m, re)) return std::stoi(m[1]);
    absl::SleepFor(absl::Milliseconds(10));
  }
  return 0;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  struct sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

double MetricValue(int port, const std::string& name) {
  const std::string http = HttpGet(port, "/metrics");
  for (absl::string_view line : absl::StrSplit(http, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(absl::StripTrailingAsciiWhitespace(line), &value)) return value;
  }
  return -1;
}

}  // namespace zcc::testing
