// CopyFile: one file from a path of a Storage to a path of another (or the
// same), streamed in chunks with several writes in flight, for the upload
// of a committed step from a node-local disk to an object store. The copy
// appears at `to` only when whole and synced where the destination writes
// files whole (an object store); elsewhere a failure leaves a partial file,
// which the caller removes.
//
// Thread-safety: stateless; safe from any thread.
#ifndef ZCC_STORAGE_COPY_FILE_H_
#define ZCC_STORAGE_COPY_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace zcc::storage {

struct CopyOptions {
  // Bytes per request (a multiple of kDirectIoAlignment) and requests in
  // flight on the destination: 4 x 16 MiB of buffers.
  size_t chunk_bytes = size_t{16} << 20;
  uint32_t queue_depth = 4;
  // Asked between chunks; true stops the copy with Cancelled (null: never).
  const std::function<bool()>* cancelled = nullptr;
  // The destination's writes as background work (OpenOptions::background).
  bool background = false;
};

// Copies `from_path` of `from` to `to_path` of `to` (created or replaced);
// returns the bytes copied. DataLoss when the source changes size meanwhile.
absl::StatusOr<uint64_t> CopyFile(Storage& from, const std::string& from_path, Storage& to,
                                  const std::string& to_path, const CopyOptions& options = {});

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_COPY_FILE_H_
