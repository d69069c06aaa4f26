// Per-rank manifest (rNNNNN.manifest.json), commit record (COMMITTED) and the
// Hugging Face style index files of a checkpoint step directory. All JSON.
#ifndef ZCC_FORMAT_MANIFEST_H_
#define ZCC_FORMAT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"
#include "format/tensor_kind.h"

namespace zcc::format {

// The format version of manifests with whole tensors only (and of commit
// records and indexes); a manifest that holds a piece of a sliced tensor is
// kSlicedFormatVersion, so that a zcc from before layout-free checkpoints
// refuses it instead of restoring one piece as if it were the tensor.
// Readers accept both.
inline constexpr int kFormatVersion = 1;
inline constexpr int kSlicedFormatVersion = 2;
// Dimensions of a tensor (registration refuses more).
inline constexpr size_t kMaxManifestDims = 16;
// Upper bound on one tensor's entry in a manifest EncodeRankManifest writes:
// a 512-byte name (names hold no byte that JSON escapes), 16 dimensions of up
// to 19 digits on lines of their own for each of shape, global_shape and
// box_offset, a 255-byte file name, two 20-digit numbers, the hash, keys and
// indentation come to about 2,200 bytes.
inline constexpr uint64_t kMaxManifestEntryBytes = 2304;
// Entries one manifest can hold with zccd's default max_tensors_per_rank
// (1,048,576): every registered tensor, plus an EMA entry for each parameter.
inline constexpr uint64_t kMaxManifestEntries = uint64_t{2} << 20;
// Manifests, commit records and weight-map index files larger than this are
// refused when read back: 4.5 GiB + 1 MiB, room for kMaxManifestEntries of the
// largest entries. (A manifest of 1M tensors with short names is ~250 MB.) A
// step's index holds every rank's entries: kMaxStepIndexBytes.
inline constexpr uint64_t kMaxManifestBytes =
    kMaxManifestEntries * kMaxManifestEntryBytes + (uint64_t{1} << 20);
// A step index of `world_size` ranks is no larger than their manifests.
inline uint64_t MaxStepIndexBytes(uint32_t world_size) {
  return static_cast<uint64_t>(world_size == 0 ? 1 : world_size) * kMaxManifestBytes;
}

// One tensor as written by one rank.
struct ManifestTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // of this piece
  std::string kind;      // TensorKindName(kind), or kEmaKindName
  std::string file;      // shard file name inside the step directory (no '/')
  uint64_t offset = 0;   // absolute byte offset of the tensor in `file`
  uint64_t nbytes = 0;   // == TensorBytes(dtype, shape)
  uint64_t xxh3 = 0;     // XXH3-64 of the tensor's bytes
  // This is the piece [box_offset, box_offset + shape) of the global tensor
  // `name` of `global_shape` (layout-free checkpoints). Empty, or equal to
  // `shape` with zero offsets: the whole tensor (the JSON then omits both;
  // the decoder always fills them in).
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
};

struct ManifestFile {
  std::string name;      // e.g. "model-r00003.safetensors"
  uint64_t bytes = 0;    // whole file size
};

// What one rank says of a replica group it belongs to: members of one group
// register identical replicated tensors, so their digests must agree (the
// committer checks: checkpoint/global_index.h, CheckReplicaGroups).
struct ReplicaDigest {
  std::string kind;        // "dp" or "expert_dp"
  int64_t expert_id = -1;  // global expert id for "expert_dp"
  uint32_t size = 1;       // members in the group
  uint32_t member = 0;     // this rank's index in it, < size
  uint64_t hash = 0;       // XXH3 over the group's tensors (name, dtype, kind, box)
};

inline constexpr size_t kMaxRunIdBytes = 128;

struct RankManifest {
  int format_version = kFormatVersion;
  std::string job_id;
  int64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t manifest_hash = 0;  // hash of the registration this rank wrote from
  // The run of the job that wrote it ("run_id"; absent when the trainer gave
  // none): a step commits only when every rank's manifest names the same run,
  // so a manifest an earlier run left never completes a step written again.
  std::string run_id;
  // The line of steps of that run it belongs to ("timeline"; absent: the
  // run's first, or none given): a run that goes on from an older step it
  // restored together (every rank at once) starts a new one, so a step it
  // writes again never commits from a manifest of the steps it left, though
  // the run is the same. A step commits only from manifests of one run and
  // one timeline. At most kMaxRunIdBytes, printable.
  std::string timeline;
  // The step the rank's EMA tensors ("ema_step") were last updated at: the
  // EMA is updated every ema_interval-th step, so a step between holds the
  // EMA of an earlier one; -1 (absent) where the manifest has no EMA, or
  // was written before zcc recorded it (the EMA is then taken as the
  // step's). Never above `step`.
  int64_t ema_step = -1;
  std::vector<ManifestFile> files;
  std::vector<ManifestTensor> tensors;
  std::vector<ReplicaDigest> replica_groups;  // "replica_groups"; absent when none
};

// Encodes as pretty-printed JSON ("xxh3" and "manifest_hash" as 16-digit hex
// strings so that JSON readers without 64-bit integers keep them exact).
std::string EncodeRankManifest(const RankManifest& manifest);

// Parses and validates: version, job id (ValidateJobId), step >= 0,
// rank < world_size, file names are plain names of known files, each tensor
// refers to a listed file, lies inside it, has nbytes == dtype x shape, names
// pass ValidateTensorName and are unique per kind. Errors are DataLoss or
// InvalidArgument with a message naming the offending field.
absl::StatusOr<RankManifest> DecodeRankManifest(absl::string_view json);

// A committed step's global index (kStepIndexFileName), written by the
// committer: every rank's shard files and every piece of every global tensor
// in one document, so that restore and export need not open every manifest.
// Encoded as a manifest without "rank" and "manifest_hash"; a name appears
// once per piece (kind, name and file are unique).
struct StepIndex {
  int format_version = kFormatVersion;
  std::string job_id;
  int64_t step = 0;
  uint32_t world_size = 1;
  int64_t ema_step = -1;                // as RankManifest's: every rank's agreed
  std::string timeline;                 // every rank's (a step commits from one only)
  std::vector<ManifestFile> files;      // file names are unique across ranks
  std::vector<ManifestTensor> pieces;
};

std::string EncodeStepIndex(const StepIndex& index);
// Validates as DecodeRankManifest does (each piece lies inside a listed file,
// its box inside its global shape); whether the pieces tile their global
// tensors is checked by checkpoint::GroupPieces. Up to `max_bytes` of text.
absl::StatusOr<StepIndex> DecodeStepIndex(absl::string_view json,
                                          uint64_t max_bytes = kMaxManifestBytes);

// Contents of COMMITTED.
struct CommitRecord {
  int format_version = kFormatVersion;
  std::string job_id;
  int64_t step = 0;
  uint32_t world_size = 1;
  uint64_t manifest_hash = 0;  // hash over every rank's manifest file bytes
  uint64_t total_bytes = 0;    // sum of all shard files
  std::string committed_at;    // RFC 3339 UTC
  // XXH3-64 of the step's index file (kStepIndexFileName) as committed; 0:
  // the step has no index (committed before zcc wrote one).
  uint64_t index_xxh3 = 0;
  // The run and timeline every rank's manifest of the step names (empty:
  // none, or a record written before they were recorded): which steps of a
  // job directory one line of training wrote, without reading manifests.
  std::string run_id;
  std::string timeline;
};

std::string EncodeCommitRecord(const CommitRecord& record);
absl::StatusOr<CommitRecord> DecodeCommitRecord(absl::string_view json);

// {"metadata": {"total_size": N}, "weight_map": {name: file, ...}}, the layout
// transformers uses for model.safetensors.index.json.
std::string EncodeWeightMapIndex(const std::map<std::string, std::string>& weight_map,
                                 uint64_t total_size);
absl::StatusOr<std::map<std::string, std::string>> DecodeWeightMapIndex(absl::string_view json);

namespace internal {
// For tests: encodes `t` with the manifest's fast entry writer and with
// nlohmann; true when the fast writer applies and both wrote the same bytes.
bool ManifestEntryEncodersAgree(const ManifestTensor& t, std::string* fast, std::string* slow);
}  // namespace internal

// Names inside a step directory.
std::string StepDirName(int64_t step);              // "step-00001000" (8 digits, more if needed)
std::string PartialStepDirName(int64_t step);       // "step-00001000.partial"
// A node-local job's copy of the newest step its node sent to the object
// store: "step-00001000.sent" (daemon/restore/kept_copies.h).
std::string SentStepDirName(int64_t step);
// Parses "step-NNNNNNNN" (exactly; not the .partial form); InvalidArgument otherwise.
absl::StatusOr<int64_t> ParseStepDirName(absl::string_view name);
// prefix is "model", "optim" or "ema": "model-r00003.safetensors".
std::string ShardFileName(absl::string_view prefix, uint32_t rank);
std::string ExtraFileName(uint32_t rank);           // "extra-r00003.bin" (safetensors of U8 blobs)
std::string ManifestFileName(uint32_t rank);        // "r00003.manifest.json"
// InvalidArgument unless `name` is one plain path component (a file of a
// step directory): not empty, ".", "..", nor over 255 bytes; no '/' nor
// control character.
absl::Status ValidatePlainFileName(absl::string_view name);
inline constexpr char kCommittedFileName[] = "COMMITTED";
inline constexpr char kLatestFileName[] = "latest";
inline constexpr char kModelIndexFileName[] = "model.safetensors.index.json";
inline constexpr char kEmaIndexFileName[] = "ema.safetensors.index.json";
// The step's global index (StepIndex): every piece of every global tensor.
inline constexpr char kStepIndexFileName[] = "zcc.index.json";

}  // namespace zcc::format

#endif  // ZCC_FORMAT_MANIFEST_H_
