#include "daemon/memory/system_room.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace zcc::daemon {

SystemMemory ReadSystemMemory(const std::string& meminfo_path, const std::string& shm_dir) {
  SystemMemory m;
  std::ifstream in(meminfo_path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") m.mem_total = kib << 10;
    if (key == "MemAvailable:") m.mem_available = kib << 10;
  }
  struct statvfs fs;
  if (::statvfs(shm_dir.c_str(), &fs) == 0) {
    m.shm_total = uint64_t{fs.f_blocks} * fs.f_frsize;
    m.shm_free = uint64_t{fs.f_bavail} * fs.f_frsize;
  }
  return m;
}

uint64_t PoolRoom(const SystemMemory& m, uint64_t pooled) {
  auto room = [pooled](uint64_t total, uint64_t free) {
    const uint64_t usable = free + pooled;  // the pool's own memory is not free
    const uint64_t keep = total / 10;
    return usable > keep ? usable - keep : 0;
  };
  return std::min(room(m.mem_total, m.mem_available), room(m.shm_total, m.shm_free));
}

}  // namespace zcc::daemon
