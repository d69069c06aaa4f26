// End-to-end overhead of checkpointing on a synthetic training loop, and
// zccd's peak memory against the bytes it must hold.
//
// The loop, per step: "forward/backward" (the compute below), then
// FenceBeforeUpdate (zcc only), an "optimizer step" that changes every tensor
// (a strided update: cheap, so that the compute dominates), then Snapshot
// (zcc) or, every 10th step, a synchronous save. Step time = wall time of the
// whole step; the figure of a run is the mean over 20 measured steps (two
// whole save intervals, so each synchronous save in the window is paid in
// full). The measured steps follow a warm-up: 10 steps for zcc (EMA
// initialisation, the first checkpoint, first touch of the staging slots),
// 3 for the others (no save in it).
//
// The model: bf16 parameters plus fp32 master weights and Adam moments (14
// bytes per parameter element, ~150 tensors) and a small RNG blob: 1 GiB in
// all (--quick: 256 MiB), in one shared-memory mapping (memfd) so that the
// Python helper can read the same bytes without a copy.
//
// Two kinds of compute, each measured with every variant:
//  * cpu: a fixed amount of arithmetic (a multiply-add chain over a 32 KiB
//    working set) on the trainer thread, calibrated at start to ~200 ms a
//    step (--quick: 100 ms). The trainer's core is busy, so zcc's memcpy
//    (HostCopier: no GPU here), its EMA and its writes compete with it for
//    the remaining core(s) and for memory bandwidth: the CPU-only worst case.
//  * sleep: the compute is a sleep of the same length, standing in for
//    accelerator time. On a GPU node the host cores are idle during
//    forward/backward and the device-to-host copies are DMA on a side stream;
//    the sleep gives the host the same idle time (the copies here are still
//    memcpy on a CPU core).
//
// Variants, measured in the same process on the same state, interleaved in
// rounds (the order reversed every other round):
//  * none:     no checkpointing.
//  * zcc:      snapshot every step (kFull), EMA every step (ema_decay 0.999),
//              checkpoint every 10 steps, against a zccd started by the
//              benchmark (a fresh one per run).
//  * zcc_replicated (sleep only): zcc, plus the peer tier: every 5th step
//              replicated to a buddy zccd on loopback (plaintext), which the
//              trainer's zccd knows as a static peer.
//  * sync_cpp: every 10 steps the trainer thread writes the same tensors as
//              one safetensors file (buffered write(2) + fsync), then removes
//              the previous file: what a plain synchronous save costs.
//  * sync_py:  every 10 steps `safetensors.numpy.save_file` of the same
//              tensors + os.fsync, in a Python helper (bench/e2e/sync_save.py)
//              that maps the trainer's memory; the trainer waits for it.
//              bf16 tensors are handed over as uint16 arrays (numpy has no
//              bf16): the same bytes, labelled U16 in the header.
//
// Rows: e2e_<cpu|sleep>_step_time_<variant>_vs_none (ratio = none/variant,
// so 1.0 = no overhead; target >= 0.99 for zcc); e2e_<mode>_zcc_snapshots_enqueued
// (ratio = enqueued/steps over the measured steps: a snapshot skipped because
// no slot was free misses its EMA update); daemon_rss_vs_held (ratio =
// (held + 64 MiB) / zccd's VmHWM, where held = its staging segments (their
// full size in /dev/shm) + its EMA buffers, double-buffered by default: 2 x
// fp32 per bf16 parameter element; target >= 1/1.05); daemon_footprint_vs_held
// (the same, with the daemon's sampled peak of RssAnon + RssFile plus every
// staging byte in place of VmHWM, which counts only the staging pages zccd
// itself touched). The memory rows take the largest figures over all zcc runs.
//
// Environment: ZCC_ZCCD (zccd), ZCC_BENCH_DIR (scratch directory on the disk
// under test), PYTHON (default python3), ZCC_BENCH_SYNC_SAVE_PY (the helper;
// default: from the runfiles, else bench/e2e/sync_save.py). Flags: --quick,
// --only=PATTERN (extended regex over "e2e_bench:<row>").
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/harness.h"
#include "bench/report.h"
#include "client/client.h"
#include "tests/s3_test_server.h"
#include "format/safetensors.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSaveEvery = 10;
// The replicated variant: every 5th snapshot goes to the buddy.
constexpr int kReplicateEvery = 5;
// zcc: EMA initialisation, the first checkpoint, first touch of the slots.
// The others need little (no save in their warm-up: it would only cost time).
constexpr int kZccWarmupSteps = 10;
constexpr int kOtherWarmupSteps = 3;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "e2e_bench: %s\n", what.c_str());
  std::exit(1);
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------- model state

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  TensorKind kind;
  uint64_t offset = 0;  // in the state mapping
  uint64_t nbytes = 0;
  uint64_t elements = 0;
};

struct State {
  int fd = -1;  // memfd (close-on-exec; cleared in the Python helper's child)
  uint8_t* base = nullptr;
  uint64_t bytes = 0;       // mapping size
  uint64_t data_bytes = 0;  // sum of tensor bytes
  uint64_t param_elements = 0;
  std::vector<Tensor> tensors;

  uint8_t* data(const Tensor& t) const { return base + t.offset; }
};

// ~4 tensors per parameter (bf16 weight, fp32 master, exp_avg, exp_avg_sq) of
// row-major shape {rows, 256}, plus an RNG blob, at 4 KiB-aligned offsets.
State BuildState(uint64_t total_bytes, int num_tensors) {
  State s;
  const int params = std::max(1, (num_tensors - 1) / 4);
  const int64_t cols = 256;
  const int64_t rows = std::max<int64_t>(1, total_bytes / 14 / params / cols);
  uint64_t at = 0;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, TensorKind kind) {
    Tensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.kind = kind;
    t.elements = 1;
    for (int64_t d : t.shape) t.elements *= d;
    t.nbytes = t.elements * format::DTypeSize(dtype);
    t.offset = at;
    at = (at + t.nbytes + 4095) / 4096 * 4096;
    s.data_bytes += t.nbytes;
    s.tensors.push_back(std::move(t));
  };
  static const char* kProj[] = {"attn.qkv", "attn.out", "mlp.up", "mlp.down"};
  for (int p = 0; p < params; ++p) {
    const std::string w = absl::StrCat("model.layers.", p / 4, ".", kProj[p % 4], ".weight");
    add(w, DType::kBF16, {rows, cols}, TensorKind::kParam);
    s.param_elements += rows * cols;
    for (const char* st : {"master", "exp_avg", "exp_avg_sq"}) {
      add(absl::StrCat("optimizer.", w, ".", st), DType::kF32, {rows, cols}, TensorKind::kOptim);
    }
  }
  add("rng_state", DType::kU8, {5056}, TensorKind::kExtra);
  s.bytes = std::max<uint64_t>(at, 4096);
  s.fd = ::memfd_create("zcc-e2e-state", MFD_CLOEXEC);
  if (s.fd < 0 || ::ftruncate(s.fd, static_cast<off_t>(s.bytes)) != 0) Die("memfd_create failed");
  void* m = ::mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
  if (m == MAP_FAILED) Die("mmap of the state failed");
  s.base = static_cast<uint8_t*>(m);
  // Finite values everywhere (a non-finite parameter would make the EMA skip).
  std::mt19937 rng(42);
  for (const Tensor& t : s.tensors) {
    uint8_t* p = s.data(t);
    if (t.dtype == DType::kBF16) {
      auto* h = reinterpret_cast<uint16_t*>(p);
      for (uint64_t i = 0; i < t.elements; ++i) h[i] = 0x3f00 | (rng() & 0x807f);  // +-[0.5, 1)
    } else if (t.dtype == DType::kF32) {
      auto* f = reinterpret_cast<uint32_t*>(p);
      for (uint64_t i = 0; i < t.elements; ++i) f[i] = 0x3f000000u | (rng() & 0x807fffffu);
    } else {
      for (uint64_t i = 0; i < t.nbytes; ++i) p[i] = static_cast<uint8_t>(rng());
    }
  }
  return s;
}

// The "optimizer step": one element in every 64 KiB of every tensor changes
// (to a finite value), plus the first element: each step's state differs.
void OptimizerStep(const State& s, int64_t step) {
  for (const Tensor& t : s.tensors) {
    uint8_t* p = s.data(t);
    const uint64_t esize = format::DTypeSize(t.dtype);
    const uint64_t stride = std::max<uint64_t>(1, 65536 / esize);
    for (uint64_t i = (step * 97) % stride; i < t.elements; i += stride) {
      if (t.dtype == DType::kBF16) {
        reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(0x3f80 | ((step + i) & 0x7f));
      } else if (t.dtype == DType::kF32) {
        reinterpret_cast<float*>(p)[i] = static_cast<float>(step) * 1e-3f;
      } else {
        p[i] = static_cast<uint8_t>(step);
      }
    }
    if (t.dtype == DType::kBF16) reinterpret_cast<uint16_t*>(p)[0] = 0x3f80 | (step & 0x7f);
  }
}

// ---------------------------------------------------------------- compute

constexpr size_t kWorkingSet = 8192;  // floats: 32 KiB

// `passes` passes of a multiply-add over the working set: arithmetic on the
// trainer thread, in cache, so memory traffic from elsewhere slows it only
// through shared resources, not by design.
__attribute__((noinline)) float Burn(float* ws, int64_t passes) {
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < kWorkingSet; ++i) ws[i] = ws[i] * 0.99990f + 0.00013f;
    asm volatile("" : : "r"(ws) : "memory");
  }
  return ws[passes % kWorkingSet];
}

struct Compute {
  bool cpu = true;
  int64_t passes = 0;
  double target_s = 0;
  std::vector<float> ws = std::vector<float>(kWorkingSet, 1.0f);
  volatile float sink = 0;

  void Run() {
    if (cpu) {
      sink = Burn(ws.data(), passes);
    } else {
      absl::SleepFor(absl::Seconds(target_s));
    }
  }
};

// Passes for `target_s` seconds of Burn: the fastest of several trials (the
// least disturbed by other processes), so the step is ~target_s on a quiet core.
int64_t CalibratePasses(double target_s) {
  std::vector<float> ws(kWorkingSet, 1.0f);
  int64_t passes = 64;
  double s = 0;
  while (true) {  // grow until one trial takes >= 20 ms
    const auto t = Clock::now();
    Burn(ws.data(), passes);
    s = SecondsSince(t);
    if (s >= 0.02) break;
    passes *= 2;
  }
  double best = 1e30;
  for (int i = 0; i < 7; ++i) {
    const auto t = Clock::now();
    Burn(ws.data(), passes);
    best = std::min(best, SecondsSince(t));
  }
  return std::max<int64_t>(1, static_cast<int64_t>(passes * target_s / best));
}

// ---------------------------------------------------------------- synchronous saves

class CppSaver {
 public:
  CppSaver(const State& s, std::string dir) : state_(s), dir_(std::move(dir)) {
    std::vector<format::SafetensorsTensor> entries;
    uint64_t at = 0;
    for (const Tensor& t : s.tensors) {
      entries.push_back({t.name, t.dtype, t.shape, at, at + t.nbytes});
      at += t.nbytes;
    }
    auto header = format::EncodeSafetensorsHeader(entries, {{"format", "pt"}}, 8);
    if (!header.ok()) Die("safetensors header: " + std::string(header.status().message()));
    header_ = *header;
  }

  // Writes step-N.safetensors (buffered write + fsync), removes the previous one.
  double Save(int64_t step) {
    const auto start = Clock::now();
    const std::string path = absl::StrCat(dir_, "/cpp-step-", step, ".safetensors");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
    WriteAll(fd, reinterpret_cast<const uint8_t*>(header_.data()), header_.size());
    for (const Tensor& t : state_.tensors) WriteAll(fd, state_.data(t), t.nbytes);
    if (::fsync(fd) != 0) Die("fsync failed");
    ::close(fd);
    if (!previous_.empty()) ::unlink(previous_.c_str());
    previous_ = path;
    return SecondsSince(start);
  }

  ~CppSaver() {
    if (!previous_.empty()) ::unlink(previous_.c_str());
  }

 private:
  static void WriteAll(int fd, const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, std::min<uint64_t>(n, uint64_t{64} << 20));
      if (w <= 0) Die(absl::StrCat("write failed: ", std::strerror(errno)));
      p += w;
      n -= static_cast<uint64_t>(w);
    }
  }

  const State& state_;
  std::string dir_;
  std::string header_;
  std::string previous_;
};

// The Python helper: a child process reading "save PATH PREVIOUS" lines and
// answering "ok SECONDS" when the file is written and fsync'ed.
class PySaver {
 public:
  static std::unique_ptr<PySaver> Start(const State& s, const std::string& dir,
                                        const std::string& argv0) {
    std::string script;
    if (const char* env = std::getenv("ZCC_BENCH_SYNC_SAVE_PY"); env != nullptr && *env) {
      script = env;
    } else {
      for (const std::string& c : {argv0 + ".runfiles/zcc/bench/e2e/sync_save.py",
                                   std::string("bench/e2e/sync_save.py")}) {
        if (::access(c.c_str(), R_OK) == 0) {
          script = c;
          break;
        }
      }
    }
    if (script.empty()) {
      std::fprintf(stderr, "e2e_bench: bench/e2e/sync_save.py not found; no sync_py rows\n");
      return nullptr;
    }
    const char* py_env = std::getenv("PYTHON");
    const std::string python = py_env != nullptr && *py_env ? py_env : "python3";
    // The layout the helper maps: name dtype offset nbytes dims...
    const std::string layout = dir + "/layout.txt";
    FILE* f = std::fopen(layout.c_str(), "w");
    if (f == nullptr) Die("cannot write " + layout);
    for (const Tensor& t : s.tensors) {
      std::fprintf(f, "%s %s %" PRIu64 " %" PRIu64, t.name.c_str(),
                   std::string(format::DTypeName(t.dtype)).c_str(), t.offset, t.nbytes);
      for (int64_t d : t.shape) std::fprintf(f, " %" PRId64, d);
      std::fprintf(f, "\n");
    }
    std::fclose(f);

    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) Die("pipe");
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) Die("fork");
    if (pid == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      const int flags = ::fcntl(s.fd, F_GETFD);
      ::fcntl(s.fd, F_SETFD, flags & ~FD_CLOEXEC);
      const std::string fd_arg = absl::StrCat("--fd=", s.fd);
      const std::string size_arg = absl::StrCat("--size=", s.bytes);
      const std::string layout_arg = "--layout=" + layout;
      ::execlp(python.c_str(), python.c_str(), script.c_str(), fd_arg.c_str(), size_arg.c_str(),
               layout_arg.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    std::unique_ptr<PySaver> saver(new PySaver());
    saver->pid_ = pid;
    saver->dir_ = dir;
    saver->in_ = ::fdopen(to_child[1], "w");
    saver->out_ = ::fdopen(from_child[0], "r");
    const std::string hello = saver->ReadLine();
    if (hello.rfind("ready", 0) != 0) {
      std::fprintf(stderr, "e2e_bench: the Python helper did not start (%s); no sync_py rows\n",
                   hello.empty() ? "no answer" : hello.c_str());
      return nullptr;
    }
    std::fprintf(stderr, "e2e_bench: python helper: %s\n", hello.c_str());
    return saver;
  }

  // Asks for step-N.safetensors and waits; returns the trainer's wait in
  // seconds (the helper's own timing is logged).
  double Save(int64_t step) {
    const auto start = Clock::now();
    const std::string path = absl::StrCat(dir_, "/py-step-", step, ".safetensors");
    std::fprintf(in_, "save %s %s\n", path.c_str(), previous_.empty() ? "-" : previous_.c_str());
    std::fflush(in_);
    const std::string answer = ReadLine();
    if (answer.rfind("ok", 0) != 0) Die("python helper: " + answer);
    previous_ = path;
    return SecondsSince(start);
  }

  ~PySaver() {
    if (in_ != nullptr) {
      if (!previous_.empty()) {
        std::fprintf(in_, "remove %s\n", previous_.c_str());
        std::fflush(in_);
        (void)ReadLine();
      }
      std::fclose(in_);
    }
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }

 private:
  PySaver() = default;
  std::string ReadLine() {
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), out_) == nullptr) return "";
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }

  pid_t pid_ = -1;
  std::string dir_;
  std::string previous_;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// ---------------------------------------------------------------- runs

enum class Variant { kNone, kZcc, kZccTiered, kZccReplicated, kSyncCpp, kSyncPy };
const char* VariantName(Variant v) {
  switch (v) {
    case Variant::kNone: return "none";
    case Variant::kZcc: return "zcc";
    case Variant::kZccTiered: return "zcc_tiered";
    case Variant::kZccReplicated: return "zcc_replicated";
    case Variant::kSyncCpp: return "sync_cpp";
    case Variant::kSyncPy: return "sync_py";
  }
  return "?";
}

struct RunResult {
  std::vector<double> step_s;  // measured steps only
  std::vector<double> save_s;  // synchronous saves in the measured window
  // zcc only
  std::vector<double> snapshot_us;
  std::vector<double> fence_us;
  uint64_t snapshots_taken = 0;     // measured steps
  uint64_t snapshots_enqueued = 0;  // of those, not skipped
  uint64_t skipped_no_slot = 0;
  uint64_t daemon_peak_rss = 0;     // VmHWM
  uint64_t daemon_peak_private = 0;  // sampled peak of RssAnon + RssFile
  double daemon_cpu_s = 0;           // zccd's user + system CPU seconds
  uint64_t daemon_held = 0;
  std::string skipped_steps;
  uint64_t staging_bytes = 0;
  uint64_t ema_bytes = 0;
  double checkpoint_gbps = 0;
  int64_t committed_step = -1;
  int uploads = 0;  // tiered: steps zccd uploaded during the run
  int replicated = 0;  // replicated: steps pushed to the buddy during the run
};

struct Context {
  State* state;
  std::string dir;
  int steps_measured;
  CppSaver* cpp;
  PySaver* py;
  // The tiered variant's object-store root (an S3 server the benchmark
  // starts, zccd's environment naming it); empty when not run.
  std::string upload_root;
};

// A zccd's log, whole ("" if unreadable).
std::string ReadLog(const std::string& log_path) {
  std::string text;
  if (FILE* f = std::fopen(log_path.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

int Occurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// What zccd's log says it uploaded: "upload job=... step=N" lines, and
// whether step `step` is among them.
int UploadsLogged(const std::string& log_path, int64_t step = -1, bool* found = nullptr) {
  const std::string text = ReadLog(log_path);
  if (found != nullptr) *found = absl::StrContains(text, absl::StrCat(" step=", step, " bytes="));
  return Occurrences(text, "upload job=");
}

// How many "replicated job=..." lines (one per step pushed to the buddies)
// zccd's log has.
int ReplicationsLogged(const std::string& log_path) {
  return Occurrences(ReadLog(log_path), "replicated job=");
}

// A free TCP port on 127.0.0.1 (for the buddy zccd's peer listener).
int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// Samples zccd's RssAnon + RssFile every 10 ms (VmHWM has no private-only
// counterpart): the peak of what the daemon holds beyond the shared segments.
class PrivateMemorySampler {
 public:
  explicit PrivateMemorySampler(pid_t pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            const uint64_t v = ProcStatusBytes(pid, "RssAnon") + ProcStatusBytes(pid, "RssFile");
            if (v > peak_.load()) peak_.store(v);
            absl::SleepFor(absl::Milliseconds(10));
          }
        }) {}
  ~PrivateMemorySampler() { Stop(); }
  uint64_t Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_.load();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

// User + system CPU seconds of a process, from /proc/<pid>/stat.
double ProcessCpuSeconds(pid_t pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[2048];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // after the command name
  if (p == nullptr) return 0;
  unsigned long long utime = 0, stime = 0;
  // Fields 3..13 skipped, then utime (14) and stime (15).
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                  &stime) != 2) {
    return 0;
  }
  return double(utime + stime) / ::sysconf(_SC_CLK_TCK);
}

RunResult Run(Context& ctx, Compute& compute, Variant variant, const std::string& tag) {
  RunResult r;
  const State& s = *ctx.state;
  std::unique_ptr<ZccdProcess> daemon;
  std::unique_ptr<ZccdProcess> buddy;
  std::unique_ptr<Client> client;
  std::unique_ptr<PrivateMemorySampler> sampler;
  const bool zcc = variant == Variant::kZcc || variant == Variant::kZccTiered ||
                   variant == Variant::kZccReplicated;
  const bool tiered = variant == Variant::kZccTiered;
  const bool replicated = variant == Variant::kZccReplicated;
  if (zcc) {
    std::vector<std::string> flags;
    if (tiered) flags.push_back("--allowed_roots=" + ctx.upload_root);
    if (replicated) {
      // A buddy zccd on loopback (plaintext: the benchmark measures the
      // trainer's step, not TLS), holding every 5th step of this one's rank.
      const int port = FreeLoopbackPort();
      const std::string budget = absl::StrCat("--replica_budget_mb=",
                                              3 * (s.data_bytes >> 20) + 64);
      auto b = ZccdProcess::Start(ctx.dir, tag + "-buddy",
                                  {absl::StrCat("--peer_listen=127.0.0.1:", port), "--peer_insecure",
                                   "--node_name=buddy", "--failure_domain=rack-2", budget});
      if (!b.ok()) Die(std::string(b.status().message()));
      buddy = std::move(b).value();
      for (std::string f : {std::string("--peer_listen=127.0.0.1:0"), std::string("--peer_insecure"),
                            std::string("--node_name=trainer"), std::string("--failure_domain=rack-1"),
                            absl::StrCat("--replicate_every=", kReplicateEvery),
                            absl::StrCat("--peer_static=127.0.0.1:", port), budget}) {
        flags.push_back(std::move(f));
      }
    }
    auto d = ZccdProcess::Start(ctx.dir, tag, flags);
    if (!d.ok()) Die(std::string(d.status().message()));
    daemon = std::move(d).value();
    sampler = std::make_unique<PrivateMemorySampler>(daemon->pid());
    ClientOptions o;
    o.socket_path = daemon->socket();
    o.job_id = tag;
    o.save_every = kSaveEvery;
    o.ema_decay = 0.999f;
    o.ema_interval = 1;
    // Tiered: every checkpoint also goes to the store, in the background.
    if (tiered) o.upload_root = ctx.upload_root;
    auto c = Client::Connect(o);
    if (!c.ok()) Die("connect: " + std::string(c.status().message()));
    client = std::move(c).value();
    std::vector<TensorRef> refs;
    for (const Tensor& t : s.tensors) {
      refs.push_back({t.name, t.dtype, t.shape, s.data(t), t.kind, t.kind == TensorKind::kParam});
    }
    const absl::Status st = client->RegisterTensors(refs);
    if (!st.ok() || !client->Stats().connected) {
      Die("register: " + (st.ok() ? client->Stats().last_error : std::string(st.message())));
    }
  }
  const int warmup = zcc ? kZccWarmupSteps : kOtherWarmupSteps;
  const int total = warmup + ctx.steps_measured;  // a multiple of kSaveEvery measured
  for (int64_t step = 1; step <= total; ++step) {
    const bool measured = step > warmup;
    const auto start = Clock::now();
    compute.Run();
    if (client != nullptr) {
      const auto f = Clock::now();
      (void)client->FenceBeforeUpdate();
      if (measured) r.fence_us.push_back(SecondsSince(f) * 1e6);
    }
    OptimizerStep(s, step);
    if (client != nullptr) {
      const auto t = Clock::now();
      const SnapshotResult res = client->Snapshot(step);
      const double us = SecondsSince(t) * 1e6;
      if (measured) {
        r.snapshot_us.push_back(us);
        ++r.snapshots_taken;
        r.snapshots_enqueued += res == SnapshotResult::kEnqueued;
      }
      if (res != SnapshotResult::kEnqueued) absl::StrAppend(&r.skipped_steps, " ", step);
    }
    if (step % kSaveEvery == 0 && measured) {
      double save = -1;
      if (variant == Variant::kSyncCpp) save = ctx.cpp->Save(step);
      if (variant == Variant::kSyncPy) save = ctx.py->Save(step);
      if (save >= 0) r.save_s.push_back(save);
    }
    if (measured) r.step_s.push_back(SecondsSince(start));
  }
  if (client != nullptr) {
    (void)client->Flush();
    const int64_t last_save = total / kSaveEvery * kSaveEvery;
    const absl::Time deadline = absl::Now() + absl::Minutes(3);
    while (absl::Now() < deadline) {
      auto st = client->QueryCheckpointStatus();
      if (st.ok() && st->last_committed_step >= last_save) {
        r.committed_step = st->last_committed_step;
        r.checkpoint_gbps = st->last_checkpoint_gbps;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (r.committed_step < last_save) {
      std::fprintf(stderr, "e2e_bench: %s: step %d was not committed\n", tag.c_str(),
                   static_cast<int>(last_save));
    }
    const ClientStats stats = client->Stats();
    r.skipped_no_slot = stats.skipped_no_slot;  // warm-up included
    r.daemon_peak_rss = daemon->PeakRssBytes();
    r.daemon_peak_private = sampler->Stop();
    r.daemon_cpu_s = ProcessCpuSeconds(daemon->pid());
    r.staging_bytes = daemon->StagingBytes();
    // The EMA: fp32 per bf16 parameter element, two buffers (kDoubleBuffer).
    r.ema_bytes = 2 * 4 * s.param_elements;
    r.daemon_held = r.staging_bytes + r.ema_bytes;
    if (replicated) r.replicated = ReplicationsLogged(daemon->log_path());
    if (tiered) {
      // Counted as the run ends; then drained, so that the store's work
      // never falls into another variant's measurement.
      r.uploads = UploadsLogged(daemon->log_path());
      bool done = false;
      const absl::Time until = absl::Now() + absl::Minutes(5);
      while (absl::Now() < until && (UploadsLogged(daemon->log_path(), last_save, &done), !done)) {
        absl::SleepFor(absl::Milliseconds(100));
      }
      if (!done) std::fprintf(stderr, "e2e_bench: %s: step %d was not uploaded\n", tag.c_str(),
                              static_cast<int>(last_save));
    }
    client.reset();
    daemon->Stop();
    if (buddy != nullptr) buddy->Stop();
  }
  return r;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter("e2e_bench", argc, argv);
  const uint64_t state_bytes = quick ? uint64_t{256} << 20 : uint64_t{1} << 30;
  const int tensors = quick ? 61 : 149;
  const double step_s = quick ? 0.100 : 0.200;
  const int measured = quick ? 20 : 20;
  const int rounds = quick ? 1 : 2;

  const std::vector<std::string> modes = {"cpu", "sleep"};
  const std::vector<Variant> all = {Variant::kNone, Variant::kZcc, Variant::kSyncCpp,
                                    Variant::kSyncPy};
  // Which runs the selected rows need.
  std::map<std::string, std::vector<Variant>> plan;
  const bool memory_row = filter.Wants("daemon_rss_vs_held");
  const bool footprint_row = filter.Wants("daemon_footprint_vs_held");
  for (const std::string& m : modes) {
    std::vector<Variant> vs;
    for (Variant v : {Variant::kZcc, Variant::kZccTiered, Variant::kZccReplicated, Variant::kSyncCpp,
                      Variant::kSyncPy}) {
      // The tiered upload and the replication stand for a GPU node's: idle
      // host cores.
      if ((v == Variant::kZccTiered || v == Variant::kZccReplicated) && m != "sleep") continue;
      const std::string row = absl::StrCat("e2e_", m, "_step_time_", VariantName(v), "_vs_none");
      const bool want = filter.Wants(row) ||
                        (v == Variant::kZcc && (filter.Wants(absl::StrCat("e2e_", m, "_zcc_snapshots_enqueued")) ||
                                                ((memory_row || footprint_row) && m == "sleep")));
      if (want) vs.push_back(v);
    }
    if (!vs.empty()) {
      vs.insert(vs.begin(), Variant::kNone);
      plan[m] = vs;
    }
  }
  if (plan.empty()) return 0;

  const std::string dir = MakeScratchDir("e2e-bench");
  if (dir.empty()) Die("cannot create the scratch directory");
  State state = BuildState(state_bytes, tensors);
  std::fprintf(stderr,
               "e2e_bench: %zu tensors, %.2f GiB of state (%.0f MiB bf16 parameters), %d (zcc) or %d "
               "warm-up + %d measured steps per run, save every %d, %d round(s), scratch %s, load %.2f\n",
               state.tensors.size(), state.data_bytes / double(1 << 30),
               state.param_elements * 2 / double(1 << 20), kZccWarmupSteps, kOtherWarmupSteps,
               measured, kSaveEvery, rounds, dir.c_str(), LoadAverage1());

  CppSaver cpp(state, dir);
  std::unique_ptr<PySaver> py;
  bool need_py = false;
  for (auto& [m, vs] : plan) need_py |= std::count(vs.begin(), vs.end(), Variant::kSyncPy) > 0;
  if (need_py) py = PySaver::Start(state, dir, argv[0]);
  if (py == nullptr) {
    for (auto& [m, vs] : plan) vs.erase(std::remove(vs.begin(), vs.end(), Variant::kSyncPy), vs.end());
  }

  Compute cpu_compute;
  cpu_compute.cpu = true;
  cpu_compute.target_s = step_s;
  if (plan.count("cpu")) {
    cpu_compute.passes = CalibratePasses(step_s);
    std::fprintf(stderr, "e2e_bench: cpu compute calibrated to %" PRId64 " passes (%.0f ms)\n",
                 cpu_compute.passes, step_s * 1e3);
  }
  Compute sleep_compute;
  sleep_compute.cpu = false;
  sleep_compute.target_s = step_s;

  Context ctx{&state, dir, measured, &cpp, py.get(), ""};
  // The tiered variant's store: moto's S3 server, its keys in this process's
  // environment for the zccds started below.
  std::optional<zcc::testing::S3TestServer> s3;
  bool need_s3 = false;
  for (auto& [m, vs] : plan) need_s3 |= std::count(vs.begin(), vs.end(), Variant::kZccTiered) > 0;
  if (need_s3) {
    auto server = zcc::testing::StartS3TestServer(dir);
    if (!server.ok()) Die("S3 server: " + std::string(server.status().message()));
    s3.emplace(*std::move(server));
    ::setenv("AWS_ENDPOINT_URL", s3->endpoint.c_str(), 1);
    ::setenv("AWS_ACCESS_KEY_ID", s3->access_key.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", s3->secret_key.c_str(), 1);
    ::setenv("AWS_REGION", "us-east-1", 1);
    ctx.upload_root = absl::StrCat("s3://", s3->bucket, "/e2e");
  }
  std::map<std::pair<std::string, Variant>, RunResult> results;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [mode, variants_in] : plan) {
      std::vector<Variant> variants = variants_in;
      if (round % 2 == 1) std::reverse(variants.begin(), variants.end());
      Compute& compute = mode == "cpu" ? cpu_compute : sleep_compute;
      for (Variant v : variants) {
        const std::string tag = absl::StrCat(mode, "-", VariantName(v), "-r", round);
        const RunResult r = Run(ctx, compute, v, tag);
        std::string extra;
        if (v == Variant::kZccReplicated) {
          extra = absl::StrFormat("; %d step(s) replicated to the buddy during the run (every "
                                  "%d-th offered), %d/%d measured steps enqueued",
                                  r.replicated, kReplicateEvery,
                                  static_cast<int>(r.snapshots_enqueued),
                                  static_cast<int>(r.snapshots_taken));
        } else if (v == Variant::kZccTiered) {
          extra = absl::StrFormat("; %d step(s) uploaded to the store during the run, %d/%d "
                                  "measured steps enqueued, checkpoint %.2f GB/s",
                                  r.uploads, static_cast<int>(r.snapshots_enqueued),
                                  static_cast<int>(r.snapshots_taken), r.checkpoint_gbps);
        } else if (v == Variant::kZcc) {
          extra = absl::StrFormat(
              "; snapshot p50 %.1f us p99 %.1f us, fence mean %.0f us, %d/%d measured steps "
              "enqueued, %d skipped (no slot) at steps%s, checkpoint %.2f GB/s; zccd CPU %.0f ms/step, peak "
              "RSS %.0f MiB, peak anon+file %.0f MiB, staging %.0f MiB + EMA %.0f MiB",
              Percentile(r.snapshot_us, 0.5), Percentile(r.snapshot_us, 0.99), Mean(r.fence_us),
              static_cast<int>(r.snapshots_enqueued), static_cast<int>(r.snapshots_taken),
              static_cast<int>(r.skipped_no_slot), r.skipped_steps.c_str(), r.checkpoint_gbps,
              r.daemon_cpu_s * 1e3 / (kZccWarmupSteps + measured), r.daemon_peak_rss / double(1 << 20),
              r.daemon_peak_private / double(1 << 20), r.staging_bytes / double(1 << 20),
              r.ema_bytes / double(1 << 20));
        } else if (!r.save_s.empty()) {
          extra = absl::StrFormat("; saves %.2f s mean (%.2f GB/s)", Mean(r.save_s),
                                  state.data_bytes / Mean(r.save_s) / 1e9);
        }
        std::fprintf(stderr, "e2e_bench: %-18s step mean %.1f ms, p50 %.1f ms, max %.1f ms%s (load %.2f)\n",
                     tag.c_str(), Mean(r.step_s) * 1e3, Percentile(r.step_s, 0.5) * 1e3,
                     Percentile(r.step_s, 1.0) * 1e3, extra.c_str(), LoadAverage1());
        RunResult& acc = results[{mode, v}];
        acc.step_s.insert(acc.step_s.end(), r.step_s.begin(), r.step_s.end());
        acc.save_s.insert(acc.save_s.end(), r.save_s.begin(), r.save_s.end());
        acc.snapshot_us.insert(acc.snapshot_us.end(), r.snapshot_us.begin(), r.snapshot_us.end());
        acc.snapshots_taken += r.snapshots_taken;
        acc.snapshots_enqueued += r.snapshots_enqueued;
        acc.skipped_no_slot += r.skipped_no_slot;
        acc.daemon_peak_rss = std::max(acc.daemon_peak_rss, r.daemon_peak_rss);
        acc.daemon_peak_private = std::max(acc.daemon_peak_private, r.daemon_peak_private);
        acc.staging_bytes = std::max(acc.staging_bytes, r.staging_bytes);
        acc.daemon_held = std::max(acc.daemon_held, r.daemon_held);
      }
    }
  }
  py.reset();

  // zccd's memory over every zcc run (the same model each time).
  uint64_t peak_rss = 0, peak_private = 0, staging = 0, held = 0;
  for (const auto& [mode, variants] : plan) {
    const double none = Mean(results[{mode, Variant::kNone}].step_s);
    for (Variant v : variants) {
      if (v == Variant::kNone) continue;
      const RunResult& r = results[{mode, v}];
      const double mean = Mean(r.step_s);
      const std::string row = absl::StrCat("e2e_", mode, "_step_time_", VariantName(v), "_vs_none");
      if (filter.Wants(row) && mean > 0 && none > 0) {
        const bool targeted =
            v == Variant::kZcc || v == Variant::kZccTiered || v == Variant::kZccReplicated;
        Emit({absl::StrCat(row, " (ratio = none/", VariantName(v), ")"), mean * 1e3, none * 1e3,
              none / mean, targeted ? ">= 0.99" : "", "ms/step"});
      }
      if (v != Variant::kZcc) continue;
      const std::string pub = absl::StrCat("e2e_", mode, "_zcc_snapshots_enqueued");
      if (filter.Wants(pub) && r.snapshots_taken > 0) {
        Emit({absl::StrCat(pub, " (ratio = enqueued/steps)"), double(r.snapshots_enqueued),
              double(r.snapshots_taken), 0, "", "snapshots"});
      }
      peak_rss = std::max(peak_rss, r.daemon_peak_rss);
      peak_private = std::max(peak_private, r.daemon_peak_private);
      staging = std::max(staging, r.staging_bytes);
      held = std::max(held, r.daemon_held);
    }
  }
  const double mib = 1 << 20;
  if (memory_row && peak_rss > 0) {
    Emit({"daemon_rss_vs_held (ratio = (held+64MiB)/rss)", peak_rss / mib, held / mib + 64,
          (held / mib + 64) / (peak_rss / mib), ">= 0.952 (1/1.05)", "MiB"});
  }
  // VmHWM counts only the staging pages zccd itself touched (it reads a
  // non-checkpoint slot only for the EMA'd parameters); this row counts every
  // staging byte plus the daemon's sampled private peak.
  if (footprint_row && peak_private > 0) {
    const double footprint = (peak_private + staging) / mib;
    Emit({"daemon_footprint_vs_held (ratio = (held+64MiB)/(private peak+staging))", footprint,
          held / mib + 64, (held / mib + 64) / footprint, ">= 0.952 (1/1.05)", "MiB"});
  }
  ::munmap(state.base, state.bytes);
  ::close(state.fd);
  RemoveScratchDir(dir);
  return 0;
}
