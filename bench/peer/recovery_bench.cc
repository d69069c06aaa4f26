// Recovery of a lost node from the peer tier, against the same step restored
// from disk, with real zccds on loopback (plaintext: the transport's TLS cost
// has rows of its own in peer_bench).
//
// node-a trains two ranks of one job (8 f32 tensors each, 1 GiB in all;
// --quick: 128 MiB) with a checkpoint every 4 steps, each also replicated to
// its buddy, node-b (a static peer in another rack). After step 4 is committed on
// node-a's disk and held in node-b's memory, node-a is killed (SIGKILL).
//   * recovery: a replacement zccd, node-c, with an empty root, registers the
//     ranks and restores them: it reads step 4 in place, each rank's restore
//     pulling what it needs from node-b straight into its staging memory
//     (node-c writes the step into its root only after the restores);
//   * reference: node-a restarted on its own root (no peer tier) registers
//     the ranks and restores step 4 from its disk.
// Both are timed from the start of the registration to the restore's end,
// and both restores are checked byte for byte against the trained state.
// The page cache is warm for the reference (node-a's files were just
// written); say so beside the figures.
//
// Rows:
//   peer_recovery_vs_disk_restore (ratio = disk / recovery), seconds
//   peer_recovery_gbps_vs_tcp: the step's bytes / recovery time, against a
//     plain TCP stream of the same bytes over the same loopback (GB/s)
//   peer_memory_held_vs_step_bytes (ratio = step bytes / held): node-b's
//     resident memory grown by holding the step, against the step's bytes
//     (replicas = 1: at most one copy of what needs one; target >= 0.95)
//
// Environment: ZCC_ZCCD (the zccd binary), ZCC_BENCH_DIR. Flags: --quick,
// --only=PATTERN.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/harness.h"
#include "bench/peer/tcp_stream.h"
#include "bench/report.h"
#include "client/client.h"

namespace zcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRanks = 2;    // on one node, restored together
constexpr int kTensors = 8;  // per rank
constexpr int kSaveEvery = 4;
constexpr char kJob[] = "recovery";

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "recovery_bench: %s\n", why.c_str());
  std::exit(1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits up to `timeout` for `text` in the zccd's log.
bool AwaitLog(const ZccdProcess& d, const std::string& text, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (absl::StrContains(ReadFile(d.log_path()), text)) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

struct State {
  int rank = 0;
  std::vector<std::vector<float>> tensors;
  uint64_t bytes() const { return uint64_t{tensors.size()} * tensors[0].size() * sizeof(float); }
  std::vector<TensorRef> Refs() {
    std::vector<TensorRef> refs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      TensorRef r;
      r.name = absl::StrCat("rank", rank, ".layer", i, ".weight");  // a rank's own tensors
      r.dtype = DType::kF32;
      r.shape = {static_cast<int64_t>(tensors[i].size())};
      r.data = tensors[i].data();
      r.kind = TensorKind::kParam;
      refs.push_back(r);
    }
    return refs;
  }
};

std::unique_ptr<Client> Connect(const ZccdProcess& d, State& state, int rank) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = kJob;
  o.rank = rank;
  o.world_size = kRanks;
  o.save_every = kSaveEvery;
  o.backpressure = Backpressure::kBlock;
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect: " + std::string(c.status().message()));
  const absl::Status st = (*c)->RegisterTensors(state.Refs());
  if (!st.ok()) Die("register: " + std::string(st.message()));
  return std::move(c).value();
}

// Seconds from the registrations' start to `step` restored into fresh
// states by every rank at once (a thread each), which must then equal `want`.
double TimedRestore(const ZccdProcess& d, const std::vector<State>& want, int64_t step) {
  std::vector<State> fresh(want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    fresh[r].rank = want[r].rank;
    fresh[r].tensors.assign(want[r].tensors.size(),
                            std::vector<float>(want[r].tensors[0].size(), 0.f));
  }
  std::vector<absl::StatusOr<int64_t>> got(want.size(), absl::UnknownError("not run"));
  const auto start = Clock::now();
  {
    std::vector<std::thread> ranks;
    for (size_t r = 0; r < want.size(); ++r) {
      ranks.emplace_back([&, r] {
        std::unique_ptr<Client> c = Connect(d, fresh[r], static_cast<int>(r));
        got[r] = c->Restore();
      });
    }
    for (std::thread& t : ranks) t.join();
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  for (size_t r = 0; r < want.size(); ++r) {
    if (!got[r].ok() || *got[r] != step) {
      Die(absl::StrCat("rank ", r, "'s restore from ", d.log_path(), ": ",
                       got[r].ok() ? absl::StrCat("step ", *got[r]) : got[r].status().ToString()));
    }
    for (size_t i = 0; i < want[r].tensors.size(); ++i) {
      if (std::memcmp(fresh[r].tensors[i].data(), want[r].tensors[i].data(),
                      want[r].tensors[i].size() * sizeof(float)) != 0) {
        Die(absl::StrCat("rank ", r, "'s tensor ", i, " restored from ", d.log_path(),
                         " differs"));
      }
    }
  }
  return s;
}

std::vector<std::string> PeerFlags(const std::string& node, const std::string& rack,
                                   const std::string& listen, uint64_t budget_mb) {
  return {"--peer_listen=" + listen, "--peer_insecure", "--node_name=" + node,
          "--failure_domain=" + rack, absl::StrCat("--replica_budget_mb=", budget_mb)};
}

// A node lost: its zccd killed, and what the kernel would lose with the
// node (its shared memory) removed.
void KillAndReap(ZccdProcess& d) {
  ::kill(d.pid(), SIGKILL);
  int status = 0;
  ::waitpid(d.pid(), &status, 0);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, d.shm_prefix() + ".") ||
        name == absl::StrCat(".zccd.", d.shm_prefix(), ".lock")) {
      std::error_code ignored;
      std::filesystem::remove(e.path(), ignored);
    }
  }
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  using zcc::Client;
  using zcc::SnapshotResult;
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter("recovery_bench", argc, argv);
  if (!filter.Wants("peer_recovery_vs_disk_restore") &&
      !filter.Wants("peer_recovery_gbps_vs_tcp") &&
      !filter.Wants("peer_memory_held_vs_step_bytes")) {
    return 0;
  }
  const std::string dir = MakeScratchDir("recovery_bench");
  if (dir.empty()) Die("no scratch directory");
  const uint64_t total = quick ? (uint64_t{128} << 20) : (uint64_t{1} << 30);
  std::vector<State> state(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    state[r].rank = r;
    state[r].tensors.resize(kTensors);
    for (int i = 0; i < kTensors; ++i) {
      std::vector<float>& t = state[r].tensors[i];
      t.resize(total / kRanks / kTensors / sizeof(float));
      for (size_t j = 0; j < t.size(); ++j) {
        t[j] = static_cast<float>((j * 2654435761u + i + 7 * r) % 1000003) * 1e-3f;
      }
    }
  }
  const uint64_t budget_mb = 3 * (total >> 20) + 64;

  // node-b: the buddy, on a port chosen by the kernel (read from its log).
  auto b = ZccdProcess::Start(dir, "node-b", PeerFlags("node-b", "rack-2", "127.0.0.1:0", budget_mb));
  if (!b.ok()) Die(std::string(b.status().message()));
  std::string port;
  {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (port.empty() && absl::Now() < until) {
      const std::string log = ReadFile((*b)->log_path());
      const size_t at = log.find("(port ");
      if (at != std::string::npos) port = log.substr(at + 6, log.find_first_of(",)", at) - at - 6);
      if (port.empty()) absl::SleepFor(absl::Milliseconds(50));
    }
  }
  if (port.empty()) Die("node-b's peer port is not in its log");
  const std::string buddy = "--peer_static=127.0.0.1:" + port;
  const uint64_t b_rss_before = (*b)->RssBytes();

  // node-a trains, checkpoints step 4 and replicates it to node-b.
  std::vector<std::string> a_flags = PeerFlags("node-a", "rack-1", "127.0.0.1:0", budget_mb);
  a_flags.push_back(buddy);
  auto a = ZccdProcess::Start(dir, "node-a", a_flags);
  if (!a.ok()) Die(std::string(a.status().message()));
  {
    std::vector<std::unique_ptr<Client>> trainers;
    for (int r = 0; r < kRanks; ++r) trainers.push_back(Connect(**a, state[r], r));
    for (int64_t step = 1; step <= kSaveEvery; ++step) {
      for (int r = 0; r < kRanks; ++r) {
        for (auto& t : state[r].tensors) t[step] += 1.f;
        if (trainers[r]->Snapshot(step) != SnapshotResult::kEnqueued) Die("a snapshot was not taken");
      }
    }
    for (auto& t : trainers) (void)t->Flush();
    const absl::Time until = absl::Now() + absl::Minutes(3);
    for (;;) {
      auto st = trainers[0]->QueryCheckpointStatus();
      if (st.ok() && st->last_committed_step >= kSaveEvery) break;
      if (absl::Now() > until) Die("step 4 was not committed on node-a");
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    if (!AwaitLog(**a, absl::StrCat("replicated job=", kJob, " rank=", r, " step=", kSaveEvery, " "),
                  absl::Minutes(3))) {
      Die("step 4 did not reach node-b");
    }
  }
  const uint64_t b_rss_after = (*b)->RssBytes();
  const uint64_t held = b_rss_after > b_rss_before ? b_rss_after - b_rss_before : 1;
  KillAndReap(**a);
  a->reset();

  // The replacement recovers from node-b; then node-a, restarted on its own
  // root, restores from its disk.
  std::vector<std::string> c_flags = PeerFlags("node-c", "rack-1", "127.0.0.1:0", budget_mb);
  c_flags.push_back(buddy);
  auto c = ZccdProcess::Start(dir, "node-c", c_flags);
  if (!c.ok()) Die(std::string(c.status().message()));
  const double recovery_s = TimedRestore(**c, state, kSaveEvery);
  if (!absl::StrContains(ReadFile((*c)->log_path()), "recovered from the peer tier")) {
    Die("node-c did not recover from the peer tier");
  }
  (*c)->Stop();
  auto a2 = ZccdProcess::Start(dir, "node-a");
  if (!a2.ok()) Die(std::string(a2.status().message()));
  const double disk_s = TimedRestore(**a2, state, kSaveEvery);
  (*a2)->Stop();
  (*b)->Stop();

  // The TCP reference: the same bytes through one loopback connection.
  const std::string piece(total / kRanks / kTensors, '\x5a');
  const double tcp_s = TcpSeconds(piece, kRanks * kTensors);
  uint64_t step_bytes = 0;
  for (const State& r : state) step_bytes += r.bytes();
  const double gb = static_cast<double>(step_bytes) / 1e9;
  const std::string what =
      absl::StrCat(" (", kRanks, " ranks, ", step_bytes >> 20, " MiB, loopback, warm cache)");
  if (filter.Wants("peer_recovery_vs_disk_restore")) {
    Emit({"peer_recovery_vs_disk_restore (ratio = disk/recovery)" + what, recovery_s, disk_s,
          disk_s / recovery_s, "", "s"});
  }
  if (filter.Wants("peer_recovery_gbps_vs_tcp")) {
    Emit({"peer_recovery_gbps_vs_tcp" + what, gb / recovery_s, gb / tcp_s, 0, "", "GB/s"});
  }
  if (filter.Wants("peer_memory_held_vs_step_bytes")) {
    Emit({"peer_memory_held_vs_step_bytes (ratio = step/held)" + what,
          static_cast<double>(held) / (1 << 20), static_cast<double>(step_bytes) / (1 << 20),
          static_cast<double>(step_bytes) / static_cast<double>(held), ">= 0.95", "MiB"});
  }
  if (std::getenv("ZCC_BENCH_KEEP") == nullptr) RemoveScratchDir(dir);
  return 0;
}
