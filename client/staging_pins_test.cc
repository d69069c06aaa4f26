#include "client/staging_pins.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "common/testing/status_matchers.h"

namespace zcc::client_internal {
namespace {

using namespace std::chrono_literals;

// Records registrations; the registration of the piece at `hold` waits
// until Release(), and one at `fail` is refused.
class GatedCopier final : public DeviceCopier {
 public:
  GatedCopier(const uint8_t* hold, const uint8_t* fail) : hold_(hold), fail_(fail) {}

  std::string name() const override { return "gated"; }
  absl::Status RegisterHostMemory(void* base, size_t bytes) override {
    zcc::MutexLock lock(&mu_);
    if (base == hold_) {
      auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; };
      mu_.Await(absl::Condition(&released));
    }
    if (base == fail_) return absl::ResourceExhaustedError("no more pinned memory");
    registered_.emplace(static_cast<uint8_t*>(base), bytes);
    return absl::OkStatus();
  }
  absl::Status UnregisterHostMemory(void* base) override {
    zcc::MutexLock lock(&mu_);
    unregistered_.insert(static_cast<uint8_t*>(base));
    return absl::OkStatus();
  }
  absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion>, void*) override {
    return absl::UnimplementedError("not for this test");
  }
  absl::Status Wait(CopyTicket) override { return absl::OkStatus(); }
  absl::Status FenceBeforeUpdate(void*) override { return absl::OkStatus(); }
  absl::Status CopyToDevice(absl::Span<const CopyRegion>, void*) override {
    return absl::OkStatus();
  }

  void Release() {
    zcc::MutexLock lock(&mu_);
    released_ = true;
  }
  std::set<std::pair<uint8_t*, size_t>> registered() {
    zcc::MutexLock lock(&mu_);
    return registered_;
  }
  std::set<uint8_t*> unregistered() {
    zcc::MutexLock lock(&mu_);
    return unregistered_;
  }

 private:
  const uint8_t* const hold_;
  const uint8_t* const fail_;
  zcc::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::pair<uint8_t*, size_t>> registered_ ABSL_GUARDED_BY(mu_);
  std::set<uint8_t*> unregistered_ ABSL_GUARDED_BY(mu_);
};

// Three pieces of a 300-byte "segment": [0, 100), [100, 200), [200, 300).
struct Segment {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(300);
  uint8_t* at(size_t offset) { return bytes.data() + offset; }
};

TEST_CASE("staging pins: a copy waits only for the pieces it touches") {
  Segment seg;
  auto copier = std::make_shared<GatedCopier>(seg.at(100), nullptr);
  {
    StagingPins pins(copier, seg.at(0), 300, {100, 200});
    // The first piece is pinned although the second is held.
    REQUIRE_OK(pins.Await(seg.at(10), 50));
    REQUIRE_OK(pins.Await(seg.at(0), 100));
    // Memory outside the segment needs nothing.
    uint8_t elsewhere[8];
    REQUIRE_OK(pins.Await(elsewhere, sizeof(elsewhere)));
    // A range reaching into the second piece waits for it, as does the third.
    auto second = std::async(std::launch::async, [&] { return pins.Await(seg.at(90), 20); });
    auto all = std::async(std::launch::async, [&] { return pins.AwaitAll(); });
    REQUIRE(second.wait_for(100ms) == std::future_status::timeout);
    REQUIRE(all.wait_for(0ms) == std::future_status::timeout);
    CHECK(copier->registered() == std::set<std::pair<uint8_t*, size_t>>{{seg.at(0), 100}});
    copier->Release();
    REQUIRE_OK(second.get());
    REQUIRE_OK(all.get());
    CHECK(copier->registered() == std::set<std::pair<uint8_t*, size_t>>{
                                      {seg.at(0), 100}, {seg.at(100), 100}, {seg.at(200), 100}});
    REQUIRE_OK(pins.Await(seg.at(299), 1));
    CHECK(copier->unregistered().empty());
  }
  // Released: every piece unregistered.
  CHECK(copier->unregistered() == std::set<uint8_t*>{seg.at(0), seg.at(100), seg.at(200)});
}

TEST_CASE("staging pins: a refused piece fails the copies that need it, not the earlier ones") {
  Segment seg;
  auto copier = std::make_shared<GatedCopier>(nullptr, seg.at(100));
  {
    StagingPins pins(copier, seg.at(0), 300, {100, 200});
    REQUIRE_OK(pins.Await(seg.at(0), 100));
    const absl::Status second = pins.Await(seg.at(150), 10);
    REQUIRE(second.code() == absl::StatusCode::kResourceExhausted);
    CHECK(second.message().find("piece 2 of 3") != absl::string_view::npos);
    // Pinning stopped there: the third piece fails the same way.
    REQUIRE(pins.Await(seg.at(250), 10).code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(pins.AwaitAll().code() == absl::StatusCode::kResourceExhausted);
  }
  CHECK(copier->unregistered() == std::set<uint8_t*>{seg.at(0)});
}

TEST_CASE("staging pins: released while a piece is being pinned") {
  Segment seg;
  auto copier = std::make_shared<GatedCopier>(seg.at(100), nullptr);
  auto pins = std::make_unique<StagingPins>(copier, seg.at(0), 300, std::vector<size_t>{100, 200});
  REQUIRE_OK(pins->Await(seg.at(0), 1));
  // The destructor waits for the piece in progress, pins nothing after it,
  // and unregisters both it and the first.
  auto destroyed = std::async(std::launch::async, [&] { pins.reset(); });
  REQUIRE(destroyed.wait_for(100ms) == std::future_status::timeout);
  copier->Release();
  destroyed.get();
  CHECK(copier->registered() == std::set<std::pair<uint8_t*, size_t>>{{seg.at(0), 100},
                                                                      {seg.at(100), 100}});
  CHECK(copier->unregistered() == std::set<uint8_t*>{seg.at(0), seg.at(100)});
}

TEST_CASE("staging pins: one piece when there are no cuts") {
  Segment seg;
  auto copier = std::make_shared<GatedCopier>(nullptr, nullptr);
  {
    StagingPins pins(copier, seg.at(0), 300, {});
    REQUIRE_OK(pins.AwaitAll());
    CHECK(copier->registered() == std::set<std::pair<uint8_t*, size_t>>{{seg.at(0), 300}});
  }
  CHECK(copier->unregistered() == std::set<uint8_t*>{seg.at(0)});
}

}  // namespace
}  // namespace zcc::client_internal
