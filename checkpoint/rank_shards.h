// What one rank contributes to a checkpoint step: its tensors, where they lie in
// a staging slot, and the shard files they are written to.
#ifndef ZCC_CHECKPOINT_RANK_SHARDS_H_
#define ZCC_CHECKPOINT_RANK_SHARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "format/manifest.h"
#include "format/tensor_kind.h"
#include "shm/slot_layout.h"

namespace zcc::checkpoint {

struct RankTensor {
  std::string name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> shape;
  format::TensorKind kind = format::TensorKind::kParam;
  uint64_t slot_offset = 0;  // from the slot start
  uint64_t nbytes = 0;
  // The piece of the global tensor this is (format::ManifestTensor); empty
  // for a whole tensor.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
};

// Immutable after registration; shared by the writer and the reader.
struct RankShards {
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t manifest_hash = 0;
  std::string run_id;  // the job's run (RankManifest::run_id); empty: none given
  std::vector<RankTensor> tensors;  // registration order
  shm::SlotLayout layout;
  // The replica groups the rank is in, with the digest of each group's
  // tensors; written to the manifest for the committer to compare.
  std::vector<format::ReplicaDigest> replica_groups;
};

// The shard file `rank`'s tensors of `kind` are written to.
std::string ShardFileForKind(format::TensorKind kind, uint32_t rank);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_RANK_SHARDS_H_
