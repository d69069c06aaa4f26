// A tensor as a trainer rank registered it, after zccd validated it.
#ifndef ZCC_DAEMON_RANK_REGISTERED_TENSOR_H_
#define ZCC_DAEMON_RANK_REGISTERED_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "format/box.h"
#include "format/dtype.h"
#include "format/tensor_kind.h"

namespace zcc::daemon {

// Only `staged` tensors are copied into the slots and written by this rank;
// the rest are replicas another member of their group writes, and come back
// from its shards on restore.
struct RegisteredTensor {
  std::string name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> shape;       // this rank's piece
  format::TensorKind kind = format::TensorKind::kParam;
  uint64_t nbytes = 0;
  bool ema_eligible = false;
  // An EXTRA tensor a step may lack: restored as zeros then, and named in
  // the restore's reply (TensorSpec.optional).
  bool optional = false;
  bool staged = true;
  uint64_t slot_offset = 0;  // valid when staged
  // The piece is [box_offset, box_offset + shape) of the global tensor of
  // this shape; a whole tensor has global_shape == shape and zero offsets
  // (or both empty).
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;

  const std::vector<int64_t>& global() const { return global_shape.empty() ? shape : global_shape; }
  format::Box box() const {
    return {box_offset.empty() ? std::vector<int64_t>(shape.size(), 0) : box_offset, shape};
  }
};

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_RANK_REGISTERED_TENSOR_H_
