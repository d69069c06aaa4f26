// FaultInjectingStorage: a Storage for tests that wraps another one and makes
// it fail the way disks do: no space left after N bytes, EIO on the k-th write
// or read, short writes and reads, a failing fdatasync, a file system that
// refuses O_DIRECT, and a slow disk (a delay per request). Failed requests
// fail in their completion, as with io_uring; nothing is faked for requests
// that are let through.
//
// Thread-safety: thread-safe; its Files are used by one thread at a time.
// Ownership: borrows `base`, which must outlive it; it must outlive its Files.
#ifndef ZCC_STORAGE_FAULT_STORAGE_H_
#define ZCC_STORAGE_FAULT_STORAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "storage/storage.h"
#include "storage/storage_wrapper.h"

namespace zcc::storage {

struct FaultPlan {
  // Faults and counters cover only files whose path contains this (all files
  // when empty).
  std::string path_filter;
  // Writes succeed until this many bytes have been written in all (counted as
  // they are submitted); the write that crosses the limit is cut short there
  // and the ones after it fail with ENOSPC.
  std::optional<uint64_t> enospc_after_bytes;
  // The k-th write / read request (1-based, over all files) fails with EIO;
  // 0 = never.
  uint64_t eio_on_write = 0;
  uint64_t eio_on_read = 0;
  // Each request moves at most this many bytes (rounded down to the alignment
  // on direct files, but at least one block); 0 = no limit.
  size_t max_write_bytes = 0;
  size_t max_read_bytes = 0;
  // File::Sync fails with EIO.
  bool fail_sync = false;
  // Name operations, for directories and names the plan covers: SyncDir
  // fails with EIO; the k-th Rename or Exchange (1-based) fails with EIO
  // before anything is renamed; 0 = never.
  bool fail_sync_dir = false;
  uint64_t eio_on_rename = 0;
  // Asking for direct I/O gets a buffered file, as on a file system that
  // refuses O_DIRECT (with the same one WARNING line per storage).
  bool refuse_direct_io = false;
  // Added before every request and sync, and before every name operation
  // (mkdir, directory sync, rename, exchange, remove, stat, list) on a path
  // the plan covers: a slow or hung disk.
  absl::Duration op_delay = absl::ZeroDuration();
};

// Parses a plan written as comma-separated key=value pairs, for zccd's
// ZCCD_INJECT_STORAGE_FAULTS (fault drills and integration tests):
//   path=TEXT  enospc_after_bytes=N  eio_on_write=K  eio_on_read=K
//   max_write_bytes=N  max_read_bytes=N  fail_sync=0|1  refuse_direct_io=0|1
//   op_delay_ms=N  fail_sync_dir=0|1  eio_on_rename=K
// e.g. "path=model-,op_delay_ms=5000". InvalidArgument naming the bad pair.
absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view spec);

// One line describing the plan, for the log.
std::string DescribeFaultPlan(const FaultPlan& plan);

class FaultInjectingStorage final : public StorageWrapper {
 public:
  explicit FaultInjectingStorage(Storage* base, FaultPlan plan = {});

  // Replaces the plan and zeroes the counters.
  void SetPlan(FaultPlan plan);

  // Since construction or the last SetPlan, for files the plan covers.
  uint64_t bytes_written() const;
  uint64_t write_requests() const;
  uint64_t read_requests() const;
  // Bytes asked for by the read requests let through (the kernel returns
  // fewer at the end of a file): what a reader made the disk do, alignment
  // padding included.
  uint64_t bytes_read() const;
  uint64_t faults_injected() const;

  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const std::string& path,
                                                     const OpenOptions& options) override;
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(const std::string& path,
                                                    const OpenOptions& options) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Exchange(const std::string& a, const std::string& b) override;
  // These fail only as the base does; they are delayed like the rest.
  absl::Status MakeDirs(const std::string& path) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& path) override;

 private:
  friend class FaultInjectingFile;

  // What to do with one request: forward `bytes` of it, or fail it with errno
  // `fail_errno` (non-zero).
  // Sleeps op_delay when the plan covers `path` (a name operation).
  void DelayNameOp(const std::string& path) const;

  struct Decision {
    size_t bytes = 0;
    int fail_errno = 0;
  };
  bool Covers(const std::string& path) const;
  Decision DecideWrite(size_t n, bool direct);
  Decision DecideRead(size_t n, bool direct);
  bool SyncFails();
  // Whether the name operation on `path` fails: SyncDir when `sync_dir`, else
  // the next Rename/Exchange (counted).
  bool NameOpFails(const std::string& path, bool sync_dir);
  absl::Duration Delay() const;
  OpenOptions AdjustOpen(const std::string& path, const OpenOptions& options);

  mutable zcc::Mutex mu_;
  FaultPlan plan_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_read_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t faults_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t renames_ ABSL_GUARDED_BY(mu_) = 0;
  bool warned_direct_refused_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zcc::storage

#endif  // ZCC_STORAGE_FAULT_STORAGE_H_
