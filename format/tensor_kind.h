// What a registered tensor is: the one tensor-kind type of the project. The
// client API, the staging-slot layout (one file group per kind), the shard
// files and the manifests all use it; the control protocol's v1::TensorKind is
// converted to and from it in proto/convert.h only.
#ifndef ZCC_FORMAT_TENSOR_KIND_H_
#define ZCC_FORMAT_TENSOR_KIND_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::format {

// Values index per-kind arrays (the slot layout's file groups).
enum class TensorKind : uint32_t {
  kParam = 0,  // model weights: model-rNNNNN.safetensors, EMA-eligible
  kOptim = 1,  // optimizer state: optim-rNNNNN.safetensors
  kExtra = 2,  // anything else (RNG, data-loader state): extra-rNNNNN.bin
};
inline constexpr uint32_t kNumTensorKinds = 3;

// The manifest's spelling: "param", "optim", "extra".
absl::string_view TensorKindName(TensorKind kind);

// Inverse of TensorKindName; InvalidArgument naming the accepted spellings.
absl::StatusOr<TensorKind> ParseTensorKindName(absl::string_view name);

// The manifest kind of an EMA tensor ("ema"): EMA manifests describe the
// averaged parameters, which are written to ema-rNNNNN.safetensors.
inline constexpr char kEmaKindName[] = "ema";

}  // namespace zcc::format

#endif  // ZCC_FORMAT_TENSOR_KIND_H_
