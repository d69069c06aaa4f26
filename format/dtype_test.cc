#include "format/dtype.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "common/testing/status_matchers.h"
#include "format/tensor_kind.h"

namespace zcc::format {
namespace {

TEST_CASE("every dtype round-trips through its safetensors name") {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  for (DType d : all) {
    auto parsed = ParseDTypeName(DTypeName(d));
    REQUIRE_OK(parsed);
    CHECK(*parsed == d);
  }
  CHECK(DTypeName(DType::kBF16) == "BF16");
  CHECK(DTypeName(DType::kBool) == "BOOL");
  CHECK(DTypeSize(DType::kF32) == 4);
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kF64) == 8);
  CHECK(DTypeSize(DType::kI64) == 8);
  CHECK(DTypeSize(DType::kI8) == 1);
  CHECK(DTypeSize(DType::kBool) == 1);
}

TEST_CASE("unknown dtype names are refused") {
  for (const char* bad : {"", "f32", "F 32", "FP32", "U64", "F32 ", "BF16\n"}) {
    INFO(bad);
    REQUIRE_STATUS_CODE(ParseDTypeName(bad), absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("tensor bytes multiply dims by the element size") {
  auto b = TensorBytes(DType::kF32, {2, 3});
  REQUIRE_OK(b);
  CHECK(*b == 24);
  b = TensorBytes(DType::kBF16, {});  // a scalar
  REQUIRE_OK(b);
  CHECK(*b == 2);
  b = TensorBytes(DType::kI64, {7, 0, 5});
  REQUIRE_OK(b);
  CHECK(*b == 0);
  // A zero dimension makes the tensor empty even next to huge ones.
  b = TensorBytes(DType::kF64, {INT64_MAX, INT64_MAX, 0});
  REQUIRE_OK(b);
  CHECK(*b == 0);
}

TEST_CASE("tensor bytes refuse negative dims, overflow and the limit") {
  REQUIRE_STATUS_CODE(TensorBytes(DType::kF32, {2, -1}), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(TensorBytes(DType::kF32, {-1, 0}), absl::StatusCode::kInvalidArgument);
  // 2^32 * 2^32 elements overflows uint64 before the element size is applied.
  REQUIRE_STATUS_CODE(TensorBytes(DType::kU8, {int64_t{1} << 32, int64_t{1} << 32}),
               absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(TensorBytes(DType::kF64, {INT64_MAX}), absl::StatusCode::kInvalidArgument);
  // Exactly at the limit is fine, one element over is not.
  auto b = TensorBytes(DType::kF32, {16}, 64);
  REQUIRE_OK(b);
  CHECK(*b == 64);
  REQUIRE_STATUS_CODE(TensorBytes(DType::kF32, {17}, 64), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(TensorBytes(DType::kF32, {}, 3), absl::StatusCode::kInvalidArgument);
  // The default limit is 2^50 bytes.
  REQUIRE_OK(TensorBytes(DType::kU8, {int64_t{1} << 25, int64_t{1} << 25}));
  REQUIRE_STATUS_CODE(TensorBytes(DType::kU8, {int64_t{1} << 25, (int64_t{1} << 25) + 1}),
               absl::StatusCode::kInvalidArgument);
}

TEST_CASE("every tensor kind round-trips through its manifest name; others are refused") {
  for (uint32_t k = 0; k < kNumTensorKinds; ++k) {
    const auto kind = static_cast<TensorKind>(k);
    auto parsed = ParseTensorKindName(TensorKindName(kind));
    REQUIRE_OK(parsed);
    CHECK(*parsed == kind);
  }
  CHECK(TensorKindName(TensorKind::kOptim) == "optim");
  REQUIRE_STATUS_CODE(ParseTensorKindName("ema"), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ParseTensorKindName("Param"), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ParseTensorKindName(""), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc::format
