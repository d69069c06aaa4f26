// How the checkpoint writer and reader do their file I/O. The defaults are
// what the daemon uses; tests pass a fault-injecting storage.
#ifndef ZCC_CHECKPOINT_IO_OPTIONS_H_
#define ZCC_CHECKPOINT_IO_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "format/manifest.h"
#include "storage/storage.h"

namespace zcc::checkpoint {

class ReadProgress;  // read_progress.h

struct IoOptions {
  // Where files are written and read; null means storage::DefaultStorage().
  // Borrowed: must outlive the call.
  storage::Storage* storage = nullptr;
  // O_DIRECT where the file system allows it (buffered otherwise).
  bool direct_io = true;
  // Requests in flight per file, each of `chunk_bytes` (a multiple of
  // storage::kDirectIoAlignment). Reads that cannot land in the caller's
  // memory directly use up to 2 x queue_depth x chunk_bytes of bounce
  // buffers (128 MiB with the defaults) while they run.
  uint32_t queue_depth = 8;
  size_t chunk_bytes = size_t{8} << 20;
  // Reads report the tensor bytes they have read and checked here (null:
  // nowhere), so that a long restore logs its progress. Borrowed: must
  // outlive the call.
  ReadProgress* progress = nullptr;
  // Reads ask it before each chunk and stop with Cancelled once it returns
  // true (null: never), so that an abandoned read of many GB ends within a
  // chunk; a rank's write asks it before each chunk it queues and
  // before its manifest (WriteRankShards), and removes what it wrote.
  // Borrowed: must outlive the call.
  const std::function<bool()>* cancelled = nullptr;
  // Reads call it with each piece (a tensor of a shard file) whose bytes
  // matched its checksum, from the reading thread, once the bytes are at
  // their destination (null: nobody). Borrowed: must outlive the call.
  const std::function<void(const format::ManifestTensor& piece)>* verified = nullptr;
};

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_IO_OPTIONS_H_
