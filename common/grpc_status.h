// Conversion between absl::Status and grpc::Status: the one place it happens.
#ifndef ZCC_COMMON_GRPC_STATUS_H_
#define ZCC_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace zcc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace zcc

#endif  // ZCC_COMMON_GRPC_STATUS_H_
