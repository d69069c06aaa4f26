// SelectDeviceCopier in a build without CUDA (--config=nocuda).
#include <catch2/catch.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "cuda/copier_select.h"

namespace zcc {
namespace {

TEST_CASE("built without CUDA: kAuto is the host copier, with one log line") {
  testing::StderrCapture capture;
  auto copier = SelectDeviceCopier(CopierSelection());
  const std::string log = capture.Release();
  REQUIRE_OK(copier);
  CHECK((*copier)->name() == "host");
  CHECK(testing::CountLinesWith(log, " W ") == 1);
  CHECK(testing::CountLinesWith(log, "zcc: no usable CUDA device (built without CUDA") == 1);
  CHECK(testing::CountLinesWith(log, "); using the host copy backend") == 1);
}

TEST_CASE("built without CUDA: kCuda says so, kHost works") {
  CopierSelection selection;
  selection.backend = CopierSelection::Backend::kCuda;
  auto cuda = SelectDeviceCopier(selection);
  CHECK(cuda.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(absl::StrContains(cuda.status().message(), "--config=nocuda"));
  selection.backend = CopierSelection::Backend::kHost;
  auto host = SelectDeviceCopier(selection);
  REQUIRE_OK(host);
  CHECK((*host)->name() == "host");
}

}  // namespace
}  // namespace zcc
