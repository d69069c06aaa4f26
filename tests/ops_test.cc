// Operations against a real zccd: Prometheus metrics scraped over HTTP and
// parsed back, the read-only TCP status listener, the gRPC health service,
// and READY=1 to systemd's notify socket.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/testing/temp_dir.h"
#include "metrics/testing/exposition_parser.h"
#include "proto/zcc.grpc.pb.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

// grpc.health.v1.Health/Check with an empty request; returns the raw response
// bytes (status SERVING is field 1 = 1: "\x08\x01").
std::string HealthCheck(int port) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

TEST_CASE("metrics, TCP status, health and systemd readiness of a live daemon") {
  const std::string dir = ShortTempDir("it-ops");
  // A notify socket standing in for systemd's.
  const std::string notify_path = dir + "/notify.sock";
  const int notify_fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify_path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(bind(notify_fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);

  Daemon daemon(dir, {{"--metrics_listen=127.0.0.1:0", "--status_listen=127.0.0.1:0"},
                      "", "zccd", {"NOTIFY_SOCKET=" + notify_path}});
  REQUIRE(daemon.Start());
  char buf[256] = {};
  struct timeval tv{10, 0};
  setsockopt(notify_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const ssize_t n = recv(notify_fd, buf, sizeof(buf) - 1, 0);
  REQUIRE(n > 0);
  CHECK(absl::StrContains(std::string(buf, n), "READY=1"));

  const int metrics_port = PortFromLog(daemon, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  const int status_port = PortFromLog(daemon, R"(read-only status and health on \S+ \(port (\d+)\))");
  REQUIRE(metrics_port > 0);
  REQUIRE(status_port > 0);

  // With an EMA, whose update at step 4 a NaN parameter makes it skip.
  auto t = StartTrainer(daemon, dir, "train",
                        {"--steps=10", "--block", "--linger_ms=3000", "--ema_decay=0.9",
                         "--nonfinite_at_step=4"});
  REQUIRE(t->WaitForOutput("published=", absl::Seconds(60)));
  absl::SleepFor(absl::Seconds(1));  // one housekeeping round for the gauges

  const std::string http = HttpGet(metrics_port, "/metrics");
  REQUIRE(absl::StartsWith(http, "HTTP/1.1 200"));
  const std::string body = http.substr(http.find("\r\n\r\n") + 4);
  auto exposition = metrics::testing::ParseExposition(body);
  INFO(body);
  REQUIRE(exposition.ok());
  CHECK(exposition->Value("zcc_snapshots_total").value_or(0) == 10);
  CHECK(exposition->Value("zcc_bytes_written_total").value_or(0) > 4e6);
  CHECK(exposition->Value("zcc_checkpoint_seconds_count").value_or(0) == 2);
  CHECK(exposition->Value("zcc_commit_latency_seconds_count").value_or(0) == 2);
  CHECK(exposition->Value("zcc_registered_ranks").value_or(0) == 1);
  CHECK(exposition->Value("zcc_staging_bytes").value_or(0) > 0);
  CHECK(exposition->Value("zcc_errors_total", {{"kind", "write"}}).value_or(-1) == 0);
  CHECK(exposition->Value("zcc_ema_snapshots_left_out_total", {{"reason", "nonfinite"}})
            .value_or(-1) == 1);
  CHECK(exposition->Value("zcc_ema_snapshots_left_out_total", {{"reason", "out_of_order"}})
            .value_or(-1) == 0);
  CHECK(absl::StartsWith(HttpGet(metrics_port, "/nope"), "HTTP/1.1 404"));

  // The TCP listener serves status (all jobs, read-only) and health.
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", status_port),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Status::NewStub(channel);
  v1::StatusRequest sreq;
  v1::StatusResponse sresp;
  grpc::ClientContext sctx;
  REQUIRE(stub->GetStatus(&sctx, sreq, &sresp).ok());
  REQUIRE(sresp.jobs_size() == 1);
  CHECK(sresp.jobs(0).last_committed_step() == 10);
  REQUIRE(sresp.jobs(0).ranks_size() == 1);
  CHECK(sresp.jobs(0).ranks(0).ema_skipped_nonfinite() == 1);
  CHECK(sresp.jobs(0).ranks(0).ema_out_of_order() == 0);
  // zccctl status says it per rank.
  auto [zcode, zout] = Zccctl(dir, daemon, {"status"});
  INFO(zout);
  CHECK(zcode == 0);
  CHECK(absl::StrContains(zout, "rank 0 EMA: snapshots left out: 1 holding NaN or Inf, 0 taken "
                                "in after a later one"));
  // No control service there.
  auto control = v1::Control::NewStub(channel);
  v1::SaveNowRequest save;
  save.set_job_id("itest");
  v1::SaveNowResponse saved;
  grpc::ClientContext cctx;
  CHECK(control->SaveNow(&cctx, save, &saved).error_code() == grpc::StatusCode::UNIMPLEMENTED);
  CHECK(HealthCheck(status_port) == std::string("\x08\x01", 2));

  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  REQUIRE(daemon.Stop() == 0);
  const ssize_t m = recv(notify_fd, buf, sizeof(buf) - 1, 0);
  REQUIRE(m > 0);
  CHECK(absl::StrContains(std::string(buf, m), "STOPPING=1"));
  close(notify_fd);
}

TEST_CASE("zccd refuses a bad config file with the line and field, and flags override the file") {
  const std::string dir = ShortTempDir("it-conf");
  {
    std::FILE* f = std::fopen((dir + "/bad.conf").c_str(), "w");
    std::fputs("keep_last: 3\nkeep_lst: 4\n", f);
    std::fclose(f);
  }
  Subprocess bad({Runfile("daemon/zccd"), "--config=" + dir + "/bad.conf"}, dir + "/bad.log");
  CHECK(bad.Wait(absl::Seconds(10)) == 2);
  CHECK(absl::StrContains(bad.Output(), "bad.conf:2:1"));
  CHECK(absl::StrContains(bad.Output(), "keep_lst"));
  {
    std::FILE* f = std::fopen((dir + "/range.conf").c_str(), "w");
    std::fputs("default_num_slots: 99\n", f);
    std::fclose(f);
  }
  Subprocess range({Runfile("daemon/zccd"), "--config=" + dir + "/range.conf"}, dir + "/range.log");
  CHECK(range.Wait(absl::Seconds(10)) == 2);
  CHECK(absl::StrContains(range.Output(), "default_num_slots"));

  // A good file; --keep_last on the command line wins over it.
  {
    std::FILE* f = std::fopen((dir + "/good.conf").c_str(), "w");
    std::fputs("keep_last: 5\ncommit_timeout_s: 30\n", f);
    std::fclose(f);
  }
  Daemon daemon(dir, {{"--config=" + dir + "/good.conf", "--keep_last=1"}});
  REQUIRE(daemon.Start());
  auto t = StartTrainer(daemon, dir, "train", {"--steps=15", "--block"});
  REQUIRE(t->Wait(absl::Seconds(60)) == 0);
  CHECK(*checkpoint::ListCommittedSteps(JobDir(daemon)) == std::vector<int64_t>{15});
  REQUIRE(daemon.Stop() == 0);
}

TEST_CASE("one zccd per shared-memory prefix and socket: a second refuses and touches nothing") {
  const std::string dir = ShortTempDir("ops-one");
  Daemon first(dir);
  REQUIRE(first.Start());
  const std::string prefix = first.shm_prefix();
  const std::string pid = absl::StrCat(first.process()->pid());
  auto t = StartTrainer(first, dir, "train",
                        {"--steps=6", "--save_every=0", "--pause_at=2", "--daemon_timeout_s=30",
                         "--step_ms=5"});
  REQUIRE(t->WaitForOutput("paused", absl::Seconds(30)));
  const std::vector<std::string> segments = ShmSegments(prefix + ".");
  REQUIRE(!segments.empty());

  // The same prefix on another socket: refused, naming the live zccd; the
  // live one's segments (its trainer's staging slots) are all still there.
  Subprocess same_prefix({Runfile("daemon/zccd"), "--socket=" + dir + "/second.sock",
                          "--root=" + dir + "/ckpt2", "--shm_prefix=" + prefix},
                         dir + "/second.log");
  CHECK(same_prefix.Wait(absl::Seconds(30)) == 1);
  INFO(same_prefix.Output());
  CHECK(absl::StrContains(same_prefix.Output(),
                          absl::StrCat("another zccd (pid ", pid,
                                       ") is running with shared-memory prefix '", prefix, "'")));
  CHECK(ShmSegments(prefix + ".") == segments);

  // The same socket with another prefix: refused, and the socket stays.
  Subprocess same_socket({Runfile("daemon/zccd"), "--socket=" + first.socket(),
                          "--root=" + dir + "/ckpt3", "--shm_prefix=" + prefix + "b"},
                         dir + "/third.log");
  CHECK(same_socket.Wait(absl::Seconds(30)) == 1);
  INFO(same_socket.Output());
  CHECK(absl::StrContains(same_socket.Output(),
                          absl::StrCat("another zccd (pid ", pid, ") is running with socket ",
                                       first.socket())));
  CHECK(ShmSegments(prefix + "b.").empty());
  auto [code, out] = Zccctl(dir, first, {"status"});
  CHECK(code == 0);

  // The trainer never noticed: every snapshot after the pause was taken.
  t->Signal(SIGUSR1);
  REQUIRE(t->Wait(absl::Seconds(30)) == 0);
  CHECK(t->Values()["skipped_disconnected"] == "0");
  CHECK(t->Values()["published"] == "6");

  // Once it is gone (killed: no cleanup), the next zccd with the prefix
  // takes it and removes exactly what the dead one left.
  const size_t left = ShmSegments(prefix + ".").size();
  REQUIRE(left > 0);  // the departed trainer's snapshots, kept for a restore
  first.Kill();
  REQUIRE(first.Start());
  INFO(first.LatestLog());
  CHECK(absl::StrContains(first.LatestLog(), absl::StrCat("removed ", left, " of ", left,
                                                          " stale staging segment(s)")));
  CHECK(ShmSegments(prefix + ".").empty());
  REQUIRE(first.Stop() == 0);
  // A clean stop lets go of the prefix's lock file.
  CHECK(::access(absl::StrCat("/dev/shm/.zccd.", prefix, ".lock").c_str(), F_OK) != 0);
}

}  // namespace
}  // namespace zcc::testing
