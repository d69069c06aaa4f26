// Checking a committed step before trusting it, at two depths that share
// every check of the step's metadata:
//
// * CheckStepMetadata reads everything but tensor data: what a restore
//   checks before it reads. The restore then verifies each piece's checksum
//   as it reads it (ReadPieces, ReadBoxes), so a restore reads the step's
//   data once, and a damaged piece fails the read with DataLoss.
// * VerifyStep also reads every tensor of every rank and checks its
//   checksum: what `zccctl verify` and the tests use to vouch for a whole
//   step.
//
// Thread-safety: stateless functions; safe to call concurrently.
#ifndef ZCC_CHECKPOINT_STEP_CHECK_H_
#define ZCC_CHECKPOINT_STEP_CHECK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"

namespace zcc::checkpoint {

struct VerifyReport {
  uint32_t ranks = 0;
  uint64_t tensors = 0;         // pieces, as the ranks wrote them
  uint64_t global_tensors = 0;  // the tensors they tile
  uint64_t bytes_checked = 0;   // tensor bytes read and hashed (0 for metadata only)
};

// The metadata of a committed step, without reading tensor data: COMMITTED
// is valid and matches the manifests (by their combined hash) and the shard
// files' total size, every manifest is valid and belongs to the commit,
// every shard file exists, has the size its manifest says and a safetensors
// header that agrees with the manifest (one small read per file), the
// replica groups agree, the pieces of every global tensor tile it, and the
// step's index (zcc.index.json) is the one COMMITTED records. On success
// `*grouped` (when not null) receives the step's index, grouped, for a
// restore to read from. The first problem is returned as DataLoss (or the
// I/O error: NotFound for a missing file) with the file named.
absl::Status CheckStepMetadata(const std::string& step_dir, const IoOptions& options,
                               std::shared_ptr<const GroupedIndex>* grouped);

// Full verification of a committed step: CheckStepMetadata, and every
// tensor's bytes match their checksum (an incomplete EMA tensor is left out,
// as the committer does). The first problem is returned as DataLoss (or the
// I/O error) with the file and tensor named.
absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir);
absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options);
// The same; on success `*grouped` (when not null) receives the step's index,
// grouped, as verified, for a restore to read from without decoding it again.
absl::StatusOr<VerifyReport> VerifyStep(const std::string& step_dir, const IoOptions& options,
                                        std::shared_ptr<const GroupedIndex>* grouped);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_STEP_CHECK_H_
