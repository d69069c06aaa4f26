// zccd stays responsive while one job's work is stalled, with real zccd and
// trainer processes: a registration's reservation of staging memory held up
// by the fault drill ZCCD_INJECT_RESERVE_DELAY_MS, a restore's metadata check
// and a commit's write of COMMITTED held up by a slow disk
// (ZCCD_INJECT_STORAGE_FAULTS on that step's files), and a job forgotten while
// its committer's read of `latest` hangs. While each is stalled, another job
// registers, snapshots, checkpoints and restores, the status service
// answers, housekeeping notices a dead trainer, and the systemd watchdog is
// fed.
#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "proto/registration_waits.h"
#include "proto/zcc.grpc.pb.h"
#include "tests/process_harness.h"
#include <grpcpp/grpcpp.h>

namespace zcc::testing {
namespace {

// What the other work may take while one job is stalled; the stalls (3 or
// 6 s per request) last far longer, so a wait for them passes only where it
// began in a request's last second (and each case checks that the stall is
// still on once the work is done). (200 ms failed once where the full suite
// loaded both cores: a commit of 260 KB took 248 ms.)
constexpr absl::Duration kAnswerWithin = absl::Seconds(1);

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Names in `dir` (none when it cannot be read).
std::vector<std::string> ListDirForTest(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

// A datagram socket standing in for systemd's notify socket, read all the
// time as systemd does (a full socket would block zccd's notifications).
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = ::bind(fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0;
    struct timeval tv{0, 100 * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    reader_ = std::thread([this] {
      char buf[256];
      while (!stop_.load()) {
        const ssize_t n = ::recv(fd_, buf, sizeof(buf) - 1, 0);
        if (n > 0 && absl::StrContains(std::string(buf, n), "WATCHDOG=1")) pings_.fetch_add(1);
      }
    });
  }
  ~NotifySocket() {
    stop_.store(true);
    reader_.join();
    ::close(fd_);
  }
  bool bound() const { return bound_; }
  std::string env() const { return "NOTIFY_SOCKET=" + path_; }
  // WATCHDOG=1 messages received during the next `d`.
  int CountPings(absl::Duration d) {
    const int before = pings_.load();
    absl::SleepFor(d);
    return pings_.load() - before;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int> pings_{0};
  std::thread reader_;
};

// A job trained in this process, with one small tensor, a checkpoint every step.
struct InProcessJob {
  std::vector<float> weights;
  std::unique_ptr<Client> client;
};

InProcessJob Register(const Daemon& daemon, const std::string& job, float fill) {
  InProcessJob j;
  j.weights.assign(64 * 1024, fill);
  ClientOptions options;
  options.socket_path = daemon.socket();
  options.job_id = job;
  options.save_every = 1;
  options.backpressure = Backpressure::kBlock;
  auto client = Client::Connect(options);
  REQUIRE(client.ok());
  j.client = *std::move(client);
  REQUIRE(j.client->RegisterTensors({{"w", DType::kF32, {static_cast<int64_t>(j.weights.size())},
                                      j.weights.data()}})
              .ok());
  return j;
}

// The other work, done while another job is stalled (from `stall_start` for
// `stall`): a trainer of a third job (`doomed`, paused) is killed first and
// its death must be noticed; `checkpointed` is a job with step 1 committed,
// restored here. `stalled()` says whether the stall still holds.
void CheckOtherWorkGoesOn(const Daemon& daemon, NotifySocket& notify, Subprocess& doomed,
                          InProcessJob& checkpointed, absl::Time stall_start,
                          absl::Duration stall, const std::function<bool()>& stalled) {
  doomed.Signal(SIGKILL);
  REQUIRE(doomed.Wait(absl::Seconds(5)).has_value());  // reaped: its pid is gone

  // Another job's registration, snapshot (ingested, written and committed)
  // and restore.
  absl::Time t0 = absl::Now();
  InProcessJob fresh = Register(daemon, "freshjob", 2.0f);
  const absl::Duration registered = absl::Now() - t0;
  CHECK(fresh.client->Stats().connected);
  t0 = absl::Now();
  REQUIRE(fresh.client->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "freshjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  const absl::Duration committed = absl::Now() - t0;
  checkpointed.weights.assign(checkpointed.weights.size(), 0.0f);
  t0 = absl::Now();
  auto restored = checkpointed.client->Restore(1);
  const absl::Duration restore = absl::Now() - t0;
  REQUIRE(restored.ok());
  CHECK(*restored == 1);
  CHECK(checkpointed.weights[123] == 1.0f);

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
      [&] {
        const std::string log = daemon.LatestLog();
        const size_t at = log.find("job doomedjob rank 0: trainer pid");
        return at != std::string::npos && log.find("dropping its registration", at) != std::string::npos;
      },
      stall / 2, absl::Milliseconds(10));
  // The watchdog is fed (every 200 ms while healthy).
  const int pings = notify.CountPings(absl::Seconds(1));
  const bool still_stalled = stalled();
  const absl::Duration into = absl::Now() - stall_start;
  std::fprintf(stderr,
               "during the stall: register %.1f ms, snapshot to commit %.1f ms, restore %.1f ms, "
               "status %.1f ms, %d watchdog pings in 1 s; %.0f ms into the stall\n",
               Ms(registered), Ms(committed), Ms(restore), Ms(status), pings, Ms(into));
  INFO("register " << Ms(registered) << " ms, snapshot to commit " << Ms(committed)
                   << " ms, restore " << Ms(restore) << " ms, status " << Ms(status)
                   << " ms, watchdog pings " << pings << ", " << Ms(into)
                   << " ms into the stall\n"
                   << daemon.LatestLog());
  CHECK(still_stalled);
  CHECK(into < stall);
  CHECK(registered < kAnswerWithin);
  CHECK(committed < kAnswerWithin);
  CHECK(restore < kAnswerWithin);
  CHECK(status < kAnswerWithin);
  CHECK(noticed);
  CHECK(pings >= 3);
}

std::unique_ptr<Subprocess> StartDoomed(const Daemon& daemon, const std::string& dir) {
  auto doomed = StartTrainer(daemon, dir, "doomed",
                             {"--job=doomedjob", "--steps=3", "--save_every=0", "--pause_at=1",
                              "--daemon_timeout_s=30"});
  REQUIRE(doomed->WaitForOutput("paused", absl::Seconds(30)));
  return doomed;
}

TEST_CASE("a registration stalled in its staging reservation holds up no other job, status, "
          "housekeeping or the watchdog") {
  constexpr int kStallMs = 6000;
  const std::string dir = ShortTempDir("stall-reg");
  NotifySocket notify(dir + "/notify.sock");
  REQUIRE(notify.bound());
  Daemon daemon(dir, {{"--client_timeout_s=30"}, "", "zccd",
                      {notify.env(), "WATCHDOG_USEC=400000",
                       absl::StrCat("ZCCD_INJECT_RESERVE_DELAY_MS=", kStallMs),
                       "ZCCD_INJECT_RESERVE_DELAY_MATCH=.slowjob."}});
  REQUIRE(daemon.Start());
  InProcessJob checkpointed = Register(daemon, "fastjob", 1.0f);
  REQUIRE(checkpointed.client->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  auto doomed = StartDoomed(daemon, dir);

  auto slow = StartTrainer(daemon, dir, "slow", {"--job=slowjob", "--steps=2", "--save_every=0"});
  REQUIRE(Eventually(
      [&] { return absl::StrContains(daemon.LatestLog(), "fault drill: the reservation of"); },
      absl::Seconds(30), absl::Milliseconds(10)));
  CheckOtherWorkGoesOn(daemon, notify, *doomed, checkpointed, absl::Now(),
                       absl::Milliseconds(kStallMs), [&] {
                         return !absl::StrContains(daemon.LatestLog(), "registered job slowjob");
                       });

  // The stalled registration completes, and its trainer trains.
  REQUIRE(slow->Wait(absl::Seconds(60)) == 0);
  CHECK(slow->Values()["published"] == "2");
  checkpointed.client.reset();
  REQUIRE(daemon.Stop() == 0);
}

// zccd's control service, over its unix socket.
std::unique_ptr<v1::Control::Stub> ControlOf(const Daemon& daemon) {
  return v1::Control::NewStub(
      grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials()));
}

// A registration of rank 0 of `job` (world size 1, one 16-KiB tensor) from
// this process, as a client sends it.
v1::RegisterRequest OneTensorRegistration(const std::string& job) {
  v1::RegisterRequest req;
  req.set_job_id(job);
  req.set_rank(0);
  req.set_world_size(1);
  req.set_pid(::getpid());
  v1::TensorSpec* t = req.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::F32);
  t->add_shape(4096);
  t->set_kind(v1::PARAM);
  return req;
}

TEST_CASE("a registration whose client stopped waiting for it is undone: the trainer's next "
          "attempt is not refused as a live registration") {
  constexpr int kStallMs = 3000;
  const std::string dir = ShortTempDir("stall-gaveup");
  Daemon daemon(dir, {{"--client_timeout_s=30"}, "", "zccd",
                      {absl::StrCat("ZCCD_INJECT_RESERVE_DELAY_MS=", kStallMs),
                       "ZCCD_INJECT_RESERVE_DELAY_MATCH=.gaveupjob."}});
  REQUIRE(daemon.Start());
  std::unique_ptr<v1::Control::Stub> control = ControlOf(daemon);
  const v1::RegisterRequest req = OneTensorRegistration("gaveupjob");
  {
    // The client gives up while zccd reserves the staging memory.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::RegisterResponse resp;
    REQUIRE(control->Register(&ctx, req, &resp).error_code() == grpc::DEADLINE_EXCEEDED);
  }
  REQUIRE(Eventually(
      [&] {
        return absl::StrContains(daemon.LatestLog(),
                                 "stopped waiting for its registration before it was answered; "
                                 "undone");
      },
      absl::Seconds(30), absl::Milliseconds(10)));
  // The same process asks again (and waits): answered, not refused for
  // client_timeout as a registration of a live process.
  grpc::ClientContext ctx;
  v1::RegisterResponse resp;
  const grpc::Status again = control->Register(&ctx, req, &resp);
  INFO(again.error_message());
  REQUIRE(again.ok());
  CHECK(resp.generation() > 0);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a registration answered after its client stopped waiting (the answer lost) does not "
          "refuse that client's next attempt; another client's is refused while it lives") {
  const std::string dir = ShortTempDir("stall-lost");
  Daemon daemon(dir, {{"--client_timeout_s=30"}});
  REQUIRE(daemon.Start());
  std::unique_ptr<v1::Control::Stub> control = ControlOf(daemon);
  v1::RegisterRequest req = OneTensorRegistration("lostjob");
  req.set_client_instance(7);
  auto register_once = [&](v1::RegisterResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return control->Register(&ctx, req, resp);
  };
  // Registered; the client never maps it nor beats (as if the answer was
  // lost when its deadline passed just before it arrived).
  v1::RegisterResponse first;
  REQUIRE(register_once(&first).ok());
  // The same client asks again: answered at once, the lost one retired.
  v1::RegisterResponse again;
  const absl::Time asked = absl::Now();
  const grpc::Status st = register_once(&again);
  INFO(st.error_message() << "\n" << daemon.Log());
  REQUIRE(st.ok());
  CHECK(absl::Now() - asked < absl::Seconds(10));
  CHECK(again.generation() > first.generation());
  CHECK(absl::StrContains(daemon.Log(), "registers again from the same client"));
  // Another client of the rank in the same process: refused while the
  // registration it would replace is alive (client_timeout has not passed).
  req.set_client_instance(8);
  v1::RegisterResponse other;
  const grpc::Status refused = register_once(&other);
  CHECK(refused.error_code() == grpc::ALREADY_EXISTS);
  CHECK(absl::StrContains(refused.error_message(), "still alive"));
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a trainer restarted while the reaper still retires its predecessor (a commit "
          "stalled on a slow disk) waits for it, past its RPC deadline, and restores the newest "
          "snapshot from memory") {
  // Before each of the commit's four operations on step 2's COMMITTED: the
  // commit takes 12 s.
  constexpr int kDelayMs = 3000;
  const std::string dir = ShortTempDir("stall-retire");
  // zccd waited client_timeout (3 s here) for a retirement under way, then
  // registered the trainer without its predecessor's snapshots.
  Daemon daemon(dir, {{"--client_timeout_s=3", "--metrics_listen=127.0.0.1:0"}, "", "zccd",
                      {absl::StrCat("ZCCD_INJECT_STORAGE_FAULTS=path=retirejob/step-00000002."
                                    "partial/COMMITTED,op_delay_ms=", kDelayMs)}});
  REQUIRE(daemon.Start());
  const int metrics_port =
      PortFromLog(daemon, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  REQUIRE(metrics_port > 0);
  std::vector<std::string> first = {"--job=retirejob", "--save_every=2", "--tensors=1",
                                    "--block", "--steps=3", "--pause_at=3",
                                    "--daemon_timeout_s=30"};
  auto t = StartTrainer(daemon, dir, "first", first);
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(60)));
  REQUIRE(WaitSnapshotted(dir, daemon, "retirejob", 3));
  t->Signal(SIGKILL);
  REQUIRE(t->Wait(absl::Seconds(5)).has_value());
  // The reaper takes it, and waits for step 2's commit (stalled) before
  // the rank's snapshots are retained.
  REQUIRE(Eventually(
      [&] { return absl::StrContains(daemon.LatestLog(), "exited; dropping its registration"); },
      absl::Seconds(10), absl::Milliseconds(5)));
  CHECK_FALSE(absl::StrContains(daemon.LatestLog(), "keeping 1 snapshot"));
  // Its registration's deadline (3 s) passes several times over while the
  // commit stalls: zccd answers before each that the predecessor is still
  // retiring, and the client registers again, until zccd registers it with
  // the predecessor's snapshots.
  auto r = StartTrainer(daemon, dir, "restarted",
                        {"--job=retirejob", "--save_every=2", "--tensors=1", "--mode=restore",
                         "--expect_step=3", "--expect_from=memory", "--rpc_timeout_s=3"});
  CHECK(r->Wait(absl::Seconds(60)) == 0);
  INFO(r->Output() << daemon.Log());
  CHECK(r->Values()["registered"] == "1");
  CHECK(r->Values()["restored_step"] == "3");
  CHECK(r->Values()["restored_from"] == "memory");
  CHECK(r->Values()["mismatched_tensors"] == "0");
  CHECK(absl::StrContains(r->Output(), "waiting to register"));
  CHECK(absl::StrContains(r->Output(), "the rank's previous trainer is still retiring"));
  CHECK(absl::StrContains(daemon.Log(), "a registration waits for the previous trainer's "
                                        "retirement"));
  CHECK(absl::StrContains(daemon.Log(), "the previous trainer retired (within"));
  // Being told to register again is not a refused request.
  CHECK(MetricValue(metrics_port, "zcc_errors_total{kind=\"rpc\"}") == 0);
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a restore stalled in its step's metadata check holds up no other job's restore, "
          "status, housekeeping or the watchdog") {
  constexpr int kDelayMs = 3000;  // each read request of the stalled step's files
  const std::string dir = ShortTempDir("stall-check");
  const std::string root = dir + "/ckpt";
  {
    // The step the slow restore will read, written by a zccd without faults.
    Daemon writer(dir, {{}, root, "writer"});
    REQUIRE(writer.Start());
    auto t = StartTrainer(writer, dir, "write", {"--job=slowjob", "--steps=2", "--save_every=2",
                                                 "--tensors=1", "--block"});
    REQUIRE(t->Wait(absl::Seconds(60)) == 0);
    REQUIRE(writer.Stop() == 0);
  }
  NotifySocket notify(dir + "/notify.sock");
  REQUIRE(notify.bound());
  Daemon daemon(dir, {{"--client_timeout_s=30"}, root, "zccd",
                      {notify.env(), "WATCHDOG_USEC=400000",
                       absl::StrCat("ZCCD_INJECT_STORAGE_FAULTS=path=slowjob/step-00000002/,"
                                    "op_delay_ms=", kDelayMs)}});
  REQUIRE(daemon.Start());
  InProcessJob checkpointed = Register(daemon, "fastjob", 1.0f);
  REQUIRE(checkpointed.client->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  auto doomed = StartDoomed(daemon, dir);

  auto slow = StartTrainer(daemon, dir, "slow", {"--mode=restore", "--job=slowjob",
                                                 "--tensors=1", "--expect_step=2"});
  REQUIRE(Eventually(
      [&] { return absl::StrContains(daemon.LatestLog(), "registered job slowjob"); },
      absl::Seconds(30), absl::Milliseconds(10)));
  // The restore's metadata check reads the step's shard headers, each read
  // held up kDelayMs.
  const absl::Time stall_start = absl::Now();
  CheckOtherWorkGoesOn(daemon, notify, *doomed, checkpointed, stall_start,
                       absl::Milliseconds(2 * kDelayMs),
                       [&] { return !absl::StrContains(slow->Output(), "restored_step="); });

  // The stalled restore completes, slowly, with the right step.
  REQUIRE(slow->Wait(absl::Seconds(120)) == 0);
  CHECK(absl::StrContains(slow->Output(), "restored_step=2"));
  checkpointed.client.reset();
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a commit stalled on a slow disk holds up no other job, status, housekeeping or the "
          "watchdog, nor its own job's snapshots") {
  constexpr int kDelayMs = 3000;  // before the write of COMMITTED, and before its sync
  const std::string dir = ShortTempDir("stall-commit");
  NotifySocket notify(dir + "/notify.sock");
  REQUIRE(notify.bound());
  Daemon daemon(dir, {{"--client_timeout_s=30"}, "", "zccd",
                      {notify.env(), "WATCHDOG_USEC=400000",
                       absl::StrCat("ZCCD_INJECT_STORAGE_FAULTS=path=stalljob/step-00000002.partial/"
                                    "COMMITTED,op_delay_ms=", kDelayMs)}});
  REQUIRE(daemon.Start());
  InProcessJob checkpointed = Register(daemon, "fastjob", 1.0f);
  REQUIRE(checkpointed.client->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  auto doomed = StartDoomed(daemon, dir);

  // Step 2 of the stalled job is written, and its commit stalls writing
  // COMMITTED; the trainer goes on snapshotting meanwhile.
  auto stalled = StartTrainer(daemon, dir, "stalled",
                              {"--job=stalljob", "--steps=8", "--save_every=2", "--step_ms=100",
                               "--wait_commit=false", "--daemon_timeout_s=30"});
  const std::string partial = JobDir(daemon, "stalljob") + "/step-00000002.partial";
  REQUIRE(Eventually(
      [&] {
        for (const std::string& name : ListDirForTest(partial)) {
          if (absl::StartsWith(name, "COMMITTED.tmp")) return true;
        }
        return false;
      },
      absl::Seconds(30), absl::Milliseconds(5)));
  const absl::Time stall_start = absl::Now();
  const std::string step2 = JobDir(daemon, "stalljob") + "/step-00000002/COMMITTED";
  CheckOtherWorkGoesOn(daemon, notify, *doomed, checkpointed, stall_start,
                       absl::Milliseconds(2 * kDelayMs),
                       [&] { return ::access(step2.c_str(), F_OK) != 0; });

  // The stalled job's trainer was not held up: its snapshots after step 2
  // were taken (not skipped for want of a slot), and every step commits.
  REQUIRE(stalled->Wait(absl::Seconds(60)) == 0);
  INFO(stalled->Output());
  CHECK(stalled->Values()["published"] == "8");
  REQUIRE(WaitForPath(JobDir(daemon, "stalljob") + "/step-00000008/COMMITTED", absl::Seconds(30)));
  // (Step 2 committed first, in order; retention has removed it since.)
  CHECK(absl::StrContains(daemon.LatestLog(), "checkpoint job=stalljob step=2 "));
  checkpointed.client.reset();
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("a job forgotten while its committer is stalled on a hung file system holds up no "
          "housekeeping, other job, status or watchdog") {
  // Rank 1 of a 2-rank job whose rank 0 registers elsewhere: each
  // housekeeping round has this job's committer follow the job's progress
  // by reading `latest`, which the slow disk holds up. Once its trainer is
  // gone, a round forgets the job while that read is in flight; the wait
  // for its committer belongs on the reaper, not on the housekeeping thread.
  constexpr int kDelayMs = 6000;
  const std::string dir = ShortTempDir("stall-forget");
  NotifySocket notify(dir + "/notify.sock");
  REQUIRE(notify.bound());
  Daemon daemon(dir, {{"--client_timeout_s=30", "--retain_snapshots_s=0"}, "", "zccd",
                      {notify.env(), "WATCHDOG_USEC=400000",
                       absl::StrCat("ZCCD_INJECT_STORAGE_FAULTS=path=dropjob/latest,op_delay_ms=",
                                    kDelayMs)}});
  REQUIRE(daemon.Start());
  InProcessJob checkpointed = Register(daemon, "fastjob", 1.0f);
  REQUIRE(checkpointed.client->Snapshot(1) == SnapshotResult::kEnqueued);
  REQUIRE(WaitForPath(JobDir(daemon, "fastjob") + "/step-00000001/COMMITTED", absl::Seconds(30)));
  auto doomed = StartDoomed(daemon, dir);
  auto dropper = StartTrainer(daemon, dir, "dropper",
                              {"--job=dropjob", "--rank=1", "--world=2", "--steps=3",
                               "--save_every=0", "--pause_at=1", "--daemon_timeout_s=30"});
  REQUIRE(dropper->WaitForOutput("paused", absl::Seconds(60)));
  // What rank 0's zccd, on another node, has committed by now.
  {
    std::FILE* latest = std::fopen((JobDir(daemon, "dropjob") + "/latest").c_str(), "w");
    REQUIRE(latest != nullptr);
    std::fputs("step-00000001\n", latest);
    REQUIRE(std::fclose(latest) == 0);
  }
  dropper->Signal(SIGKILL);
  REQUIRE(dropper->Wait(absl::Seconds(5)).has_value());
  REQUIRE(Eventually(
      [&] { return absl::StrContains(daemon.LatestLog(), "job dropjob: forgotten"); },
      absl::Seconds(60), absl::Milliseconds(5)));
  const absl::Time stall_start = absl::Now();
  // The round that forgot the job asked its committer for a read of
  // `latest` just before (at most one round, 0.5 s, earlier), so the read
  // and the wait for it last until kDelayMs after that: the checks are done
  // well within it.
  CheckOtherWorkGoesOn(daemon, notify, *doomed, checkpointed, stall_start,
                       absl::Milliseconds(kDelayMs - 1000),
                       [&] { return absl::Now() - stall_start < absl::Milliseconds(kDelayMs - 1000); });
  checkpointed.client.reset();
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
