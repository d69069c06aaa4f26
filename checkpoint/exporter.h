// Exports a committed checkpoint step as a standard Hugging Face checkpoint:
// whole global tensors (their pieces reassembled, whatever layout wrote them)
// in safetensors files named as transformers names them, so that
// `from_pretrained(out_dir)` and `safetensors.safe_open` load them without zcc.
//
//   one shard:   model.safetensors (no index, as transformers writes it)
//   n > 1:       model-00001-of-0000n.safetensors ... model-0000n-of-0000n.safetensors
//                model.safetensors.index.json  {"metadata": {"total_size": N},
//                                               "weight_map": {name: file}}
//
// The file names are the same whichever tensors are exported (model, EMA or
// optimizer state). Tensors go to shards in name order; a shard is closed when the next tensor
// would take it past max_shard_bytes (tensor data only, as transformers
// counts), so a tensor larger than the limit has a shard of its own. Every
// file's header carries {"format": "pt"}.
//
// Streaming in bounded memory: every shard's header is computed from the
// step's index before any data is read; each shard is then written front to
// back, a few tensors at a time: the tensors read in one go total at most
// read_batch_bytes (one larger tensor is read alone), each through
// ReadBoxes, which verifies every piece's checksum; a dtype conversion goes
// through a fixed 4 MiB buffer, not a converted copy. Peak memory is about
// max(largest tensor, read_batch_bytes) + max(staging_bytes, largest piece of
// a column- or block-split tensor) + the reader's bounce buffers (2 x
// io.queue_depth x io.chunk_bytes) + 4 MiB: with the defaults,
// max(largest tensor, 64 MiB) + 68 MiB while no staged piece exceeds 32 MiB
// (measured: 127 MB of resident memory, 13 MB of it the process itself,
// exporting a 284 MB model whose largest tensor is 66 MB).
//
// Atomicity: everything is written under temporary names in out_dir
// (".<name>.<pid>.zcc-partial"), fsync'ed, and renamed to the final names only
// after every file is complete, the index (or the single model.safetensors)
// last, then out_dir is fsync'ed. Any failure (a bad index, pieces that do not
// tile their tensor, a checksum mismatch, a missing file, a full disk) removes
// the temporary files and leaves no file under a final name; a crash leaves at
// most temporary names.
//
// Thread-safety: stateless; concurrent exports into different directories
// are safe.
#ifndef ZCC_CHECKPOINT_EXPORTER_H_
#define ZCC_CHECKPOINT_EXPORTER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/io_options.h"
#include "format/dtype.h"

namespace zcc::checkpoint {

// Which tensors of the step are exported.
enum class ExportWhat {
  kModel,  // kind "param"
  kEma,    // kind "ema", under the parameter names: from_pretrained loads the
           // EMA; parameters that have no EMA (integer buffers, parameters not
           // EMA-eligible) come from kind "param", so the model is complete
  kOptim,  // kind "optim"
};

// "model", "ema", "optim"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<ExportWhat> ParseExportWhat(absl::string_view text);

// "bf16", "f16", "f32" (case-insensitive; also "bfloat16", "float16",
// "float32"), or "keep" (nullopt); InvalidArgument otherwise.
absl::StatusOr<std::optional<format::DType>> ParseExportDType(absl::string_view text);

// A byte count: digits and an optional unit, case-insensitive: B, KB, MB, GB,
// TB (powers of 1000, as transformers reads "5GB") or KiB, MiB, GiB, TiB
// (powers of 1024). "5GB" = 5,000,000,000; "1GiB" = 1,073,741,824; "4096" = 4096.
// InvalidArgument for anything else (no digits, a fraction, a sign, an
// unknown unit, zero, or more than 2^63 bytes), with the accepted forms named.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// The first tensor index of each shard when tensors of `bytes` (in order) are
// packed into shards of at most `max_shard_bytes` each (see the file
// comment). Empty for no tensors.
std::vector<size_t> ShardStarts(const std::vector<uint64_t>& bytes, uint64_t max_shard_bytes);

// The file name of shard k (from 1) of n: "model-0000k-of-0000n.safetensors",
// or "model.safetensors" when n == 1.
std::string ExportShardFileName(size_t k, size_t n);

// One shard file written.
struct ExportedShard {
  std::string file;       // its final name in out_dir
  size_t index = 0;       // from 1
  size_t count = 0;       // shards in the export
  uint64_t tensors = 0;
  uint64_t bytes = 0;     // file size, header included
  double seconds = 0;     // reading, converting and writing it
};

struct ExportOptions {
  ExportWhat what = ExportWhat::kModel;
  // F32, BF16 or F16: floating tensors (F32, BF16, F16) are converted to it;
  // other dtypes (F64, integers, BOOL) are written as they are. nullopt: keep.
  std::optional<format::DType> dtype;
  // transformers' default ("5GB"); > 0.
  uint64_t max_shard_bytes = 5'000'000'000;
  // Files copied into out_dir under their base names (config.json, tokenizer
  // files). A name that collides with a weight file or another extra file is
  // refused.
  std::vector<std::string> extra_files;
  // Also copy the files the trainer stored with the job (Client::PutJobFile:
  // <job dir>/metadata/, beside the step directory). A file in extra_files
  // of the same name is refused (FailedPrecondition naming both), unless
  // `force`: then the given file replaces the stored one. With `dtype` set,
  // a config.json's "torch_dtype" (and "dtype", where present) is set to the
  // exported dtype, so that from_pretrained loads the weights as written.
  // The job's export layout (export_layout.h: 2-D tensors written
  // transposed) is read among them, not copied; without job_files every
  // tensor is written as the trainer held it.
  bool job_files = true;
  // Write into an out_dir that is not empty: files with the export's names
  // are replaced, weight files of an earlier export that this one does not
  // write (model*.safetensors, the index) and leftover temporary files of an
  // interrupted export are removed (as transformers' save_pretrained does);
  // other files are left alone. Without it a non-empty out_dir is refused.
  // (It also lets an extra file replace a stored job file of its name.)
  bool force = false;
  // Bytes read in one go (several small tensors at once, so that each shard
  // file's header is opened and checked once per batch, not once per tensor);
  // a larger tensor is read alone. 0: one tensor at a time.
  uint64_t read_batch_bytes = uint64_t{64} << 20;
  // A tensor cut into pieces that are not contiguous runs of it (column or
  // block splits) is assembled from pieces read into a staging buffer of at
  // most this many bytes at a time (a larger piece is read alone); ReadBoxes.
  uint64_t staging_bytes = uint64_t{32} << 20;
  // How the step is read, with the job's stored files (storage, direct I/O,
  // queue depth), and out_dir written.
  IoOptions io = {nullptr, true, 4, size_t{4} << 20};
  // Where out_dir is written, when not where the step is read (an export
  // from an object store into a local folder). --extra-file paths are local.
  storage::Storage* out_storage = nullptr;
  // Called after each shard file is complete (progress reporting), on the
  // calling thread.
  std::function<void(const ExportedShard&)> on_shard;
};

struct ExportReport {
  std::string kind;                    // the manifest kind exported
  std::vector<ExportedShard> shards;
  bool indexed = false;                // model.safetensors.index.json written
  uint64_t tensors = 0;
  uint64_t params_without_ema = 0;     // --what ema: tensors taken from the parameters
  uint64_t transposed = 0;             // written transposed, as the job's export layout asks
  uint64_t tensor_bytes = 0;           // the index's total_size
  uint64_t file_bytes = 0;             // shard files, headers included
  std::vector<std::string> extra_files;  // copied, names in out_dir
  uint64_t peak_buffer_bytes = 0;      // largest read buffer the export held
  uint64_t bytes_read = 0;             // piece bytes read (and verified)
  double seconds = 0;
};

// Exports the committed step in `step_dir` into `out_dir` (created if
// missing). Errors: InvalidArgument for bad options or extra files;
// FailedPrecondition for a non-empty out_dir without `force`, a step without
// tensors of the kind asked for, or pieces that do not tile their tensor;
// DataLoss for a damaged step (a bad index, a checksum mismatch, a shard
// file that disagrees with the index; the file and tensor named); the I/O
// error otherwise (NotFound for a missing file, ResourceExhausted for a full
// disk).
absl::StatusOr<ExportReport> ExportStep(const std::string& step_dir, const std::string& out_dir,
                                        const ExportOptions& options);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_EXPORTER_H_
