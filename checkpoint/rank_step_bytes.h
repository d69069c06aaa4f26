// A rank's part of a step as the bytes of the files a write makes (its
// safetensors shards, its extra shards such as the EMA, its manifest), made
// in memory rather than on disk: what the peer tier sends to other nodes, so
// that a lost node's step can be read back from them exactly as from disk
// (every tensor with its checksum, in any layout).
//
// Thread-safety: stateless; concurrent calls are safe.
#ifndef ZCC_CHECKPOINT_RANK_STEP_BYTES_H_
#define ZCC_CHECKPOINT_RANK_STEP_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/shard_writer.h"

namespace zcc::checkpoint {

struct RankStepFile {
  std::string name;  // a plain file name, as in a step directory
  std::string bytes;
};

struct RankStepBytes {
  uint32_t rank = 0;
  int64_t step = 0;
  // The manifest last: a holder with the manifest holds the whole.
  std::vector<RankStepFile> files;
  // The rank's first step replicated after it went on from a restore of
  // this step (-1: not such a step): its holders drop the rank's newer
  // steps (peer::ReplicaStore::Put).
  int64_t went_on_from = -1;
  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const RankStepFile& f : files) n += f.bytes.size();
    return n;
  }
};

// The files WriteRankShards would write for `step`, from the slot at
// `slot` and the `extra` shards, byte for byte.
absl::StatusOr<RankStepBytes> SerializeRankStep(int64_t step, const RankShards& shards,
                                                const uint8_t* slot,
                                                const std::vector<ExtraShard>& extra,
                                                const std::string& timeline = "");

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_RANK_STEP_BYTES_H_
