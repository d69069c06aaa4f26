#include "storage/storage.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "common/testing/temp_dir.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_storage.h"
#include "storage/io_pipeline.h"
#include "storage/memory_storage.h"
#include "storage/posix_storage.h"
#include "storage/routed_storage.h"
#include "storage/testing/conformance.h"
#include "storage/testing/object_store_model.h"
#include "storage/whole_file.h"

namespace zcc::storage {
namespace {

constexpr size_t kA = kDirectIoAlignment;

using ::zcc::testing::CountLinesWith;
using ::zcc::testing::StderrCapture;
using ::zcc::testing::TempDir;
using ::zcc::testing::TempDirUnder;
using testing::AsString;
using testing::CheckStorageConformance;
using testing::Direct;
using testing::Pattern;

TEST_CASE("storage conformance: POSIX with io_uring on the work disk") {
  PosixStorage storage;
  CheckStorageConformance(storage, TempDir());
}

TEST_CASE("storage conformance: POSIX without io_uring") {
  PosixStorageOptions options;
  options.use_io_uring = false;
  PosixStorage storage(options);
  CheckStorageConformance(storage, TempDir());
  auto f = storage.OpenForWrite(JoinPath(TempDir(), "x"), Direct(8));
  REQUIRE_OK(f);
  CHECK((*f)->queue_depth() == 1);
}

TEST_CASE("storage conformance: POSIX on tmpfs (/dev/shm)") {
  if (!PathExists("/dev/shm")) {
    WARN("no /dev/shm here; skipped");
    return;
  }
  PosixStorage storage;
  const std::string dir = TempDirUnder("/dev/shm");
  CheckStorageConformance(storage, dir);
  REQUIRE_OK(RemoveTree(dir));
}

TEST_CASE("storage conformance: fault wrapper with no faults planned") {
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  CheckStorageConformance(storage, TempDir());
  CHECK(storage.faults_injected() == 0);
  CHECK(storage.write_requests() > 0);
  CHECK(storage.read_requests() > 0);
}

// Writes `text` to `path` and syncs the file (not its directory).
void WriteSynced(Storage& s, const std::string& path, const std::string& text) {
  auto f = s.OpenForWrite(path, {});
  REQUIRE_OK(f);
  REQUIRE_OK(WriteAt(**f, 0, text.data(), text.size()));
  REQUIRE_OK((*f)->Sync());
  REQUIRE_OK((*f)->Close());
}

TEST_CASE("storage conformance: memory") {
  MemoryStorage storage;
  REQUIRE_OK(storage.MakeDirs("/work"));
  CheckStorageConformance(storage, "/work");
  CHECK(storage.OpenForRead("relative", {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(storage.MakeDirs("/a/../b").code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("storage conformance: routed to a storage under a URL, and to an object store's model") {
  MemoryStorage base;
  MemoryStorage routed;
  testing::ObjectStoreModel store(&routed);
  RoutedStorage storage(&base);
  storage.AddRoute("mem://bucket/ckpt", &routed, "/keys");
  storage.AddRoute("store://bucket/", &store, "/");
  REQUIRE_OK(routed.MakeDirs("/keys"));
  CheckStorageConformance(storage, "mem://bucket/ckpt");
  CHECK(storage.renames("mem://bucket/ckpt/x"));
  // Everything went to the routed storage, under its own path.
  CHECK(base.List("/")->empty());
  CHECK_FALSE(routed.List("/keys")->empty());

  CheckStorageConformance(storage, "store://bucket/work");
  CHECK_FALSE(storage.renames("store://bucket/work"));
  CHECK(storage.atomic_file_writes("store://bucket/work/f"));
  CHECK_FALSE(storage.atomic_file_writes("/work/f"));
  CHECK(storage.renames("/work"));
}

TEST_CASE("routed storage: whole components, the longest prefix, no rename across storages") {
  MemoryStorage base;
  MemoryStorage a;
  MemoryStorage b;
  RoutedStorage storage(&base);
  storage.AddRoute("s3://bucket/ckpt", &a, "/a");
  storage.AddRoute("s3://bucket/ckpt/big/", &b, "/b");
  REQUIRE_OK(storage.MakeDirs("s3://bucket/ckpt/job"));
  REQUIRE_OK(storage.MakeDirs("s3://bucket/ckpt/big/job"));
  // Not under a route: the base's, which takes absolute paths only.
  CHECK(absl::IsInvalidArgument(storage.MakeDirs("s3://bucket/ckpt2/job")));
  CHECK(a.Stat("/a/job").ok());
  CHECK(b.Stat("/b/job").ok());
  CHECK(absl::IsNotFound(a.Stat("/a/big/job").status()));
  REQUIRE_OK(WriteFileAtomic(storage, "s3://bucket/ckpt/job/f", "x"));
  CHECK(absl::IsUnimplemented(storage.Rename("s3://bucket/ckpt/job/f", "s3://bucket/ckpt/big/f")));
  CHECK(absl::IsUnimplemented(
      storage.Exchange("s3://bucket/ckpt/job/f", "s3://bucket/ckpt/big/job")));
  REQUIRE_OK(storage.Rename("s3://bucket/ckpt/job/f", "s3://bucket/ckpt/job/g"));
  CHECK(a.Stat("/a/job/g").ok());
}

TEST_CASE("storage conformance: fault wrapper over memory") {
  MemoryStorage memory;
  FaultInjectingStorage storage(&memory);
  REQUIRE_OK(storage.MakeDirs("/work"));
  CheckStorageConformance(storage, "/work");
  CHECK(storage.faults_injected() == 0);
}

TEST_CASE("memory storage: a crash keeps what was synced, file by file and entry by entry") {
  MemoryStorage s;
  REQUIRE_OK(s.MakeDirs("/d"));
  REQUIRE_OK(s.SyncDir("/"));
  WriteSynced(s, "/d/kept", "kept");
  WriteSynced(s, "/d/old-name", "renamed");
  WriteSynced(s, "/d/removed", "removed");
  WriteSynced(s, "/d/rewritten", "first");
  REQUIRE_OK(s.SyncDir("/d"));

  WriteSynced(s, "/d/entry-not-synced", "lost");  // its directory is not synced after
  {
    auto f = s.OpenForWrite("/d/rewritten", {});  // new data, never synced
    REQUIRE_OK(f);
    REQUIRE_OK(WriteAt(**f, 0, "second", 6));
    REQUIRE_OK((*f)->Close());
  }
  REQUIRE_OK(s.Rename("/d/old-name", "/d/new-name"));
  REQUIRE_OK(s.Remove("/d/removed"));
  REQUIRE_OK(s.MakeDirs("/d/sub"));
  CHECK(*ReadWholeFile(s, "/d/rewritten", 100) == "second");
  CHECK(*s.List("/d") == std::vector<std::string>{"entry-not-synced", "kept", "new-name",
                                                  "rewritten", "sub"});
  auto open = s.OpenForRead("/d/kept", {});
  REQUIRE_OK(open);

  s.Crash();
  CHECK(*s.List("/d") == std::vector<std::string>{"kept", "old-name", "removed", "rewritten"});
  CHECK(*ReadWholeFile(s, "/d/kept", 100) == "kept");
  CHECK(*ReadWholeFile(s, "/d/old-name", 100) == "renamed");
  CHECK(*ReadWholeFile(s, "/d/removed", 100) == "removed");
  CHECK(*ReadWholeFile(s, "/d/rewritten", 100) == "first");
  // A file opened before the crash belongs to a process that is gone.
  CHECK((*open)->Size().status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("memory storage: CrashAfter(n) lets n changes through, then nothing until Crash()") {
  MemoryStorage s;
  REQUIRE_OK(s.MakeDirs("/d"));  // one change
  CHECK(s.changes() == 1);
  REQUIRE_OK(s.SyncDir("/"));   // two
  s.CrashAfter(3);
  WriteSynced(s, "/d/a", "x");  // open, write and sync: three more
  CHECK(s.changes() == 5);
  CHECK(s.SyncDir("/d").code() == absl::StatusCode::kUnavailable);
  // Dead: reads fail too, and the change that failed was not made.
  CHECK(s.List("/d").status().code() == absl::StatusCode::kUnavailable);
  s.Crash();
  CHECK(s.List("/d")->empty());  // /d/a was never synced into /d
  REQUIRE_OK(s.SyncDir("/d"));   // alive again
}

TEST_CASE("fault plans parse from zccd's key=value spelling; bad ones name the pair") {
  auto plan = ParseFaultPlan("path=model-, op_delay_ms=250,eio_on_write=3,fail_sync=1");
  REQUIRE_OK(plan);
  CHECK(plan->path_filter == "model-");
  CHECK(plan->op_delay == absl::Milliseconds(250));
  CHECK(plan->eio_on_write == 3);
  CHECK(plan->fail_sync);
  CHECK_FALSE(plan->refuse_direct_io);
  CHECK_FALSE(plan->enospc_after_bytes.has_value());
  CHECK(absl::StrContains(DescribeFaultPlan(*plan), "250ms per request"));
  auto empty = ParseFaultPlan("");
  REQUIRE_OK(empty);
  CHECK(empty->op_delay == absl::ZeroDuration());
  for (const char* bad : {"op_delay_ms", "op_delay_ms=-1", "op_delay_ms=5s", "speed=3",
                          "fail_sync=2", "op_delay_ms=999999999"}) {
    auto p = ParseFaultPlan(bad);
    INFO(bad);
    REQUIRE_STATUS_CODE(p, absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(p.status().message(), bad));
  }
}

TEST_CASE("fault wrapper: directory fsync and the k-th rename or exchange fail, within the path") {
  auto plan = ParseFaultPlan("path=job,fail_sync_dir=1,eio_on_rename=2");
  REQUIRE_OK(plan);
  CHECK(plan->fail_sync_dir);
  CHECK(plan->eio_on_rename == 2);
  CHECK(absl::StrContains(DescribeFaultPlan(*plan), "EIO on rename #2"));
  REQUIRE_STATUS_CODE(ParseFaultPlan("fail_sync_dir=3"), absl::StatusCode::kInvalidArgument);

  MemoryStorage memory;
  FaultInjectingStorage storage(&memory, *plan);
  REQUIRE_OK(storage.MakeDirs("/job/a"));
  REQUIRE_OK(storage.MakeDirs("/other"));
  CHECK(storage.SyncDir("/job").code() != absl::StatusCode::kOk);
  REQUIRE_OK(storage.SyncDir("/other"));  // outside the path: no fault
  REQUIRE_OK(storage.Rename("/job/a", "/job/b"));  // rename #1
  const absl::Status second = storage.Rename("/job/b", "/job/c");
  CHECK_FALSE(second.ok());
  CHECK(absl::StrContains(second.message(), "injected"));
  CHECK(memory.Stat("/job/b").ok());  // nothing was renamed
  CHECK(absl::IsNotFound(memory.Stat("/job/c").status()));
  REQUIRE_OK(storage.Rename("/job/b", "/job/c"));  // #3
  CHECK(storage.faults_injected() == 2);
}

TEST_CASE("a file system that refuses O_DIRECT gets buffered I/O and one warning") {
  PosixStorage storage;
  StderrCapture capture;
  std::string first;
  for (int i = 0; i < 3; ++i) {
    // procfs refuses O_DIRECT with EINVAL, like ramfs or an old tmpfs.
    auto f = storage.OpenForRead("/proc/self/status", Direct(4));
    REQUIRE_OK(f);
    CHECK_FALSE((*f)->direct());
    char buf[256] = {};
    auto n = ReadAt(**f, 0, buf, sizeof(buf) - 1);
    REQUIRE_OK(n);
    CHECK(std::string(buf).rfind("Name:", 0) == 0);
  }
  const std::string log = capture.Release();
  CHECK(CountLinesWith(log, "refuses O_DIRECT") == 1);
}

// A direct file written through `storage` with `chunk`-sized requests.
absl::Status WriteChunks(Storage& storage, const std::string& path, const AlignedBuffer& data,
                         size_t chunk) {
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<File> f, storage.OpenForWrite(path, Direct(4)));
  IoPipeline pipe(f.get());
  for (size_t off = 0; off < data.size(); off += chunk) {
    if (pipe.full()) ZCC_RETURN_IF_ERROR(pipe.RetireOldest().status());
    ZCC_RETURN_IF_ERROR(
        pipe.SubmitWrite(off, data.data() + off, std::min(chunk, data.size() - off)));
  }
  ZCC_RETURN_IF_ERROR(pipe.Finish());
  ZCC_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

TEST_CASE("fault wrapper: no space left after N bytes") {
  PosixStorage posix;
  const std::string dir = TempDir();
  FaultPlan plan;
  plan.enospc_after_bytes = 100 << 10;
  FaultInjectingStorage storage(&posix, plan);
  AlignedBuffer data = Pattern(256 << 10, 2);
  const absl::Status st = WriteChunks(storage, JoinPath(dir, "full.bin"), data, 64 << 10);
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(st.message().find("No space left on device") != absl::string_view::npos);
  CHECK(st.message().find("full.bin") != absl::string_view::npos);
  // What fit went to disk: 100 KiB rounded down to whole blocks.
  CHECK(storage.bytes_written() == 100 << 10);
  CHECK(storage.faults_injected() >= 1);
}

TEST_CASE("fault wrapper: EIO on the k-th write and read") {
  PosixStorage posix;
  const std::string dir = TempDir();
  FaultPlan plan;
  plan.eio_on_write = 2;
  FaultInjectingStorage storage(&posix, plan);
  AlignedBuffer data = Pattern(256 << 10, 3);
  const absl::Status st = WriteChunks(storage, JoinPath(dir, "eio.bin"), data, 64 << 10);
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(st.message().find("Input/output error") != absl::string_view::npos);
  CHECK(st.message().find("injected") != absl::string_view::npos);

  storage.SetPlan({});
  REQUIRE_OK(WriteChunks(storage, JoinPath(dir, "ok.bin"), data, 64 << 10));
  FaultPlan read_plan;
  read_plan.eio_on_read = 1;
  storage.SetPlan(read_plan);
  auto f = storage.OpenForRead(JoinPath(dir, "ok.bin"), Direct(2));
  REQUIRE_OK(f);
  AlignedBuffer in(64 << 10);
  CHECK(ReadAt(**f, 0, in.data(), in.size()).status().code() == absl::StatusCode::kInternal);
  auto second = ReadAt(**f, 0, in.data(), in.size());
  REQUIRE_OK(second);
  CHECK(*second == in.size());
}

TEST_CASE("fault wrapper: short writes and reads are continued by IoPipeline") {
  PosixStorage posix;
  const std::string dir = TempDir();
  FaultPlan plan;
  plan.max_write_bytes = 5000;  // 4096 on a direct file
  plan.max_read_bytes = 3 * 4096 + 17;
  FaultInjectingStorage storage(&posix, plan);
  AlignedBuffer data = Pattern(96 << 10, 4);
  const std::string path = JoinPath(dir, "short.bin");
  REQUIRE_OK(WriteChunks(storage, path, data, 32 << 10));
  CHECK(storage.write_requests() >= 3);
  CHECK(*ReadFileToString(path, 1 << 20) == AsString(data.data(), data.size()));

  auto f = storage.OpenForRead(path, Direct(2));
  REQUIRE_OK(f);
  AlignedBuffer in(data.size());
  auto n = ReadAt(**f, 0, in.data(), in.size());
  REQUIRE_OK(n);
  CHECK(*n == data.size());
  CHECK(std::memcmp(in.data(), data.data(), data.size()) == 0);
  CHECK(storage.read_requests() > 1);
  // The continued pieces add up to the bytes asked for, counted once.
  CHECK(storage.bytes_read() == data.size());
}

TEST_CASE("fault wrapper: fdatasync failure, refused O_DIRECT, slow disk, path filter") {
  PosixStorage posix;
  const std::string dir = TempDir();
  AlignedBuffer data = Pattern(16 << 10, 5);

  FaultPlan sync_plan;
  sync_plan.fail_sync = true;
  FaultInjectingStorage storage(&posix, sync_plan);
  const absl::Status st = WriteChunks(storage, JoinPath(dir, "sync.bin"), data, 8 << 10);
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(st.message().find("fdatasync") != absl::string_view::npos);

  FaultPlan refuse;
  refuse.refuse_direct_io = true;
  storage.SetPlan(refuse);
  {
    StderrCapture capture;
    for (int i = 0; i < 2; ++i) {
      auto f = storage.OpenForWrite(JoinPath(dir, "buffered.bin"), Direct(4));
      REQUIRE_OK(f);
      CHECK_FALSE((*f)->direct());
    }
    CHECK(CountLinesWith(capture.Release(), "refuses O_DIRECT") == 1);
  }

  FaultPlan slow;
  slow.op_delay = absl::Milliseconds(20);
  slow.path_filter = "slow";
  storage.SetPlan(slow);
  absl::Time start = absl::Now();
  REQUIRE_OK(WriteChunks(storage, JoinPath(dir, "fast.bin"), data, 4 << 10));
  CHECK(absl::Now() - start < absl::Milliseconds(60));
  CHECK(storage.write_requests() == 0);  // not covered by the filter
  start = absl::Now();
  REQUIRE_OK(WriteChunks(storage, JoinPath(dir, "slow.bin"), data, 4 << 10));
  CHECK(absl::Now() - start >= absl::Milliseconds(4 * 20 + 20));  // 4 writes and a sync
  CHECK(storage.write_requests() == 4);

  // Name operations on covered paths are slow too (a hung file system
  // holds up a stat or a listing as much as a write); others are not.
  REQUIRE_OK(storage.MakeDirs(JoinPath(dir, "fast")));
  start = absl::Now();
  REQUIRE_OK(storage.Stat(JoinPath(dir, "fast.bin")).status());
  REQUIRE_OK(storage.List(JoinPath(dir, "fast")).status());
  REQUIRE_OK(storage.RemoveTree(JoinPath(dir, "fast")));
  CHECK(absl::Now() - start < absl::Milliseconds(20));
  start = absl::Now();
  REQUIRE_OK(storage.MakeDirs(JoinPath(dir, "slowdir")));
  REQUIRE_OK(storage.Stat(JoinPath(dir, "slow.bin")).status());
  REQUIRE_OK(storage.List(JoinPath(dir, "slowdir")).status());
  REQUIRE_OK(storage.Remove(JoinPath(dir, "slow.bin")));
  REQUIRE_OK(storage.RemoveTree(JoinPath(dir, "slowdir")));
  CHECK(absl::Now() - start >= absl::Milliseconds(5 * 20));
}

}  // namespace
}  // namespace zcc::storage
