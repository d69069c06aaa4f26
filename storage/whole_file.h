// Whole small files through a Storage: the commit's index files, COMMITTED,
// `latest` and the manifests, written and read where the shards are (and
// meeting the same injected faults).
//
// Thread-safety: stateless; safe from any thread.
#ifndef ZCC_STORAGE_WHOLE_FILE_H_
#define ZCC_STORAGE_WHOLE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/storage.h"

namespace zcc::storage {

// Replaces `path` with `content` atomically and durably: written to a
// temporary name beside it, synced, renamed over `path`, and the directory
// synced; or, where the storage's synced files appear whole or not at all
// (atomic_file_writes: an object store), written in place. A failure leaves
// `path` as it was (and no temporary file).
absl::Status WriteFileAtomic(Storage& storage, const std::string& path, absl::string_view content);

// The whole of a small file. FailedPrecondition when it holds more than
// `max_bytes` (nothing is read then).
absl::StatusOr<std::string> ReadWholeFile(Storage& storage, const std::string& path,
                                          uint64_t max_bytes);

// Whether anything is at `path`; an error other than NotFound counts as
// there (a caller then meets the error where it reads).
bool Exists(Storage& storage, const std::string& path);

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_WHOLE_FILE_H_
