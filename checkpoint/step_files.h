// The files of a committed step, each read and checked against what
// describes it: a rank's manifest against its rank, the step index against
// the hash COMMITTED records for it, a shard file's size and safetensors
// header against the manifest entries that point into it. Shared by the
// checks of a step (step_check.h) and its readers (reader.h), so that both
// trust a file for the same reasons; internal to checkpoint/.
//
// Thread-safety: stateless functions; safe to call concurrently.
#ifndef ZCC_CHECKPOINT_STEP_FILES_H_
#define ZCC_CHECKPOINT_STEP_FILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/io_options.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

// Decodes `text`, the manifest of `rank` read from `path`; DataLoss naming
// the file when it is invalid or names another rank.
absl::StatusOr<format::RankManifest> DecodeManifestFile(const std::string& path, uint32_t rank,
                                                        absl::string_view text);
// Reads and decodes rank `rank`'s manifest in `step_dir`.
absl::StatusOr<format::RankManifest> ReadRankManifest(const std::string& step_dir, uint32_t rank,
                                                      storage::Storage* fs = nullptr);

// The step's index file, checked against the hash COMMITTED records for it;
// nullopt for a step committed before zcc wrote one (neither file nor hash).
absl::StatusOr<std::optional<std::string>> ReadCommittedIndexText(
    const std::string& step_dir, const format::CommitRecord& record, storage::Storage* fs = nullptr);

// The manifest entries of each file, by file name; every file of `files`
// has an entry, possibly empty.
std::map<std::string, std::vector<const format::ManifestTensor*>> TensorsByFile(
    const std::vector<format::ManifestFile>& files,
    const std::vector<format::ManifestTensor>& tensors);

// An open shard file whose size and safetensors header have been checked.
struct OpenShard {
  std::unique_ptr<storage::File> file;
  uint64_t size = 0;
};

// Opens shard file `file` of `step_dir` for reading (as `options` say) and
// checks it against the manifest: its size is file.bytes, and its header
// lists exactly the tensors of `in_file` with their dtype, shape and offset.
// Reads the header only (one 64 KiB read for any file zcc writes), no
// tensor data. DataLoss naming the file and the fault; the open's error
// (NotFound for a missing file) otherwise.
absl::StatusOr<OpenShard> OpenAndCheckShard(
    const std::string& step_dir, const format::ManifestFile& file,
    const std::vector<const format::ManifestTensor*>& in_file, const IoOptions& options);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_STEP_FILES_H_
