// Writes one rank's part of a checkpoint step from a staging slot into
// <job_dir>/step-N.partial/: a safetensors file per non-empty file group, each
// tensor checksummed as it is written, each file fdatasync'ed, the directory
// fsync'ed, and the rank's manifest written last (atomically), so that a
// manifest's presence means the rank's files are complete and durable.
//
// Thread-safety: stateless; concurrent calls for different ranks are safe.
#ifndef ZCC_CHECKPOINT_SHARD_WRITER_H_
#define ZCC_CHECKPOINT_SHARD_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/rank_shards.h"

namespace zcc::checkpoint {

struct WriteStats {
  uint64_t bytes = 0;    // all files of this rank, headers included
  double seconds = 0;
};

// `slot` points at `shards.layout.slot_bytes` readable bytes.
absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_SHARD_WRITER_H_
