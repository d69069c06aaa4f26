// How much memory the staging pool may hold without crowding the machine:
// it leaves a tenth of the system's memory available, a tenth of /dev/shm
// free and, where zccd runs under a cgroup memory limit (a container, a
// systemd MemoryMax=), a tenth of that limit unused: shared memory zccd
// faults in is charged to its cgroup, and a pool that fills the cgroup gets
// zccd killed by the OOM killer with every snapshot it holds. Read from
// /proc/meminfo (MemAvailable, MemTotal), statvfs("/dev/shm") and the
// cgroup's files each time: the trainers' memory comes and goes.
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
  // The memory limit of zccd's cgroup or of an ancestor, the one with the
  // least left (0: none), and the memory charged where that limit is set.
  uint64_t cgroup_limit = 0;
  uint64_t cgroup_usage = 0;
};

// Where a process's cgroups are: its /proc/<pid>/cgroup and the cgroup file
// systems' mount point (cgroup v2, or v1 with a `memory` hierarchy under it).
struct CgroupPaths {
  std::string proc_cgroup = "/proc/self/cgroup";
  std::string root = "/sys/fs/cgroup";
};

// From `meminfo` (the text of /proc/meminfo), the file system at `shm_dir`
// and `cgroup`; a figure that cannot be read is 0.
SystemMemory ReadSystemMemory(const std::string& meminfo_path = "/proc/meminfo",
                              const std::string& shm_dir = "/dev/shm",
                              const CgroupPaths& cgroup = CgroupPaths());

// The memory limit with the least left of the cgroup `paths` names and its ancestors,
// cgroup v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes,
// memory.usage_in_bytes), into `m`'s cgroup fields; "max", or a v1 limit
// no smaller than the machine's memory, is no limit.
void ReadCgroupMemory(const CgroupPaths& paths, SystemMemory* m);

// The bytes a pool that holds `pooled` may hold in all: what it holds plus
// what is available, less the tenth of each that stays free.
uint64_t PoolRoom(const SystemMemory& m, uint64_t pooled);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_MEMORY_SYSTEM_ROOM_H_
