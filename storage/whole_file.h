// Whole small files written through a Storage: the commit's index files,
// COMMITTED and `latest`, so that they meet the same storage (and the same
// injected faults) as the shards.
//
// Thread-safety: stateless; safe from any thread.
#ifndef ZCC_STORAGE_WHOLE_FILE_H_
#define ZCC_STORAGE_WHOLE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "storage/storage.h"

namespace zcc::storage {

// Replaces `path` with `content` atomically and durably: written to a
// temporary name beside it, synced, renamed over `path`, and the directory
// synced. A failure leaves `path` as it was (and no temporary file).
absl::Status WriteFileAtomic(Storage& storage, const std::string& path, absl::string_view content);

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_WHOLE_FILE_H_
