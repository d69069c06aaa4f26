#include "format/dtype.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zcc::format {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

// Indexed by the enum value.
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};
constexpr size_t kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

constexpr bool TableFollowsEnum() {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return kNumDTypes == static_cast<size_t>(DType::kBool) + 1;
}
static_assert(TableFollowsEnum(), "kDTypes must list every DType in enum order");

const DTypeInfo& InfoOf(DType dtype) {
  const size_t i = static_cast<size_t>(dtype);
  // An out-of-range enum value can only come from a cast of garbage; map it to
  // U8 rather than reading past the table.
  return i < kNumDTypes ? kDTypes[i] : kDTypes[static_cast<size_t>(DType::kU8)];
}

}  // namespace

size_t DTypeSize(DType dtype) { return InfoOf(dtype).size; }

absl::string_view DTypeName(DType dtype) { return InfoOf(dtype).name; }

absl::StatusOr<DType> ParseDTypeName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", absl::CHexEscape(name.substr(0, 32)),
                   "'; expected one of F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL"));
}

absl::StatusOr<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape,
                                     uint64_t max_bytes) {
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", i, " of the shape is negative (", shape[i], ")"));
    }
    if (shape[i] == 0) has_zero = true;
  }
  // An empty tensor has no bytes however large its other dimensions are.
  if (has_zero) return uint64_t{0};
  const uint64_t elem = DTypeSize(dtype);
  const uint64_t max_elements = max_bytes / elem;
  const auto too_big = [&] {
    return absl::InvalidArgumentError(absl::StrCat("a ", DTypeName(dtype), " tensor of shape [",
                                                   absl::StrJoin(shape, ","),
                                                   "] exceeds the limit of ", max_bytes, " bytes"));
  };
  uint64_t elements = 1;
  for (int64_t dim : shape) {
    const uint64_t d = static_cast<uint64_t>(dim);
    // elements * d <= max_elements, checked by division so that it cannot overflow.
    if (elements > max_elements / d) return too_big();
    elements *= d;
  }
  if (elements > max_elements) return too_big();  // a scalar when max_bytes < elem
  return elements * elem;
}

}  // namespace zcc::format
