// Disk helpers shared by the benchmarks that compare with the device's own
// speed: dropping the page cache, and the raw O_DIRECT read that the restore
// rows take as their reference.
#ifndef ZCC_BENCH_DISK_IO_H_
#define ZCC_BENCH_DISK_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zcc::bench {

// Raw reads go in blocks of kRawBlock bytes, kRawDepth in flight (io_uring).
inline constexpr size_t kRawBlock = size_t{8} << 20;
inline constexpr unsigned kRawDepth = 8;

// Drops what the page cache holds of `paths` (each fsynced, then evicted
// with posix_fadvise) and, where allowed (root outside a container), the
// whole page cache; silently does less where not allowed. Returns whether
// /proc/sys/vm/drop_caches took the write.
bool DropCaches(const std::vector<std::string>& paths);

// Reads all of `path` with O_DIRECT, kRawDepth blocks of kRawBlock in flight:
// into `buffer` at the file's offsets when `whole`, else into a ring of
// kRawDepth blocks at `buffer`. Sets `*bytes_read`; returns seconds. Exits
// the process on an I/O error (a benchmark has nothing to measure then).
double RawRead(const std::string& path, uint8_t* buffer, uint64_t* bytes_read,
               bool whole = false);

}  // namespace zcc::bench

#endif  // ZCC_BENCH_DISK_IO_H_
