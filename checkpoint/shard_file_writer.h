// Writes one safetensors shard file from memory: the header, then the data
// section straight from the caller's (page-aligned) memory with direct I/O and
// several requests in flight, checksumming each tensor while its bytes are
// being written. Then fdatasync.
//
// With direct I/O the file is first sized (writes that extend a file are
// serialised by ext4), the header goes out from an aligned bounce buffer (it is
// padded to a multiple of storage::kDirectIoAlignment, so the data section
// starts aligned in the file), the data section's whole blocks are written
// from the caller's memory without a copy, and its last partial block from a
// zero-padded bounce block, after which the file is cut to its exact size.
// Memory that is not aligned goes through rotating bounce buffers instead.
// Where the file system refuses O_DIRECT the same requests run buffered.
//
// Thread-safety: stateless; concurrent calls on different files are safe.
#ifndef ZCC_CHECKPOINT_SHARD_FILE_WRITER_H_
#define ZCC_CHECKPOINT_SHARD_FILE_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/io_options.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

struct ShardFileSource {
  std::string path;
  // The encoded safetensors header (8-byte length and JSON); for direct I/O a
  // multiple of storage::kDirectIoAlignment long.
  absl::string_view header;
  // The data section; must stay unchanged until the call returns.
  const uint8_t* data = nullptr;
  uint64_t data_bytes = 0;
  // Sizes of the tensors that tile the data section, in order (zeros allowed).
  std::vector<uint64_t> tensor_bytes;
};

struct ShardFileWritten {
  uint64_t file_bytes = 0;     // header + data
  std::vector<uint64_t> xxh3;  // per tensor, as format::Xxh3 of its bytes
  bool direct = false;         // written with O_DIRECT
};

// Creates (or truncates) and writes `source.path`; durable (fdatasync'ed) on
// success. On failure the file may be left partly written; the caller removes it.
absl::StatusOr<ShardFileWritten> WriteShardFile(storage::Storage& storage,
                                                const ShardFileSource& source,
                                                const IoOptions& options);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_SHARD_FILE_WRITER_H_
