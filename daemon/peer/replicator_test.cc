// The replicator's bookkeeping of jobs: a job that leaves this zccd without
// a buddy ever known is forgotten (nothing could send its steps), instead of
// being retried and kept for as long as zccd runs, and its pin lifted.
#include "daemon/peer/replicator.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/mutex.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "grpcpp/security/credentials.h"

namespace zcc::daemon::peer {
namespace {

checkpoint::RankStepBytes Step(int64_t step) {
  checkpoint::RankStepBytes s;
  s.rank = 0;
  s.step = step;
  s.files.push_back({"model-r00000.safetensors", std::string(4096, 'm')});
  s.files.push_back({"r00000.manifest.json", "{}"});
  return s;
}

TEST_CASE("a job that left before any buddy was known is forgotten") {
  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  std::atomic<bool> here{true};
  Replicator::Options options;
  options.self_node = "self";
  options.retry_after = absl::Milliseconds(20);
  Replicator replicator(options, &store, &directory,
                        [&here](const std::string&) -> std::optional<std::vector<std::string>> {
                          if (here) return std::vector<std::string>{};
                          return std::nullopt;
                        });
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(5)));
  store.Pin("j", 0, 5);  // (as the registry pins the job's newest whole step)
  // While the job is here, its step waits for a buddy, and says why.
  CHECK(replicator.Stats("j").newest_step == 5);
  CHECK(testing::Eventually(
      [&] { return absl::StrContains(replicator.Stats("j").last_error, "no buddy"); },
      absl::Seconds(10), absl::Milliseconds(5)));
  CHECK(replicator.Stats("j").replicated_step == -1);
  // Gone: nothing can send its steps; it is forgotten at the next round.
  here = false;
  CHECK(testing::Eventually([&] { return replicator.Stats("j").newest_step == -1; },
                            absl::Seconds(10), absl::Milliseconds(5)));
  CHECK(replicator.Stats("j").last_error.empty());
  // And its pin is lifted: its pieces age out with the others'.
  CHECK_FALSE(store.pinned("j", 0).has_value());
}

TEST_CASE("PinSoon calls after_push for the job on the replicator's thread, once per request") {
  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  zcc::Mutex mu;
  std::vector<std::pair<std::string, uint32_t>> calls;
  Replicator::Options options;
  options.self_node = "self";
  options.after_push = [&](const std::string& job_id, uint32_t uid) {
    zcc::MutexLock lock(&mu);
    calls.emplace_back(job_id, uid);
  };
  Replicator replicator(options, &store, &directory,
                        [](const std::string&) -> std::optional<std::vector<std::string>> {
                          return std::vector<std::string>{};
                        });
  replicator.PinSoon("j", 7);
  CHECK(testing::Eventually(
      [&] {
        zcc::MutexLock lock(&mu);
        return calls.size() == 1;
      },
      absl::Seconds(10), absl::Milliseconds(5)));
  zcc::MutexLock lock(&mu);
  CHECK(calls.front() == std::pair<std::string, uint32_t>{"j", 7});
}

}  // namespace
}  // namespace zcc::daemon::peer
