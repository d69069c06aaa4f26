// Tests of the CPU-only stand-in linked with --config=nocuda.
#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "cuda/cuda_copier.h"

namespace zcc {
namespace {

TEST_CASE("built without CUDA, NewCudaCopier says so and no device is reported") {
  WARN("built with --config=nocuda: the CUDA copier tests are not compiled in");
  CHECK_FALSE(CudaDeviceAvailable());
  auto copier = NewCudaCopier(CudaCopierOptions());
  REQUIRE_FALSE(copier.ok());
  CHECK(copier.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(absl::StrContains(copier.status().message(), "--config=nocuda"));
}

}  // namespace
}  // namespace zcc
