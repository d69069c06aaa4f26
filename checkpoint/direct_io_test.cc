// The direct-I/O shard writer and reader: byte-exact files, checksums taken
// while writing, reads in place and through bounce buffers, and the buffered
// fallback where a file system refuses O_DIRECT.
#include <sys/mount.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "checkpoint/shard_file_writer.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "common/testing/temp_dir.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/safetensors.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_storage.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

using format::DType;
using format::TensorKind;
using testing::SyntheticRank;
using testing::TensorSpec;
using ::zcc::testing::CountLinesWith;
using ::zcc::testing::StderrCapture;
using ::zcc::testing::TempDir;
using ::zcc::testing::TempDirUnder;

// Odd sizes everywhere: a tensor smaller than a block, one just over a block,
// zero-sized ones (first, middle, last), an empty optim group and an extra
// group of one byte, so every file ends in a partial block.
std::vector<TensorSpec> OddSpecs() {
  return {
      {"empty_first", DType::kF32, {0}, format::TensorKind::kParam},
      {"w", DType::kBF16, {3, 5}, format::TensorKind::kParam},
      {"just_over_a_block", DType::kU8, {4097}, format::TensorKind::kParam},
      {"empty_mid", DType::kF32, {4, 0}, format::TensorKind::kParam},
      {"big", DType::kF32, {3, 11111}, format::TensorKind::kParam},
      {"h", DType::kF16, {1}, format::TensorKind::kParam},
      {"empty_last", DType::kI64, {0, 7}, format::TensorKind::kParam},
      {"rng", DType::kU8, {1}, format::TensorKind::kExtra},
  };
}

IoOptions SmallChunks(storage::Storage* storage = nullptr) {
  IoOptions o;
  o.storage = storage;
  o.queue_depth = 3;
  o.chunk_bytes = 16 << 10;
  return o;
}

// Checks every shard file of `rank` in `dir` against the slot it came from:
// a valid safetensors file whose data section is byte-for-byte the group's
// slot range, and a manifest whose checksums are format::Xxh3 of the bytes.
void CheckFilesMatchSlot(const std::string& dir, SyntheticRank& rank) {
  auto text =
      ReadFileToString(JoinPath(dir, format::ManifestFileName(rank.shards().rank)), 1 << 24);
  REQUIRE_OK(text);
  auto manifest = format::DecodeRankManifest(*text);
  REQUIRE_OK(manifest);
  const RankShards& shards = rank.shards();
  for (uint32_t g = 0; g < format::kNumTensorKinds; ++g) {
    const auto group = static_cast<format::TensorKind>(g);
    const shm::GroupRange range = shards.layout.groups[g];
    const std::string name = ShardFileForKind(group, shards.rank);
    size_t members = 0;
    for (const RankTensor& t : shards.tensors) members += t.kind == group;
    INFO(name);
    if (members == 0) {
      CHECK_FALSE(PathExists(JoinPath(dir, name)));
      continue;
    }
    auto bytes = ReadFileToString(JoinPath(dir, name), 1 << 30);
    REQUIRE_OK(bytes);
    auto header = format::DecodeSafetensorsHeader(*bytes, bytes->size());
    REQUIRE_OK(header);
    CHECK(header->data_start % storage::kDirectIoAlignment == 0);
    CHECK(header->tensors.size() == members);
    const uint64_t data_bytes = range.end - range.begin;
    REQUIRE(bytes->size() == header->data_start + data_bytes);
    CHECK(std::memcmp(bytes->data() + header->data_start, rank.slot() + range.begin, data_bytes) ==
          0);
  }
  size_t checked = 0;
  for (const RankTensor& t : shards.tensors) {
    for (const format::ManifestTensor& mt : manifest->tensors) {
      if (mt.name != t.name) continue;
      INFO(t.name);
      CHECK(mt.nbytes == t.nbytes);
      CHECK(mt.xxh3 == format::Xxh3(rank.slot() + t.slot_offset, t.nbytes));
      auto bytes = ReadFileToString(JoinPath(dir, mt.file), 1 << 30);
      REQUIRE_OK(bytes);
      REQUIRE(mt.offset + mt.nbytes <= bytes->size());
      CHECK(std::memcmp(bytes->data() + mt.offset, rank.slot() + t.slot_offset, t.nbytes) == 0);
      ++checked;
    }
  }
  CHECK(checked == shards.tensors.size());
}

TEST_CASE(
    "direct writer: files are byte-exact, odd sizes, zero-size tensors, empty groups, tails") {
  for (size_t shift : {size_t{0}, size_t{16}}) {
    INFO("slot shifted by " << shift << " bytes from a page boundary");
    const std::string root = TempDir();
    SyntheticRank rank(0, 1, OddSpecs(), shift);
    rank.Fill(7);
    auto stats = WriteRankShards(root, 7, rank.shards(), rank.slot(), SmallChunks());
    REQUIRE_OK(stats);
    if (!stats->direct_io) WARN("the test directory's file system refuses O_DIRECT");
    const std::string partial = JoinPath(root, format::PartialStepDirName(7));
    CheckFilesMatchSlot(partial, rank);

    auto commit = TryCommit(root, "job", 7, 1);
    REQUIRE_OK(commit);
    REQUIRE(commit->outcome == CommitOutcome::kCommitted);
    const std::string step_dir = JoinPath(root, format::StepDirName(7));
    auto report = VerifyStep(step_dir, SmallChunks());
    REQUIRE_OK(report);
    CHECK(report->tensors == rank.shards().tensors.size());
    REQUIRE_OK(VerifyStep(step_dir));
  }
}

TEST_CASE("direct writer: many chunks in flight, page-aligned slot or not") {
  const std::vector<TensorSpec> specs = {
      {"a", DType::kF32, {1000, 777}, format::TensorKind::kParam},  // 3,108,000 bytes
      {"b", DType::kBF16, {12345}, format::TensorKind::kParam},
      {"a.exp_avg", DType::kF32, {1000, 777}, format::TensorKind::kOptim},
      {"a.exp_avg_sq", DType::kF32, {1000, 777}, format::TensorKind::kOptim},
      {"step", DType::kI64, {1}, format::TensorKind::kExtra},
  };
  for (size_t shift : {size_t{0}, size_t{4096 + 8}}) {
    for (uint32_t depth : {1u, 4u, 8u}) {
      INFO("shift " << shift << " depth " << depth);
      const std::string root = TempDir();
      SyntheticRank rank(3, 4, specs, shift);
      rank.Fill(depth);
      IoOptions options;
      options.queue_depth = depth;
      options.chunk_bytes = 256 << 10;
      auto stats = WriteRankShards(root, 1, rank.shards(), rank.slot(), options);
      REQUIRE_OK(stats);
      CheckFilesMatchSlot(JoinPath(root, format::PartialStepDirName(1)), rank);
    }
  }
}

TEST_CASE("direct writer: the source must tile the data section and the header must be padded") {
  storage::PosixStorage posix;
  const std::string dir = TempDir();
  std::string header(4096, ' ');
  std::vector<uint8_t> data(100);
  ShardFileSource source;
  source.path = JoinPath(dir, "x.safetensors");
  source.header = header;
  source.data = data.data();
  source.data_bytes = data.size();
  source.tensor_bytes = {60, 30};
  CHECK(WriteShardFile(posix, source, IoOptions()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  source.tensor_bytes = {60, 40};
  header.resize(4000);
  source.header = header;
  auto unpadded = WriteShardFile(posix, source, IoOptions());
  auto file = posix.OpenForWrite(JoinPath(dir, "probe"), storage::OpenOptions{true, 1});
  REQUIRE_OK(file);
  if ((*file)->direct()) {
    CHECK(unpadded.status().code() == absl::StatusCode::kInvalidArgument);
  } else {
    CHECK_OK(unpadded);  // buffered files need no padding
  }
  header.resize(4096);
  source.header = header;
  auto written = WriteShardFile(posix, source, IoOptions());
  REQUIRE_OK(written);
  CHECK(written->file_bytes == 4196);
  CHECK(written->xxh3 ==
        std::vector<uint64_t>{format::Xxh3(data.data(), 60), format::Xxh3(data.data() + 60, 40)});
}

TEST_CASE("reader: in place into an aligned slot, through bounce buffers elsewhere, short reads") {
  const std::string root = TempDir();
  SyntheticRank rank(0, 1, OddSpecs());
  rank.Fill(3);
  REQUIRE_OK(WriteRankShards(root, 3, rank.shards(), rank.slot()));
  REQUIRE_OK(TryCommit(root, "job", 3, 1));
  const std::string step_dir = JoinPath(root, format::StepDirName(3));

  storage::PosixStorage posix;
  storage::FaultPlan short_reads;
  short_reads.max_read_bytes = 5000;
  storage::FaultInjectingStorage faulty(&posix, short_reads);
  for (IoOptions options : {IoOptions(), SmallChunks(), SmallChunks(&faulty)}) {
    for (size_t shift : {size_t{0}, size_t{1}, size_t{4096 + 512}}) {
      INFO("shift " << shift << " chunk " << options.chunk_bytes);
      storage::AlignedBuffer back(rank.slot_bytes() + shift);
      std::memset(back.data(), 0xee, back.size());
      REQUIRE_OK(ReadRankTensors(step_dir, 0, rank.Targets(back.data() + shift), options));
      CHECK(rank.SameTensors(back.data() + shift));
      // Nothing outside the tensors was written.
      for (size_t i = 0; i < shift; ++i) REQUIRE(back.data()[i] == 0xee);
    }
  }
  CHECK(faulty.read_requests() > 0);

  // A subset, in reverse order: runs with gaps between them.
  storage::AlignedBuffer back(rank.slot_bytes());
  std::vector<ReadTarget> all = rank.Targets(back.data());
  std::vector<ReadTarget> some = {all[5], all[4], all[1]};
  REQUIRE_OK(ReadRankTensors(step_dir, 0, some, SmallChunks()));
  for (int i : {1, 4, 5}) {
    const RankTensor& t = rank.shards().tensors[i];
    CHECK(std::memcmp(back.data() + t.slot_offset, rank.slot() + t.slot_offset, t.nbytes) == 0);
  }
  const RankTensor& skipped = rank.shards().tensors[2];
  CHECK(std::all_of(back.data() + skipped.slot_offset,
                    back.data() + skipped.slot_offset + skipped.nbytes,
                    [](uint8_t b) { return b == 0; }));
}

TEST_CASE("reader: a flipped bit is caught whichever way the bytes travel") {
  const std::string root = TempDir();
  SyntheticRank rank(0, 1, OddSpecs());
  rank.Fill(4);
  REQUIRE_OK(WriteRankShards(root, 4, rank.shards(), rank.slot()));
  REQUIRE_OK(TryCommit(root, "job", 4, 1));
  const std::string step_dir = JoinPath(root, format::StepDirName(4));
  // A byte in the middle of "big" (past the first blocks, so an in-place read
  // lands it without a bounce buffer).
  const std::string file = JoinPath(step_dir, ShardFileForKind(format::TensorKind::kParam, 0));
  auto bytes = ReadFileToString(file, 1 << 30);
  REQUIRE_OK(bytes);
  (*bytes)[bytes->size() - 50000] ^= 0x10;
  REQUIRE_OK(WriteFileAtomic(file, *bytes));
  for (IoOptions options : {IoOptions(), SmallChunks()}) {
    auto st = VerifyStep(step_dir, options);
    CHECK(st.status().code() == absl::StatusCode::kDataLoss);
    CHECK(st.status().message().find("checksum mismatch for tensor 'r0/big'") != std::string::npos);
    storage::AlignedBuffer back(rank.slot_bytes());
    const absl::Status read = ReadRankTensors(step_dir, 0, rank.Targets(back.data()), options);
    CHECK(read.code() == absl::StatusCode::kDataLoss);
  }
}

// Writes, commits, verifies and reads back a one-rank checkpoint under
// `root` through `storage`; returns the writer's stats.
WriteStats RoundTrip(const std::string& root, storage::Storage* storage) {
  SyntheticRank rank(0, 1, OddSpecs());
  rank.Fill(5);
  IoOptions options = SmallChunks(storage);
  auto stats = WriteRankShards(root, 5, rank.shards(), rank.slot(), options);
  REQUIRE_OK(stats);
  CheckFilesMatchSlot(JoinPath(root, format::PartialStepDirName(5)), rank);
  auto commit = TryCommit(root, "job", 5, 1);
  REQUIRE_OK(commit);
  REQUIRE(commit->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, format::StepDirName(5));
  REQUIRE_OK(VerifyStep(step_dir, options));
  storage::AlignedBuffer back(rank.slot_bytes());
  REQUIRE_OK(ReadRankTensors(step_dir, 0, rank.Targets(back.data()), options));
  CHECK(rank.SameTensors(back.data()));
  return *stats;
}

TEST_CASE(
    "fallback: a file system that refuses O_DIRECT (injected) gets buffered files and one "
    "warning") {
  storage::PosixStorage posix;
  storage::FaultPlan plan;
  plan.refuse_direct_io = true;
  storage::FaultInjectingStorage refusing(&posix, plan);
  StderrCapture capture;
  const WriteStats stats = RoundTrip(TempDir(), &refusing);
  const std::string log = capture.Release();
  CHECK_FALSE(stats.direct_io);
  CHECK(CountLinesWith(log, "falling back to buffered I/O") == 1);
}

TEST_CASE("fallback: a checkpoint under /dev/shm (tmpfs)") {
  if (!PathExists("/dev/shm")) {
    WARN("no /dev/shm on this machine; skipped");
    return;
  }
  const std::string root = TempDirUnder("/dev/shm");
  storage::PosixStorage posix;  // its own, so its one warning is ours to see
  StderrCapture capture;
  const WriteStats stats = RoundTrip(root, &posix);
  const std::string log = capture.Release();
  if (stats.direct_io) {
    // Linux 6.6 and later accept O_DIRECT on tmpfs (served from the page
    // cache), so nothing falls back there; the injected and ramfs cases
    // cover the fallback.
    CHECK(CountLinesWith(log, "falling back to buffered I/O") == 0);
    WARN(
        "this kernel's tmpfs accepts O_DIRECT: the checkpoint under /dev/shm was written with "
        "direct I/O, no fallback needed");
  } else {
    CHECK(CountLinesWith(log, "falling back to buffered I/O") == 1);
  }
  REQUIRE_OK(RemoveTree(root));
}

TEST_CASE("fallback: a checkpoint on ramfs, which refuses O_DIRECT") {
  const std::string mnt = TempDir();
  if (::mount("ramfs", mnt.c_str(), "ramfs", 0, nullptr) != 0) {
    WARN("cannot mount ramfs here (" << std::strerror(errno)
                                     << "); the real O_DIRECT refusal is not exercised");
    return;
  }
  storage::PosixStorage posix;
  WriteStats stats;
  std::string log;
  {
    StderrCapture capture;
    stats = RoundTrip(mnt, &posix);
    log = capture.Release();
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
  CHECK_FALSE(stats.direct_io);
  CHECK(CountLinesWith(log, "refuses O_DIRECT (EINVAL); falling back to buffered I/O") == 1);
}

}  // namespace
}  // namespace zcc::checkpoint
