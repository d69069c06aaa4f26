// A tensor as a trainer rank registered it, after zccd validated it.
#ifndef ZCC_DAEMON_REGISTERED_TENSOR_H_
#define ZCC_DAEMON_REGISTERED_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "format/tensor_kind.h"

namespace zcc::daemon {

// Only `staged` tensors are copied into the slots and written by this rank;
// the rest are replicas another member of their group writes, and come back
// from its shards on restore.
struct RegisteredTensor {
  std::string name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> shape;
  format::TensorKind kind = format::TensorKind::kParam;
  uint64_t nbytes = 0;
  bool ema_eligible = false;
  bool staged = true;
  uint64_t slot_offset = 0;  // valid when staged
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_REGISTERED_TENSOR_H_
