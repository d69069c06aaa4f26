// How much memory the staging pool may hold without crowding the machine:
// it leaves a tenth of the system's memory available and a tenth of
// /dev/shm free. Read from /proc/meminfo (MemAvailable, MemTotal) and
// statvfs("/dev/shm") each time: the trainers' memory comes and goes.
#ifndef ZCC_DAEMON_MEMORY_SYSTEM_ROOM_H_
#define ZCC_DAEMON_MEMORY_SYSTEM_ROOM_H_

#include <cstdint>
#include <string>

namespace zcc::daemon {

struct SystemMemory {
  uint64_t mem_total = 0;
  uint64_t mem_available = 0;  // the kernel's estimate; shared memory is not in it
  uint64_t shm_total = 0;
  uint64_t shm_free = 0;
};

// From `meminfo` (the text of /proc/meminfo) and the file system at
// `shm_dir`; a figure that cannot be read is 0.
SystemMemory ReadSystemMemory(const std::string& meminfo_path = "/proc/meminfo",
                              const std::string& shm_dir = "/dev/shm");

// The bytes a pool that holds `pooled` may hold in all: what it holds plus
// what is available, less the tenth of each that stays free.
uint64_t PoolRoom(const SystemMemory& m, uint64_t pooled);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_MEMORY_SYSTEM_ROOM_H_
