// Conversions of the client API's types to the control protocol's: written
// once, used for every registration.
#ifndef ZCC_CLIENT_PROTO_CONVERT_H_
#define ZCC_CLIENT_PROTO_CONVERT_H_

#include "client/client.h"
#include "proto/zcc.pb.h"

namespace zcc::client_internal {

v1::DType ToProto(DType dtype);
v1::ReplicaGroup::Kind ToProto(ReplicaGroup::Kind kind);
v1::TensorKind ToProto(TensorKind kind);

}  // namespace zcc::client_internal

#endif  // ZCC_CLIENT_PROTO_CONVERT_H_
