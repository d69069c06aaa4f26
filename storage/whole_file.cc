#include "storage/whole_file.h"

#include <unistd.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"
#include "storage/io_pipeline.h"

namespace zcc::storage {
namespace {

absl::Status WriteAndSync(Storage& storage, const std::string& path, absl::string_view content) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> file, storage.OpenForWrite(path, OpenOptions()));
  ZCC_RETURN_IF_ERROR(WriteAt(*file, 0, content.data(), content.size()));
  ZCC_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

absl::Status WriteFileAtomic(Storage& storage, const std::string& path, absl::string_view content) {
  // Where a synced file appears whole or not at all, in place.
  if (storage.atomic_file_writes(path)) return WriteAndSync(storage, path, content);
  // Unique per call: two threads writing the same path never share a
  // temporary file (the last rename wins, whole).
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", sequence.fetch_add(1));
  absl::Status st = WriteAndSync(storage, tmp, content);
  if (st.ok()) st = storage.Rename(tmp, path);
  if (!st.ok()) {
    (void)storage.Remove(tmp);
    return st;
  }
  return storage.SyncDir(DirName(path));
}

absl::StatusOr<std::string> ReadWholeFile(Storage& storage, const std::string& path,
                                          uint64_t max_bytes) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> file, storage.OpenForRead(path, OpenOptions()));
  ZCC_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  if (size > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", size, " bytes; at most ", max_bytes, " expected"));
  }
  std::string text(size, '\0');
  size_t got = 0;
  while (got < size) {
    ZCC_ASSIGN_OR_RETURN(const size_t n, ReadAt(*file, got, text.data() + got, size - got));
    if (n == 0) break;  // shorter than it was a moment ago
    got += n;
  }
  text.resize(got);
  return text;
}

bool Exists(Storage& storage, const std::string& path) {
  return !absl::IsNotFound(storage.Stat(path).status());
}

}  // namespace zcc::storage
