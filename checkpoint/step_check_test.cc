// CheckStepMetadata against real steps on disk: it accepts a good step and
// returns its grouped index, rejects missing, truncated or mismatched files,
// reads no tensor data (counted through the storage), and so lets a step
// whose tensor bytes are damaged through, for the read (ReadBoxes) to catch.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "checkpoint/committer.h"
#include "checkpoint/global_index.h"
#include "checkpoint/read_progress.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "common/testing/temp_dir.h"
#include "format/box.h"
#include "format/manifest.h"
#include "storage/fault_storage.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

using format::DType;
using format::TensorKind;
using testing::SyntheticRank;
using testing::TensorSpec;
using ::zcc::testing::TempDir;

constexpr uint32_t kWorld = 2;

std::vector<TensorSpec> Specs() {
  return {
      {"embed", DType::kBF16, {1024, 1024}, TensorKind::kParam},  // 2 MiB
      {"norm", DType::kF32, {1024}, TensorKind::kParam},
      {"embed.exp_avg", DType::kF32, {1024, 1024}, TensorKind::kOptim},
      {"rng", DType::kU8, {33}, TensorKind::kExtra},
  };
}

// Writes and commits `step` of kWorld ranks under `root`; returns its
// directory.
std::string WriteStep(const std::string& root, int64_t step,
                      std::vector<SyntheticRank>* ranks = nullptr) {
  std::vector<SyntheticRank> local;
  if (ranks == nullptr) ranks = &local;
  if (ranks->empty()) {
    for (uint32_t r = 0; r < kWorld; ++r) ranks->emplace_back(r, kWorld, Specs());
  }
  for (SyntheticRank& r : *ranks) {
    r.Fill(step);
    REQUIRE_OK(WriteRankShards(root, step, r.shards(), r.slot()));
  }
  auto commit = TryCommit(root, "job", step, kWorld);
  REQUIRE_OK(commit);
  REQUIRE(commit->outcome == CommitOutcome::kCommitted);
  return JoinPath(root, format::StepDirName(step));
}

void FlipByte(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b ^= 0x5a;
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::close(fd);
}

// The largest piece of the step (its bytes are well inside tensor data).
format::ManifestTensor LargestPiece(const std::string& step_dir) {
  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  const format::ManifestTensor* largest = &index->pieces.front();
  for (const auto& p : index->pieces) {
    if (p.nbytes > largest->nbytes) largest = &p;
  }
  return *largest;
}

// Every global tensor of `grouped`, read whole.
absl::StatusOr<ReshardStats> ReadEverything(const std::string& step_dir,
                                            const GroupedIndex& grouped,
                                            std::vector<std::vector<uint8_t>>* out,
                                            const IoOptions& io = IoOptions()) {
  std::vector<BoxTarget> targets;
  out->resize(grouped.tensors.size());
  for (size_t i = 0; i < grouped.tensors.size(); ++i) {
    const GlobalTensor& g = grouped.tensors[i];
    const format::Box box{std::vector<int64_t>(g.global_shape.size(), 0), g.global_shape};
    (*out)[i].assign(format::Volume(box) * format::DTypeSize(g.dtype), 0xEE);
    targets.push_back({g.kind, g.name, g.dtype, g.global_shape, box, (*out)[i].data()});
  }
  return ReadBoxes(step_dir, grouped.index, grouped.tensors, targets, io);
}

uint64_t ShardFiles(const GroupedIndex& grouped) { return grouped.index.files.size(); }

uint64_t TensorBytes(const GroupedIndex& grouped) {
  uint64_t total = 0;
  for (const auto& p : grouped.index.pieces) total += p.nbytes;
  return total;
}

TEST_CASE("CheckStepMetadata accepts a committed step and reads no tensor data") {
  const std::string step_dir = WriteStep(TempDir(), 10);
  storage::PosixStorage posix;
  storage::FaultInjectingStorage counting(&posix);
  IoOptions io;
  io.storage = &counting;

  std::shared_ptr<const GroupedIndex> grouped;
  REQUIRE_OK(CheckStepMetadata(step_dir, io, &grouped));
  REQUIRE(grouped != nullptr);
  auto report = VerifyStep(step_dir);
  REQUIRE_OK(report);
  CHECK(grouped->tensors.size() == report->global_tensors);
  CHECK(grouped->index.pieces.size() == report->tensors);
  // The header of each shard file (one 64 KiB read, continued once where
  // the file is shorter), nothing else.
  const uint64_t tensor_bytes = TensorBytes(*grouped);
  INFO("metadata check read " << counting.bytes_read() << " bytes of shard files in "
                              << counting.read_requests() << " requests");
  CHECK(counting.read_requests() <= 2 * ShardFiles(*grouped));
  CHECK(counting.bytes_read() <= ShardFiles(*grouped) * (128 << 10));
  CHECK(tensor_bytes > 10 * counting.bytes_read());

  // The full verification, through the same counter, reads every tensor.
  counting.SetPlan({});
  REQUIRE_OK(VerifyStep(step_dir, io));
  CHECK(counting.bytes_read() >= tensor_bytes);
}

TEST_CASE("a step whose tensor bytes are damaged passes the metadata check; its read fails") {
  const std::string root = TempDir();
  std::vector<SyntheticRank> ranks;
  WriteStep(root, 10, &ranks);
  const std::string step_dir = WriteStep(root, 20, &ranks);
  const format::ManifestTensor piece = LargestPiece(step_dir);
  FlipByte(JoinPath(step_dir, piece.file), static_cast<off_t>(piece.offset + piece.nbytes / 2));

  std::shared_ptr<const GroupedIndex> grouped;
  REQUIRE_OK(CheckStepMetadata(step_dir, IoOptions(), &grouped));
  REQUIRE_STATUS_CODE(VerifyStep(step_dir), absl::StatusCode::kDataLoss);

  std::vector<std::vector<uint8_t>> got;
  auto read = ReadEverything(step_dir, *grouped, &got);
  REQUIRE_STATUS_CODE(read, absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(read.status().message(), "checksum mismatch"));
  CHECK(absl::StrContains(read.status().message(), piece.name));
  CHECK(absl::StrContains(read.status().message(), piece.file));

  // The metadata check alone picks step 20; the older step reads back whole.
  auto choice = ChooseRestoreStep(root, -1, [](const std::string& dir) {
    return CheckStepMetadata(dir, IoOptions(), nullptr);
  });
  REQUIRE_OK(choice);
  CHECK(choice->step == 20);
  const std::string step10 = JoinPath(root, format::StepDirName(10));
  REQUIRE_OK(CheckStepMetadata(step10, IoOptions(), &grouped));
  REQUIRE_OK(ReadEverything(step10, *grouped, &got));
}

TEST_CASE("CheckStepMetadata rejects damaged metadata, naming the file") {
  const std::string root = TempDir();
  std::vector<SyntheticRank> ranks;
  WriteStep(root, 10, &ranks);
  const std::string step_dir = WriteStep(root, 20, &ranks);
  const format::ManifestTensor piece = LargestPiece(step_dir);
  const std::string shard = JoinPath(step_dir, piece.file);
  absl::StatusCode want = absl::StatusCode::kDataLoss;
  std::string named;  // in the message

  SECTION("a missing shard file") {
    REQUIRE(::unlink(shard.c_str()) == 0);
    want = absl::StatusCode::kNotFound;
    named = piece.file;
  }
  SECTION("a truncated shard file") {
    REQUIRE(::truncate(shard.c_str(), static_cast<off_t>(piece.offset + piece.nbytes / 2)) == 0);
    named = piece.file;
  }
  SECTION("a shard file one byte too long") {
    const int fd = ::open(shard.c_str(), O_WRONLY | O_APPEND);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "x", 1) == 1);
    ::close(fd);
    named = piece.file;
  }
  SECTION("a damaged safetensors header") {
    FlipByte(shard, 9);  // inside the JSON, past the 8-byte length
    named = piece.file;
  }
  SECTION("a damaged COMMITTED") {
    FlipByte(JoinPath(step_dir, format::kCommittedFileName), 3);
    named = format::kCommittedFileName;
  }
  SECTION("a damaged step index") {
    FlipByte(JoinPath(step_dir, format::kStepIndexFileName), 20);
    named = format::kStepIndexFileName;
  }
  SECTION("a damaged manifest") {
    FlipByte(JoinPath(step_dir, format::ManifestFileName(1)), 5);
    named = format::ManifestFileName(1);
  }

  std::shared_ptr<const GroupedIndex> grouped;
  const absl::Status st = CheckStepMetadata(step_dir, IoOptions(), &grouped);
  REQUIRE_STATUS_CODE(st, want);
  INFO(st.message());
  CHECK(absl::StrContains(st.message(), named));
  CHECK(grouped == nullptr);
  // A restore of the latest falls back to the older step, and says why.
  auto choice = ChooseRestoreStep(root, -1, [](const std::string& dir) {
    return CheckStepMetadata(dir, IoOptions(), nullptr);
  });
  REQUIRE_OK(choice);
  CHECK(choice->step == 10);
  REQUIRE(choice->rejected.size() == 1);
  CHECK(absl::StartsWith(choice->rejected[0], format::StepDirName(20)));
}

TEST_CASE("a read reports its progress: every tensor byte once, against its plan") {
  const std::string step_dir = WriteStep(TempDir(), 10);
  std::shared_ptr<const GroupedIndex> grouped;
  REQUIRE_OK(CheckStepMetadata(step_dir, IoOptions(), &grouped));
  ReadProgress progress("restore of test", absl::ZeroDuration());  // a line per chunk
  IoOptions io;
  io.progress = &progress;
  io.chunk_bytes = 256 << 10;  // several chunks per large tensor
  std::vector<std::vector<uint8_t>> got;
  zcc::testing::StderrCapture capture;
  auto stats = ReadEverything(step_dir, *grouped, &got, io);
  const std::string log = capture.Release();
  REQUIRE_OK(stats);
  CHECK(progress.bytes_planned() == TensorBytes(*grouped));
  CHECK(progress.bytes_read() == TensorBytes(*grouped));
  CHECK(stats->bytes_read == TensorBytes(*grouped));
  CHECK(absl::StrContains(log, "restore of test: "));
  CHECK(absl::StrContains(log, "GB/s"));
  CHECK(absl::StrContains(progress.Summary(), "GB read in"));
}

}  // namespace
}  // namespace zcc::checkpoint
