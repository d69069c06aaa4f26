// Conversions between the project's own types and the control protocol's, in
// both directions, written once: the client converts to the protocol, zccd
// converts back and refuses values it does not know (a newer or hostile peer).
#ifndef ZCC_PROTO_CONVERT_H_
#define ZCC_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "format/dtype.h"
#include "format/tensor_kind.h"
#include "proto/zcc.pb.h"

namespace zcc::proto {

v1::DType ToProto(format::DType dtype);
v1::TensorKind ToProto(format::TensorKind kind);

// InvalidArgument for an unspecified or unknown value.
absl::StatusOr<format::DType> FromProto(v1::DType dtype);
absl::StatusOr<format::TensorKind> FromProto(v1::TensorKind kind);

}  // namespace zcc::proto

#endif  // ZCC_PROTO_CONVERT_H_
