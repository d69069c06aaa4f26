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
// On an object store (no rename; checkpoint/step_dirs.h) the same files go
// into step-N/ itself, and a COMMITTED left there by an earlier commit of
// the step is removed first: from then on the step is uncommitted until
// this attempt's commit writes COMMITTED again.
//
// Thread-safety: stateless; concurrent calls for different ranks are safe.
#ifndef ZCC_CHECKPOINT_SHARD_WRITER_H_
#define ZCC_CHECKPOINT_SHARD_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/io_options.h"
#include "format/dtype.h"
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

// A tensor of a shard written from memory outside the slot.
struct ExtraTensor {
  std::string name;
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // nbytes bytes, unchanged until the call returns
  uint64_t nbytes = 0;
  // The piece of a global tensor this is (format::ManifestTensor); empty for
  // a whole tensor.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
};

// One more shard file of the rank, e.g. its EMA ("ema", "ema-r00003.safetensors").
struct ExtraShard {
  std::string kind;  // the manifest's kind for its tensors
  std::string file;  // a plain file name
  std::vector<ExtraTensor> tensors;
  // The EMA's (kind "ema"): the step it was last updated at, recorded as
  // the manifest's ema_step (-1: not recorded).
  int64_t step = -1;
};

// As above, also writing `extra` shard files (before the manifest, which lists
// their tensors under their kinds). A shard's tensors laid out back to back in
// memory, in order, are written from there; otherwise they are packed into an
// aligned buffer first. `timeline`: the manifest's (format::RankManifest;
// empty: none).
absl::StatusOr<WriteStats> WriteRankShards(const std::string& job_dir, int64_t step,
                                           const RankShards& shards, const uint8_t* slot,
                                           const IoOptions& options,
                                           const std::vector<ExtraShard>& extra,
                                           const std::string& timeline = "");

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_SHARD_WRITER_H_
