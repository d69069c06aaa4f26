#include "client/proto_convert.h"

namespace zcc::client_internal {

v1::ReplicaGroup::Kind ToProto(ReplicaGroup::Kind kind) {
  switch (kind) {
    case ReplicaGroup::Kind::kNone: return v1::ReplicaGroup::NONE;
    case ReplicaGroup::Kind::kDataParallel: return v1::ReplicaGroup::DATA_PARALLEL;
    case ReplicaGroup::Kind::kExpertDataParallel: return v1::ReplicaGroup::EXPERT_DATA_PARALLEL;
  }
  return v1::ReplicaGroup::NONE;
}

}  // namespace zcc::client_internal
