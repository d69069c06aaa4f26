// Writes one rank's part of a checkpoint step from a staging slot into
// <job_dir>/step-N.partial/: a safetensors file per non-empty file group,
// written with direct I/O straight from the slot (shard_file_writer.h), each
// tensor checksummed as it is written, each file fdatasync'ed, the directory
// fsync'ed, and the rank's manifest written last (atomically), so that a
// manifest's presence means the rank's files are complete and durable.
//
// On failure (no space, I/O error) the call returns the error, removes the
// files it created and leaves no manifest for the rank, so the step cannot
// commit; nothing outside step-N.partial/ is touched.
//
// Thread-safety: stateless; concurrent calls for different ranks are safe.
#ifndef ZCC_CHECKPOINT_SHARD_WRITER_H_
#define ZCC_CHECKPOINT_SHARD_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/io_options.h"
#include "checkpoint/rank_shards.h"

namespace zcc::checkpoint {

struct WriteStats {
  uint64_t bytes = 0;    // all files of this rank, headers included
  double seconds = 0;
  bool direct_io = false;  // every shard file was written with O_DIRECT
};

// `slot` points at `shards.layout.slot_bytes` readable bytes (page-aligned for
// writes without a copy; other memory is staged through bounce buffers).
absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot);
absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot,
                                           const IoOptions& options);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_SHARD_WRITER_H_
