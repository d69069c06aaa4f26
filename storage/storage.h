// The file-system interface the checkpoint writer and reader go through: just
// what they need (files with queued reads and writes, truncate, fdatasync;
// mkdir -p, directory fsync, rename, unlink), so that a POSIX implementation
// (posix_storage.h) and a fault-injecting wrapper (fault_storage.h) are
// interchangeable, the way leveldb's Env is.
//
// I/O is asynchronous so that one thread can keep several requests in flight
// (what direct I/O needs to reach a device's sequential speed): a File accepts
// up to queue_depth() submitted requests and hands back one completion per
// request, in any order, identified by the caller's tag. Like read(2) and
// write(2), a completion may report fewer bytes than asked for; IoPipeline
// (io_pipeline.h) continues short transfers and retires requests in order.
//
// Thread-safety: a Storage is safe to use from any number of threads at once.
// A File is used by one thread at a time.
// Ownership: a File belongs to whoever opened it; destroying it waits for its
// requests still in flight (so that their buffers may then be freed) and
// closes it. The Storage must outlive its Files.
#ifndef ZCC_STORAGE_STORAGE_H_
#define ZCC_STORAGE_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zcc::storage {

// Buffer addresses, file offsets and lengths of direct I/O are multiples of
// this (the page size; every block size Linux allows divides it).
inline constexpr size_t kDirectIoAlignment = 4096;

struct OpenOptions {
  // Asks for direct I/O (O_DIRECT). A file system that refuses it gets a
  // buffered file instead; File::direct() says which one it is.
  bool direct = false;
  // How many requests the file may have in flight; 1 = synchronous.
  uint32_t queue_depth = 1;
};

struct IoCompletion {
  uint64_t tag = 0;
  absl::Status status;  // the request's error, if it failed
  // Bytes transferred when it did not: possibly fewer than asked (0 for a
  // read at end of file).
  size_t bytes = 0;
};

class File {
 public:
  virtual ~File() = default;

  virtual const std::string& path() const = 0;
  // True when reads and writes bypass the page cache; their buffers, offsets
  // and lengths must then be multiples of kDirectIoAlignment.
  virtual bool direct() const = 0;
  // How many requests may be in flight at once (>= 1).
  virtual uint32_t queue_depth() const = 0;
  virtual uint32_t in_flight() const = 0;

  // Starts a transfer of `n` bytes at `offset`. The buffer must stay valid and
  // unchanged until the request's completion is returned. FailedPrecondition
  // when queue_depth() requests are in flight already.
  virtual absl::Status SubmitWrite(uint64_t offset, const void* src, size_t n, uint64_t tag) = 0;
  virtual absl::Status SubmitRead(uint64_t offset, void* dst, size_t n, uint64_t tag) = 0;
  // Waits for one in-flight request to finish. FailedPrecondition when none is
  // in flight.
  virtual absl::StatusOr<IoCompletion> WaitForCompletion() = 0;
  // True when WaitForCompletion would return without waiting.
  virtual bool HasCompletion() const = 0;

  virtual absl::StatusOr<uint64_t> Size() = 0;
  virtual absl::Status Truncate(uint64_t size) = 0;
  // fdatasync(2): the file's data and the metadata needed to read it back.
  virtual absl::Status Sync() = 0;
  // Waits for requests in flight, then closes; reports a failed close(2).
  virtual absl::Status Close() = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Creates `path` (mode 0644) or truncates it, for writing.
  virtual absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const std::string& path,
                                                             const OpenOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<File>> OpenForRead(const std::string& path,
                                                            const OpenOptions& options) = 0;
  // mkdir -p (mode 0755 for the directories it creates).
  virtual absl::Status MakeDirs(const std::string& path) = 0;
  // fsync(2) of a directory: entries created or renamed in it become durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Unlinks a file; NotFound when there is none.
  virtual absl::Status Remove(const std::string& path) = 0;
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_STORAGE_H_
