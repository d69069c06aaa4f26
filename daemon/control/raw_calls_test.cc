#include "daemon/control/raw_calls.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "common/testing/eventually.h"
#include "proto/zcc.grpc.pb.h"

namespace zcc::daemon {
namespace {

using RawStatus = v1::Status::WithRawCallbackMethod_GetStatus<
    v1::Status::WithRawCallbackMethod_ListCheckpoints<v1::Status::Service>>;

// GetStatus answers with the job id it was asked about, once `release` is
// notified when the job id is "hold". The caller's uid is the request's
// "uid" metadata (0 without).
class TestService final : public RawStatus {
 public:
  explicit TestService(RawCalls* calls) : calls_(calls) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    Caller caller;
    auto uid = ctx->client_metadata().find("uid");
    if (uid != ctx->client_metadata().end()) {
      caller.uid = static_cast<uid_t>(std::stoi(std::string(uid->second.data(), uid->second.size())));
    }
    return calls_->Serve<v1::StatusRequest, v1::StatusResponse>(
        ctx, "GetStatus", caller, req, resp, kSmallRequest,
        [this](const Caller&, const v1::StatusRequest& r, v1::StatusResponse* out) {
          if (r.job_id() == "hold") {
            held.fetch_add(1);
            release.WaitForNotification();
          }
          out->add_jobs()->set_job_id(r.job_id());
          return grpc::Status::OK;
        });
  }

  std::atomic<int> held{0};
  absl::Notification release;

 private:
  RawCalls* calls_;
};

struct Fixture {
  explicit Fixture(RawCallsOptions options) : calls(std::move(options)), service(&calls) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    channel = server->InProcessChannel(grpc::ChannelArguments());
    stub = v1::Status::NewStub(channel);
  }
  ~Fixture() {
    if (!service.release.HasBeenNotified()) service.release.Notify();
    server->Shutdown();
    server->Wait();
    calls.Drain();
  }

  // GetStatus for `job` as `uid`, on a thread of its own.
  std::future<std::pair<grpc::Status, v1::StatusResponse>> Ask(const std::string& job,
                                                               int uid = 0) {
    return std::async(std::launch::async, [this, job, uid] {
      v1::StatusRequest req;
      req.set_job_id(job);
      v1::StatusResponse resp;
      grpc::ClientContext ctx;
      ctx.AddMetadata("uid", std::to_string(uid));
      grpc::Status st = stub->GetStatus(&ctx, req, &resp);
      return std::make_pair(st, resp);
    });
  }

  void WaitHeld(int n) {
    for (int i = 0; i < 5000 && service.held.load() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
    REQUIRE(service.held.load() == n);
  }

  RawCalls calls;
  TestService service;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Status::Stub> stub;
};

TEST_CASE("a call is parsed, handled on a thread of its own and answered; its cost is given "
          "back") {
  Fixture f(RawCallsOptions{});
  auto [st, resp] = f.Ask("job-a").get();
  REQUIRE(st.ok());
  REQUIRE(resp.jobs_size() == 1);
  CHECK(resp.jobs(0).job_id() == "job-a");
  CHECK(f.calls.cost_in_flight() == 0);
  // Calls one after another leave at most one ended thread unjoined (once
  // the last has ended: it replies first).
  for (int i = 0; i < 20; ++i) REQUIRE(f.Ask("job-b").get().first.ok());
  CHECK(testing::Eventually([&] { return f.calls.threads() <= 1; }, absl::Seconds(5),
                            absl::Milliseconds(1)));
}

TEST_CASE("calls beyond max_calls wait (UNAVAILABLE) while the others are served, and are "
          "counted") {
  std::atomic<int> refused{0};
  Fixture f(RawCallsOptions{.max_calls = 2, .on_refused = [&refused] { refused.fetch_add(1); }});
  auto first = f.Ask("hold");
  auto second = f.Ask("hold", 1);
  f.WaitHeld(2);
  auto [st, resp] = f.Ask("third", 2).get();
  CHECK(st.error_code() == grpc::UNAVAILABLE);
  CHECK(absl::StrContains(st.error_message(), "serving 2 requests"));
  CHECK(refused.load() == 1);
  f.service.release.Notify();
  CHECK(first.get().first.ok());
  CHECK(second.get().first.ok());
  // The threads that ended make room again.
  CHECK(f.Ask("fourth").get().first.ok());
}

TEST_CASE("one user's calls fill that user's share only: another user's are served") {
  Fixture f(RawCallsOptions{.max_calls_per_uid = 2});
  auto first = f.Ask("hold", 1000);
  auto second = f.Ask("hold", 1000);
  f.WaitHeld(2);
  auto [st, resp] = f.Ask("third", 1000).get();
  CHECK(st.error_code() == grpc::UNAVAILABLE);
  CHECK(absl::StrContains(st.error_message(), "requests of this user"));
  auto [other, answer] = f.Ask("other", 1001).get();
  CHECK(other.ok());
  CHECK(answer.jobs(0).job_id() == "other");
  f.service.release.Notify();
  CHECK(first.get().first.ok());
  CHECK(second.get().first.ok());
  CHECK(f.Ask("again", 1000).get().first.ok());
}

TEST_CASE("parse memory in flight is shared: a call that does not fit beside the others is "
          "refused, one alone always fits") {
  // Each StatusRequest costs its object and its job id's string: a budget of
  // one such call lets one in at a time.
  Fixture f(RawCallsOptions{.max_cost_in_flight = 200});
  auto held = f.Ask("hold");
  f.WaitHeld(1);
  const uint64_t one = f.calls.cost_in_flight();
  CHECK(one > 0);
  CHECK(one <= 200);
  auto [st, resp] = f.Ask(std::string(150, 'x'), 1).get();
  CHECK(st.error_code() == grpc::UNAVAILABLE);
  CHECK(absl::StrContains(st.error_message(), "bytes of other requests being served"));
  f.service.release.Notify();
  CHECK(held.get().first.ok());
  CHECK(f.calls.cost_in_flight() == 0);
  // Alone, a call over the shared budget (but within its method's) is served.
  auto [alone, answer] = f.Ask(std::string(1000, 'y')).get();
  CHECK(alone.ok());
}

TEST_CASE("one user's parse memory is bounded apart from the others'") {
  Fixture f(RawCallsOptions{.max_cost_per_uid = 200});
  auto held = f.Ask("hold", 7);
  f.WaitHeld(1);
  auto [st, resp] = f.Ask(std::string(150, 'x'), 7).get();
  CHECK(st.error_code() == grpc::UNAVAILABLE);
  CHECK(absl::StrContains(st.error_message(), "this user's other requests"));
  CHECK(f.Ask(std::string(150, 'x'), 8).get().first.ok());
  f.service.release.Notify();
  CHECK(held.get().first.ok());
}

TEST_CASE("Drain waits for the calls being served, then refuses new ones") {
  Fixture f(RawCallsOptions{});
  auto held = f.Ask("hold");
  f.WaitHeld(1);
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    f.calls.Drain();
    drained = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(drained.load());
  f.service.release.Notify();
  CHECK(held.get().first.ok());
  drainer.join();
  CHECK(drained.load());
  auto [st, resp] = f.Ask("late").get();
  CHECK(st.error_code() == grpc::UNAVAILABLE);
  CHECK(absl::StrContains(st.error_message(), "shutting down"));
}

}  // namespace
}  // namespace zcc::daemon
