// GPU benchmark of the two ways a snapshot's device tensors reach the
// staging slots, through a real zccd (run on a GPU node by
// tools/gpu/run_gpu_checks.sh):
//
//   cuda      the trainer's CUDA copier (copy thread, side stream, pinned slots)
//   cuda_ipc  daemon-pull: zccd copies over CUDA IPC on its own context
//
// against a plain cudaMemcpyAsync of the same tensors into cudaMallocHost
// memory. Per backend and step: the trainer thread's cost of Snapshot() (µs:
// what the training loop pays) and the time from Snapshot() to the snapshot
// being handed to zccd (Flush), as GB/s of the snapshot's bytes. Each step
// first fences and "updates" the start of every tensor on the trainer's
// stream, as an optimizer step would. zccd persists nothing (save_every 0):
// only the copy path is measured.
//
// Host code only (the CUDA runtime API through nvcc's headers), so the same
// source also links against the fake runtime for a smoke test in CI.
// Without a usable CUDA device it says so and exits 0.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "bench/harness.h"

ABSL_FLAG(std::string, zccd, "", "zccd binary to start (with --daemon_pull)");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(int, tensors, 16, "tensors snapshotted each step");
ABSL_FLAG(int, tensor_mib, 64, "MiB per tensor");
ABSL_FLAG(int, steps, 10, "timed steps per backend (after --warmup steps)");
ABSL_FLAG(int, warmup, 2, "untimed steps per backend");
ABSL_FLAG(std::string, backends, "cuda,cuda_ipc", "backends to measure, comma-separated");

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kUpdateBytes = 4096;  // the "optimizer step" per tensor

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "daemon_pull_bench: %s: %s\n", what, cudaGetErrorString(err));
  return false;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  double snapshot_us_median = 0;
  double snapshot_us_max = 0;
  double gbps_median = 0;
  double register_s = 0;
};

// Plain cudaMemcpyAsync of every tensor into pinned memory: the reference.
bool PinnedBaseline(const std::vector<void*>& tensors, size_t bytes, cudaStream_t stream, int iters,
                    double* gbps) {
  void* host = nullptr;
  if (!Check(cudaMallocHost(&host, tensors.size() * bytes), "cudaMallocHost")) return false;
  std::vector<double> rates;
  for (int i = 0; i < iters + 1; ++i) {
    const auto t0 = Clock::now();
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (!Check(cudaMemcpyAsync(static_cast<char*>(host) + t * bytes, tensors[t], bytes,
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync")) {
        return false;
      }
    }
    if (!Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) return false;
    if (i > 0) rates.push_back(tensors.size() * bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  cudaFreeHost(host);
  *gbps = Median(rates);
  return true;
}

bool Measure(const std::string& socket, const std::string& backend,
             const std::vector<void*>& tensors, size_t bytes, cudaStream_t stream,
             const std::vector<char>& update, Result* out) {
  zcc::ClientOptions o;
  o.socket_path = socket;
  o.job_id = "pull-bench-" + backend;
  o.num_slots = 2;
  o.save_every = 0;
  o.backpressure = zcc::Backpressure::kBlock;
  o.cuda_device = absl::GetFlag(FLAGS_device);
  o.copy_backend = backend == "cuda_ipc" ? zcc::ClientOptions::CopyBackend::kCudaIpc
                                         : zcc::ClientOptions::CopyBackend::kCuda;
  auto client = zcc::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "%s: connect: %s\n", backend.c_str(), client.status().ToString().c_str());
    return false;
  }
  std::vector<zcc::TensorRef> refs;
  for (size_t t = 0; t < tensors.size(); ++t) {
    zcc::TensorRef r;
    r.name = absl::StrCat("t", t);
    r.dtype = zcc::DType::kU8;
    r.shape = {static_cast<int64_t>(bytes)};
    r.data = tensors[t];
    refs.push_back(r);
  }
  const auto r0 = Clock::now();
  if (auto st = (*client)->RegisterTensors(refs); !st.ok()) {
    std::fprintf(stderr, "%s: register: %s\n", backend.c_str(), st.ToString().c_str());
    return false;
  }
  out->register_s = Seconds(r0, Clock::now());
  if (!(*client)->Stats().connected) {
    std::fprintf(stderr, "%s: not registered with zccd\n", backend.c_str());
    return false;
  }
  std::vector<double> us, rates;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int step = 1; step <= warmup + steps; ++step) {
    if (auto st = (*client)->FenceBeforeUpdate(stream); !st.ok()) {
      std::fprintf(stderr, "%s: fence: %s\n", backend.c_str(), st.ToString().c_str());
      return false;
    }
    for (void* t : tensors) {
      if (!Check(cudaMemcpyAsync(t, update.data(), std::min(bytes, kUpdateBytes),
                                 cudaMemcpyHostToDevice, stream),
                 "update")) {
        return false;
      }
    }
    const auto t0 = Clock::now();
    const zcc::SnapshotResult result = (*client)->Snapshot(step, zcc::SnapshotKind::kFull, stream);
    const auto t1 = Clock::now();
    if (result != zcc::SnapshotResult::kEnqueued) {
      std::fprintf(stderr, "%s: snapshot of step %d not enqueued (%d)\n", backend.c_str(), step,
                   static_cast<int>(result));
      return false;
    }
    if (auto st = (*client)->Flush(absl::Seconds(120)); !st.ok()) {
      std::fprintf(stderr, "%s: flush: %s\n", backend.c_str(), st.ToString().c_str());
      return false;
    }
    const auto t2 = Clock::now();
    if (step > warmup) {
      us.push_back(Seconds(t0, t1) * 1e6);
      rates.push_back(tensors.size() * bytes / Seconds(t0, t2) / 1e9);
    }
  }
  const zcc::ClientStats s = (*client)->Stats();
  if (s.snapshots_published != static_cast<uint64_t>(warmup + steps)) {
    std::fprintf(stderr, "%s: %llu of %d snapshots published (%s)\n", backend.c_str(),
                 static_cast<unsigned long long>(s.snapshots_published), warmup + steps,
                 s.last_error.c_str());
    return false;
  }
  out->snapshot_us_median = Median(us);
  out->snapshot_us_max = us.empty() ? 0 : *std::max_element(us.begin(), us.end());
  out->gbps_median = Median(rates);
  return true;
}

int Run() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    std::printf("daemon_pull_bench: skipped: no CUDA device\n");
    return 0;
  }
  const std::string zccd = absl::GetFlag(FLAGS_zccd);
  if (zccd.empty()) {
    std::fprintf(stderr, "daemon_pull_bench: --zccd is required\n");
    return 2;
  }
  if (!Check(cudaSetDevice(absl::GetFlag(FLAGS_device)), "cudaSetDevice")) return 1;
  // zccd on a private socket and root (bench/harness.h), with daemon-pull.
  setenv("ZCC_ZCCD", zccd.c_str(), 1);
  const std::string dir = zcc::bench::MakeScratchDir("pull-bench");
  if (dir.empty()) return 1;
  auto started = zcc::bench::ZccdProcess::Start(dir, "zccd", {"--daemon_pull"});
  if (!started.ok()) {
    std::fprintf(stderr, "daemon_pull_bench: %s\n", started.status().ToString().c_str());
    return 1;
  }
  zcc::bench::ZccdProcess& daemon = **started;
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_tensor_mib)) * kMiB;
  const int n = absl::GetFlag(FLAGS_tensors);
  cudaStream_t stream = nullptr;
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  std::vector<char> update(std::min(bytes, kUpdateBytes), 7);
  std::vector<void*> tensors(n, nullptr);
  for (void*& t : tensors) {
    if (!Check(cudaMalloc(&t, bytes), "cudaMalloc")) return 1;
  }
  double pinned = 0;
  if (!PinnedBaseline(tensors, bytes, stream, absl::GetFlag(FLAGS_steps), &pinned)) return 1;
  std::printf("snapshot of %d tensors x %d MiB = %.3f GB on device %d\n", n,
              absl::GetFlag(FLAGS_tensor_mib), n * bytes / 1e9, absl::GetFlag(FLAGS_device));
  std::printf("%-10s %14s %14s %12s %12s %12s\n", "backend", "snapshot_us", "snapshot_max",
              "d2h_GB/s", "vs_pinned", "register_s");
  std::printf("%-10s %14s %14s %12.2f %12s %12s\n", "pinned", "-", "-", pinned, "1.00", "-");
  int failed = 0;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_backends), ',')) {
    const std::string backend(b);
    Result r;
    if (!Measure(daemon.socket(), backend, tensors, bytes, stream, update, &r)) {
      std::printf("%-10s FAILED (see above; zccd log %s)\n", backend.c_str(),
                  daemon.log_path().c_str());
      ++failed;
      continue;
    }
    std::printf("%-10s %14.1f %14.1f %12.2f %12.2f %12.3f\n", backend.c_str(), r.snapshot_us_median,
                r.snapshot_us_max, r.gbps_median, pinned > 0 ? r.gbps_median / pinned : 0,
                r.register_s);
  }
  for (void* t : tensors) cudaFree(t);
  cudaStreamDestroy(stream);
  daemon.Stop();
  if (failed == 0) zcc::bench::RemoveScratchDir(dir);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
