// Reads tensors back from one open shard file and checks each against its
// manifest checksum, with several requests in flight.
//
// Tensors that are contiguous in the file form runs. A run whose destinations
// are contiguous in memory and aligned like the file (as when restoring into a
// page-aligned staging slot) is read straight into the destination: its whole
// blocks without a copy, its partial first and last blocks through bounce
// buffers. Other runs (and checks without a destination) stream through
// queue_depth bounce buffers of chunk_bytes. Either way each tensor is hashed
// as its bytes arrive, and on a buffered file (no O_DIRECT) the same requests
// simply need no alignment.
//
// Thread-safety: stateless; concurrent calls on different files are safe.
#ifndef ZCC_CHECKPOINT_SHARD_FILE_READER_H_
#define ZCC_CHECKPOINT_SHARD_FILE_READER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/io_options.h"
#include "format/manifest.h"
#include "storage/aligned_buffer.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

struct TensorReadRequest {
  const format::ManifestTensor* tensor = nullptr;  // where it is and its checksum
  uint8_t* dst = nullptr;                          // tensor->nbytes bytes; null: check only
};

// Reads `requests` from `file` (of `file_size` bytes, with no requests in
// flight). DataLoss naming the tensor and file on a checksum mismatch, a
// tensor outside the file or a file that ends early; the I/O error otherwise.
// `bounce` holds bounce buffers, reused across calls.
absl::Status ReadShardTensors(storage::File& file, uint64_t file_size,
                              std::vector<TensorReadRequest> requests, const IoOptions& options,
                              std::vector<storage::AlignedBuffer>* bounce);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_SHARD_FILE_READER_H_
