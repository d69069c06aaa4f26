// GPU benchmark of the CUDA copier (run on a GPU node by
// tools/gpu/run_gpu_checks.sh). One thread per rank, rank r on device
// r % device_count, all ranks at once (they share the host's PCIe and memory):
//
//  1. D2H bandwidth per rank: the same tensors copied into a shared-memory
//     staging mapping through the CudaCopier (Enqueue + Wait, pinned with
//     cudaHostRegister, chunked cudaMemcpyAsync on its low-priority stream),
//     against a plain cudaMemcpyAsync per tensor into cudaMallocHost memory.
//  2. Step-time overhead of a snapshot every step: a synthetic training loop
//     (fp32 matmuls as forward/backward, an elementwise "optimizer step" over
//     all parameters) on a compute stream, with and without FenceBeforeUpdate
//     + Enqueue of every parameter each step, as the client does it: two
//     staging slots, a notifier thread that Waits, and a snapshot skipped when
//     no slot is free. Each step ends with a host sync (like loss.item()).
//
// Without a usable CUDA device it prints why and exits 0.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "common/status.h"
#include "copy/device_copier.h"
#include "cuda/cuda_copier.h"
#include "bench/gpu/gpu_bench_cuda.h"

ABSL_FLAG(int, ranks, 0, "ranks (threads), rank r on device r % devices; 0 = one per device");
ABSL_FLAG(int, copy_mib, 2048, "bytes copied per rank in the bandwidth test, MiB");
ABSL_FLAG(int, tensor_mib, 64, "tensor size in the bandwidth test, MiB");
ABSL_FLAG(int, chunk_mib, 64, "CudaCopier chunk size, MiB");
ABSL_FLAG(int, iters, 5, "timed iterations of the bandwidth test (after one warm-up)");
ABSL_FLAG(int, param_mib, 1024, "parameters snapshotted each step, MiB (fp32)");
ABSL_FLAG(int, params_per_tensor_mib, 32, "tensor size of the parameters, MiB");
ABSL_FLAG(int, matmul_n, 4096, "matrix size of the synthetic step's fp32 matmuls");
ABSL_FLAG(int, matmuls, 4, "matmuls per step");
ABSL_FLAG(int, steps, 20, "timed steps per mode (after warm-up steps)");
ABSL_FLAG(int, warmup_steps, 3, "untimed steps per mode");

namespace zcc::gpu_bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMiB = size_t{1} << 20;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A shared anonymous mapping standing in for the daemon's staging segment.
class Staging {
 public:
  static absl::StatusOr<std::unique_ptr<Staging>> Create(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoToStatus(errno, "mmap of the staging mapping");
    return std::unique_ptr<Staging>(new Staging(static_cast<char*>(p), bytes));
  }
  ~Staging() { munmap(base_, bytes_); }
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  Staging(char* base, size_t bytes) : base_(base), bytes_(bytes) {}
  char* base_;
  size_t bytes_;
};

// Owns device memory, a pinned block, or a stream.
template <absl::Status (*Free)(void*)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(void* p) : p_(p) {}
  ~Owned() {
    if (p_ != nullptr) (void)Free(p_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  void* get() const { return p_; }
  char* bytes() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
};
using DeviceMemory = Owned<DeviceFree>;
using PinnedMemory = Owned<PinnedFree>;
using Stream = Owned<DestroyStream>;

// All ranks start a phase together.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Arrive() {
    zcc::MutexLock lock(&mu_);
    const int generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    auto next = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != generation; };
    mu_.Await(absl::Condition(&next));
  }

 private:
  zcc::Mutex mu_;
  const int n_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<CopyRegion> SplitIntoRegions(const char* src, char* dst, size_t bytes, size_t piece) {
  std::vector<CopyRegion> regions;
  for (size_t off = 0; off < bytes; off += piece) {
    regions.push_back({src + off, dst + off, std::min(piece, bytes - off)});
  }
  return regions;
}

struct BandwidthResult {
  double copier_gbps = 0;
  double plain_gbps = 0;
};

absl::StatusOr<BandwidthResult> MeasureBandwidth(int device, Barrier& barrier) {
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_copy_mib)) * kMiB;
  const size_t tensor = static_cast<size_t>(absl::GetFlag(FLAGS_tensor_mib)) * kMiB;
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  ZCC_RETURN_IF_ERROR(SetDevice(device));
  ZCC_ASSIGN_OR_RETURN(void* src_ptr, DeviceAlloc(bytes));
  DeviceMemory src(src_ptr);
  ZCC_ASSIGN_OR_RETURN(void* stream_ptr, NewStream());
  Stream stream(stream_ptr);
  ZCC_RETURN_IF_ERROR(Fill(src.get(), 0x3C, bytes, stream.get()));
  ZCC_RETURN_IF_ERROR(Synchronize(stream.get()));

  CudaCopierOptions options;
  options.device = device;
  options.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_mib)) * kMiB;
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier, NewCudaCopier(options));
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<Staging> staging, Staging::Create(bytes));
  ZCC_RETURN_IF_ERROR(copier->RegisterHostMemory(staging->base(), bytes));
  const std::vector<CopyRegion> regions =
      SplitIntoRegions(src.bytes(), staging->base(), bytes, tensor);

  BandwidthResult result;
  barrier.Arrive();
  for (int i = -1; i < iters; ++i) {  // i = -1: warm-up (first touch, pinning caches).
    const auto start = Clock::now();
    ZCC_ASSIGN_OR_RETURN(CopyTicket ticket, copier->Enqueue(regions, stream.get()));
    ZCC_RETURN_IF_ERROR(copier->Wait(ticket));
    if (i >= 0) result.copier_gbps += bytes / SecondsSince(start) / 1e9 / iters;
  }
  ZCC_RETURN_IF_ERROR(copier->UnregisterHostMemory(staging->base()));
  copier.reset();
  staging.reset();

  ZCC_ASSIGN_OR_RETURN(void* pinned_ptr, PinnedAlloc(bytes));
  PinnedMemory pinned(pinned_ptr);
  barrier.Arrive();
  for (int i = -1; i < iters; ++i) {
    const auto start = Clock::now();
    for (size_t off = 0; off < bytes; off += tensor) {
      ZCC_RETURN_IF_ERROR(CopyAsync(pinned.bytes() + off, src.bytes() + off,
                                    std::min(tensor, bytes - off), stream.get()));
    }
    ZCC_RETURN_IF_ERROR(Synchronize(stream.get()));
    if (i >= 0) result.plain_gbps += bytes / SecondsSince(start) / 1e9 / iters;
  }
  return result;
}

struct StepResult {
  double base_ms = 0;
  double snap_ms = 0;
  double copy_ms = 0;     // Enqueue to Wait returning, averaged.
  double enqueue_us = 0;  // Trainer-thread cost of FenceBeforeUpdate + Enqueue.
  int snapshots = 0;
  int skipped = 0;
};

// The client's notifier: waits for each snapshot and frees its slot.
class Notifier {
 public:
  explicit Notifier(DeviceCopier* copier) : copier_(copier), thread_([this] { Run(); }) {}
  ~Notifier() {
    {
      zcc::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  // A free slot (0 or 1), or -1.
  int TakeSlot() {
    zcc::MutexLock lock(&mu_);
    for (int s = 0; s < 2; ++s) {
      if (!busy_[s]) {
        busy_[s] = true;
        return s;
      }
    }
    return -1;
  }
  void Submit(int slot, CopyTicket ticket) {
    zcc::MutexLock lock(&mu_);
    queue_.push_back({slot, ticket, Clock::now()});
  }
  void Drain() {
    zcc::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.empty() && !busy_[0] && !busy_[1];
    };
    mu_.Await(absl::Condition(&idle));
  }
  absl::Status status() {
    zcc::MutexLock lock(&mu_);
    return status_;
  }
  double MeanCopyMs() {
    zcc::MutexLock lock(&mu_);
    return copies_ == 0 ? 0 : copy_seconds_ * 1e3 / copies_;
  }

 private:
  struct Pending {
    int slot;
    CopyTicket ticket;
    Clock::time_point enqueued;
  };

  void Run() {
    for (;;) {
      Pending p;
      {
        zcc::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !queue_.empty() || stopping_;
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        p = queue_.front();
        queue_.pop_front();
      }
      const absl::Status st = copier_->Wait(p.ticket);
      const double seconds = SecondsSince(p.enqueued);
      zcc::MutexLock lock(&mu_);
      if (!st.ok() && status_.ok()) status_ = st;
      copy_seconds_ += seconds;
      ++copies_;
      busy_[p.slot] = false;
    }
  }

  DeviceCopier* const copier_;
  zcc::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double copy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

absl::StatusOr<StepResult> MeasureStepOverhead(int device, Barrier& barrier) {
  const size_t param_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_param_mib)) * kMiB;
  const size_t tensor = static_cast<size_t>(absl::GetFlag(FLAGS_params_per_tensor_mib)) * kMiB;
  const int n = absl::GetFlag(FLAGS_matmul_n);
  const int matmuls = absl::GetFlag(FLAGS_matmuls);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  const int warmup = std::max(0, absl::GetFlag(FLAGS_warmup_steps));
  ZCC_RETURN_IF_ERROR(SetDevice(device));
  const size_t matrix = static_cast<size_t>(n) * n * sizeof(float);
  ZCC_ASSIGN_OR_RETURN(void* params_ptr, DeviceAlloc(param_bytes));
  DeviceMemory params(params_ptr);
  ZCC_ASSIGN_OR_RETURN(void* abc_ptr, DeviceAlloc(3 * matrix));
  DeviceMemory abc(abc_ptr);
  const auto* a = reinterpret_cast<const float*>(abc.bytes());
  const auto* b = reinterpret_cast<const float*>(abc.bytes() + matrix);
  auto* c = reinterpret_cast<float*>(abc.bytes() + 2 * matrix);
  ZCC_ASSIGN_OR_RETURN(void* stream_ptr, NewStream());
  Stream compute(stream_ptr);
  ZCC_RETURN_IF_ERROR(Fill(params.get(), 0, param_bytes, compute.get()));
  ZCC_RETURN_IF_ERROR(Fill(abc.get(), 0, 3 * matrix, compute.get()));
  ZCC_RETURN_IF_ERROR(Synchronize(compute.get()));

  CudaCopierOptions options;
  options.device = device;
  options.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_mib)) * kMiB;
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier, NewCudaCopier(options));
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<Staging> staging, Staging::Create(2 * param_bytes));
  ZCC_RETURN_IF_ERROR(copier->RegisterHostMemory(staging->base(), staging->bytes()));
  const std::vector<CopyRegion> slot_regions[2] = {
      SplitIntoRegions(params.bytes(), staging->base(), param_bytes, tensor),
      SplitIntoRegions(params.bytes(), staging->base() + param_bytes, param_bytes, tensor)};

  StepResult result;
  for (bool snapshots : {false, true}) {
    auto notifier = std::make_unique<Notifier>(copier.get());
    double enqueue_seconds = 0;
    barrier.Arrive();
    Clock::time_point start;
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) start = Clock::now();
      ZCC_RETURN_IF_ERROR(Matmuls(a, b, c, n, matmuls, compute.get()));  // forward/backward
      const auto t0 = Clock::now();
      if (snapshots) ZCC_RETURN_IF_ERROR(copier->FenceBeforeUpdate(compute.get()));
      enqueue_seconds += step >= warmup && snapshots ? SecondsSince(t0) : 0;
      ZCC_RETURN_IF_ERROR(UpdateParams(params.get(), param_bytes, compute.get()));  // optimizer
      if (snapshots) {
        const auto t1 = Clock::now();
        const int slot = notifier->TakeSlot();
        if (slot < 0) {
          if (step >= warmup) ++result.skipped;
        } else {
          ZCC_ASSIGN_OR_RETURN(CopyTicket ticket,
                               copier->Enqueue(slot_regions[slot], compute.get()));
          notifier->Submit(slot, ticket);
          if (step >= warmup) ++result.snapshots;
        }
        if (step >= warmup) enqueue_seconds += SecondsSince(t1);
      }
      ZCC_RETURN_IF_ERROR(Synchronize(compute.get()));  // loss.item()
    }
    const double step_ms = SecondsSince(start) * 1e3 / steps;
    notifier->Drain();
    ZCC_RETURN_IF_ERROR(notifier->status());
    if (snapshots) {
      result.snap_ms = step_ms;
      result.copy_ms = notifier->MeanCopyMs();
      result.enqueue_us = enqueue_seconds * 1e6 / steps;
    } else {
      result.base_ms = step_ms;
    }
  }
  ZCC_RETURN_IF_ERROR(copier->UnregisterHostMemory(staging->base()));
  return result;
}

int Run() {
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok() || *count == 0) {
    // NewCudaCopier says why in the words the client would log.
    const absl::Status why = NewCudaCopier(CudaCopierOptions()).status();
    std::printf("gpu_bench: skipped: no CUDA device: %s\n",
                std::string(why.ok() ? count.status().message() : why.message()).c_str());
    return 0;
  }
  const int ranks = absl::GetFlag(FLAGS_ranks) > 0 ? absl::GetFlag(FLAGS_ranks) : *count;
  for (int d = 0; d < *count; ++d) {
    absl::StatusOr<DeviceDescription> desc = Describe(d);
    if (!desc.ok()) {
      std::printf("gpu_bench: device %d: %s\n", d, desc.status().ToString().c_str());
      return 1;
    }
    std::printf("gpu_bench: device %d: %s, %.0f GiB, driver %d.%d, runtime %d.%d\n", d,
                desc->name.c_str(), desc->total_memory / double(1 << 30),
                desc->driver_version / 1000, desc->driver_version % 1000 / 10,
                desc->runtime_version / 1000, desc->runtime_version % 1000 / 10);
  }

  std::vector<absl::StatusOr<BandwidthResult>> bw(ranks, absl::UnknownError("not run"));
  std::vector<absl::StatusOr<StepResult>> st(ranks, absl::UnknownError("not run"));
  {
    Barrier barrier(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] { bw[r] = MeasureBandwidth(r % *count, barrier); });
    }
    for (std::thread& t : threads) t.join();
  }
  std::printf("\nD2H bandwidth: %d MiB per rank in %d MiB tensors, %d ranks at once, mean of %d\n",
              absl::GetFlag(FLAGS_copy_mib), absl::GetFlag(FLAGS_tensor_mib), ranks,
              absl::GetFlag(FLAGS_iters));
  bool ok = true;
  for (int r = 0; r < ranks; ++r) {
    if (!bw[r].ok()) {
      std::printf("  rank %d: FAILED: %s\n", r, bw[r].status().ToString().c_str());
      ok = false;
      continue;
    }
    std::printf(
        "  rank %d (device %d): CudaCopier %.1f GB/s (%d MiB chunks, cudaHostRegister'ed shared "
        "mapping) | plain pinned cudaMemcpyAsync %.1f GB/s | copier/plain %.2f\n",
        r, r % *count, bw[r]->copier_gbps, absl::GetFlag(FLAGS_chunk_mib), bw[r]->plain_gbps,
        bw[r]->copier_gbps / bw[r]->plain_gbps);
  }
  {
    Barrier barrier(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] { st[r] = MeasureStepOverhead(r % *count, barrier); });
    }
    for (std::thread& t : threads) t.join();
  }
  std::printf(
      "\nSnapshot every step: %d MiB fp32 params in %d MiB tensors, %d x %d^3 fp32 matmuls per "
      "step, %d steps per mode\n",
      absl::GetFlag(FLAGS_param_mib), absl::GetFlag(FLAGS_params_per_tensor_mib),
      absl::GetFlag(FLAGS_matmuls), absl::GetFlag(FLAGS_matmul_n), absl::GetFlag(FLAGS_steps));
  for (int r = 0; r < ranks; ++r) {
    if (!st[r].ok()) {
      std::printf("  rank %d: FAILED: %s\n", r, st[r].status().ToString().c_str());
      ok = false;
      continue;
    }
    const StepResult& s = *st[r];
    std::printf(
        "  rank %d: step %.2f ms without snapshots, %.2f ms with (%+.1f%%); snapshot latency "
        "%.2f ms (Enqueue to Wait, behind the optimizer step; ~%.1f GB/s), fence+Enqueue %.0f us "
        "on the trainer thread; %d snapshots, %d skipped (no free slot)\n",
        r, s.base_ms, s.snap_ms, (s.snap_ms / s.base_ms - 1) * 100, s.copy_ms,
        s.copy_ms > 0 ? absl::GetFlag(FLAGS_param_mib) * double(kMiB) / (s.copy_ms / 1e3) / 1e9 : 0,
        s.enqueue_us, s.snapshots, s.skipped);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace zcc::gpu_bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zcc::gpu_bench::Run();
}
