// Ranks per daemon: 1, 2, 4 and 8 trainer ranks (threads, each with its own
// Client, in lockstep like data-parallel ranks) against one zccd: the total
// checkpoint write throughput and the trainer-thread cost of Snapshot.
//
// Each rank holds its own state (bf16 parameters + fp32 master/Adam, 128 MiB;
// --quick: 32 MiB), so a checkpoint of N ranks is N times larger (weak
// scaling, as GPUs added to a node). Per step every rank waits at a barrier,
// "computes" (a sleep standing in for accelerator time), calls
// FenceBeforeUpdate, changes its state and calls Snapshot; checkpoint every 10
// steps, no EMA (this benchmark isolates ingest and writes; bench/e2e
// measures the EMA). 10 warm-up steps (first checkpoint included), then 20
// measured steps (--quick: 10) with checkpoints at steps 20 and 30.
//
// Rows, per rank count N:
//  scale_write_gbps_<N>ranks (ratio = zcc/raw O_DIRECT): per checkpoint in
//    the measured window, the bytes of its committed shard files over the
//    time from the first rank's snapshot of the step being published (its
//    slot READY: the earliest zccd can start writing) to step-N/ appearing
//    (the commit's rename), so writes, fsyncs, manifests and the commit are
//    all in it; against a raw O_DIRECT write of the same number of bytes to
//    the same disk right after (8 MiB requests, 8 in flight through io_uring,
//    then fdatasync). (zccd's own figure from QueryCheckpointStatus is logged
//    but not used: with several ranks it counts only the ranks whose write
//    finished before the commit; see BENCHMARKS.md.)
//  scale_snapshot_p50_us_<N>ranks / _p99_ (ratio = 1-rank / N-rank): the
//    trainer-thread cost of Snapshot over all ranks' measured steps, against
//    the 1-rank figure of the same run.
//
// Environment: ZCC_ZCCD, ZCC_BENCH_DIR. Flags: --quick, --only=PATTERN
// (extended regex over "scale_bench:<row>"; every rank count still runs, the
// 1-rank figures being the references).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/harness.h"
#include "bench/report.h"
#include "client/client.h"
#include "format/manifest.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSaveEvery = 10;
constexpr int kWarmupSteps = 10;
constexpr unsigned kDepth = 8;
constexpr uint64_t kBlock = uint64_t{8} << 20;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "scale_bench: %s\n", what.c_str());
  std::exit(1);
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

// One rank's tensors: bf16 weights and fp32 master/exp_avg/exp_avg_sq.
struct RankState {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorRef> refs;
};

RankState BuildRank(uint32_t rank, uint64_t bytes, int params) {
  RankState s;
  const int64_t cols = 256;
  const int64_t rows = std::max<int64_t>(1, bytes / 14 / params / cols);
  std::mt19937 rng(rank + 1);
  for (int p = 0; p < params; ++p) {
    // Distinct names per rank (tensor-parallel shards, say): every rank writes its own.
    const std::string w = absl::StrCat("model.layers.", p, ".weight.shard", rank);
    auto add = [&](std::string name, DType dtype, size_t esize, TensorKind kind) {
      s.buffers.emplace_back(rows * cols * esize);
      std::vector<uint8_t>& b = s.buffers.back();
      for (size_t i = 0; i + 4 <= b.size(); i += 4) {
        const uint32_t v = 0x3f000000u | (rng() & 0x807fffffu);
        std::memcpy(&b[i], &v, 4);
      }
      s.refs.push_back({std::move(name), dtype, {rows, cols}, b.data(), kind, kind == TensorKind::kParam});
    };
    add(w, DType::kBF16, 2, TensorKind::kParam);
    for (const char* st : {"master", "exp_avg", "exp_avg_sq"}) {
      add(absl::StrCat("optimizer.", w, ".", st), DType::kF32, 4, TensorKind::kOptim);
    }
  }
  return s;
}

void Touch(RankState& s, int64_t step) {
  for (std::vector<uint8_t>& b : s.buffers) {
    for (size_t i = (step * 64) % 65536; i + 2 <= b.size(); i += 65536) b[i] ^= 1;
  }
}

// The disk's sequential speed for `total` bytes: 8 MiB O_DIRECT writes from
// `source` (written repeatedly), 8 in flight, into a file sized first, then
// fdatasync. Returns GB/s.
double RawWriteGbps(const std::string& path, const uint8_t* source, uint64_t source_bytes,
                    uint64_t total) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + path + " with O_DIRECT: " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) Die("ftruncate");
  io_uring ring;
  if (io_uring_queue_init(kDepth, &ring, 0) != 0) Die("io_uring_queue_init");
  unsigned in_flight = 0;
  auto reap = [&] {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe->res <= 0) Die("raw write failed");
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  };
  for (uint64_t off = 0; off < total; off += kBlock) {
    const uint64_t len = std::min(kBlock, total - off);
    if (in_flight == kDepth) reap();
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_write(sqe, fd, source + (off % source_bytes), len, off);
    io_uring_submit(&ring);
    ++in_flight;
  }
  while (in_flight > 0) reap();
  if (::fdatasync(fd) != 0) Die("fdatasync");
  ::close(fd);
  io_uring_queue_exit(&ring);
  const double s = SecondsSince(start);
  ::unlink(path.c_str());
  return total / s / 1e9;
}

struct ScaleResult {
  std::vector<double> snapshot_us;  // all ranks, measured steps
  std::vector<double> gbps;         // per checkpoint in the measured window
  uint64_t checkpoint_bytes = 0;
  uint64_t taken = 0, published = 0;
  double raw_gbps = 0;
};

ScaleResult RunRanks(const std::string& dir, int ranks, uint64_t rank_bytes, int measured,
                     double step_s, const uint8_t* raw_source, uint64_t raw_source_bytes) {
  ScaleResult res;
  auto d = ZccdProcess::Start(dir, absl::StrCat("scale", ranks));
  if (!d.ok()) Die(std::string(d.status().message()));
  std::unique_ptr<ZccdProcess> daemon = std::move(d).value();
  const int total = kWarmupSteps + measured;
  const int params = 8;
  std::vector<RankState> states;
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < ranks; ++r) {
    states.push_back(BuildRank(r, rank_bytes, params));
    ClientOptions o;
    o.socket_path = daemon->socket();
    o.job_id = absl::StrCat("scale", ranks);
    o.rank = r;
    o.world_size = ranks;
    o.save_every = kSaveEvery;
    auto c = Client::Connect(o);
    if (!c.ok()) Die("connect: " + std::string(c.status().message()));
    const absl::Status st = (*c)->RegisterTensors(states.back().refs);
    if (!st.ok() || !(*c)->Stats().connected) {
      Die("register: " + (st.ok() ? (*c)->Stats().last_error : std::string(st.message())));
    }
    clients.push_back(std::move(c).value());
  }
  Barrier barrier(ranks);
  std::vector<std::vector<double>> costs(ranks);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      for (int64_t step = 1; step <= total; ++step) {
        barrier.Wait();
        absl::SleepFor(absl::Seconds(step_s));  // forward/backward on the accelerator
        (void)clients[r]->FenceBeforeUpdate();
        Touch(states[r], step);
        const auto t = Clock::now();
        (void)clients[r]->Snapshot(step);
        if (step > kWarmupSteps) {
          costs[r].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
        }
      }
    });
  }
  // Each checkpoint from outside the daemon: it may start writing when the
  // first rank's snapshot of the step is published (slot READY), and it is
  // committed when step-N/ appears (the commit renames step-N.partial/); the
  // bytes are the committed shard files. (zccd's own figure is logged too,
  // but it counts only the ranks whose write finished before the commit
  // started: see BENCHMARKS.md.)
  const int64_t last_save = total / kSaveEvery * kSaveEvery;
  const std::string job_dir = absl::StrCat(daemon->root(), "/scale", ranks);
  std::map<int64_t, Clock::time_point> first_published, committed;
  std::thread watcher([&] {
    while (!done.load() && static_cast<int64_t>(committed.size()) < last_save / kSaveEvery) {
      const auto now = Clock::now();
      for (int64_t s = kSaveEvery; s <= last_save; s += kSaveEvery) {
        if (!first_published.count(s)) {
          for (auto& c : clients) {
            if (c->Stats().last_published_step >= s) {
              first_published[s] = now;
              break;
            }
          }
        }
        if (!committed.count(s) &&
            ::access(absl::StrCat(job_dir, "/", format::StepDirName(s)).c_str(), F_OK) == 0) {
          committed[s] = now;
        }
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  for (std::thread& t : threads) t.join();
  for (auto& c : clients) (void)c->Flush();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    auto st = clients[0]->QueryCheckpointStatus();
    if (st.ok() && st->last_committed_step >= last_save) {
      std::fprintf(stderr, "scale_bench: %d rank(s): zccd reports step %" PRId64 ": %.3f GB in "
                   "%.3f s, %.2f GB/s\n", ranks, st->last_committed_step,
                   st->last_checkpoint_bytes / 1e9, st->last_checkpoint_seconds,
                   st->last_checkpoint_gbps);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  done.store(true);
  watcher.join();
  for (const auto& [s, at] : committed) {
    uint64_t bytes = 0;
    const std::string step_dir = absl::StrCat(job_dir, "/", format::StepDirName(s));
    if (DIR* d = ::opendir(step_dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() < 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0) continue;
        struct stat st;
        if (::stat((step_dir + "/" + name).c_str(), &st) == 0) bytes += st.st_size;
      }
      ::closedir(d);
    }
    auto p = first_published.find(s);
    if (p == first_published.end() || bytes == 0) continue;
    const double secs = std::chrono::duration<double>(at - p->second).count();
    std::fprintf(stderr, "scale_bench: %d rank(s): step %" PRId64 ": %.3f GB committed %.3f s "
                 "after the first rank's slot was ready: %.2f GB/s%s\n", ranks, s, bytes / 1e9,
                 secs, bytes / secs / 1e9, s > kWarmupSteps ? "" : " (warm-up)");
    if (s > kWarmupSteps) {
      res.gbps.push_back(bytes / secs / 1e9);
      res.checkpoint_bytes = bytes;
    }
  }
  if (static_cast<int64_t>(committed.size()) < last_save / kSaveEvery) {
    auto st = clients[0]->QueryCheckpointStatus();
    std::fprintf(stderr, "scale_bench: not every checkpoint committed: %s\n",
                 st.ok() ? st->last_error.c_str() : std::string(st.status().message()).c_str());
  }
  for (int r = 0; r < ranks; ++r) {
    res.snapshot_us.insert(res.snapshot_us.end(), costs[r].begin(), costs[r].end());
    const ClientStats s = clients[r]->Stats();
    res.taken += total;
    res.published += s.snapshots_published;
  }
  clients.clear();
  daemon->Stop();
  // The same number of bytes straight to the disk.
  const uint64_t bytes = res.checkpoint_bytes > 0 ? res.checkpoint_bytes : ranks * rank_bytes;
  const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  res.raw_gbps = RawWriteGbps(dir + "/raw.bin", raw_source, raw_source_bytes, rounded);
  return res;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter("scale_bench", argc, argv);
  const std::vector<int> counts = CountsFromEnv("ZCC_SCALE_COUNTS", {1, 2, 4, 8});
  bool any = false;
  for (int n : counts) {
    for (const char* row : {"scale_write_gbps_", "scale_snapshot_p50_us_", "scale_snapshot_p99_us_"}) {
      any = any || filter.Wants(absl::StrCat(row, n, "ranks"));
    }
  }
  if (!any) return 0;
  const uint64_t rank_bytes = quick ? uint64_t{32} << 20 : uint64_t{128} << 20;
  const int measured = quick ? 10 : 20;
  const double step_s = quick ? 0.1 : 0.2;
  const std::string dir = MakeScratchDir("scale-bench");
  if (dir.empty()) Die("cannot create the scratch directory");
  // Source of the raw writes: incompressible, 2 MiB aligned.
  const uint64_t raw_source_bytes = uint64_t{64} << 20;
  void* raw = std::aligned_alloc(2 << 20, raw_source_bytes);
  if (raw == nullptr) Die("allocation failed");
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < raw_source_bytes / 8; ++i) static_cast<uint64_t*>(raw)[i] = rng();
  std::fprintf(stderr, "scale_bench: %.0f MiB per rank, step %.0f ms (sleep), %d warm-up + %d "
               "measured steps, checkpoint every %d, scratch %s, load %.2f\n",
               rank_bytes / double(1 << 20), step_s * 1e3, kWarmupSteps, measured, kSaveEvery,
               dir.c_str(), LoadAverage1());

  std::map<int, ScaleResult> results;
  for (int n : counts) {
    const ScaleResult r = RunRanks(dir, n, rank_bytes, measured, step_s,
                                   static_cast<const uint8_t*>(raw), raw_source_bytes);
    std::fprintf(stderr,
                 "scale_bench: %d rank(s): %.2f GB/s (mean of %zu checkpoints), raw O_DIRECT %.2f "
                 "GB/s; Snapshot p50 %.1f us p99 %.1f us max %.1f us (%zu samples); %" PRIu64
                 "/%" PRIu64 " published (load %.2f)\n",
                 n, Mean(r.gbps), r.gbps.size(), r.raw_gbps,
                 Percentile(r.snapshot_us, 0.5), Percentile(r.snapshot_us, 0.99),
                 Percentile(r.snapshot_us, 1.0), r.snapshot_us.size(), r.published, r.taken,
                 LoadAverage1());
    results[n] = r;
  }
  std::free(raw);
  RemoveScratchDir(dir);

  const double p50_1 = Percentile(results[1].snapshot_us, 0.5);
  const double p99_1 = Percentile(results[1].snapshot_us, 0.99);
  for (int n : counts) {
    const ScaleResult& r = results[n];
    const std::string w = absl::StrCat("scale_write_gbps_", n, "ranks");
    if (filter.Wants(w) && !r.gbps.empty() && r.raw_gbps > 0) {
      Emit({absl::StrCat(w, " (ratio = zcc/raw O_DIRECT)"), Mean(r.gbps), r.raw_gbps, 0, "",
            "GB/s"});
    }
    const double p50 = Percentile(r.snapshot_us, 0.5), p99 = Percentile(r.snapshot_us, 0.99);
    const std::string a = absl::StrCat("scale_snapshot_p50_us_", n, "ranks");
    if (filter.Wants(a) && p50 > 0) {
      Emit({absl::StrCat(a, " (ratio = 1-rank/", n, "-rank)"), p50, p50_1, p50_1 / p50, "", "us"});
    }
    const std::string b = absl::StrCat("scale_snapshot_p99_us_", n, "ranks");
    if (filter.Wants(b) && p99 > 0) {
      Emit({absl::StrCat(b, " (ratio = 1-rank/", n, "-rank)"), p99, p99_1, p99_1 / p99, "", "us"});
    }
  }
  return 0;
}
