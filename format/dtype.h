// Tensor element types as the on-disk format spells them (safetensors names).
#ifndef ZCC_FORMAT_DTYPE_H_
#define ZCC_FORMAT_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::format {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);

// "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL".
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; InvalidArgument for anything else.
absl::StatusOr<DType> ParseDTypeName(absl::string_view name);

// Product of dims times the element size. InvalidArgument for a negative
// dimension or when the byte count would exceed `max_bytes` or overflow.
absl::StatusOr<uint64_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape,
                                     uint64_t max_bytes = uint64_t{1} << 50);

}  // namespace zcc::format

#endif  // ZCC_FORMAT_DTYPE_H_
