#include "proto/convert.h"

#include <catch2/catch.hpp>

#include "common/testing/status_matchers.h"

namespace zcc::proto {
namespace {

TEST_CASE("every dtype and tensor kind survives the round trip through the protocol") {
  const format::DType dtypes[] = {format::DType::kF32, format::DType::kF16, format::DType::kBF16,
                                  format::DType::kF64, format::DType::kI64, format::DType::kI32,
                                  format::DType::kI16, format::DType::kI8,  format::DType::kU8,
                                  format::DType::kBool};
  for (format::DType d : dtypes) {
    CHECK(ToProto(d) != v1::DTYPE_UNSPECIFIED);
    auto back = FromProto(ToProto(d));
    REQUIRE_OK(back);
    CHECK(*back == d);
  }
  for (uint32_t k = 0; k < format::kNumTensorKinds; ++k) {
    const auto kind = static_cast<format::TensorKind>(k);
    CHECK(ToProto(kind) != v1::TENSOR_KIND_UNSPECIFIED);
    auto back = FromProto(ToProto(kind));
    REQUIRE_OK(back);
    CHECK(*back == kind);
  }
}

TEST_CASE("unspecified and unknown protocol values are refused") {
  REQUIRE_STATUS_CODE(FromProto(v1::DTYPE_UNSPECIFIED), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(FromProto(static_cast<v1::DType>(99)), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(FromProto(v1::TENSOR_KIND_UNSPECIFIED), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(FromProto(static_cast<v1::TensorKind>(42)),
                      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zcc::proto
