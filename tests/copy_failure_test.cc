// A snapshot whose copy cannot be enqueued (the copier refuses it: a failed
// pin, a device error) against a real zccd: the trainer is told so, not that
// zccd is gone; the registration stays, and the next snapshot is taken and
// committed.
#include <catch2/catch.hpp>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/testing/temp_dir.h"
#include "copy/host_copier.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

// The host copier, with Enqueue refused while `refuse` is set.
class RefusingCopier final : public DeviceCopier {
 public:
  explicit RefusingCopier(std::unique_ptr<HostCopier> host) : host_(std::move(host)) {}

  std::atomic<bool> refuse{false};

  std::string name() const override { return "refusing-host"; }
  absl::Status RegisterHostMemory(void* base, size_t bytes) override {
    return host_->RegisterHostMemory(base, bytes);
  }
  absl::Status UnregisterHostMemory(void* base) override {
    return host_->UnregisterHostMemory(base);
  }
  absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion> regions,
                                     void* stream) override {
    if (refuse.load()) return absl::InternalError("the device refused the copy");
    return host_->Enqueue(regions, stream);
  }
  absl::Status Wait(CopyTicket ticket) override { return host_->Wait(ticket); }
  absl::Status FenceBeforeUpdate(void* stream) override {
    return host_->FenceBeforeUpdate(stream);
  }
  absl::Status CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) override {
    return host_->CopyToDevice(regions, stream);
  }

 private:
  std::unique_ptr<HostCopier> host_;
};

TEST_CASE("a snapshot whose copy cannot be enqueued is skipped as such, with the reason; the "
          "registration stays and the next snapshot commits") {
  const std::string dir = ShortTempDir("copyfail");
  Daemon daemon(dir);
  REQUIRE(daemon.Start());
  auto host = HostCopier::Create(HostCopierOptions{});
  REQUIRE(host.ok());
  auto copier = std::make_shared<RefusingCopier>(*std::move(host));
  ClientOptions options;
  options.socket_path = daemon.socket();
  options.job_id = "copyfail";
  options.save_every = 1;
  options.copier = copier;
  auto client = Client::Connect(options);
  REQUIRE(client.ok());
  std::vector<float> weights(4096, 1.0f);
  REQUIRE((*client)->RegisterTensors({{"w", DType::kF32, {4096}, weights.data()}}).ok());
  REQUIRE((*client)->Stats().connected);

  copier->refuse = true;
  CHECK((*client)->Snapshot(1) == SnapshotResult::kSkippedCopyFailed);
  ClientStats stats = (*client)->Stats();
  INFO(stats.last_error);
  CHECK(stats.skipped_copy_failed == 1);
  CHECK(stats.skipped_disconnected == 0);
  CHECK(stats.connected);
  CHECK(absl::StrContains(stats.last_error, "snapshot of step 1 skipped"));
  CHECK(absl::StrContains(stats.last_error, "the device refused the copy"));

  // The slot it claimed is free again: every slot takes the next snapshots.
  copier->refuse = false;
  for (int64_t step = 2; step <= 4; ++step) {
    REQUIRE((*client)->FenceBeforeUpdate().ok());
    CHECK((*client)->Snapshot(step) == SnapshotResult::kEnqueued);
  }
  REQUIRE((*client)->Flush().ok());
  CHECK(WaitForPath(JobDir(daemon, "copyfail") + "/step-00000004/COMMITTED", absl::Seconds(30)));
  CHECK((*client)->Stats().skipped_copy_failed == 1);
  REQUIRE((*client)->Close().ok());
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
