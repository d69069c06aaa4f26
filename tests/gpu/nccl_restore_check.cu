// An NCCL restore of a C++ trainer on the GPUs present (run on a GPU node by
// tools/gpu/run_gpu_checks.sh): one rank per device, each a thread with its
// own zcc::Client and CUDA tensors, all ranks of one communicator from
// ncclCommInitAll, and a real zccd.
//
// The ranks train a few steps (every step snapshotted, checkpoints every
// other step), then, as restarted trainers would, register again with zeroed
// tensors and restore together with RestoreOptions::collective =
// NewNcclCollective(their communicator): the replicated tensors are read from
// zccd by one rank each and broadcast to the others on the trainer's stream;
// the sharded ones are read by their owners. Every rank then checks every
// tensor against the values of the restored step, on the device.
//
// Prints one result line; exits 0 when every rank restored the same step
// bit-exact (or, without a CUDA device, after saying so).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cuda/nccl_collective.h"
#include "bench/harness.h"

ABSL_FLAG(std::string, zccd, "", "zccd binary to start");
ABSL_FLAG(int, steps, 4, "steps to train (checkpoints every 2nd)");
ABSL_FLAG(int, tensors, 4, "replicated tensors (and as many sharded ones)");
ABSL_FLAG(int, kib, 1024, "KiB per tensor piece");

namespace {

constexpr char kJob[] = "nccl-restore";

// The value of byte `i` of tensor `t` at `step` (a rank's shard uses its rank).
uint8_t ValueAt(int64_t step, int t, int rank, size_t i) {
  return static_cast<uint8_t>(step * 31 + t * 7 + rank * 13 + i * 3);
}

std::vector<uint8_t> Pattern(int64_t step, int t, int rank, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = ValueAt(step, t, rank, i);
  return v;
}

struct Rank {
  int rank = 0;
  int world = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<void*> replicated;  // same bytes on every rank
  std::vector<void*> sharded;     // this rank's piece of a global tensor
  size_t bytes = 0;
  std::string error;
  int64_t restored_step = -1;
  int received = 0;
};

std::vector<zcc::TensorRef> Refs(const Rank& r) {
  std::vector<zcc::TensorRef> refs;
  for (size_t t = 0; t < r.replicated.size(); ++t) {
    zcc::TensorRef ref;
    ref.name = absl::StrCat("dense.", t);
    ref.dtype = zcc::DType::kU8;
    ref.shape = {static_cast<int64_t>(r.bytes)};
    ref.data = r.replicated[t];
    ref.replica = {zcc::ReplicaGroup::Kind::kDataParallel, static_cast<uint32_t>(r.world),
                   static_cast<uint32_t>(r.rank), -1};
    refs.push_back(ref);
  }
  for (size_t t = 0; t < r.sharded.size(); ++t) {
    zcc::TensorRef ref;
    ref.name = absl::StrCat("optim.", t);
    ref.dtype = zcc::DType::kU8;
    ref.kind = zcc::TensorKind::kOptim;
    ref.shape = {static_cast<int64_t>(r.bytes)};
    ref.data = r.sharded[t];
    ref.global_shape = {static_cast<int64_t>(r.bytes) * r.world};
    ref.box_offset = {static_cast<int64_t>(r.bytes) * r.rank};
    refs.push_back(ref);
  }
  return refs;
}

bool Upload(Rank& r, int64_t step) {
  for (size_t t = 0; t < r.replicated.size(); ++t) {
    const std::vector<uint8_t> v = Pattern(step, static_cast<int>(t), 0, r.bytes);
    if (cudaMemcpy(r.replicated[t], v.data(), r.bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      return false;
    }
  }
  for (size_t t = 0; t < r.sharded.size(); ++t) {
    const std::vector<uint8_t> v = Pattern(step, 100 + static_cast<int>(t), r.rank, r.bytes);
    if (cudaMemcpy(r.sharded[t], v.data(), r.bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      return false;
    }
  }
  return true;
}

zcc::ClientOptions Options(const std::string& socket, const Rank& r) {
  zcc::ClientOptions o;
  o.socket_path = socket;
  o.job_id = kJob;
  o.rank = static_cast<uint32_t>(r.rank);
  o.world_size = static_cast<uint32_t>(r.world);
  o.save_every = 2;
  o.backpressure = zcc::Backpressure::kBlock;
  o.copy_backend = zcc::ClientOptions::CopyBackend::kCuda;
  o.cuda_device = r.rank;
  return o;
}

void Train(const std::string& socket, Rank* r) {
  cudaSetDevice(r->rank);
  auto client = zcc::Client::Connect(Options(socket, *r));
  if (!client.ok()) {
    r->error = client.status().ToString();
    return;
  }
  if (auto st = (*client)->RegisterTensors(Refs(*r)); !st.ok()) {
    r->error = st.ToString();
    return;
  }
  for (int64_t step = 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
    if (auto st = (*client)->FenceBeforeUpdate(r->stream); !st.ok()) {
      r->error = st.ToString();
      return;
    }
    cudaStreamSynchronize(r->stream);
    if (!Upload(*r, step)) {
      r->error = "upload failed";
      return;
    }
    (*client)->Snapshot(step, zcc::SnapshotKind::kFull, r->stream);
  }
  if (auto st = (*client)->Flush(); !st.ok()) r->error = st.ToString();
  // Rank 0 waits for the last due step to be committed by every rank.
  const int64_t last_due = absl::GetFlag(FLAGS_steps) / 2 * 2;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (r->rank == 0 && absl::Now() < deadline) {
    auto st = (*client)->QueryCheckpointStatus();
    if (st.ok() && st->last_committed_step >= last_due) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Restore(const std::string& socket, Rank* r) {
  cudaSetDevice(r->rank);
  for (void* p : r->replicated) cudaMemset(p, 0, r->bytes);
  for (void* p : r->sharded) cudaMemset(p, 0, r->bytes);
  auto client = zcc::Client::Connect(Options(socket, *r));
  if (!client.ok()) {
    r->error = client.status().ToString();
    return;
  }
  if (auto st = (*client)->RegisterTensors(Refs(*r)); !st.ok()) {
    r->error = st.ToString();
    return;
  }
  auto collective = zcc::NewNcclCollective(r->comm, r->rank);
  if (!collective.ok()) {
    r->error = collective.status().ToString();
    return;
  }
  zcc::RestoreOptions options;
  options.collective = collective->get();
  auto result = (*client)->Restore(options, r->stream);
  if (!result.ok()) {
    r->error = result.status().ToString();
    return;
  }
  cudaStreamSynchronize(r->stream);
  r->restored_step = result->step;
  for (bool b : result->received) r->received += b ? 1 : 0;
  std::vector<uint8_t> got(r->bytes);
  for (size_t t = 0; t < r->replicated.size(); ++t) {
    cudaMemcpy(got.data(), r->replicated[t], r->bytes, cudaMemcpyDeviceToHost);
    if (got != Pattern(result->step, static_cast<int>(t), 0, r->bytes)) {
      r->error = absl::StrCat("dense.", t, " differs after the restore");
      return;
    }
  }
  for (size_t t = 0; t < r->sharded.size(); ++t) {
    cudaMemcpy(got.data(), r->sharded[t], r->bytes, cudaMemcpyDeviceToHost);
    if (got != Pattern(result->step, 100 + static_cast<int>(t), r->rank, r->bytes)) {
      r->error = absl::StrCat("optim.", t, " differs after the restore");
      return;
    }
  }
}

int Run() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    std::printf("nccl_restore_check: skipped: no CUDA device\n");
    return 0;
  }
  const std::string zccd = absl::GetFlag(FLAGS_zccd);
  if (zccd.empty()) {
    std::fprintf(stderr, "nccl_restore_check: --zccd is required\n");
    return 2;
  }
  // zccd on a private socket and root (bench/harness.h).
  setenv("ZCC_ZCCD", zccd.c_str(), 1);
  const std::string dir = zcc::bench::MakeScratchDir("nccl-restore");
  if (dir.empty()) return 1;
  auto started = zcc::bench::ZccdProcess::Start(dir, "zccd", {"--client_timeout_s=60"});
  if (!started.ok()) {
    std::fprintf(stderr, "nccl_restore_check: %s\n", started.status().ToString().c_str());
    return 1;
  }
  zcc::bench::ZccdProcess& daemon = **started;
  std::vector<ncclComm_t> comms(n);
  if (ncclCommInitAll(comms.data(), n, nullptr) != ncclSuccess) {
    std::fprintf(stderr, "nccl_restore_check: ncclCommInitAll failed\n");
    return 1;
  }
  std::vector<Rank> ranks(n);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kib)) * 1024;
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks[r];
    rank.rank = r;
    rank.world = n;
    rank.comm = comms[r];
    rank.bytes = bytes;
    cudaSetDevice(r);
    cudaStreamCreateWithFlags(&rank.stream, cudaStreamNonBlocking);
    for (int t = 0; t < absl::GetFlag(FLAGS_tensors); ++t) {
      void* a = nullptr;
      void* b = nullptr;
      if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        std::fprintf(stderr, "nccl_restore_check: cudaMalloc failed\n");
        return 1;
      }
      rank.replicated.push_back(a);
      rank.sharded.push_back(b);
    }
  }
  for (auto phase : {&Train, &Restore}) {
    std::vector<std::thread> threads;
    for (Rank& r : ranks) threads.emplace_back(phase, daemon.socket(), &r);
    for (std::thread& t : threads) t.join();
    for (const Rank& r : ranks) {
      if (!r.error.empty()) {
        std::printf("nccl_restore_check: FAILED: rank %d: %s (zccd log %s)\n", r.rank,
                    r.error.c_str(), daemon.log_path().c_str());
        return 1;
      }
    }
  }
  int received = 0;
  for (const Rank& r : ranks) {
    if (r.restored_step != ranks[0].restored_step) {
      std::printf("nccl_restore_check: FAILED: ranks restored different steps\n");
      return 1;
    }
    received += r.received;
  }
  std::printf(
      "nccl_restore_check: %d rank(s), one per GPU, restored step %lld bit-exact "
      "through NCCL; %d piece(s) arrived by ncclBroadcast\n",
      n, static_cast<long long>(ranks[0].restored_step), received);
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  daemon.Stop();
  zcc::bench::RemoveScratchDir(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
