#include "storage/testing/conformance.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "storage/io_pipeline.h"
#include "storage/whole_file.h"

namespace zcc::storage::testing {

constexpr size_t kA = kDirectIoAlignment;

AlignedBuffer Pattern(size_t n, uint32_t seed) {
  AlignedBuffer b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    b.data()[i] = static_cast<uint8_t>(x >> 24);
  }
  return b;
}

OpenOptions Direct(uint32_t queue_depth) {
  OpenOptions o;
  o.direct = true;
  o.queue_depth = queue_depth;
  return o;
}

std::string AsString(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}


void CheckStorageConformance(Storage& storage, const std::string& dir) {
  const std::string sub = JoinPath(dir, "a/b");
  REQUIRE_OK(storage.MakeDirs(sub));
  REQUIRE_OK(storage.MakeDirs(sub));  // exists already: fine

  // Queued writes from aligned memory, then a cut to an unaligned size.
  const std::string path = JoinPath(sub, "f.bin");
  const size_t chunk = 64 << 10;
  const size_t size = 5 * chunk + 1000;
  AlignedBuffer data = Pattern(AlignUp(size, kA), 1);
  {
    auto file = storage.OpenForWrite(path, Direct(4));
    REQUIRE_OK(file);
    File& f = **file;
    CHECK(f.path() == path);
    CHECK(f.queue_depth() >= 1);
    IoPipeline pipe(&f);
    for (size_t off = 0; off < data.size(); off += chunk) {
      if (pipe.full()) REQUIRE_OK(pipe.RetireOldest());
      const size_t len = std::min(chunk, data.size() - off);
      REQUIRE_OK(pipe.SubmitWrite(off, data.data() + off, len));
    }
    REQUIRE_OK(pipe.Finish());
    REQUIRE_OK(f.Truncate(size));
    REQUIRE_OK(f.Sync());
    auto sz = f.Size();
    REQUIRE_OK(sz);
    CHECK(*sz == size);
    REQUIRE_OK(f.Close());
  }
  auto back = ReadWholeFile(storage, path, 1 << 30);
  REQUIRE_OK(back);
  CHECK(*back == AsString(data.data(), size));

  // Queued reads, the last one running past the end of the file.
  {
    auto file = storage.OpenForRead(path, Direct(4));
    REQUIRE_OK(file);
    File& f = **file;
    CHECK(*f.Size() == size);
    AlignedBuffer in(AlignUp(size, kA));
    IoPipeline pipe(&f);
    std::vector<size_t> got;
    for (size_t off = 0; off < in.size(); off += chunk) {
      if (pipe.full()) {
        auto n = pipe.RetireOldest();
        REQUIRE_OK(n);
        got.push_back(*n);
      }
      REQUIRE_OK(pipe.SubmitRead(off, in.data() + off, std::min(chunk, in.size() - off)));
    }
    while (pipe.pending() > 0) {
      auto n = pipe.RetireOldest();
      REQUIRE_OK(n);
      got.push_back(*n);
    }
    REQUIRE(got.size() == 6);
    CHECK(got.back() == 1000);
    CHECK(std::memcmp(in.data(), data.data(), size) == 0);
    // At and past the end: nothing.
    auto at_end = ReadAt(f, AlignUp(size, kA), in.data(), kA);
    REQUIRE_OK(at_end);
    CHECK(*at_end == 0);
    if (f.direct()) {
      CHECK(f.SubmitRead(1, in.data(), kA, 0).code() == absl::StatusCode::kInvalidArgument);
      CHECK(f.SubmitRead(0, in.data() + 1, kA, 0).code() == absl::StatusCode::kInvalidArgument);
      CHECK(f.SubmitRead(0, in.data(), 100, 0).code() == absl::StatusCode::kInvalidArgument);
    }
    CHECK(f.WaitForCompletion().status().code() == absl::StatusCode::kFailedPrecondition);
  }

  // Buffered files take any offset, length and address.
  const std::string odd = JoinPath(sub, "odd.bin");
  {
    auto file = storage.OpenForWrite(odd, {});
    REQUIRE_OK(file);
    CHECK_FALSE((*file)->direct());
    CHECK((*file)->queue_depth() == 1);
    REQUIRE_OK(WriteAt(**file, 3, data.data() + 7, 10));
    REQUIRE_OK(WriteAt(**file, 0, data.data(), 3));
    CHECK((*file)->SubmitWrite(0, data.data(), 1, 1).ok());
    CHECK((*file)->SubmitWrite(0, data.data(), 1, 2).code() ==
          absl::StatusCode::kFailedPrecondition);
    auto c = (*file)->WaitForCompletion();
    REQUIRE_OK(c);
    CHECK(c->tag == 1);
    // (Synced: where written files appear whole or not at all, one never
    // synced does not appear.)
    REQUIRE_OK((*file)->Sync());
    REQUIRE_OK((*file)->Close());
  }
  {
    auto file = storage.OpenForRead(odd, {});
    REQUIRE_OK(file);
    char buf[32] = {};
    auto n = ReadAt(**file, 1, buf, sizeof(buf));
    REQUIRE_OK(n);
    CHECK(*n == 12);
    CHECK(std::memcmp(buf, data.data() + 1, 2) == 0);
    CHECK(std::memcmp(buf + 2, data.data() + 7, 10) == 0);
  }

  // Names. A backend without rename (an object store) says so.
  const std::string moved = JoinPath(dir, "moved.bin");
  const absl::Status renamed = storage.Rename(path, moved);
  const bool renames = !absl::IsUnimplemented(renamed);
  CHECK(renames == storage.renames(dir));  // says what it does
  if (renames) {
    REQUIRE_OK(renamed);
    REQUIRE_OK(storage.SyncDir(dir));
    CHECK(storage.OpenForRead(path, {}).status().code() == absl::StatusCode::kNotFound);
  } else {
    CHECK(storage.atomic_file_writes(path));  // then written files must appear whole
    REQUIRE_OK(storage.Remove(path));
    REQUIRE_OK(WriteFileAtomic(storage, moved, "moved"));
  }
  REQUIRE_OK(storage.Remove(moved));
  CHECK(storage.Remove(moved).code() == absl::StatusCode::kNotFound);
  CHECK(storage.SyncDir(JoinPath(dir, "missing")).code() == absl::StatusCode::kNotFound);
  CHECK(storage.OpenForWrite(JoinPath(dir, "missing/x"), {}).status().code() ==
        absl::StatusCode::kNotFound);

  // Metadata: Stat, List, RemoveTree, Exchange.
  {
    const std::string meta = JoinPath(dir, "meta");
    REQUIRE_OK(storage.MakeDirs(JoinPath(meta, "d1/inner")));
    REQUIRE_OK(WriteFileAtomic(storage, JoinPath(meta, "f1"), "one"));
    REQUIRE_OK(WriteFileAtomic(storage, JoinPath(meta, "d1/inner/f2"), "two!"));
    auto names = storage.List(meta);
    REQUIRE_OK(names);
    CHECK(*names == std::vector<std::string>{"d1", "f1"});
    auto info = storage.Stat(JoinPath(meta, "f1"));
    REQUIRE_OK(info);
    CHECK_FALSE(info->is_dir);
    CHECK(info->size == 3);
    CHECK(absl::Now() - info->modified < absl::Minutes(5));
    auto dinfo = storage.Stat(JoinPath(meta, "d1"));
    REQUIRE_OK(dinfo);
    CHECK(dinfo->is_dir);
    CHECK(storage.Stat(JoinPath(meta, "nope")).status().code() == absl::StatusCode::kNotFound);
    CHECK(storage.List(JoinPath(meta, "nope")).status().code() == absl::StatusCode::kNotFound);
    CHECK_FALSE(storage.List(JoinPath(meta, "f1")).ok());
    CHECK_FALSE(storage.Remove(JoinPath(meta, "d1")).ok());  // a directory

    // Exchange swaps a file and a directory in one step, where supported.
    const absl::Status swapped = storage.Exchange(JoinPath(meta, "f1"), JoinPath(meta, "d1"));
    if (swapped.ok()) {
      CHECK(storage.Stat(JoinPath(meta, "f1"))->is_dir);
      CHECK(*ReadWholeFile(storage, JoinPath(meta, "d1"), 100) == "one");
      CHECK(*ReadWholeFile(storage, JoinPath(meta, "f1/inner/f2"), 100) == "two!");
      REQUIRE_OK(storage.Exchange(JoinPath(meta, "f1"), JoinPath(meta, "d1")));
    } else {
      CHECK(swapped.code() == absl::StatusCode::kUnimplemented);
    }
    CHECK(storage.Exchange(JoinPath(meta, "f1"), JoinPath(meta, "nope")).code() ==
          absl::StatusCode::kNotFound);

    // A directory renamed over an empty one; never over one that holds files.
    if (renames) {
      REQUIRE_OK(storage.MakeDirs(JoinPath(meta, "empty")));
      REQUIRE_OK(storage.Rename(JoinPath(meta, "d1"), JoinPath(meta, "empty")));
      CHECK(*ReadWholeFile(storage, JoinPath(meta, "empty/inner/f2"), 100) == "two!");
      REQUIRE_OK(storage.MakeDirs(JoinPath(meta, "d2/x")));
      CHECK_FALSE(storage.Rename(JoinPath(meta, "d2"), JoinPath(meta, "empty")).ok());
    } else {
      REQUIRE_OK(storage.MakeDirs(JoinPath(meta, "empty/inner")));
      REQUIRE_OK(WriteFileAtomic(storage, JoinPath(meta, "empty/inner/f2"), "two!"));
    }
    // Atomic writes leave no temporary names behind.
    auto listed = storage.List(JoinPath(meta, "empty/inner"));
    REQUIRE_OK(listed);
    CHECK(*listed == std::vector<std::string>{"f2"});

    // A whole file bigger than the reader's limit is refused.
    CHECK(ReadWholeFile(storage, JoinPath(meta, "f1"), 2).status().code() ==
          absl::StatusCode::kFailedPrecondition);

    REQUIRE_OK(storage.RemoveTree(JoinPath(meta, "empty")));
    REQUIRE_OK(storage.RemoveTree(JoinPath(meta, "empty")));  // nothing there: fine
    CHECK(storage.Stat(JoinPath(meta, "empty/inner/f2")).status().code() ==
          absl::StatusCode::kNotFound);
    REQUIRE_OK(storage.RemoveTree(meta));
    CHECK(storage.Stat(meta).status().code() == absl::StatusCode::kNotFound);
  }
}

}  // namespace zcc::storage::testing
