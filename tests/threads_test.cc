// How many threads zccd runs as ranks register and write: a real zccd with
// 1, 8 and 32 ranks of one job (in-process clients, one small tensor each,
// with and without an EMA, each rank checkpointing a step), its thread count
// read from /proc. Each rank has one thread of its own (ingest); the writers
// (writer_threads) and the EMA's workers (ema_threads - 1) are zccd's, shared
// by all ranks, and each job has a committer. The test prints the counts and
// holds zccd to that, so that a change in the model shows here.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "client/client.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

int ThreadsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int n = 0;
    if (absl::StartsWith(line, "Threads:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) {
      return n;
    }
  }
  return -1;
}

// Registers `ranks` ranks of job `job` (world size `ranks`) and returns the
// clients; each rank's tensor lives in `memory`.
std::vector<std::unique_ptr<Client>> RegisterRanks(const Daemon& daemon, const std::string& job,
                                                   uint32_t ranks, double ema_decay,
                                                   std::vector<std::vector<float>>* memory) {
  std::vector<std::unique_ptr<Client>> clients;
  memory->assign(ranks, std::vector<float>(1024, 1.0f));
  for (uint32_t r = 0; r < ranks; ++r) {
    ClientOptions o;
    o.socket_path = daemon.socket();
    o.job_id = job;
    o.rank = r;
    o.world_size = ranks;
    o.ema_decay = ema_decay;
    o.save_every = 1;
    auto client = Client::Connect(o);
    REQUIRE(client.ok());
    TensorRef t{absl::StrCat("w", r), DType::kF32, {1024}, (*memory)[r].data()};
    t.ema_eligible = ema_decay > 0;
    REQUIRE((*client)->RegisterTensors({t}).ok());
    REQUIRE((*client)->Stats().connected);
    clients.push_back(*std::move(client));
  }
  return clients;
}

TEST_CASE("zccd's threads at 1, 8 and 32 ranks") {
  const std::string dir = ShortTempDir("threads");
  Daemon daemon(dir, {{"--log_level=WARNING"}});
  REQUIRE(daemon.Start());
  const pid_t pid = daemon.process()->pid();
  const int idle = ThreadsOf(pid);
  REQUIRE(idle > 0);
  std::string report = absl::StrCat("zccd threads: idle ", idle);
  for (const double ema : {0.0, 0.99}) {
    for (const uint32_t ranks : {1u, 8u, 32u}) {
      std::vector<std::vector<float>> memory;
      const std::string job = absl::StrCat("threads", ranks, ema > 0 ? "ema" : "");
      auto clients = RegisterRanks(daemon, job, ranks, ema, &memory);
      // Every rank checkpoints step 1: the writer threads are busy at once.
      for (auto& c : clients) REQUIRE(c->Snapshot(1) == SnapshotResult::kEnqueued);
      for (auto& c : clients) REQUIRE(c->Flush().ok());
      CHECK(Eventually(
          [&] {
            auto status = clients[0]->QueryCheckpointStatus();
            return status.ok() && status->last_committed_step == 1;
          },
          absl::Seconds(60)));
      const int threads = ThreadsOf(pid);
      absl::StrAppend(&report, ", ", ranks, " rank(s)", ema > 0 ? " with EMA " : " ", threads);
      // Per rank: ingest. Shared: the 4 writers, the EMA's worker (ema_threads
      // 2: one worker beside the ingest thread), the job's committer, and the
      // gRPC server's threads for the connections (its pool grows with
      // concurrent calls: up to 8 here).
      const int ranks_threads = static_cast<int>(ranks);
      CHECK(threads - idle <= ranks_threads + 4 + 1 + 1 + 8);
      // Closed: the ranks' threads stop. What stays is zccd's own: the idle
      // ones, the pools (4 writers, the EMA's worker) and the gRPC server's,
      // whose pool the closes themselves may have grown (up to 8 here).
      for (auto& c : clients) CHECK(c->Close().ok());
      const int kept = idle + 4 + 1 + 8;
      const bool released = Eventually([&] { return ThreadsOf(pid) <= kept; }, absl::Seconds(30));
      INFO(ranks << " rank(s)" << (ema > 0 ? " with EMA" : "") << ": " << threads
                 << " threads before the close, " << ThreadsOf(pid) << " after");
      CHECK(released);
    }
  }
  std::fprintf(stderr, "%s\n", report.c_str());
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
