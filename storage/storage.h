// The file-system interface zccd's checkpoints go through: the writer, the
// commit, retention, recovery and the reader. Just what they need (files with
// queued reads and writes, truncate, fdatasync; mkdir -p, directory fsync,
// rename, exchange, unlink, remove a tree, stat, list), so that POSIX
// (posix_storage.h), memory with crashes on demand (memory_storage.h) and a
// fault-injecting wrapper (fault_storage.h) are interchangeable, the way
// leveldb's Env is.
//
// Paths are absolute. A backend without directories or renames (an object
// store: streamed writes, ranged reads, listing by prefix, a conditional
// write of a small object) maps directories to key prefixes: MakeDirs and
// SyncDir may do nothing, List lists a prefix, RemoveTree deletes one, and
// Rename and Exchange may answer Unimplemented, in which case the commit
// protocol has to do without them.
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

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

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
  // Work that must never slow anything else down (zccd's tiered upload): a
  // backend that moves the bytes on threads of its own runs them at idle
  // priority (common/thread_priority.h).
  bool background = false;
};

struct IoCompletion {
  uint64_t tag = 0;
  absl::Status status;  // the request's error, if it failed
  // Bytes transferred when it did not: possibly fewer than asked (0 for a
  // read at end of file).
  size_t bytes = 0;
};

// A small file's content with its version (an object store's ETag).
struct VersionedFile {
  std::string content;
  std::string version;
};

struct FileInfo {
  bool is_dir = false;
  uint64_t size = 0;  // a file's bytes
  // The last change of a file's data or of a directory's entries.
  absl::Time modified;
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
  // The request size this file serves best, 0 for no preference: an object
  // store's reads each cost a round trip and a server's work, so readers
  // make their requests at least this large there.
  virtual size_t preferred_request_bytes() const { return 0; }

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

  // True when a file written and synced at `path` appears there whole or
  // not at all, and a file never synced not at all (an object store's PUT or
  // completed multipart upload): WriteFileAtomic then writes in place, with
  // no temporary name and no rename. (Asked of a path, because a storage
  // may route paths to different backends: storage/routed_storage.h.)
  virtual bool atomic_file_writes(const std::string& path) const { return false; }

  // False where Rename and Exchange under `path` answer Unimplemented (an
  // object store): a checkpoint's step is then written and committed in
  // place, in step-N/ itself, with COMMITTED written last
  // (checkpoint/step_dirs.h).
  virtual bool renames(const std::string& path) const { return true; }

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
  // Swaps two existing names (files or directories) in one atomic step, like
  // renameat2(RENAME_EXCHANGE): at every moment both names exist. NotFound
  // when either is missing; Unimplemented where the backend (or the file
  // system under it) cannot, for the caller to fall back to two renames.
  virtual absl::Status Exchange(const std::string& a, const std::string& b) = 0;
  // Unlinks a file; NotFound when there is none.
  virtual absl::Status Remove(const std::string& path) = 0;
  // Removes `path` and everything under it; OK when nothing is there.
  virtual absl::Status RemoveTree(const std::string& path) = 0;
  // NotFound when nothing is at `path`.
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;
  // The names in directory `path`, sorted, without "." and "..". NotFound
  // when there is no such directory.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& path) = 0;

  // Compare-and-swap of a small file, where the backend has one (an object
  // store's conditional write): ReadVersioned reads the file (at most
  // `max_bytes`; NotFound when absent) with its version, and WriteIfVersion
  // replaces it whole only if its version is still `version` (empty: only
  // if nothing is there), FailedPrecondition when it changed meanwhile (an
  // object store's write retried after an answer lost on the way counts as
  // done where the file holds `content` then, whoever wrote it: callers
  // write contents whose repetition is harmless, such as `latest`). By
  // default Unimplemented: on a file system one writer per job (the
  // committer) writes such files with WriteFileAtomic.
  virtual absl::StatusOr<VersionedFile> ReadVersioned(const std::string& path,
                                                      uint64_t max_bytes) {
    return absl::UnimplementedError("no versioned files here");
  }
  virtual absl::Status WriteIfVersion(const std::string& path, const std::string& content,
                                      const std::string& version) {
    return absl::UnimplementedError("no versioned files here");
  }
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_STORAGE_H_
