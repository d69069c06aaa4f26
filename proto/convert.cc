#include "proto/convert.h"

#include "absl/strings/str_cat.h"

namespace zcc::proto {
namespace {

// The protocol's spelling of every DType, in one table for both directions.
struct DTypePair {
  format::DType dtype;
  v1::DType wire;
};
constexpr DTypePair kDTypes[] = {
    {format::DType::kF32, v1::F32}, {format::DType::kF16, v1::F16},
    {format::DType::kBF16, v1::BF16}, {format::DType::kF64, v1::F64},
    {format::DType::kI64, v1::I64}, {format::DType::kI32, v1::I32},
    {format::DType::kI16, v1::I16}, {format::DType::kI8, v1::I8},
    {format::DType::kU8, v1::U8},   {format::DType::kBool, v1::BOOL},
};

struct KindPair {
  format::TensorKind kind;
  v1::TensorKind wire;
};
constexpr KindPair kKinds[] = {
    {format::TensorKind::kParam, v1::PARAM},
    {format::TensorKind::kOptim, v1::OPTIM},
    {format::TensorKind::kExtra, v1::EXTRA},
};

}  // namespace

v1::DType ToProto(format::DType dtype) {
  for (const DTypePair& p : kDTypes) {
    if (p.dtype == dtype) return p.wire;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::TensorKind ToProto(format::TensorKind kind) {
  for (const KindPair& p : kKinds) {
    if (p.kind == kind) return p.wire;
  }
  return v1::TENSOR_KIND_UNSPECIFIED;
}

absl::StatusOr<format::DType> FromProto(v1::DType dtype) {
  for (const DTypePair& p : kDTypes) {
    if (p.wire == dtype) return p.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
}

absl::StatusOr<format::TensorKind> FromProto(v1::TensorKind kind) {
  for (const KindPair& p : kKinds) {
    if (p.wire == kind) return p.kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor kind ", static_cast<int>(kind), " is not PARAM, OPTIM or EXTRA"));
}

}  // namespace zcc::proto
