#include "bench/disk_io.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zcc::bench {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

bool DropCaches(const std::vector<std::string>& paths) {
  ::sync();
  for (const std::string& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  bool dropped = false;
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    dropped = ::write(fd, "3", 1) == 1;
    ::close(fd);
  }
  return dropped;
}

double RawRead(const std::string& path, uint8_t* buffer, uint64_t* bytes_read, bool whole) {
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const off_t size = ::lseek(fd, 0, SEEK_END);
  io_uring ring;
  if (io_uring_queue_init(kRawDepth, &ring, 0) != 0) Die("io_uring_queue_init");
  unsigned in_flight = 0;
  uint64_t next = 0, done = 0, slot = 0;
  while (done < static_cast<uint64_t>(size)) {
    while (in_flight < kRawDepth && next < static_cast<uint64_t>(size)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      uint8_t* dst = whole ? buffer + next : buffer + (slot++ % kRawDepth) * kRawBlock;
      io_uring_prep_read(sqe, fd, dst, kRawBlock, next);
      io_uring_submit(&ring);
      ++in_flight;
      next += kRawBlock;
    }
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe->res < 0) Die("raw read failed");
    done += static_cast<uint64_t>(cqe->res);
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  while (in_flight > 0) {
    io_uring_cqe* cqe;
    io_uring_wait_cqe(&ring, &cqe);
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  ::close(fd);
  io_uring_queue_exit(&ring);
  *bytes_read = done;
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace zcc::bench
