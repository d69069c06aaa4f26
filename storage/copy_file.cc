#include "storage/copy_file.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"

namespace zcc::storage {

absl::StatusOr<uint64_t> CopyFile(Storage& from, const std::string& from_path, Storage& to,
                                  const std::string& to_path, const CopyOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes % kDirectIoAlignment != 0 ||
      options.queue_depth == 0) {
    return absl::InvalidArgumentError("CopyFile: chunk_bytes must be a positive multiple of 4096");
  }
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> in, from.OpenForRead(from_path, OpenOptions{}));
  ZCC_ASSIGN_OR_RETURN(const uint64_t size, in->Size());
  OpenOptions write_options;
  write_options.direct = true;  // whole aligned chunks; streamed by an object store
  write_options.queue_depth = options.queue_depth;
  write_options.background = options.background;
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> out, to.OpenForWrite(to_path, write_options));
  std::vector<AlignedBuffer> buffers;
  for (uint32_t i = 0; i < options.queue_depth; ++i) {
    buffers.push_back(AlignedBuffer::Uninitialized(options.chunk_bytes));
  }
  {
    IoPipeline pipe(out.get());
    uint64_t offset = 0;
    for (size_t k = 0; offset < size; ++k) {
      if (options.cancelled != nullptr && (*options.cancelled)()) {
        return absl::CancelledError(absl::StrCat("copy of ", from_path, " cancelled"));
      }
      if (pipe.full()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
      AlignedBuffer& buf = buffers[k % buffers.size()];
      const size_t n = static_cast<size_t>(std::min<uint64_t>(options.chunk_bytes, size - offset));
      ZCC_ASSIGN_OR_RETURN(const size_t got, ReadAt(*in, offset, buf.data(), n));
      if (got != n) {
        return absl::DataLossError(absl::StrCat(from_path, " ended at ", offset + got,
                                                " bytes while being copied; it had ", size));
      }
      // The last chunk padded to the alignment, cut off again below.
      const size_t padded = (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
      std::memset(buf.data() + n, 0, padded - n);
      ZCC_RETURN_IF_ERROR(pipe.SubmitWrite(offset, buf.data(), padded));
      offset += n;
    }
    ZCC_RETURN_IF_ERROR(pipe.Finish());
  }
  if (size % kDirectIoAlignment != 0) ZCC_RETURN_IF_ERROR(out->Truncate(size));
  ZCC_RETURN_IF_ERROR(out->Sync());
  ZCC_RETURN_IF_ERROR(out->Close());
  return size;
}

}  // namespace zcc::storage
