// The replicator's bookkeeping of jobs: a job that leaves this zccd without
// a buddy ever known is forgotten (nothing could send its steps), instead of
// being retried and kept for as long as zccd runs, and its pin lifted; a
// step a buddy dropped is pushed to it again; and its stop ends a push in
// flight instead of waiting for the call's deadline.
#include "daemon/peer/replicator.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "daemon/peer/memory_tier.h"
#include "daemon/peer/peer_service.h"
#include "format/checksum.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "proto/peer.grpc.pb.h"

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
  options.after_push = [&](const std::string& job_id, uint32_t uid, CallCancel*) {
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

// A buddy's replica memory behind zccd's own Peer service, over loopback,
// counting the pushes and listings it answers.
struct Buddy final : public v1::Peer::Service {
  ReplicaStore store{uint64_t{64} << 20};
  PeerService service;
  std::atomic<int> pushes{0};
  std::atomic<int> lists{0};
  std::unique_ptr<grpc::Server> server;
  std::string address;
  explicit Buddy(absl::Duration parts_idle = absl::Minutes(10))
      : service("buddy", "rack-2", &store, nullptr, went_back_handler(), parts_idle) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~Buddy() override {
    Hold(false);  // (a push held up would keep Shutdown waiting)
    server->Shutdown();
  }
  grpc::Status PushReplica(grpc::ServerContext* ctx, grpc::ServerReader<v1::ReplicaChunk>* reader,
                           v1::PushReplicaResponse* resp) override {
    ++pushes;
    {
      zcc::MutexLock lock(&gate_mu);
      ++arrived;
      connections.insert(ctx->peer());
      if (passed < pass_first) {
        ++passed;  // (let through while held)
      } else {
        gate_mu.Await(absl::Condition(+[](bool* held) { return !*held; }, &held));
      }
    }
    return service.PushReplica(ctx, reader, resp);
  }
  // While held, pushes wait before they are taken (a slow link), but for
  // the first `pass` from now.
  void Hold(bool hold, int pass = 0) {
    zcc::MutexLock lock(&gate_mu);
    held = hold;
    pass_first = pass;
    passed = 0;
  }
  int Arrived() {
    zcc::MutexLock lock(&gate_mu);
    return arrived;
  }
  // Until `n` pushes have arrived, and no more do for a while after.
  void ExpectArrivedStays(int n, absl::Duration settle = absl::Milliseconds(100)) {
    REQUIRE(testing::Eventually([&] { return Arrived() == n; }, absl::Seconds(30),
                                absl::Milliseconds(5)));
    absl::SleepFor(settle);
    CHECK(Arrived() == n);
  }
  // The TCP connections the pushes came on (each its own client port).
  size_t Connections() {
    zcc::MutexLock lock(&gate_mu);
    return connections.size();
  }
  zcc::Mutex gate_mu;
  bool held ABSL_GUARDED_BY(gate_mu) = false;
  int arrived ABSL_GUARDED_BY(gate_mu) = 0;
  int pass_first ABSL_GUARDED_BY(gate_mu) = 0;
  int passed ABSL_GUARDED_BY(gate_mu) = 0;
  std::set<std::string> connections ABSL_GUARDED_BY(gate_mu);
  grpc::Status ListReplicas(grpc::ServerContext* ctx, const v1::ListReplicasRequest* req,
                            v1::ListReplicasResponse* resp) override {
    ++lists;
    return service.ListReplicas(ctx, req, resp);
  }
  grpc::Status Hello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                     v1::PeerHelloResponse* resp) override {
    return service.Hello(ctx, req, resp);
  }
  bool Holds(int64_t step) const {
    return store.Get(ReplicaKey{"j", 0, 0, step, "model-r00000.safetensors"}).ok() &&
           store.Get(ReplicaKey{"j", 0, 0, step, "r00000.manifest.json"}).ok();
  }
  // Rank 0's step `step` of job "j", whole here (as a push leaves it).
  void PutWhole(int64_t step) {
    for (const char* name : {"model-r00000.safetensors", "r00000.manifest.json"}) {
      Replica r;
      r.info.key = ReplicaKey{"j", 0, 0, step, name};
      r.info.received = absl::Now();
      r.bytes = "x";
      REQUIRE_OK(store.Put(std::move(r)));
    }
  }
  // A buddy that runs none of the job's ranks (Registry::OnPeerWentBack),
  // answering "unavailable" to the first `refuse_went_back` calls.
  std::atomic<int> went_back{0};
  std::atomic<int> refuse_went_back{0};
  PeerService::WentBackHandler went_back_handler() {
    return [this](const std::string& job_id, uint32_t uid, int64_t restored,
                  const std::set<uint32_t>& ranks, absl::Duration ago) -> absl::StatusOr<bool> {
      ++went_back;
      if (refuse_went_back.fetch_sub(1) > 0) return absl::UnavailableError("not now");
      store.DropLeftBehind(job_id, uid, restored, absl::Now() - ago, &ranks);
      return true;
    };
  }
  grpc::Status WentBack(grpc::ServerContext* ctx, const v1::WentBackRequest* req,
                        v1::WentBackResponse* resp) override {
    return service.WentBack(ctx, req, resp);
  }
};

// A replicator over a replica store of its own, whose jobs' buddy is
// `buddy` alone.
struct ToOneBuddy {
  static Replicator::Options Options() {
    Replicator::Options options;
    options.self_node = "self";
    options.retry_after = absl::Milliseconds(20);
    // No buddy checks: what reaches the buddy is what the pushes send.
    options.check_buddies_every = absl::ZeroDuration();
    return options;
  }
  explicit ToOneBuddy(const Buddy& buddy, const Replicator::Options& options = Options(),
                      uint64_t store_bytes = uint64_t{64} << 20)
      : store(store_bytes),
        replicator(options, &store, &directory,
                   [&buddy](const std::string&) -> std::optional<std::vector<std::string>> {
                     return std::vector<std::string>{buddy.address};
                   }) {}
  ReplicaStore store;
  PeerDirectory directory{{"self", "rack-1"}, grpc::InsecureChannelCredentials()};
  Replicator replicator;
};

// Step 7 of `rank`: `n` files of 4096 bytes, then its manifest.
checkpoint::RankStepBytes ManyFiles(int n, uint32_t rank = 0) {
  checkpoint::RankStepBytes step;
  step.rank = rank;
  step.step = 7;
  for (int i = 0; i < n; ++i) {
    step.files.push_back({absl::StrCat("optim-", i, ".safetensors"), std::string(4096, 'a' + i)});
  }
  step.files.push_back({absl::StrFormat("r%05u.manifest.json", rank), "{}"});
  return step;
}

// Pushes ManyFiles(files) of each of `ranks` ranks through a replicator
// with `options` to a buddy that holds every push back: `at_once` of them
// reach it, each on a connection of its own, and no more, until it lets
// them through and every rank's step is replicated, each with its manifest.
void CheckPushesAtOnce(Buddy& buddy, const Replicator::Options& options, int ranks, int files,
                       int at_once) {
  ToOneBuddy self(buddy, options);
  buddy.Hold(true);
  for (int r = 0; r < ranks; ++r) REQUIRE_OK(self.replicator.Enqueue("j", 0, ManyFiles(files, r)));
  buddy.ExpectArrivedStays(at_once);
  CHECK(buddy.Connections() == static_cast<size_t>(at_once));
  buddy.Hold(false);
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(buddy.pushes == ranks * (files + 1));
  for (int r = 0; r < ranks; ++r) {
    CHECK(buddy.store.Get(ReplicaKey{"j", 0, static_cast<uint32_t>(r), 7,
                                     absl::StrFormat("r%05u.manifest.json", r)})
              .ok());
  }
}

TEST_CASE("a step's files go to a buddy several at a time, each on a connection of its own, "
          "and its manifest after them") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 4;
  CheckPushesAtOnce(buddy, options, 1, 6, 4);  // (the manifest is not among them)
  const std::vector<ReplicaInfo> held = buddy.store.List("j", 0);
  REQUIRE(held.size() == 7);
  absl::Time manifest, newest_data = absl::InfinitePast();
  for (const ReplicaInfo& r : held) {
    if (r.key.piece == "r00000.manifest.json") {
      manifest = r.received;
    } else {
      newest_data = std::max(newest_data, r.received);
    }
  }
  CHECK(manifest >= newest_data);
}

TEST_CASE("a manifest that reaches a buddy after the step's data was dropped there is refused, "
          "and the step is pushed again") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  // The data passes; the manifest waits at the buddy's door while the
  // buddy drops the data (a registration took the room).
  buddy.Hold(true, /*pass=*/1);
  REQUIRE_OK(self.replicator.Enqueue("j", 0, Step(5)));
  buddy.ExpectArrivedStays(2);
  REQUIRE(buddy.store.Get(ReplicaKey{"j", 0, 0, 5, "model-r00000.safetensors"}).ok());
  CHECK(buddy.store.ShrinkTo(0) == 4096);
  buddy.Hold(false);
  // Refused ("came without piece ..."), tried again: whole at the buddy.
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 5; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(buddy.Holds(5));
  CHECK(buddy.pushes == 4);
}

TEST_CASE("a buddy that is down keeps the step neither from the job's other buddies nor, once "
          "they took it, sends it to them again") {
  Buddy up;
  REQUIRE(up.server != nullptr);
  const std::string down = "127.0.0.1:1";  // (nothing listens: refused at once)
  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  Replicator replicator(ToOneBuddy::Options(), &store, &directory,
                        [&](const std::string&) -> std::optional<std::vector<std::string>> {
                          return std::vector<std::string>{down, up.address};
                        });
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(5)));
  REQUIRE(testing::Eventually([&] { return up.Holds(5); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // Tried again every retry_after (20 ms) for the buddy that is down, not
  // for the one that took it; not replicated (not at every buddy).
  REQUIRE(testing::Eventually(
      [&] { return absl::StrContains(replicator.Stats("j").last_error, down); },
      absl::Seconds(30), absl::Milliseconds(5)));
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(up.pushes == 2);
  CHECK(replicator.Stats("j").replicated_step == -1);
  // The next step goes to each again.
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(6)));
  REQUIRE(testing::Eventually([&] { return up.Holds(6); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(up.pushes == 4);
}

TEST_CASE("a job that left with a step its buddy never took is forgotten after a while, its pin "
          "lifted") {
  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  std::atomic<bool> here{true};
  Replicator::Options options = ToOneBuddy::Options();
  options.gone_job_patience = absl::Milliseconds(500);
  Replicator replicator(options, &store, &directory,
                        [&here](const std::string&) -> std::optional<std::vector<std::string>> {
                          if (here) return std::vector<std::string>{"127.0.0.1:1"};
                          return std::nullopt;
                        });
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(5)));
  store.Pin("j", 0, 5);
  REQUIRE(testing::Eventually([&] { return !replicator.Stats("j").last_error.empty(); },
                              absl::Seconds(10), absl::Milliseconds(5)));
  const absl::Time left = absl::Now();
  here = false;
  // Tried for its patience still (the buddy may come back), then given up.
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(replicator.Stats("j").newest_step == 5);
  REQUIRE(testing::Eventually([&] { return replicator.Stats("j").newest_step == -1; },
                              absl::Seconds(10), absl::Milliseconds(5)));
  CHECK(absl::Now() - left >= absl::Milliseconds(500));
  CHECK_FALSE(store.pinned("j", 0).has_value());
}

TEST_CASE("a step's files under way to a buddy keep to the bytes allowed in flight") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 4;
  options.push_bytes_in_flight = 2 * 4096;  // two of the pieces
  CheckPushesAtOnce(buddy, options, 1, 6, 2);
}

TEST_CASE("the ranks' steps go to a buddy side by side, sharing its connections") {
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 6;
  // Two files of each of three ranks: six at once, where one rank's step
  // alone has two.
  {
    Buddy buddy;
    REQUIRE(buddy.server != nullptr);
    CheckPushesAtOnce(buddy, options, 3, 2, 6);
  }
  // Six files of each of three ranks: still six, not six a rank.
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  CheckPushesAtOnce(buddy, options, 3, 6, 6);
}

TEST_CASE("the ranks' files under way to a buddy keep to the bytes allowed in flight, together") {
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 6;
  options.push_bytes_in_flight = 3 * 4096;  // three of the pieces, of any rank
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  CheckPushesAtOnce(buddy, options, 3, 2, 3);
}

TEST_CASE("a piece larger than the bytes allowed in flight goes to a buddy alone, whichever "
          "rank's the others are") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 6;
  options.push_bytes_in_flight = 3 * 4096;
  ToOneBuddy self(buddy, options);
  buddy.Hold(true);
  checkpoint::RankStepBytes large = ManyFiles(0, 0);
  large.files.insert(large.files.begin(), {"model.safetensors", std::string(4 * 4096, 'm')});
  REQUIRE_OK(self.replicator.Enqueue("j", 0, std::move(large)));
  REQUIRE(testing::Eventually([&] { return buddy.Arrived() == 1; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // Another rank's small pieces wait for it.
  REQUIRE_OK(self.replicator.Enqueue("j", 0, ManyFiles(2, 1)));
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(buddy.Arrived() == 1);
  buddy.Hold(false);
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "model.safetensors"}).ok());
  CHECK(buddy.store.Get(ReplicaKey{"j", 0, 1, 7, "r00001.manifest.json"}).ok());
}

// Until the replicator's directory has heard from `buddy` that it takes
// parts (its Hello).
void KnowsItTakesParts(ToOneBuddy& self, const Buddy& buddy) {
  self.directory.Watch(buddy.address);
  REQUIRE(testing::Eventually(
      [&] {
        const std::optional<PeerState> state = self.directory.State(buddy.address);
        return state.has_value() && state->takes_parts;
      },
      absl::Seconds(30), absl::Milliseconds(5)));
}

TEST_CASE("a large file goes in parts side by side to a buddy that takes them, whole to one "
          "not known to") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 4;
  options.part_bytes = 4096;
  std::string optim(5 * 4096 + 100, '\0');
  for (size_t i = 0; i < optim.size(); ++i) optim[i] = static_cast<char>(i * 7 + i / 4096);
  checkpoint::RankStepBytes step = ManyFiles(0, 0);
  step.files.insert(step.files.begin(), {"optim.safetensors", optim});

  SECTION("the buddy says it takes parts: six of them, four at a time") {
    ToOneBuddy self(buddy, options);
    KnowsItTakesParts(self, buddy);
    buddy.Hold(true);
    REQUIRE_OK(self.replicator.Enqueue("j", 0, std::move(step)));
    buddy.ExpectArrivedStays(4);
    CHECK(buddy.Connections() == 4);
    CHECK_FALSE(buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "optim.safetensors"}).ok());
    buddy.Hold(false);
    REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                                absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(buddy.pushes == 6 + 1);
    CHECK(self.replicator.Stats("j").bytes_sent == optim.size() + 2);
  }
  SECTION("the directory has not heard from the buddy: the file goes whole") {
    ToOneBuddy self(buddy, options);
    REQUIRE_OK(self.replicator.Enqueue("j", 0, std::move(step)));
    REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                                absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(buddy.pushes == 2);
  }
  auto held = buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "optim.safetensors"});
  REQUIRE_OK(held.status());
  CHECK((*held)->bytes == optim);
  CHECK((*held)->info.xxh3 == format::Xxh3(optim.data(), optim.size()));
}

TEST_CASE("a file whose first parts the buddy dropped before its last arrived is not made "
          "whole there: its manifest waits, and the step goes again") {
  Buddy buddy(absl::Milliseconds(50));  // (pieces in parts wait 50 ms for their next part)
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 4;
  options.part_bytes = 4096;
  // (Time to see the failure before the step goes again.)
  options.retry_after = absl::Seconds(2);
  ToOneBuddy self(buddy, options);
  KnowsItTakesParts(self, buddy);
  const std::string optim(4 * 4096, 'p');
  checkpoint::RankStepBytes step = ManyFiles(0, 0);
  step.files.insert(step.files.begin(), {"optim.safetensors", optim});
  // Three parts go through, the fourth waits past the buddy's patience.
  buddy.Hold(true, 3);
  REQUIRE_OK(self.replicator.Enqueue("j", 0, std::move(step)));
  REQUIRE(testing::Eventually([&] { return buddy.Arrived() == 4; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  absl::SleepFor(absl::Milliseconds(200));
  // A peer's hello: the buddy drops what waited too long.
  REQUIRE_OK(PeerClient(buddy.address, grpc::InsecureChannelCredentials())
                 .Hello("test", "rack-3", absl::Seconds(10))
                 .status());
  buddy.Hold(false);
  REQUIRE(testing::Eventually(
      [&] { return absl::StrContains(self.replicator.Stats("j").last_error, "did not keep"); },
      absl::Seconds(30), absl::Milliseconds(5)));
  CHECK_FALSE(buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "r00000.manifest.json"}).ok());
  // The step again: its parts this time all arrive.
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  auto held = buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "optim.safetensors"});
  REQUIRE_OK(held.status());
  CHECK((*held)->bytes == optim);
}

TEST_CASE("one rank's push at a time sends files in parts to a buddy (it holds each whole from "
          "its first part)") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 8;
  options.part_bytes = 4096;
  ToOneBuddy self(buddy, options);
  KnowsItTakesParts(self, buddy);
  buddy.Hold(true);
  for (uint32_t r = 0; r < 2; ++r) {
    checkpoint::RankStepBytes step = ManyFiles(0, r);
    step.files.insert(step.files.begin(), {"optim.safetensors", std::string(6 * 4096, 'o' + r)});
    REQUIRE_OK(self.replicator.Enqueue("j", 0, std::move(step)));
  }
  // Six parts of one rank's file, where eight connections would take two ranks'.
  buddy.ExpectArrivedStays(6, absl::Milliseconds(200));
  buddy.Hold(false);
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  for (uint32_t r = 0; r < 2; ++r) {
    auto held = buddy.store.Get(ReplicaKey{"j", 0, r, 7, "optim.safetensors"});
    REQUIRE_OK(held.status());
    CHECK((*held)->bytes == std::string(6 * 4096, 'o' + r));
  }
}

TEST_CASE("a step one of whose files a buddy refuses is not made whole there: its manifest "
          "is not sent") {
  Buddy buddy;  // (a replica memory of 64 MiB)
  REQUIRE(buddy.server != nullptr);
  Replicator::Options options = ToOneBuddy::Options();
  options.push_connections = 4;
  options.retry_after = absl::Seconds(30);  // (one round)
  ToOneBuddy self(buddy, options, uint64_t{128} << 20);
  Replicator& replicator = self.replicator;
  checkpoint::RankStepBytes step = ManyFiles(3);
  step.files.insert(step.files.end() - 1, {"model.safetensors", std::string(size_t{65} << 20, 'm')});
  REQUIRE_OK(replicator.Enqueue("j", 0, std::move(step)));
  REQUIRE(testing::Eventually([&] { return !replicator.Stats("j").last_error.empty(); },
                              absl::Seconds(30), absl::Milliseconds(5)));
  INFO(replicator.Stats("j").last_error);
  CHECK_THAT(replicator.Stats("j").last_error, Catch::Contains("larger than this zccd's replica"));
  CHECK(replicator.Stats("j").replicated_step == -1);
  CHECK_FALSE(buddy.store.Get(ReplicaKey{"j", 0, 0, 7, "r00000.manifest.json"}).ok());
}

TEST_CASE("a step its buddy dropped is pushed to it again from the owner's copy") {
  Buddy buddy, other;
  REQUIRE(buddy.server != nullptr);
  REQUIRE(other.server != nullptr);
  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  zcc::Mutex mu;
  int pins = 0;  // after_push calls: the registry pins the job's newest whole step then
  Replicator::Options options;
  options.self_node = "self";
  options.retry_after = absl::Milliseconds(20);
  options.check_buddies_every = absl::Milliseconds(50);
  options.after_push = [&](const std::string&, uint32_t, CallCancel*) {
    zcc::MutexLock lock(&mu);
    ++pins;
  };
  Replicator replicator(
      options, &store, &directory,
      [&](const std::string&) -> std::optional<std::vector<std::string>> {
        return std::vector<std::string>{buddy.address, other.address};
      });
  auto pinned = [&] {
    zcc::MutexLock lock(&mu);
    return pins;
  };
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(5)));
  REQUIRE(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 5; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  REQUIRE(buddy.Holds(5));
  REQUIRE(other.Holds(5));
  REQUIRE(testing::Eventually([&] { return pinned() == 1; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // The checks ask both buddies and find nothing missing: nothing is pushed again.
  const int lists = buddy.lists + other.lists;
  REQUIRE(testing::Eventually([&] { return buddy.lists + other.lists >= lists + 4; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(replicator.Stats("j").pushed_again == 0);
  const int pushed_before = other.pushes;

  SECTION("one buddy dropped it (a trainer registered there): it is pushed again, to that one") {
    REQUIRE(buddy.store.ShrinkTo(0, "other-job", 0) > 0);
    CHECK(testing::Eventually([&] { return buddy.Holds(5); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
    CHECK(testing::Eventually(
        [&] {
          const Replicator::JobStats st = replicator.Stats("j");
          return st.replicated_step == 5 && st.pushed_again == 1 && st.last_error.empty();
        },
        absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(testing::Eventually([&] { return pinned() == 2; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
    CHECK(other.pushes == pushed_before);  // it still held it
    // A newer step goes to both, as before.
    REQUIRE_OK(replicator.Enqueue("j", 0, Step(6)));
    CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 6; },
                              absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(buddy.Holds(6));
    CHECK(other.Holds(6));
  }
  SECTION("a buddy holds other bytes under the step's names (another run's): pushed again") {
    Replica stale;
    stale.info.key = ReplicaKey{"j", 0, 0, 5, "model-r00000.safetensors"};
    stale.bytes = std::string(4096, 'x');
    stale.info.nbytes = stale.bytes.size();
    stale.info.xxh3 = format::Xxh3(stale.bytes.data(), stale.bytes.size());
    REQUIRE_OK(other.store.Put(std::move(stale)));
    CHECK(testing::Eventually(
        [&] {
          auto piece = other.store.Get(ReplicaKey{"j", 0, 0, 5, "model-r00000.safetensors"});
          return piece.ok() && (*piece)->bytes == std::string(4096, 'm');
        },
        absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(testing::Eventually([&] { return replicator.Stats("j").pushed_again == 1; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  }
  SECTION("the buddy dropped it and so did this zccd: said, and the next step goes") {
    REQUIRE(store.ShrinkTo(0, "other-job", 0) > 0);
    REQUIRE(buddy.store.ShrinkTo(0, "other-job", 0) > 0);
    CHECK(testing::Eventually(
        [&] {
          const Replicator::JobStats st = replicator.Stats("j");
          return st.replicated_step == -1 &&
                 absl::StrContains(st.last_error, "this zccd's copy is gone too");
        },
        absl::Seconds(30), absl::Milliseconds(5)));
    const Replicator::JobStats st = replicator.Stats("j");
    CHECK(st.newest_step == 5);
    CHECK(st.pushed_again == 0);
    CHECK(absl::StrContains(st.last_error, "no longer holds step 5 of rank 0"));
    REQUIRE_OK(replicator.Enqueue("j", 0, Step(6)));
    CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 6; },
                              absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(buddy.Holds(6));
    CHECK(replicator.Stats("j").last_error.empty());
  }
  SECTION("the rank went back to an older step (restored): that step is replicated") {
    REQUIRE_OK(replicator.Enqueue("j", 0, Step(3)));
    CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 3; },
                              absl::Seconds(30), absl::Milliseconds(5)));
    CHECK(buddy.Holds(3));
    CHECK(replicator.Stats("j").newest_step == 3);
  }
}

// A peer that takes a push's bytes, or a listing request, and then does not
// answer until released (a zccd stuck behind a slow disk or a full CPU) or
// the call is cancelled.
class StuckPeer final : public v1::Peer::Service {
 public:
  grpc::Status PushReplica(grpc::ServerContext* ctx, grpc::ServerReader<v1::ReplicaChunk>* reader,
                           v1::PushReplicaResponse*) override {
    v1::ReplicaChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return Stuck(ctx);
  }
  grpc::Status ListReplicas(grpc::ServerContext* ctx, const v1::ListReplicasRequest*,
                            v1::ListReplicasResponse*) override {
    return Stuck(ctx);
  }
  grpc::Status Stuck(grpc::ServerContext* ctx) {
    zcc::MutexLock lock(&mu_);
    ++entered_;
    auto done = [this, ctx]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return released_ || ctx->IsCancelled();
    };
    // (IsCancelled has no wake-up of its own: asked again every 10 ms.)
    while (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(10))) {
    }
    return released_ ? grpc::Status::OK : grpc::Status::CANCELLED;
  }
  int entered() {
    zcc::MutexLock lock(&mu_);
    return entered_;
  }
  void Release() {
    zcc::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  zcc::Mutex mu_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_CASE("a rank's first step after it went on from a restore drops its newer steps at the "
          "buddy and in the owner's copy") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  ReplicaStore& store = self.store;
  Replicator& replicator = self.replicator;
  auto own = [&](int64_t step) {
    return store.Get(ReplicaKey{"j", 0, 0, step, "r00000.manifest.json"}).ok();
  };
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(20)));
  REQUIRE(testing::Eventually([&] { return buddy.Holds(20); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // An older step without the flag (no restore told of) drops nothing.
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(15)));
  REQUIRE(testing::Eventually([&] { return buddy.Holds(15); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  CHECK(buddy.Holds(20));
  CHECK(own(20));
  // The trainer restored step 10 and trained on: step 11 tells.
  checkpoint::RankStepBytes first = Step(11);
  first.went_on_from = 10;
  REQUIRE_OK(replicator.Enqueue("j", 0, std::move(first)));
  CHECK(!own(15));
  CHECK(!own(20));
  REQUIRE(testing::Eventually([&] { return buddy.Holds(11); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  CHECK(!buddy.Holds(15));
  CHECK(!buddy.Holds(20));
  CHECK(replicator.Stats("j").replicated_step == 11);
}

TEST_CASE("a rank's first step after a restore goes behind a push of the run it left still in "
          "flight, and is the step replicated") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  ReplicaStore& store = self.store;
  Replicator& replicator = self.replicator;
  // Step 20 of the run left is on its way (its first piece held up).
  buddy.Hold(true);
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(20)));
  REQUIRE(testing::Eventually([&] { return buddy.Arrived() == 1; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // The trainer restored step 10 and trained on: step 11 is handed in.
  checkpoint::RankStepBytes first = Step(11);
  first.went_on_from = 10;
  REQUIRE_OK(replicator.Enqueue("j", 0, std::move(first)));
  CHECK(replicator.Stats("j").newest_step == 11);
  CHECK_FALSE(store.Get(ReplicaKey{"j", 0, 0, 20, "r00000.manifest.json"}).ok());  // own copy
  buddy.Hold(false);
  CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 11; },
                            absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(buddy.Holds(11));
  // Step 20 never became whole there: its push ended with the owner's
  // copy, dropped by step 11.
  CHECK_FALSE(buddy.Holds(20));
}

TEST_CASE("a rank's first step after a restore, of the number of the step it left, is pushed in "
          "its place") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  Replicator& replicator = self.replicator;
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(11)));
  REQUIRE(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 11; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  // Back to step 10, and on: this run's step 11 has other bytes.
  checkpoint::RankStepBytes again = Step(11);
  again.files[0].bytes = std::string(4096, 'n');
  again.went_on_from = 10;
  REQUIRE_OK(replicator.Enqueue("j", 0, std::move(again)));
  auto new_bytes_there = [&] {
    auto piece = buddy.store.Get(ReplicaKey{"j", 0, 0, 11, "model-r00000.safetensors"});
    return piece.ok() && (*piece)->bytes == std::string(4096, 'n');
  };
  CHECK(testing::Eventually(new_bytes_there, absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 11; },
                            absl::Seconds(30), absl::Milliseconds(5)));
}

TEST_CASE("after the job went on from a restore, the steps of the run left are not pushed, nor "
          "does one in flight count") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  Replicator& replicator = self.replicator;
  // Step 20 is on its way (held up at the buddy), step 22 waits behind it.
  buddy.Hold(true);
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(20)));
  REQUIRE(testing::Eventually([&] { return buddy.Arrived() == 1; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(22)));
  // The job's ranks here went on from step 10 (Job::GoBack, as the
  // registry tells it: the replicator, then the store, whose own copies of
  // steps 20 and 22 go).
  const absl::Time at = absl::Now();
  replicator.WentOn("j", 0, 10, at);
  CHECK(self.store.DropLeftBehind("j", 0, 10, at) ==
        std::map<uint32_t, std::set<int64_t>>{{0, {20, 22}}});
  CHECK(replicator.Stats("j").newest_step == -1);
  buddy.Hold(false);
  // Step 20's push ends after the file on its way (its manifest is not
  // sent), counted neither as replicated nor as an error (its own copy is
  // gone); step 22 does not follow it.
  REQUIRE(testing::Eventually([&] { return replicator.Stats("j").bytes_sent == 4096; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  CHECK(replicator.Stats("j").replicated_step == -1);
  CHECK(replicator.Stats("j").last_error.empty());
  CHECK_FALSE(buddy.Holds(20));
  CHECK_FALSE(testing::Eventually([&] { return buddy.Arrived() > 2; }, absl::Milliseconds(500),
                                  absl::Milliseconds(5)));
  // This run's first step goes.
  checkpoint::RankStepBytes first = Step(11);
  first.went_on_from = 10;
  REQUIRE_OK(replicator.Enqueue("j", 0, std::move(first)));
  CHECK(testing::Eventually([&] { return replicator.Stats("j").replicated_step == 11; },
                            absl::Seconds(30), absl::Milliseconds(5)));
  CHECK_FALSE(buddy.Holds(22));
}

TEST_CASE("a job's going back is told to its buddies: one that runs none of its ranks drops the "
          "run left at once, and only what came before the going on") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  // Rank 0's step 7 pushed from here, steps 8 and 12 of the run before the
  // going back whole at the buddy.
  REQUIRE_OK(self.replicator.Enqueue("j", 0, Step(7)));
  REQUIRE(testing::Eventually([&] { return self.replicator.Stats("j").replicated_step == 7; },
                              absl::Seconds(30), absl::Milliseconds(5)));
  buddy.PutWhole(8);
  buddy.PutWhole(12);
  // The first call finds the buddy unable to answer: told again. (The
  // going on told in whole milliseconds, rounded to before it was: the
  // pieces before it are more than one earlier.)
  buddy.refuse_went_back = 1;
  absl::SleepFor(absl::Milliseconds(5));
  const absl::Time at = absl::Now();
  absl::SleepFor(absl::Milliseconds(5));  // (the new run's pieces come after it)
  self.replicator.WentOn("j", 0, 10, at);
  REQUIRE(testing::Eventually([&] { return !buddy.Holds(12); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  CHECK(buddy.Holds(8));
  CHECK(buddy.went_back == 2);
  // The new run's step 11 arrives; the same going back told again (by
  // another zccd of the job) drops nothing more.
  buddy.PutWhole(11);
  self.replicator.WentOn("j", 0, 10, at);
  REQUIRE(testing::Eventually([&] { return buddy.went_back == 3; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  CHECK_FALSE(testing::Eventually([&] { return buddy.went_back > 3; }, absl::Milliseconds(200),
                                  absl::Milliseconds(5)));
  CHECK(buddy.Holds(11));
  CHECK(buddy.Holds(8));
  CHECK(buddy.Holds(7));
}

TEST_CASE("a rank's first step after a restore that cannot be kept still tells the buddies, with "
          "the rank's next step") {
  Buddy buddy;
  REQUIRE(buddy.server != nullptr);
  ToOneBuddy self(buddy);
  Replicator& replicator = self.replicator;
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(20)));
  REQUIRE(testing::Eventually([&] { return buddy.Holds(20); }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // Back to step 10: step 11 is larger than this zccd's replica budget.
  checkpoint::RankStepBytes first = Step(11);
  first.files[0].bytes = std::string((size_t{64} << 20) + 1, 'n');
  first.went_on_from = 10;
  CHECK(replicator.Enqueue("j", 0, std::move(first)).code() ==
        absl::StatusCode::kResourceExhausted);
  // Step 12 goes, and tells: the buddy drops step 20, of the run left.
  REQUIRE_OK(replicator.Enqueue("j", 0, Step(12)));
  CHECK(testing::Eventually([&] { return buddy.Holds(12); }, absl::Seconds(30),
                            absl::Milliseconds(5)));
  CHECK_FALSE(buddy.Holds(20));
  CHECK(replicator.Stats("j").replicated_step == 12);
}

TEST_CASE("stopping the replicator ends its call in flight to a peer, not at its deadline") {
  StuckPeer peer;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&peer);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  const std::string buddy = "127.0.0.1:" + std::to_string(port);

  ReplicaStore store(uint64_t{64} << 20);
  PeerDirectory directory({"self", "rack-1"}, grpc::InsecureChannelCredentials());
  Replicator::Options options;
  options.self_node = "self";
  options.push_timeout = absl::Minutes(10);
  // As the registry's pin does: the job's zccds asked what they hold.
  options.after_push = [&](const std::string& job_id, uint32_t uid, CallCancel* cancel) {
    ListHoldings(job_id, uid, TierSources{&store, &directory, {buddy}, cancel}, absl::Minutes(10));
  };
  auto replicator = std::make_unique<Replicator>(
      options, &store, &directory,
      [&buddy](const std::string&) -> std::optional<std::vector<std::string>> {
        return std::vector<std::string>{buddy};
      });
  SECTION("a push") { REQUIRE_OK(replicator->Enqueue("j", 0, Step(5))); }
  SECTION("the listing of the pin after a push") { replicator->PinSoon("j", 0); }
  REQUIRE(testing::Eventually([&] { return peer.entered() == 1; }, absl::Seconds(30),
                              absl::Milliseconds(5)));
  // The call is in flight, its deadline ten minutes away: the stop ends it.
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    replicator.reset();
    stopped = true;
  });
  const bool prompt =
      testing::Eventually([&] { return stopped.load(); }, absl::Seconds(30), absl::Milliseconds(5));
  CHECK(prompt);
  peer.Release();  // (without the cancel: lets the stop finish, and the test fail, not hang)
  stopper.join();
  server->Shutdown();
}

}  // namespace
}  // namespace zcc::daemon::peer
