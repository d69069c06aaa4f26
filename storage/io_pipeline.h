// IoPipeline keeps up to File::queue_depth() reads or writes in flight on one
// File and retires them in submission order, so that a caller can stream a
// file through a few buffers and process each piece as soon as it is done.
// Short transfers are continued where they stopped; a read retires early only
// at end of file.
//
//   IoPipeline pipe(file.get());
//   for (each chunk) {
//     if (pipe.full()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
//     ZCC_RETURN_IF_ERROR(pipe.SubmitWrite(offset, chunk, len));
//   }
//   ZCC_RETURN_IF_ERROR(pipe.Finish());
//
// Devices often finish a queue's requests together; a caller with work to do
// per request (checksums) keeps the device busy by retiring every finished
// request (OldestDone) and refilling the queue before doing that work.
//
// A File serves one pipeline at a time (request tags are the pipeline's).
//
// Thread-safety: one thread at a time, like the File. Ownership: borrows the
// File, which must outlive the pipeline; the destructor waits for requests
// still in flight, so buffers may be freed after the pipeline is gone even
// when an error cut the work short.
#ifndef ZCC_STORAGE_IO_PIPELINE_H_
#define ZCC_STORAGE_IO_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace zcc::storage {

class IoPipeline {
 public:
  explicit IoPipeline(File* file);
  ~IoPipeline();
  IoPipeline(const IoPipeline&) = delete;
  IoPipeline& operator=(const IoPipeline&) = delete;

  // Requests submitted and not retired yet.
  size_t pending() const { return pending_.size(); }
  bool full() const { return pending_.size() >= file_->queue_depth(); }

  // Starts a request; FailedPrecondition when full(). The buffer must stay
  // valid and unchanged until the request is retired.
  absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n);
  absl::Status SubmitRead(uint64_t offset, void* dst, size_t n);

  // True when the oldest pending request has finished, so that RetireOldest
  // will not wait (completions already in are taken in, nothing blocks).
  bool OldestDone();

  // Waits for the oldest pending request and returns the bytes it moved: all
  // of them for a write; for a read, fewer only when the file ended first.
  absl::StatusOr<size_t> RetireOldest();

  // Retires every pending request; the first error.
  absl::Status Finish();

 private:
  struct Request {
    bool write = false;
    uint64_t offset = 0;
    uint8_t* buf = nullptr;
    size_t n = 0;
    size_t done = 0;  // bytes transferred so far
    bool complete = false;
    absl::Status status;
  };

  absl::Status Submit(bool write, uint64_t offset, uint8_t* buf, size_t n);
  // Waits for one completion from the file and applies it.
  absl::Status Advance();

  File* const file_;
  std::deque<Request> pending_;  // in submission order
  uint64_t first_id_ = 0;        // id (and tag) of pending_.front()
};

// Writes all `n` bytes at `offset`. The file must have nothing in flight.
absl::Status WriteAt(File& file, uint64_t offset, const void* src, size_t n);

// Reads up to `n` bytes at `offset`; fewer only at end of file. The file must
// have nothing in flight.
absl::StatusOr<size_t> ReadAt(File& file, uint64_t offset, void* dst, size_t n);

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_IO_PIPELINE_H_
