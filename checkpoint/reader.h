// Reading committed checkpoints back: listing, choosing the step to restore
// and restore reads (checking a whole step: step_check.h). Everything read
// from disk is treated as untrusted: manifests and safetensors headers are
// validated, sizes checked before use, and every tensor's bytes checked
// against its manifest checksum as they are read. Shard files are read with direct I/O
// and several requests in flight where the file system allows it
// (shard_file_reader.h), buffered otherwise.
//
// Thread-safety: stateless functions; safe to call concurrently.
#ifndef ZCC_CHECKPOINT_READER_H_
#define ZCC_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

// The small reads below go through `fs` (null: storage::DefaultStorage());
// those that take IoOptions, through its storage.

// Steps with a step-N/ directory that holds a COMMITTED file, ascending.
absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(const std::string& job_dir,
                                                        storage::Storage* fs = nullptr);

// The step named by <job_dir>/latest. NotFound when there is no such file,
// DataLoss when it does not name a step directory.
absl::StatusOr<int64_t> ReadLatest(const std::string& job_dir, storage::Storage* fs = nullptr);
// The newest step a restore of the newest may consider: the one `latest`
// names; nullopt (every step) when there is no `latest` or it is garbage
// (DataLoss, recorded in `*garbage` when given). Any other error reading it
// (I/O, permission, a store's outage) is returned: without `latest` a choice
// could take a step of a timeline that was left behind.
absl::StatusOr<std::optional<int64_t>> TimelineEnd(const std::string& job_dir,
                                                   storage::Storage* fs = nullptr,
                                                   std::string* garbage = nullptr);

// The committed steps a restore of the newest considers, ascending: none
// above the one `latest` names (a run that went back to an older step left
// those behind; ChooseRestoreStep). Without `latest` (or with a garbage one),
// every committed step; an error reading `latest` is returned (TimelineEnd).
absl::StatusOr<std::vector<int64_t>> CommittedOnTimeline(const std::string& job_dir,
                                                         storage::Storage* fs = nullptr);
// The newest of them, -1 when there is none.
absl::StatusOr<int64_t> NewestOnTimeline(const std::string& job_dir,
                                         storage::Storage* fs = nullptr);

// The committed steps of a job directory, ascending, with their COMMITTED
// records (nullopt when one cannot be read: listed anyway) and which one
// `latest` names. What zccd's ListCheckpoints and zccctl's offline list show.
struct CommittedStep {
  int64_t step = -1;
  std::string dir;
  bool is_latest = false;
  std::optional<format::CommitRecord> record;
};
absl::StatusOr<std::vector<CommittedStep>> ListCheckpoints(const std::string& job_dir,
                                                           storage::Storage* fs = nullptr);

// What a path given for a step names (zccctl export and verify): a step
// directory holding COMMITTED; a job directory (its newest committed step:
// the one `latest` names when that one is committed, else the newest with
// COMMITTED); or a job's `latest` file (the step it names). NotFound when
// there is nothing there or no committed step; FailedPrecondition for a step
// directory without COMMITTED.
struct ResolvedStep {
  std::string dir;
  int64_t step = -1;
  std::string how;  // "" for a step directory given as such; else how it was chosen
};
absl::StatusOr<ResolvedStep> ResolveStepDir(const std::string& path,
                                            storage::Storage* fs = nullptr);

// Reads and validates COMMITTED of a step directory.
absl::StatusOr<format::CommitRecord> ReadCommitRecord(const std::string& step_dir,
                                                      storage::Storage* fs = nullptr);

// One tensor a restoring rank wants back.
struct ReadTarget {
  std::string name;
  std::string kind;  // "param", "optim", "extra", "ema"
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> shape;
  uint8_t* dst = nullptr;
  uint64_t nbytes = 0;
};

// Reads `targets` from rank `rank`'s shards of a committed step and verifies
// each checksum. A target missing from the checkpoint, or with another dtype
// or shape, is a FailedPrecondition naming the tensor. Targets laid out in
// memory as in the file (a page-aligned staging slot) are read into place
// without a copy; a null `dst` only checks the tensor.
absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets);
absl::Status ReadRankTensors(const std::string& step_dir, uint32_t rank,
                             const std::vector<ReadTarget>& targets, const IoOptions& options);
// The same with the rank's manifest already read and decoded (by a caller
// that needed it anyway), so that it is not decoded again.
absl::Status ReadRankTensors(const std::string& step_dir, const format::RankManifest& manifest,
                             const std::vector<ReadTarget>& targets, const IoOptions& options);

// The step's global index as written at commit; for a step committed before
// zcc wrote one, built from the rank manifests (the COMMITTED record says how
// many). Validated as format::DecodeStepIndex does; run GroupPieces on it
// before trusting the pieces to tile.
absl::StatusOr<format::StepIndex> LoadStepIndex(const std::string& step_dir,
                                                storage::Storage* fs = nullptr);
// LoadStepIndex, then GroupIndex.
absl::StatusOr<std::shared_ptr<const GroupedIndex>> LoadGroupedIndex(
    const std::string& step_dir, storage::Storage* fs = nullptr);

// One piece of a step index to read: its bytes (piece->nbytes), verified
// against its checksum, land at `dst` (null: check only).
struct PieceRead {
  const format::ManifestTensor* piece = nullptr;  // into the index
  uint8_t* dst = nullptr;
};

// Reads pieces of a committed step by its index (checkpoint/global_index.h),
// file by file; each file's safetensors header is checked against the index
// before anything is read from it.
absl::Status ReadPieces(const std::string& step_dir, const format::StepIndex& index,
                        const std::vector<PieceRead>& reads, const IoOptions& options);

// Every piece of `index` by its file, for ReadPieces calls over one index
// (built once instead of once per call).
using PiecesByFile = std::map<std::string, std::vector<const format::ManifestTensor*>>;
PiecesByFile IndexPiecesByFile(const format::StepIndex& index);
absl::Status ReadPieces(const std::string& step_dir, const format::StepIndex& index,
                        const PiecesByFile& by_file, const std::vector<PieceRead>& reads,
                        const IoOptions& options);

struct RestoreChoice {
  int64_t step = -1;
  std::vector<std::string> rejected;  // newer candidates, each "step-N: reason"
};

// Picks the step to restore. `requested` >= 0: that step, if `verify`
// accepts it. `requested` < 0: the step named by `latest` if `verify` accepts
// it, else the newest committed step below it that it accepts (all committed
// steps when `latest` is missing or garbage; any other error reading it is
// returned, TimelineEnd). `verify` is called for each
// candidate (CheckStepMetadata or VerifyStep of step_check.h, or a cached
// equivalent). `requested` < 0 considers no step above `at_most` (a
// fallback from a step found damaged looks only at older ones). NotFound
// when nothing qualifies.
// Lists and reads `latest` through `fs` (null: the default POSIX storage).
template <typename VerifyFn>
absl::StatusOr<RestoreChoice> ChooseRestoreStep(const std::string& job_dir, int64_t requested,
                                                VerifyFn verify,
                                                int64_t at_most = INT64_MAX,
                                                storage::Storage* fs = nullptr);

}  // namespace zcc::checkpoint

#include "checkpoint/reader_inl.h"

#endif  // ZCC_CHECKPOINT_READER_H_
