#include "daemon/memory/system_room.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zcc::daemon {
namespace {

// The first line of `path`, trimmed ("" when it cannot be read).
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

std::optional<uint64_t> ReadBytes(const std::string& path) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(FirstLine(path), &v)) return std::nullopt;
  return v;
}

// `dir` and each of its ancestors up to `top`, deepest first.
std::vector<std::string> UpTo(const std::string& top, const std::string& rel) {
  std::vector<std::string> dirs;
  std::string path(absl::StripSuffix(rel, "/"));
  while (true) {
    dirs.push_back(top + path);
    if (path.empty()) break;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
  return dirs;
}

}  // namespace

void ReadCgroupMemory(const CgroupPaths& paths, SystemMemory* m) {
  std::ifstream in(paths.proc_cgroup);
  std::string line;
  std::string v1_path;
  std::optional<std::string> v2_path;
  while (std::getline(in, line)) {
    // hierarchy-ID:controller-list:cgroup-path
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) v2_path = f[2];
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "memory") v1_path = f[2];
    }
  }
  auto consider = [m](std::optional<uint64_t> limit, std::optional<uint64_t> usage) {
    if (!limit.has_value() || !usage.has_value()) return;
    // A v1 hierarchy without a limit reports a huge number.
    if (m->mem_total > 0 && *limit >= m->mem_total) return;
    // The level with the least left: a larger limit shared with siblings
    // can be the tighter one.
    const uint64_t left = *limit > *usage ? *limit - *usage : 0;
    const uint64_t left_now =
        m->cgroup_limit > m->cgroup_usage ? m->cgroup_limit - m->cgroup_usage : 0;
    if (m->cgroup_limit == 0 || left < left_now) {
      m->cgroup_limit = *limit;
      m->cgroup_usage = *usage;
    }
  };
  if (!v1_path.empty()) {
    for (const std::string& dir : UpTo(paths.root + "/memory", v1_path)) {
      consider(ReadBytes(dir + "/memory.limit_in_bytes"), ReadBytes(dir + "/memory.usage_in_bytes"));
    }
    return;
  }
  if (v2_path.has_value()) {
    for (const std::string& dir : UpTo(paths.root, *v2_path)) {
      consider(ReadBytes(dir + "/memory.max"), ReadBytes(dir + "/memory.current"));  // "max": none
    }
  }
}

SystemMemory ReadSystemMemory(const std::string& meminfo_path, const std::string& shm_dir,
                              const CgroupPaths& cgroup) {
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
  ReadCgroupMemory(cgroup, &m);
  return m;
}

uint64_t PoolRoom(const SystemMemory& m, uint64_t pooled) {
  auto room = [pooled](uint64_t total, uint64_t free) {
    const uint64_t usable = free + pooled;  // the pool's own memory is not free
    const uint64_t keep = total / 10;
    return usable > keep ? usable - keep : 0;
  };
  uint64_t out = std::min(room(m.mem_total, m.mem_available), room(m.shm_total, m.shm_free));
  if (m.cgroup_limit > 0) {
    // The pool's pages are charged to the cgroup: in its usage, and its own.
    const uint64_t unused = m.cgroup_limit > m.cgroup_usage ? m.cgroup_limit - m.cgroup_usage : 0;
    out = std::min(out, room(m.cgroup_limit, unused));
  }
  return out;
}

}  // namespace zcc::daemon
