// Conversions of the types only the client API has to the control protocol's.
// The types shared with zccd (DType, TensorKind) convert in proto/convert.h.
#ifndef ZCC_CLIENT_PROTO_CONVERT_H_
#define ZCC_CLIENT_PROTO_CONVERT_H_

#include "client/client.h"
#include "proto/convert.h"
#include "proto/zcc.pb.h"

namespace zcc::client_internal {

v1::ReplicaGroup::Kind ToProto(ReplicaGroup::Kind kind);
using proto::ToProto;

}  // namespace zcc::client_internal

#endif  // ZCC_CLIENT_PROTO_CONVERT_H_
