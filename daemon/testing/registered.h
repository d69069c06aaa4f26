// Test and benchmark helper: the tensors a trainer registered, as zccd holds
// them (daemon/rank/registered_tensor.h), for a rank that wrote `shards` (whole
// tensors, every one staged by this rank at its slot offset).
#ifndef ZCC_DAEMON_TESTING_REGISTERED_H_
#define ZCC_DAEMON_TESTING_REGISTERED_H_

#include <utility>
#include <vector>

#include "checkpoint/rank_shards.h"
#include "daemon/rank/registered_tensor.h"

namespace zcc::daemon::testing {

inline std::vector<RegisteredTensor> RegisteredFor(const checkpoint::RankShards& shards) {
  std::vector<RegisteredTensor> out;
  for (const checkpoint::RankTensor& t : shards.tensors) {
    RegisteredTensor r;
    r.name = t.name;
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.kind = t.kind;
    r.nbytes = t.nbytes;
    r.slot_offset = t.slot_offset;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace zcc::daemon::testing

#endif  // ZCC_DAEMON_TESTING_REGISTERED_H_
