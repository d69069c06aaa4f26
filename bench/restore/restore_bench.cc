// Restore from memory: a trainer restarted after its predecessor died gets
// the newest snapshot back from the staging segment zccd kept, with no disk
// read. One rank, one zccd, 1 GiB of fp32 state in 64 tensors (--quick:
// 256 MiB), no EMA, through the real daemon path (this process is the
// trainer, zccd a child process).
//
// Per round: a client registers the tensors, snapshots step 1, flushes and
// goes away (zccd keeps its snapshot); a second client registers the same
// tensors over zeroed buffers and calls Restore(), which must come from
// memory; the bytes are checked afterwards. The time is the Restore() call:
// its RPC, the copy out of the staging slot into the tensors, RestoreDone.
// Reference: memcpy of the same bytes from one resident buffer into the same
// tensors, in the same round. Median of 3 rounds.
//
// Rows: restore_memory_vs_memcpy (GB/s, ratio = restore / memcpy, target
// >= 0.8) and restore_memory_s (seconds, informative).
//
// From disk, cold (restore_disk_cold_vs_odirect): a second zccd that keeps
// no snapshots in memory (--retain_snapshots_s=0) commits step 1 of the same
// state; per round the page cache is dropped (the step's files fsynced and
// evicted, /proc/sys/vm/drop_caches where allowed) and a new client restores
// it: zccd checks the step's metadata and reads each piece once into the
// rank's staging slot, checking checksums, and the client copies it out.
// Reference: raw O_DIRECT reads of the step's files (io_uring, 8 x 8 MiB in
// flight), cold, in the same round. Target >= 0.8.
//
// The same with a staging pool (restore_disk_cold_pool_vs_odirect): a third
// zccd with --staging_pool_mb of one piece per registration (the commit's and
// each round's), made ready before the rounds; the rank's staging slot is
// memory zccd allocated and mapped before the trainer registered, as after a
// restart of a zccd that has a pool. Target >= 0.8.
//
// Environment: ZCC_ZCCD, ZCC_BENCH_DIR. Flags: --quick, --only=PATTERN.
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/disk_io.h"
#include "bench/harness.h"
#include "bench/report.h"
#include "client/client.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTensors = 64;
constexpr int kRounds = 3;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "restore_bench: %s\n", what.c_str());
  std::exit(1);
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct State {
  std::vector<std::vector<float>> tensors;
  std::vector<TensorRef> refs;
};

// `bytes` of fp32 state in kTensors tensors, every element set from `seed`
// (0: zeros), touched so that its pages are resident.
State MakeState(uint64_t bytes, uint32_t seed) {
  State s;
  const size_t elements = bytes / sizeof(float) / kTensors;
  s.tensors.resize(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    s.tensors[i].resize(elements);
    for (size_t e = 0; e < elements; ++e) {
      s.tensors[i][e] = seed == 0 ? 0.0f : static_cast<float>((seed * 2654435761u + i * 40503u + e) % 1000003);
    }
    TensorRef r;
    r.name = absl::StrCat("layers.", i, ".weight");
    r.dtype = DType::kF32;
    r.shape = {static_cast<int64_t>(elements)};
    r.data = s.tensors[i].data();
    r.kind = TensorKind::kParam;
    s.refs.push_back(r);
  }
  return s;
}

std::unique_ptr<Client> Register(const ZccdProcess& daemon, const State& state,
                                 uint32_t save_every = 0) {
  ClientOptions o;
  o.socket_path = daemon.socket();
  o.job_id = "restore-bench";
  o.backpressure = Backpressure::kBlock;
  o.save_every = save_every;
  auto c = Client::Connect(o);
  if (!c.ok()) Die(absl::StrCat("connect: ", c.status().ToString()));
  if (absl::Status st = (*c)->RegisterTensors(state.refs); !st.ok()) {
    Die(absl::StrCat("register: ", st.ToString()));
  }
  if (!(*c)->Stats().connected) Die("not registered with zccd");
  return std::move(*c);
}

struct Round {
  double restore_s = 0;
  double memcpy_s = 0;
};

Round RunRound(const ZccdProcess& daemon, uint64_t bytes, uint32_t seed) {
  State trained = MakeState(bytes, seed);
  {
    std::unique_ptr<Client> first = Register(daemon, trained);
    if (first->Snapshot(1) != SnapshotResult::kEnqueued) Die("snapshot not enqueued");
    if (absl::Status st = first->Flush(); !st.ok()) Die(absl::StrCat("flush: ", st.ToString()));
  }  // gone: zccd keeps the snapshot
  State fresh = MakeState(bytes, 0);
  std::unique_ptr<Client> second = Register(daemon, fresh);
  Round r;
  const Clock::time_point t0 = Clock::now();
  auto restored = second->Restore(RestoreOptions{});
  r.restore_s = SecondsSince(t0);
  if (!restored.ok()) Die(absl::StrCat("restore: ", restored.status().ToString()));
  if (!restored->from_memory || restored->step != 1) Die("the restore did not come from memory");
  for (int i = 0; i < kTensors; ++i) {
    if (std::memcmp(fresh.tensors[i].data(), trained.tensors[i].data(),
                    trained.tensors[i].size() * sizeof(float)) != 0) {
      Die(absl::StrCat("tensor ", i, " differs after the restore"));
    }
  }
  // The same bytes, memcpy from resident memory into the same tensors.
  const Clock::time_point t1 = Clock::now();
  for (int i = 0; i < kTensors; ++i) {
    std::memcpy(fresh.tensors[i].data(), trained.tensors[i].data(),
                trained.tensors[i].size() * sizeof(float));
  }
  r.memcpy_s = SecondsSince(t1);
  return r;
}

// Step 1 of `bytes` of state committed by `daemon`; returns the step's files.
std::vector<std::string> CommitStep(const ZccdProcess& daemon, uint64_t bytes) {
  State trained = MakeState(bytes, 7);
  std::unique_ptr<Client> client = Register(daemon, trained, /*save_every=*/1);
  if (client->Snapshot(1) != SnapshotResult::kEnqueued) Die("snapshot not enqueued");
  if (absl::Status st = client->Flush(); !st.ok()) Die(absl::StrCat("flush: ", st.ToString()));
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (true) {
    auto status = client->QueryCheckpointStatus();
    if (status.ok() && status->last_committed_step == 1) break;
    if (absl::Now() > deadline) Die("step 1 was not committed");
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::vector<std::string> files;
  const std::string step_dir = daemon.root() + "/restore-bench/step-00000001";
  for (const auto& entry : std::filesystem::directory_iterator(step_dir)) {
    files.push_back(entry.path().string());
  }
  return files;
}

struct DiskRound {
  double restore_gbps = 0;
  double raw_gbps = 0;
};

DiskRound RunDiskRound(const ZccdProcess& daemon, uint64_t bytes,
                       const std::vector<std::string>& files, uint8_t* ring) {
  DiskRound r;
  State fresh = MakeState(bytes, 0);
  std::unique_ptr<Client> client = Register(daemon, fresh);
  DropCaches(files);
  const Clock::time_point t0 = Clock::now();
  auto restored = client->Restore(RestoreOptions{});
  const double restore_s = SecondsSince(t0);
  if (!restored.ok()) Die(absl::StrCat("restore: ", restored.status().ToString()));
  if (restored->from_memory || restored->step != 1) Die("the restore did not come from disk");
  const State expected = MakeState(bytes, 7);
  for (int i = 0; i < kTensors; ++i) {
    if (std::memcmp(fresh.tensors[i].data(), expected.tensors[i].data(),
                    expected.tensors[i].size() * sizeof(float)) != 0) {
      Die(absl::StrCat("tensor ", i, " differs after the restore from disk"));
    }
  }
  r.restore_gbps = bytes / restore_s / 1e9;
  DropCaches(files);
  double raw_s = 0;
  uint64_t raw_bytes = 0;
  for (const std::string& f : files) {
    uint64_t got = 0;
    raw_s += RawRead(f, ring, &got);
    raw_bytes += got;
  }
  r.raw_gbps = raw_bytes / raw_s / 1e9;
  return r;
}

// Waits (at most 5 minutes) until the zccd's log says its staging pool is ready.
void AwaitPoolReady(const ZccdProcess& daemon) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (true) {
    std::ifstream in(daemon.log_path());
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("of staging memory ready") != std::string::npos) return;
    if (absl::Now() > deadline) Die("the staging pool was not ready in 5 minutes");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// One cold-restore row: its zccd, its step's files and its rounds so far.
struct DiskRow {
  const char* name;
  const char* what;
  const ZccdProcess* daemon;
  std::vector<std::string> files;
  std::vector<double> zcc_gbps, raw_gbps;
};

// kRounds rounds of each row, the rows taking turns within a round (the
// disk's speed drifts: each row meets the same drift), then their medians.
void RunDiskRows(std::vector<DiskRow>& rows, uint64_t bytes) {
  for (DiskRow& row : rows) row.files = CommitStep(*row.daemon, bytes);
  std::unique_ptr<uint8_t, decltype(&std::free)> ring(
      static_cast<uint8_t*>(std::aligned_alloc(4096, kRawBlock * kRawDepth)), &std::free);
  for (int round = 0; round < kRounds; ++round) {
    for (DiskRow& row : rows) {
      const DiskRound r = RunDiskRound(*row.daemon, bytes, row.files, ring.get());
      row.zcc_gbps.push_back(r.restore_gbps);
      row.raw_gbps.push_back(r.raw_gbps);
      std::fprintf(stderr, "restore_bench: %.2f GB from disk, cold%s: restore %.2f GB/s, raw "
                   "O_DIRECT read %.2f GB/s (load %.2f)\n", bytes / 1e9, row.what,
                   r.restore_gbps, r.raw_gbps, LoadAverage1());
    }
  }
  for (const DiskRow& row : rows) {
    Emit({row.name, Percentile(row.zcc_gbps, 0.5), Percentile(row.raw_gbps, 0.5), 0, ">= 0.8",
          "GB/s"});
  }
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter("restore_bench", argc, argv);
  const bool memory_rows = filter.Wants("restore_memory_vs_memcpy") || filter.Wants("restore_memory_s");
  const bool disk_rows = filter.Wants("restore_disk_cold_vs_odirect");
  const bool pool_rows = filter.Wants("restore_disk_cold_pool_vs_odirect");
  if (!memory_rows && !disk_rows && !pool_rows) return 0;
  const uint64_t bytes = (quick ? uint64_t{256} : uint64_t{1024}) << 20;
  const std::string dir = MakeScratchDir("restore-bench");
  if (dir.empty()) Die("cannot create the scratch directory");
  std::vector<DiskRow> rows;
  std::unique_ptr<ZccdProcess> disk_daemon, pool_daemon;
  if (disk_rows) {
    auto started = ZccdProcess::Start(dir, "restore-disk", {"--retain_snapshots_s=0"});
    if (!started.ok()) Die(absl::StrCat("zccd: ", started.status().ToString()));
    disk_daemon = std::move(*started);
    rows.push_back(DiskRow{"restore_disk_cold_vs_odirect", "", disk_daemon.get(), {}, {}, {}});
  }
  if (pool_rows) {
    // A piece per registration: the commit's and each round's; each a slot
    // and the control block, rounded up.
    const uint64_t piece_mb = (bytes >> 20) + 2;
    auto started = ZccdProcess::Start(
        dir, "restore-pool",
        {"--retain_snapshots_s=0", absl::StrCat("--staging_pool_mb=", piece_mb * (kRounds + 1)),
         absl::StrCat("--staging_pool_entry_mb=", piece_mb)});
    if (!started.ok()) Die(absl::StrCat("zccd: ", started.status().ToString()));
    pool_daemon = std::move(*started);
    AwaitPoolReady(*pool_daemon);
    rows.push_back(DiskRow{"restore_disk_cold_pool_vs_odirect", ", staging pool",
                           pool_daemon.get(), {}, {}, {}});
  }
  if (!rows.empty()) RunDiskRows(rows, bytes);
  for (auto* d : {&disk_daemon, &pool_daemon}) {
    if (*d != nullptr) (*d)->Stop();
    d->reset();
  }
  if (!memory_rows) {
    RemoveScratchDir(dir);
    return 0;
  }
  auto daemon = ZccdProcess::Start(dir, "restore");
  if (!daemon.ok()) Die(absl::StrCat("zccd: ", daemon.status().ToString()));
  std::vector<double> restore_s, memcpy_s;
  for (int round = 0; round < kRounds; ++round) {
    const Round r = RunRound(**daemon, bytes, static_cast<uint32_t>(round + 1));
    restore_s.push_back(r.restore_s);
    memcpy_s.push_back(r.memcpy_s);
    std::fprintf(stderr, "restore_bench: %.2f GB: restore from memory %.3f s, memcpy %.3f s "
                 "(load %.2f)\n", bytes / 1e9, r.restore_s, r.memcpy_s, LoadAverage1());
  }
  (*daemon)->Stop();
  daemon->reset();
  RemoveScratchDir(dir);
  const double restore = Percentile(restore_s, 0.5);
  const double copy = Percentile(memcpy_s, 0.5);
  if (filter.Wants("restore_memory_vs_memcpy")) {
    Emit({"restore_memory_vs_memcpy", bytes / restore / 1e9, bytes / copy / 1e9, 0, ">= 0.8",
          "GB/s"});
  }
  if (filter.Wants("restore_memory_s")) {
    Emit({absl::StrCat("restore_memory_s (", bytes >> 20, " MiB; lower is better)"), restore, 0, 0,
          "", "s"});
  }
  return 0;
}
