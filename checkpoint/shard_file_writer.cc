#include "checkpoint/shard_file_writer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "format/checksum.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"

namespace zcc::checkpoint {
namespace {

using storage::AlignDown;
using storage::AlignedBuffer;
using storage::AlignUp;
using storage::kDirectIoAlignment;

// Hashes a data section front to back, tensor by tensor, as it is consumed.
class TensorChecksummer {
 public:
  TensorChecksummer(const uint8_t* data, const std::vector<uint64_t>& sizes)
      : data_(data), sizes_(sizes) {
    digests_.reserve(sizes.size());
  }

  // Hashes the bytes up to `end` (from where the previous call stopped).
  void ConsumeUpTo(uint64_t end) {
    while (done_ < end) {
      FinishEndedTensors();
      if (!started_) return;  // past the last tensor: nothing to hash
      const uint64_t stop = std::min(end, tensor_end_);
      if (done_ == tensor_begin_ && stop == tensor_end_) {
        // The whole tensor at once (the usual case for all but the largest):
        // one call, no streaming state to allocate per tensor.
        digests_.push_back(format::Xxh3(data_ + done_, stop - done_));
        started_ = false;
      } else {
        if (!stream_.has_value()) stream_.emplace();
        stream_->Update(data_ + done_, stop - done_);
      }
      done_ = stop;
    }
  }

  std::vector<uint64_t> Finish() {
    FinishEndedTensors();
    return std::move(digests_);
  }

 private:
  // Closes every tensor that ends at done_ (zero-sized ones included) and
  // moves to the first one that has bytes left.
  void FinishEndedTensors() {
    while (next_ < sizes_.size() || started_) {
      if (!started_) {
        tensor_begin_ = done_;
        tensor_end_ = done_ + sizes_[next_++];
        stream_.reset();
        started_ = true;
      }
      if (tensor_end_ > done_) return;
      digests_.push_back(stream_.has_value() ? stream_->Digest() : format::Xxh3(nullptr, 0));
      started_ = false;
    }
  }

  const uint8_t* const data_;
  const std::vector<uint64_t>& sizes_;
  std::vector<uint64_t> digests_;
  std::optional<format::Xxh3Stream> stream_;  // the open tensor, once hashed in parts
  uint64_t done_ = 0;        // bytes hashed
  uint64_t tensor_begin_ = 0;  // start of the current tensor
  uint64_t tensor_end_ = 0;  // end of the current tensor
  size_t next_ = 0;          // next tensor to start
  bool started_ = false;     // a tensor is open in stream_
};

absl::Status CheckSource(const ShardFileSource& source, bool direct, const IoOptions& options) {
  uint64_t sum = 0;
  for (uint64_t n : source.tensor_bytes) sum += n;
  if (sum != source.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(source.path, ": tensors add up to ", sum,
                                                   " bytes; the data section has ",
                                                   source.data_bytes));
  }
  if (direct && source.header.size() % kDirectIoAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source.path, ": header of ", source.header.size(), " bytes is not padded for direct I/O"));
  }
  if (options.chunk_bytes < kDirectIoAlignment || options.chunk_bytes % kDirectIoAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes ", options.chunk_bytes,
                                                   " is not a multiple of ", kDirectIoAlignment));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardFileWritten> WriteShardFile(storage::Storage& storage,
                                                const ShardFileSource& source,
                                                const IoOptions& options) {
  storage::OpenOptions open;
  open.direct = options.direct_io;
  open.queue_depth = std::max<uint32_t>(options.queue_depth, 1);
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file,
                       storage.OpenForWrite(source.path, open));
  const bool direct = file->direct();
  ZCC_RETURN_IF_ERROR(CheckSource(source, direct, options));
  const uint64_t header_bytes = source.header.size();
  const uint64_t align = direct ? kDirectIoAlignment : 1;

  // Declared before the pipeline so that they outlive requests in flight
  // when an error returns early (the pipeline's destructor waits for those).
  AlignedBuffer header_block;
  AlignedBuffer tail_block;
  std::vector<AlignedBuffer> bounce;
  storage::IoPipeline pipe(file.get());

  // Sized up front: on ext4 an O_DIRECT write past the end of the file waits
  // for its own completion under the inode lock, so writes that extend the
  // file run one at a time whatever the queue depth. Measured with 8 MiB
  // writes, queue depth 8, 1 GiB files on this project's machine: 1.07-1.29
  // GB/s extending vs 1.34-1.52 GB/s into a pre-sized file (3 rounds each).
  if (direct) ZCC_RETURN_IF_ERROR(file->Truncate(header_bytes + AlignUp(source.data_bytes, align)));

  const void* header_src = source.header.data();
  if (direct) {
    header_block = AlignedBuffer::Uninitialized(header_bytes);
    std::memcpy(header_block.data(), source.header.data(), header_bytes);
    header_src = header_block.data();
  }
  ZCC_RETURN_IF_ERROR(pipe.SubmitWrite(0, header_src, header_bytes));

  // The data section's whole blocks, chunk by chunk. Each round retires what
  // the device has finished, refills the queue, and only then hashes the
  // chunks just queued, while they are being written: devices tend to finish
  // a queue's requests together, and hashing between refills would leave the
  // device idle.
  TensorChecksummer checksums(source.data, source.tensor_bytes);
  const uint64_t body_bytes = AlignDown(source.data_bytes, align);
  const bool zero_copy = reinterpret_cast<uintptr_t>(source.data) % align == 0;
  uint64_t chunk_index = 0;
  for (uint64_t pos = 0; pos < body_bytes;) {
    if (pipe.full()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
    while (pipe.OldestDone()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
    for (; !pipe.full() && pos < body_bytes; ++chunk_index) {
      // A write given up (the rank's trainer went back from this state)
      // ends at the next chunk, not after all of its bytes.
      if (options.cancelled != nullptr && *options.cancelled && (*options.cancelled)()) {
        return absl::CancelledError(absl::StrCat("the write of ", source.path, " was given up"));
      }
      const size_t len =
          static_cast<size_t>(std::min<uint64_t>(options.chunk_bytes, body_bytes - pos));
      const uint8_t* src = source.data + pos;
      if (!zero_copy) {
        // Buffer i is reused by chunk i + queue depth, which is submitted
        // only after chunk i has been retired (at most that many are pending).
        if (bounce.empty()) bounce.resize(file->queue_depth());
        AlignedBuffer& buf = bounce[chunk_index % bounce.size()];
        if (buf.size() == 0) {
          buf = AlignedBuffer::Uninitialized(std::min<uint64_t>(options.chunk_bytes, body_bytes));
        }
        std::memcpy(buf.data(), src, len);
        src = buf.data();
      }
      ZCC_RETURN_IF_ERROR(pipe.SubmitWrite(header_bytes + pos, src, len));
      pos += len;
    }
    checksums.ConsumeUpTo(pos);
  }

  // The last partial block (direct I/O only): zero-padded to a whole block,
  // written, and cut off again below.
  const uint64_t tail = source.data_bytes - body_bytes;
  if (tail > 0) {
    tail_block = AlignedBuffer(kDirectIoAlignment);
    std::memcpy(tail_block.data(), source.data + body_bytes, tail);
    if (pipe.full()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
    ZCC_RETURN_IF_ERROR(
        pipe.SubmitWrite(header_bytes + body_bytes, tail_block.data(), kDirectIoAlignment));
    checksums.ConsumeUpTo(source.data_bytes);
  }
  ZCC_RETURN_IF_ERROR(pipe.Finish());

  ShardFileWritten written;
  written.file_bytes = header_bytes + source.data_bytes;
  written.xxh3 = checksums.Finish();
  written.direct = direct;
  if (tail > 0) ZCC_RETURN_IF_ERROR(file->Truncate(written.file_bytes));
  ZCC_RETURN_IF_ERROR(file->Sync());
  ZCC_RETURN_IF_ERROR(file->Close());
  return written;
}

}  // namespace zcc::checkpoint
