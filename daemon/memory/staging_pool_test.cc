#include "daemon/memory/staging_pool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "common/testing/status_matchers.h"
#include "daemon/memory/system_room.h"
#include "shm/segment.h"

namespace zcc::daemon {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Bytes of /dev/shm/<name> allocated.
uint64_t AllocatedBytes(const std::string& name) {
  struct stat st;
  if (stat(("/dev/shm/" + name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// A pool under a test's own prefix whose room the test sets, and a way to
// wait for what it holds (its on_change callback).
struct Harness {
  // Unique across tests run at once in PID namespaces (one pid for all).
  std::string prefix =
      absl::StrCat("zcctest.pool", ::getpid(), "-", absl::ToUnixNanos(absl::Now()) % 1000000007);
  std::atomic<uint64_t> room{~uint64_t{0}};
  zcc::Mutex mu;
  uint64_t pooled ABSL_GUARDED_BY(mu) = 0;

  StagingPool::Options Options(uint64_t target, uint64_t entry) {
    StagingPool::Options o;
    o.name_prefix = prefix;
    o.target_bytes = target;
    o.entry_bytes = entry;
    o.room = [this](uint64_t) { return room.load(); };
    o.on_change = [this](uint64_t bytes) {
      zcc::MutexLock lock(&mu);
      pooled = bytes;
    };
    o.refill_after = absl::ZeroDuration();
    return o;
  }

  // Waits (at most 30 s) until the pool reports holding `bytes`.
  bool AwaitPooled(StagingPool& pool, uint64_t bytes) {
    zcc::MutexLock lock(&mu);
    auto reached = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return pooled == bytes; };
    const bool met = mu.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
    return met && pool.bytes() == bytes;
  }
};

TEST_CASE("the staging pool fills to its target with allocated memory, and hands it over") {
  Harness h;
  StagingPool pool(h.Options(3 * kMiB + kMiB / 2, kMiB));
  CHECK(pool.bytes() == 0);  // nothing before Start
  pool.Start();
  // Three entries of the entry size and one of what is left of the target.
  REQUIRE(h.AwaitPooled(pool, 3 * kMiB + kMiB / 2));
  CHECK(pool.made() == 4);
  std::vector<std::string> names = shm::Segment::ListWithPrefix(h.prefix + ".");
  REQUIRE(names.size() == 4);
  uint64_t allocated = 0;
  for (const std::string& name : names) allocated += AllocatedBytes(name);
  CHECK(allocated == 3 * kMiB + kMiB / 2);  // reserved, not promised

  // A registration that needs 3 MiB of a 6 MiB segment takes a whole entry
  // (the largest that fits), zero, and the pool's name is gone once renamed.
  std::optional<shm::Segment> taken = pool.Take(3 * kMiB, 6 * kMiB);
  REQUIRE(taken.has_value());
  CHECK(taken->size() == kMiB);
  for (uint64_t i = 0; i < taken->size(); i += 4096) REQUIRE(taken->base()[i] == 0);
  const std::string renamed = h.prefix + "x.segment";
  REQUIRE_OK(taken->Rename(renamed, static_cast<uid_t>(-1)));
  REQUIRE_OK(taken->Resize(6 * kMiB, 3 * kMiB));
  CHECK(AllocatedBytes(renamed) == 3 * kMiB);
  CHECK(pool.taken() == 1);
  // It makes another at the next recheck (zccd's housekeeping rounds): the
  // 1 MiB taken again.
  pool.Recheck();
  REQUIRE(h.AwaitPooled(pool, 3 * kMiB + kMiB / 2));
  CHECK(pool.made() == 5);

  // For a segment smaller than every entry, the smallest.
  taken = pool.Take(kMiB / 4, kMiB / 4);
  REQUIRE(taken.has_value());
  CHECK(taken->size() == kMiB / 2);
}

TEST_CASE("the staging pool gives memory back when its room shrinks, and on request") {
  Harness h;
  StagingPool pool(h.Options(4 * kMiB, kMiB));
  pool.Start();
  REQUIRE(h.AwaitPooled(pool, 4 * kMiB));

  // A registration that needs the budget: down to what may stay, the
  // caller frees the memory.
  {
    std::vector<shm::Segment> released = pool.ReleaseDownTo(2 * kMiB + 1);
    CHECK(released.size() == 2);
    CHECK(pool.bytes() == 2 * kMiB);
  }
  // Memory pressure (room() below what it holds): given back at the next
  // recheck, and not made again while the room stays small.
  h.room = kMiB;
  pool.Recheck();
  REQUIRE(h.AwaitPooled(pool, kMiB));
  CHECK(shm::Segment::ListWithPrefix(h.prefix + ".").size() == 1);
  const uint64_t made = pool.made();
  pool.Recheck();
  absl::SleepFor(absl::Milliseconds(200));  // a refill would start at once
  CHECK(pool.made() == made);
  // Room again: filled to the target.
  h.room = ~uint64_t{0};
  pool.Recheck();
  REQUIRE(h.AwaitPooled(pool, 4 * kMiB));
}

TEST_CASE("the staging pool waits after a take before it makes more, and removes its memory "
          "when it goes") {
  Harness h;
  StagingPool::Options o = h.Options(2 * kMiB, kMiB);
  o.refill_after = absl::Hours(1);
  std::string prefix = h.prefix;
  {
    StagingPool pool(o);
    pool.Start();
    REQUIRE(h.AwaitPooled(pool, 2 * kMiB));
    REQUIRE(pool.Take(kMiB, kMiB).has_value());
    pool.Recheck();
    absl::SleepFor(absl::Milliseconds(200));
    CHECK(pool.made() == 2);
    CHECK(pool.bytes() == kMiB);
  }
  CHECK(shm::Segment::ListWithPrefix(prefix + ".").empty());
}

TEST_CASE("the pool's room leaves a tenth of memory and of /dev/shm free") {
  SystemMemory m;
  m.mem_total = 100;
  m.mem_available = 50;
  m.shm_total = 200;
  m.shm_free = 100;
  CHECK(PoolRoom(m, 0) == 40);   // memory: 50 - 10
  CHECK(PoolRoom(m, 20) == 60);  // what the pool holds is its own
  m.shm_free = 10;
  CHECK(PoolRoom(m, 0) == 0);  // /dev/shm: 10 - 20
  CHECK(PoolRoom(m, 30) == 20);

  // This machine's figures are read.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string meminfo = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/meminfo.", ::getpid());
  std::FILE* f = std::fopen(meminfo.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("MemTotal:       1000 kB\nMemFree:         10 kB\nMemAvailable:    400 kB\n", f);
  std::fclose(f);
  const SystemMemory read = ReadSystemMemory(meminfo, "/dev/shm");
  CHECK(read.mem_total == 1000 * 1024);
  CHECK(read.mem_available == 400 * 1024);
  CHECK(read.shm_total > 0);
  std::remove(meminfo.c_str());
}

TEST_CASE("the pool's room leaves a tenth of its cgroup's memory limit unused") {
  SystemMemory m;
  m.mem_total = 1000;
  m.mem_available = 900;
  m.shm_total = 1000;
  m.shm_free = 900;
  CHECK(PoolRoom(m, 0) == 800);  // no cgroup limit
  m.cgroup_limit = 100;
  m.cgroup_usage = 60;
  CHECK(PoolRoom(m, 0) == 30);   // 100 - 60 - 10
  CHECK(PoolRoom(m, 20) == 50);  // the pool's own pages are in the usage
  m.cgroup_usage = 100;
  CHECK(PoolRoom(m, 0) == 0);
}

// Writes `text` to `path`, making its directories.
void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST_CASE("a cgroup's memory limit is read, the tightest of it and its ancestors") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/cgroups.", ::getpid());
  SystemMemory m;
  m.mem_total = uint64_t{1} << 40;

  SECTION("cgroup v2: the pod's limit, larger than the container's but fuller") {
    CgroupPaths p{dir + "/v2/self", dir + "/v2/fs"};
    WriteFile(p.proc_cgroup, "0::/kubepods/pod1/zccd\n");
    WriteFile(p.root + "/kubepods/memory.max", "max\n");
    WriteFile(p.root + "/kubepods/memory.current", "9000\n");
    WriteFile(p.root + "/kubepods/pod1/memory.max", "3000\n");
    WriteFile(p.root + "/kubepods/pod1/memory.current", "2900\n");
    WriteFile(p.root + "/kubepods/pod1/zccd/memory.max", "1000\n");
    WriteFile(p.root + "/kubepods/pod1/zccd/memory.current", "400\n");
    ReadCgroupMemory(p, &m);
    CHECK(m.cgroup_limit == 3000);
    CHECK(m.cgroup_usage == 2900);
  }
  SECTION("cgroup v2: the container's own limit") {
    CgroupPaths p{dir + "/v2b/self", dir + "/v2b/fs"};
    WriteFile(p.proc_cgroup, "0::/pod2/zccd\n");
    WriteFile(p.root + "/pod2/memory.max", "3000\n");
    WriteFile(p.root + "/pod2/memory.current", "600\n");
    WriteFile(p.root + "/pod2/zccd/memory.max", "1000\n");
    WriteFile(p.root + "/pod2/zccd/memory.current", "400\n");
    ReadCgroupMemory(p, &m);
    CHECK(m.cgroup_limit == 1000);
    CHECK(m.cgroup_usage == 400);
  }
  SECTION("cgroup v1: the memory hierarchy") {
    CgroupPaths p{dir + "/v1/self", dir + "/v1/fs"};
    WriteFile(p.proc_cgroup, "5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n");
    WriteFile(p.root + "/memory/job/memory.limit_in_bytes", "500\n");
    WriteFile(p.root + "/memory/job/memory.usage_in_bytes", "100\n");
    WriteFile(p.root + "/memory/memory.limit_in_bytes", "9223372036854771712\n");  // none
    WriteFile(p.root + "/memory/memory.usage_in_bytes", "700\n");
    ReadCgroupMemory(p, &m);
    CHECK(m.cgroup_limit == 500);
    CHECK(m.cgroup_usage == 100);
  }
  SECTION("no limit anywhere, or nothing to read") {
    CgroupPaths p{dir + "/none/self", dir + "/none/fs"};
    WriteFile(p.proc_cgroup, "0::/user.slice\n");
    WriteFile(p.root + "/user.slice/memory.max", "max\n");
    WriteFile(p.root + "/user.slice/memory.current", "123\n");
    ReadCgroupMemory(p, &m);
    CHECK(m.cgroup_limit == 0);
    ReadCgroupMemory(CgroupPaths{dir + "/missing", dir + "/missing"}, &m);
    CHECK(m.cgroup_limit == 0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zcc::daemon
