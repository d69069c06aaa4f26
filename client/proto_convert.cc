#include "client/proto_convert.h"

namespace zcc::client_internal {

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::F32;
    case DType::kF16: return v1::F16;
    case DType::kBF16: return v1::BF16;
    case DType::kF64: return v1::F64;
    case DType::kI64: return v1::I64;
    case DType::kI32: return v1::I32;
    case DType::kI16: return v1::I16;
    case DType::kI8: return v1::I8;
    case DType::kU8: return v1::U8;
    case DType::kBool: return v1::BOOL;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::ReplicaGroup::Kind ToProto(ReplicaGroup::Kind kind) {
  switch (kind) {
    case ReplicaGroup::Kind::kNone: return v1::ReplicaGroup::NONE;
    case ReplicaGroup::Kind::kDataParallel: return v1::ReplicaGroup::DATA_PARALLEL;
    case ReplicaGroup::Kind::kExpertDataParallel: return v1::ReplicaGroup::EXPERT_DATA_PARALLEL;
  }
  return v1::ReplicaGroup::NONE;
}

v1::TensorKind ToProto(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParam: return v1::PARAM;
    case TensorKind::kOptim: return v1::OPTIM;
    case TensorKind::kExtra: return v1::EXTRA;
  }
  return v1::TENSOR_KIND_UNSPECIFIED;
}

}  // namespace zcc::client_internal
