// Tensors per rank: how registration, checkpoint and restore scale with the
// number of tensors when every tensor is tiny, so that per-tensor costs are
// all there is. One rank, one zccd (started fresh per count), 1k, 10k, 100k
// and 1M fp32 tensors of 16 bytes each (--quick: up to 100k), no EMA.
//
// Through the real daemon path: this process is the trainer (a Client), zccd
// a child process.
//  register: Client::RegisterTensors (the RPC: zccd parses and validates the
//    tensors, assigns shards, lays out the slots and creates the segment; the
//    client checks the placements and builds its copy regions).
//  checkpoint: Snapshot(step) with save_every = 1, until step-N/ appears (the
//    commit's rename): the copy into the slot, ingest, the rank's safetensors
//    shard and manifest written and fsynced, the commit (manifest validation,
//    index files, COMMITTED, renames, latest). Median of several steps.
//  restore: Restore() of that step right after its commit, into zeroed
//    tensors: zccd chooses and verifies the newest step (manifests, headers,
//    every tensor's checksum; each step is new to it, so nothing comes from
//    its cache of verdicts), reads every tensor into a restore buffer, and the
//    client copies them out; the bytes are checked afterwards. Median of the
//    same steps.
// Rows tensor_count_{register,checkpoint,restore}_us_per_tensor_<n>: time per
// tensor, reference = the 1k figure of the same run, ratio = value/reference
// (lower is better; the target is flat: <= 2).
//
// Environment: ZCC_ZCCD, ZCC_BENCH_DIR. Flags: --quick, --only=PATTERN.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
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

constexpr int64_t kFloatsPerTensor = 4;  // 16 bytes
constexpr uint64_t kBytesPerTensor = kFloatsPerTensor * sizeof(float);

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "tensor_count_bench: %s\n", what.c_str());
  std::exit(1);
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string CountName(int n) {
  if (n >= 1'000'000 && n % 1'000'000 == 0) return absl::StrCat(n / 1'000'000, "m");
  if (n >= 1000 && n % 1000 == 0) return absl::StrCat(n / 1000, "k");
  return absl::StrCat(n);
}

// `n` tensors of 16 bytes in one buffer, named like the layers of a model.
struct Tensors {
  std::vector<float> data;
  std::vector<TensorRef> refs;
};

Tensors MakeTensors(int n) {
  Tensors t;
  t.data.resize(static_cast<size_t>(n) * kFloatsPerTensor);
  t.refs.reserve(n);
  for (int i = 0; i < n; ++i) {
    t.refs.push_back({absl::StrCat("model.layers.", i / 1000, ".block", i % 1000, ".weight"),
                      DType::kF32, {kFloatsPerTensor}, &t.data[size_t(i) * kFloatsPerTensor],
                      TensorKind::kParam, false});
  }
  return t;
}

// The values every tensor holds at `step`: distinct per tensor and step.
void Fill(Tensors& t, int64_t step) {
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i * 3 + step);
}

ClientOptions Options(const ZccdProcess& daemon, const std::string& job) {
  ClientOptions o;
  o.socket_path = daemon.socket();
  o.job_id = job;
  o.save_every = 1;
  o.keep_last = 2;
  o.backpressure = Backpressure::kBlock;
  // A million tensors make the registration and restore RPCs take seconds
  // on a slow machine; these are limits, not what is measured.
  o.rpc_timeout = absl::Minutes(30);
  o.daemon_timeout = absl::Minutes(5);
  return o;
}

struct CountResult {
  double register_s = 0;
  std::vector<double> checkpoint_s;
  std::vector<double> restore_s;
};

std::unique_ptr<Client> ConnectAndRegister(const ClientOptions& o, const Tensors& t,
                                           double* seconds) {
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect: " + std::string(c.status().message()));
  const auto start = Clock::now();
  const absl::Status st = (*c)->RegisterTensors(t.refs);
  *seconds = SecondsSince(start);
  if (!st.ok() || !(*c)->Stats().connected) {
    Die("register: " + (st.ok() ? (*c)->Stats().last_error : std::string(st.message())));
  }
  return std::move(c).value();
}

CountResult RunCount(const std::string& dir, int n, int repeats) {
  CountResult res;
  const std::string tag = absl::StrCat("tc", CountName(n));
  auto d = ZccdProcess::Start(dir, tag);
  if (!d.ok()) Die(std::string(d.status().message()));
  std::unique_ptr<ZccdProcess> daemon = std::move(d).value();
  const std::string job_dir = absl::StrCat(daemon->root(), "/", tag);
  Tensors t = MakeTensors(n);
  std::unique_ptr<Client> client = ConnectAndRegister(Options(*daemon, tag), t, &res.register_s);
  // Each round checkpoints a new step and restores it, so that every restore
  // verifies a step it has not verified before (zccd caches verdicts).
  for (int64_t step = 1; step <= repeats; ++step) {
    Fill(t, step);
    const std::string committed = absl::StrCat(job_dir, "/", format::StepDirName(step));
    auto start = Clock::now();
    if (client->Snapshot(step) != SnapshotResult::kEnqueued) Die("snapshot was not enqueued");
    const absl::Time deadline = absl::Now() + absl::Minutes(30);
    while (::access(committed.c_str(), F_OK) != 0) {
      if (absl::Now() > deadline) Die(absl::StrCat("step ", step, " did not commit"));
      absl::SleepFor(absl::Microseconds(200));
    }
    res.checkpoint_s.push_back(SecondsSince(start));
    // `latest` is swapped right after the rename: wait for zccd to report it.
    for (;;) {
      auto status = client->QueryCheckpointStatus();
      if (status.ok() && status->last_committed_step >= step) {
        std::fprintf(stderr,
                     "tensor_count_bench: %s: step %" PRId64 " committed %.3f s after Snapshot "
                     "(zccd: write %.3f s)\n",
                     CountName(n).c_str(), step, res.checkpoint_s.back(),
                     status->last_checkpoint_seconds);
        break;
      }
      if (absl::Now() > deadline) Die(absl::StrCat("step ", step, " is not reported committed"));
      absl::SleepFor(absl::Milliseconds(1));
    }

    std::fill(t.data.begin(), t.data.end(), 0.0f);
    start = Clock::now();
    absl::StatusOr<int64_t> restored = client->Restore();
    res.restore_s.push_back(SecondsSince(start));
    if (!restored.ok()) Die("restore: " + std::string(restored.status().message()));
    if (*restored != step) Die(absl::StrCat("restored step ", *restored, ", not ", step));
    for (size_t k = 0; k < t.data.size(); ++k) {
      if (t.data[k] != static_cast<float>(k * 3 + step)) {
        Die(absl::StrCat("restored value ", k, " is ", t.data[k]));
      }
    }
    std::fprintf(stderr, "tensor_count_bench: %s: restore of step %" PRId64 " %.3f s\n",
                 CountName(n).c_str(), step, res.restore_s.back());
  }
  client.reset();
  std::fprintf(stderr, "tensor_count_bench: %s: zccd peak RSS %.0f MiB\n", CountName(n).c_str(),
               daemon->PeakRssBytes() / double(1 << 20));
  daemon->Stop();
  return res;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter("tensor_count_bench", argc, argv);
  std::vector<int> defaults = {1'000, 10'000, 100'000, 1'000'000};
  if (quick) defaults.pop_back();
  const std::vector<int> counts = CountsFromEnv("ZCC_TENSOR_COUNTS", defaults);
  bool any = false;
  for (int n : counts) {
    for (const char* row : {"register", "checkpoint", "restore"}) {
      any = any || filter.Wants(
                       absl::StrCat("tensor_count_", row, "_us_per_tensor_", CountName(n)));
    }
  }
  if (!any || counts.empty()) return 0;
  const std::string dir = MakeScratchDir("tensor-count-bench");
  if (dir.empty()) Die("cannot create the scratch directory");
  std::fprintf(stderr, "tensor_count_bench: %" PRIu64 "-byte fp32 tensors, scratch %s, load %.2f\n",
               kBytesPerTensor, dir.c_str(), LoadAverage1());

  std::map<int, CountResult> results;
  for (int n : counts) {
    // Medians of 5 rounds up to 10k tensors, of 3 above.
    const int repeats = n <= 10'000 ? 5 : 3;
    results[n] = RunCount(dir, n, repeats);
    const CountResult& r = results[n];
    std::fprintf(stderr,
                 "tensor_count_bench: %s tensors: register %.3f s, checkpoint %.3f s, restore "
                 "%.3f s (medians; load %.2f)\n",
                 CountName(n).c_str(), r.register_s,
                 Percentile(r.checkpoint_s, 0.5), Percentile(r.restore_s, 0.5), LoadAverage1());
  }
  RemoveScratchDir(dir);

  const int base = counts.front();
  const auto us_per_tensor = [](double seconds, int n) { return seconds * 1e6 / n; };
  struct Measure {
    const char* row;
    double (*seconds)(const CountResult&);
  };
  const Measure measures[] = {
      {"register", [](const CountResult& r) { return r.register_s; }},
      {"checkpoint", [](const CountResult& r) { return Percentile(r.checkpoint_s, 0.5); }},
      {"restore", [](const CountResult& r) { return Percentile(r.restore_s, 0.5); }},
  };
  for (const Measure& m : measures) {
    const double reference = us_per_tensor(m.seconds(results[base]), base);
    for (int n : counts) {
      const std::string name =
          absl::StrCat("tensor_count_", m.row, "_us_per_tensor_", CountName(n));
      if (!filter.Wants(name)) continue;
      const double value = us_per_tensor(m.seconds(results[n]), n);
      Emit({absl::StrCat(name, " (ratio = value/", CountName(base), "; lower is better)"), value,
            reference, value / reference, "<= 2", "us"});
    }
  }
  return 0;
}
