// SelectDeviceCopier over the fake CUDA runtime: which backend each
// situation gets, and the one log line of a fallback.
#include "cuda/copier_select.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "cuda/fake_cudart/fake_cudart.h"

namespace zcc {
namespace {

namespace fake = fake_cudart;
using Backend = CopierSelection::Backend;

constexpr char kFallbackLine[] = "zcc: no usable CUDA device (";
constexpr char kFallbackEnd[] = "); using the host copy backend";

struct Selected {
  absl::StatusOr<std::shared_ptr<DeviceCopier>> copier;
  std::string log;
};

Selected Select(const CopierSelection& selection) {
  testing::StderrCapture capture;
  Selected s{SelectDeviceCopier(selection), ""};
  s.log = capture.Release();
  return s;
}

// The copier works on host memory (every backend must, for the fallback).
void CheckCopiesHostMemory(DeviceCopier& copier) {
  std::vector<unsigned char> src(10000, 0x5C), dst(10000, 0);
  const CopyRegion region{src.data(), dst.data(), src.size()};
  auto ticket = copier.Enqueue({&region, 1}, nullptr);
  REQUIRE_OK(ticket);
  REQUIRE_OK(copier.Wait(*ticket));
  CHECK(dst == src);
}

TEST_CASE("kAuto picks the CUDA copier where a device works, silently") {
  fake::Reset();
  Selected s = Select(CopierSelection());
  REQUIRE_OK(s.copier);
  CHECK((*s.copier)->name() == "cuda");
  CHECK(testing::CountLinesWith(s.log, " W ") == 0);
  CheckCopiesHostMemory(**s.copier);
}

TEST_CASE("kAuto falls back to the host copier with one log line when CUDA is unusable") {
  for (const fake::UnusableDevice& c : fake::UnusableDevices()) {
    INFO(c.what);
    fake::Reset(c.config);
    Selected s = Select(CopierSelection());
    REQUIRE_OK(s.copier);
    CHECK((*s.copier)->name() == "host");
    INFO(s.log);
    CHECK(testing::CountLinesWith(s.log, " W ") == 1);
    CHECK(testing::CountLinesWith(s.log, kFallbackLine) == 1);
    CHECK(testing::CountLinesWith(s.log, kFallbackEnd) == 1);
    CHECK(testing::CountLinesWith(s.log, c.error_name) == 1);
    CheckCopiesHostMemory(**s.copier);
    CHECK(fake::PeekLastError() == 0);
  }
}

TEST_CASE("kAuto returns errors that do not mean 'no CUDA here'") {
  fake::Reset();
  CopierSelection selection;
  selection.device = 3;  // Of 1: a configuration error, not a missing GPU.
  Selected s = Select(selection);
  CHECK(s.copier.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(testing::CountLinesWith(s.log, kFallbackLine) == 0);

  selection = CopierSelection();
  selection.chunk_bytes = 0;
  CHECK(Select(selection).copier.status().code() == absl::StatusCode::kInvalidArgument);

  // A working device that runs out of resources: the tensors are on it.
  fake::FailCall(fake::Api::kStreamCreateWithPriority, fake::Errors().memory_allocation);
  s = Select(CopierSelection());
  CHECK(s.copier.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(testing::CountLinesWith(s.log, kFallbackLine) == 0);
}

TEST_CASE("kCuda fails loudly instead of falling back") {
  fake::Config config;
  config.device_count = 0;
  fake::Reset(config);
  CopierSelection selection;
  selection.backend = Backend::kCuda;
  Selected s = Select(selection);
  REQUIRE_FALSE(s.copier.ok());
  CHECK(s.copier.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.copier.status().message(), "cudaErrorNoDevice"));
  CHECK(testing::CountLinesWith(s.log, kFallbackLine) == 0);
  fake::Reset();
  s = Select(selection);
  REQUIRE_OK(s.copier);
  CHECK((*s.copier)->name() == "cuda");
}

TEST_CASE("kHost is the host copier, whatever the devices") {
  fake::Reset();
  CopierSelection selection;
  selection.backend = Backend::kHost;
  Selected s = Select(selection);
  REQUIRE_OK(s.copier);
  CHECK((*s.copier)->name() == "host");
  CHECK(fake::CallCount(fake::Api::kGetDeviceCount) == 0);
  CheckCopiesHostMemory(**s.copier);
}

TEST_CASE("ParseCopierBackend reads auto, host and cuda") {
  CHECK(*ParseCopierBackend("auto") == Backend::kAuto);
  CHECK(*ParseCopierBackend("host") == Backend::kHost);
  CHECK(*ParseCopierBackend("cuda") == Backend::kCuda);
  CHECK(ParseCopierBackend("gpu").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseCopierBackend("").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc
