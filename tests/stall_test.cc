// zccd stays responsive while one job's work is stalled: real zccd processes
// with a reservation of staging memory held up by the fault drill
// (ZCCD_INJECT_RESERVE_DELAY_MS). While it is stalled, another job
// registers, snapshots, checkpoints and restores, the status service
// answers, housekeeping notices a dead trainer, and the systemd watchdog is
// fed: nothing waits for the stalled registration.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "proto/zcc.grpc.pb.h"
#include "tests/process_harness.h"
#include <grpcpp/grpcpp.h>

namespace zcc::testing {
namespace {

// What the other work may take while the registration is stalled; the stall
// lasts 25 times as long, so a wait for it cannot pass.
constexpr absl::Duration kAnswerWithin = absl::Milliseconds(200);
constexpr int kStallMs = 5000;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

TEST_CASE("a registration stalled in its staging reservation holds up no other job, status, "
          "housekeeping or the watchdog") {
  const std::string dir = ShortTempDir("stall-reg");
  const std::string notify_path = dir + "/notify.sock";
  const int notify_fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify_path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(notify_fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
  struct timeval tv{0, 100 * 1000};
  ::setsockopt(notify_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

  Daemon daemon(dir, {{"--client_timeout_s=30"}, "", "zccd",
                      {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=400000",
                       absl::StrCat("ZCCD_INJECT_RESERVE_DELAY_MS=", kStallMs),
                       "ZCCD_INJECT_RESERVE_DELAY_MATCH=.slowjob."}});
  REQUIRE(daemon.Start());

  // Another job, registered and checkpointed before the stall.
  std::vector<float> weights(64 * 1024, 1.0f);
  ClientOptions options;
  options.socket_path = daemon.socket();
  options.job_id = "fastjob";
  options.save_every = 1;
  options.backpressure = Backpressure::kBlock;
  auto fast = Client::Connect(options);
  REQUIRE(fast.ok());
  REQUIRE((*fast)->RegisterTensors({{"w", DType::kF32, {static_cast<int64_t>(weights.size())},
                                     weights.data()}})
              .ok());
  REQUIRE((*fast)->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  // A trainer of a third job whose death housekeeping must notice during the stall.
  auto doomed = StartTrainer(daemon, dir, "doomed",
                             {"--job=doomedjob", "--steps=3", "--save_every=0", "--pause_at=1",
                              "--daemon_timeout_s=30"});
  REQUIRE(doomed->WaitForOutput("paused", absl::Seconds(30)));

  // The stalled registration.
  auto slow = StartTrainer(daemon, dir, "slow", {"--job=slowjob", "--steps=2", "--save_every=0"});
  REQUIRE(Eventually([&] { return absl::StrContains(daemon.LatestLog(), "fault drill: the "
                                                                        "reservation of"); },
                     absl::Seconds(30), absl::Milliseconds(10)));
  const absl::Time stall_start = absl::Now();
  doomed->Signal(SIGKILL);
  REQUIRE(doomed->Wait(absl::Seconds(5)).has_value());  // reaped: its pid is gone

  // Another job's registration, snapshot (ingested, written and committed)
  // and restore.
  ClientOptions second = options;
  second.job_id = "fastjob2";
  std::vector<float> more(64 * 1024, 2.0f);
  absl::Time t0 = absl::Now();
  auto fast2 = Client::Connect(second);
  REQUIRE(fast2.ok());
  REQUIRE((*fast2)->RegisterTensors({{"w", DType::kF32, {static_cast<int64_t>(more.size())},
                                      more.data()}})
              .ok());
  const absl::Duration registered = absl::Now() - t0;
  CHECK((*fast2)->Stats().connected);
  t0 = absl::Now();
  REQUIRE((*fast2)->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob2") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  const absl::Duration committed = absl::Now() - t0;
  weights.assign(weights.size(), 0.0f);
  t0 = absl::Now();
  auto restored = (*fast)->Restore(1);
  const absl::Duration restore = absl::Now() - t0;
  REQUIRE(restored.ok());
  CHECK(*restored == 1);
  CHECK(weights[123] == 1.0f);

  // The status service, as zccctl asks it.
  auto channel = grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials());
  auto stub = v1::Status::NewStub(channel);
  v1::StatusRequest sreq;
  v1::StatusResponse sresp;
  grpc::ClientContext sctx;
  t0 = absl::Now();
  REQUIRE(stub->GetStatus(&sctx, sreq, &sresp).ok());
  const absl::Duration status = absl::Now() - t0;

  // Housekeeping goes on: the killed trainer's registration is dropped.
  const bool noticed = Eventually(
      [&] { return absl::StrContains(daemon.LatestLog(), "dropping its registration"); },
      absl::Milliseconds(kStallMs) - (absl::Now() - stall_start) - absl::Milliseconds(500),
      absl::Milliseconds(10));
  // The watchdog is fed (every 200 ms while healthy).
  int pings = 0;
  char buf[256];
  while (absl::Now() - stall_start < absl::Milliseconds(kStallMs - 1000)) {
    const ssize_t n = ::recv(notify_fd, buf, sizeof(buf) - 1, 0);
    if (n > 0 && absl::StrContains(std::string(buf, n), "WATCHDOG=1")) ++pings;
  }
  // All of it while the registration was still stalled.
  const bool still_stalled = !absl::StrContains(daemon.LatestLog(), "registered job slowjob");
  const absl::Duration stalled_for = absl::Now() - stall_start;
  std::fprintf(stderr,
               "during the stall: register %.1f ms, snapshot to commit %.1f ms, restore %.1f ms, "
               "status %.1f ms, %d watchdog pings\n",
               Ms(registered), Ms(committed), Ms(restore), Ms(status), pings);
  INFO("register " << Ms(registered) << " ms, snapshot to commit " << Ms(committed)
                   << " ms, restore " << Ms(restore) << " ms, status " << Ms(status)
                   << " ms, watchdog pings " << pings << ", " << Ms(stalled_for)
                   << " ms into the stall\n"
                   << daemon.LatestLog());
  CHECK(still_stalled);
  CHECK(registered < kAnswerWithin);
  CHECK(committed < kAnswerWithin);
  CHECK(restore < kAnswerWithin);
  CHECK(status < kAnswerWithin);
  CHECK(noticed);
  CHECK(pings >= 3);

  // The stalled registration completes, and its trainer trains.
  REQUIRE(slow->Wait(absl::Seconds(60)) == 0);
  CHECK(slow->Values()["published"] == "2");
  fast2->reset();
  fast->reset();
  REQUIRE(daemon.Stop() == 0);
  ::close(notify_fd);
}

}  // namespace
}  // namespace zcc::testing
