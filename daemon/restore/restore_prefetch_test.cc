#include "daemon/restore/restore_prefetch.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <optional>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/eventually.h"

namespace zcc::daemon {
namespace {

using Chosen = RestorePrefetch::Chosen;

// What Finish was called with, and how often.
struct Finished {
  std::atomic<int> calls{0};
  std::atomic<int64_t> step{-2};  // -1: called without a step
  std::atomic<bool> slot_taken{false};

  RestorePrefetch::Finish Callback() {
    return [this](const std::optional<Chosen>& chosen, bool taken) {
      step.store(chosen.has_value() ? chosen->step : -1);
      slot_taken.store(taken);
      calls.fetch_add(1);
    };
  }
};

RestorePrefetch::Choose StepTen() {
  return []() -> absl::StatusOr<std::optional<Chosen>> {
    Chosen c;
    c.step = 10;
    c.step_dir = "/ckpt/job/step-00000010";
    return c;
  };
}

TEST_CASE("a restore takes the read over: it waits for the rest, and the slot is its own") {
  Finished finished;
  absl::Notification go;
  {
    RestorePrefetch prefetch(
        2, StepTen(),
        [&go](const Chosen& chosen, const std::function<bool()>&) -> absl::StatusOr<uint64_t> {
          go.WaitForNotification();
          return uint64_t{1000} + chosen.step;
        },
        finished.Callback());
    CHECK(prefetch.slot() == 2);
    std::optional<Chosen> chosen = prefetch.AwaitChoice(nullptr);
    REQUIRE(chosen.has_value());
    CHECK(chosen->step == 10);
    CHECK(chosen->step_dir == "/ckpt/job/step-00000010");
    // A caller that gives up while the read runs leaves the slot to it.
    int looks = 0;
    CHECK_FALSE(prefetch.TakeRead([&looks] { return ++looks > 2; }).has_value());
    go.Notify();
    std::optional<absl::StatusOr<uint64_t>> read = prefetch.TakeRead(nullptr);
    REQUIRE(read.has_value());
    REQUIRE(read->ok());
    CHECK(**read == 1010);
    CHECK(finished.calls.load() == 0);
  }
  CHECK(finished.calls.load() == 1);
  CHECK(finished.step.load() == 10);
  CHECK(finished.slot_taken.load());
}

TEST_CASE("a read ahead dropped before a restore takes it is cancelled and frees its slot") {
  Finished finished;
  std::atomic<bool> saw_cancel{false};
  absl::Notification reading;
  {
    RestorePrefetch prefetch(
        0, StepTen(),
        [&](const Chosen&, const std::function<bool()>& cancelled) -> absl::StatusOr<uint64_t> {
          reading.Notify();
          while (!cancelled()) absl::SleepFor(absl::Milliseconds(1));  // a long read
          saw_cancel.store(true);
          return absl::CancelledError("cancelled");
        },
        finished.Callback());
    reading.WaitForNotification();
  }  // the trainer snapshotted first, or the session ended
  CHECK(saw_cancel.load());
  CHECK(finished.calls.load() == 1);
  CHECK(finished.step.load() == 10);
  CHECK_FALSE(finished.slot_taken.load());
}

TEST_CASE("nothing to restore: the slot goes back at once, not when the prefetch is dropped") {
  Finished finished;
  std::atomic<bool> read_called{false};
  RestorePrefetch prefetch(
      1, []() -> absl::StatusOr<std::optional<Chosen>> { return std::nullopt; },
      [&read_called](const Chosen&, const std::function<bool()>&) -> absl::StatusOr<uint64_t> {
        read_called.store(true);
        return uint64_t{0};
      },
      finished.Callback());
  REQUIRE(zcc::testing::Eventually([&] { return finished.calls.load() == 1; },
                                   absl::Seconds(10)));
  CHECK(finished.step.load() == -1);
  CHECK_FALSE(finished.slot_taken.load());
  CHECK_FALSE(prefetch.AwaitChoice(nullptr).has_value());
  std::optional<absl::StatusOr<uint64_t>> read = prefetch.TakeRead(nullptr);
  REQUIRE(read.has_value());
  CHECK(read->status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(read_called.load());
}

TEST_CASE("a choice that fails reads nothing and gives the slot back") {
  Finished finished;
  RestorePrefetch prefetch(
      1, []() -> absl::StatusOr<std::optional<Chosen>> { return absl::DataLossError("no index"); },
      [](const Chosen&, const std::function<bool()>&) -> absl::StatusOr<uint64_t> {
        FAIL("read without a choice");
        return uint64_t{0};
      },
      finished.Callback());
  CHECK_FALSE(prefetch.AwaitChoice(nullptr).has_value());
  REQUIRE(zcc::testing::Eventually([&] { return finished.calls.load() == 1; },
                                   absl::Seconds(10)));
  CHECK(finished.step.load() == -1);
}

}  // namespace
}  // namespace zcc::daemon
