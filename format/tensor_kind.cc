#include "format/tensor_kind.h"

#include "absl/strings/str_cat.h"

namespace zcc::format {

absl::string_view TensorKindName(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParam: return "param";
    case TensorKind::kOptim: return "optim";
    case TensorKind::kExtra: return "extra";
  }
  return "unknown";
}

absl::StatusOr<TensorKind> ParseTensorKindName(absl::string_view name) {
  for (uint32_t k = 0; k < kNumTensorKinds; ++k) {
    const auto kind = static_cast<TensorKind>(k);
    if (name == TensorKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor kind '", name, "' is not param, optim or extra"));
}

}  // namespace zcc::format
