// The restore path as zccd runs it (RestoreService: CheckStepMetadata to
// choose the step, then ReadRestoreBuffer), against real steps on disk, with
// the disk reads counted by the storage: each tensor byte of the rank is read
// once, and a piece that fails its checksum fails the read and leaves no
// restore buffer behind.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/committer.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "daemon/rank/registered_tensor.h"
#include "daemon/restore/restorer.h"
#include "daemon/testing/registered.h"
#include "daemon/restore/shared_reads.h"
#include "format/manifest.h"
#include "shm/segment.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_storage.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {
namespace {

using checkpoint::testing::SyntheticRank;
using checkpoint::testing::TensorSpec;
using format::DType;
using format::TensorKind;

constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 34;
constexpr uid_t kNoOwner = static_cast<uid_t>(-1);

std::vector<TensorSpec> Specs() {
  return {
      {"embed", DType::kBF16, {1024, 1024}, TensorKind::kParam},  // 2 MiB
      {"norm", DType::kF32, {1000}, TensorKind::kParam},          // not a page multiple
      {"embed.exp_avg", DType::kF32, {1024, 1024}, TensorKind::kOptim},
      {"embed.exp_avg_sq", DType::kF32, {1024, 1024}, TensorKind::kOptim},
      {"rng", DType::kU8, {33}, TensorKind::kExtra},
  };
}

// A 1-rank step `step` of `rank` under `root`; returns its directory.
std::string WriteStep(const std::string& root, int64_t step, SyntheticRank& rank) {
  rank.Fill(step);
  REQUIRE_OK(checkpoint::WriteRankShards(root, step, rank.shards(), rank.slot()));
  auto commit = checkpoint::TryCommit(root, "job", step, 1);
  REQUIRE_OK(commit);
  REQUIRE(commit->outcome == checkpoint::CommitOutcome::kCommitted);
  return JoinPath(root, format::StepDirName(step));
}

// The rank's tensors as the trainer registered them (whole tensors, all
// staged by this rank).
std::vector<RegisteredTensor> Registered(const SyntheticRank& rank) {
  return testing::RegisteredFor(rank.shards());
}

uint64_t TensorBytes(const SyntheticRank& rank) {
  uint64_t total = 0;
  for (const checkpoint::RankTensor& t : rank.shards().tensors) total += t.nbytes;
  return total;
}

std::string SegmentName(const char* what) {
  return absl::StrCat("zcc-restorer-test.", ::getpid(), ".", what);
}

// The restored bytes of every tensor equal the rank's slot.
bool SameAsSlot(SyntheticRank& rank, const RestoreBuffer& buffer) {
  const auto& tensors = rank.shards().tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint8_t* got = buffer.segment.base() + buffer.data_offset + buffer.offsets[i];
    if (std::memcmp(got, rank.slot() + tensors[i].slot_offset, tensors[i].nbytes) != 0) {
      return false;
    }
  }
  return true;
}

// Flips a byte in the middle of the step's largest piece; returns its name.
// Flips a byte in the middle of `piece`'s bytes.
void FlipByteIn(const std::string& step_dir, const format::ManifestTensor& piece) {
  const int fd = ::open(JoinPath(step_dir, piece.file).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const off_t at = static_cast<off_t>(piece.offset + piece.nbytes / 2);
  uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, at) == 1);
  b ^= 0xff;
  REQUIRE(::pwrite(fd, &b, 1, at) == 1);
  ::close(fd);
}

std::string DamageLargestPiece(const std::string& step_dir) {
  auto index = checkpoint::LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  const format::ManifestTensor* piece = &index->pieces.front();
  for (const auto& p : index->pieces) {
    if (p.nbytes > piece->nbytes) piece = &p;
  }
  FlipByteIn(step_dir, *piece);
  return piece->name;
}

// Step 10 of a rank, written, and I/O options whose storage counts what is
// read of it.
struct CountedStep {
  explicit CountedStep(SyntheticRank& rank) : dir(WriteStep(zcc::testing::TempDir(), 10, rank)) {
    io.storage = &counting;
  }
  const std::string dir;
  storage::PosixStorage posix;
  storage::FaultInjectingStorage counting{&posix};
  checkpoint::IoOptions io;
};

// `ranks` replicas of `rank` restore `step_dir` at once, sharing reads.
std::vector<absl::StatusOr<RestoreBuffer>> RestoreTogether(
    int ranks, const std::string& step_dir, const checkpoint::GroupedIndex& grouped,
    const SyntheticRank& rank, const checkpoint::IoOptions& io, SharedReads* shared,
    const std::string& tag) {
  std::vector<absl::StatusOr<RestoreBuffer>> buffers;
  for (int r = 0; r < ranks; ++r) buffers.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      buffers[r] = ReadRestoreBuffer(step_dir, grouped, Registered(rank),
                                     SegmentName(absl::StrCat(tag, r).c_str()), kMaxSlotBytes,
                                     kNoOwner, io, nullptr, false, shared);
    });
  }
  for (std::thread& t : threads) t.join();
  return buffers;
}

TEST_CASE("a restore reads each tensor byte of the rank once, checking it as it arrives") {
  SyntheticRank rank(0, 1, Specs());
  CountedStep step(rank);
  const uint64_t tensor_bytes = TensorBytes(rank);
  const uint64_t tensors = rank.shards().tensors.size();

  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step.dir, step.io, &grouped));
  const uint64_t files = grouped->index.files.size();
  auto buffer = ReadRestoreBuffer(step.dir, *grouped, Registered(rank), SegmentName("once"),
                                  kMaxSlotBytes, kNoOwner, step.io);
  REQUIRE_OK(buffer);
  CHECK(SameAsSlot(rank, *buffer));
  CHECK(buffer->bytes_read == tensor_bytes);
  // On disk: every tensor byte once, plus each shard file's header twice (the
  // metadata check and the read each check it) and the partial blocks at the
  // ends of each run of tensors that direct I/O rounds out to whole blocks.
  const uint64_t slack =
      files * 2 * (64 << 10) + tensors * 2 * storage::kDirectIoAlignment;
  INFO("tensor bytes " << tensor_bytes << ", read from disk " << step.counting.bytes_read()
                       << " in " << files << " files");
  CHECK(step.counting.bytes_read() >= tensor_bytes);
  CHECK(step.counting.bytes_read() <= tensor_bytes + slack);

  // What a restore did before: VerifyStep read the whole step first.
  step.counting.SetPlan({});
  REQUIRE_OK(checkpoint::VerifyStep(step.dir, step.io, &grouped));
  auto again = ReadRestoreBuffer(step.dir, *grouped, Registered(rank), SegmentName("twice"),
                                 kMaxSlotBytes, kNoOwner, step.io);
  REQUIRE_OK(again);
  CHECK(step.counting.bytes_read() >= 2 * tensor_bytes);
}

TEST_CASE("an optional EXTRA tensor the step lacks is restored as zeros and named; a required one fails") {
  SyntheticRank rank(0, 1, Specs());
  CountedStep step(rank);
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step.dir, step.io, &grouped));
  // A rank the writing job did not have: its per-rank state is not in the step.
  std::vector<RegisteredTensor> registered = Registered(rank);
  RegisteredTensor absent = registered.back();
  absent.name = "zcc.r00001.rng";
  absent.optional = true;
  registered.push_back(absent);
  auto buffer = ReadRestoreBuffer(step.dir, *grouped, registered, SegmentName("optional"),
                                  kMaxSlotBytes, kNoOwner, step.io);
  REQUIRE_OK(buffer);
  CHECK(SameAsSlot(rank, *buffer));  // everything the step holds, as written
  const uint8_t* zeros = buffer->segment.base() + buffer->data_offset + buffer->offsets.back();
  CHECK(std::all_of(zeros, zeros + absent.nbytes, [](uint8_t b) { return b == 0; }));
  CHECK(MissingOptional(*grouped, registered) == std::vector<std::string>{"zcc.r00001.rng"});
  // Present optional tensors are not missing, and restore as written.
  registered.back().optional = false;
  registered[registered.size() - 2].optional = true;
  CHECK(MissingOptional(*grouped, {registered[registered.size() - 2]}).empty());
  // Not optional: the restore is refused, naming it.
  auto refused = ReadRestoreBuffer(step.dir, *grouped, registered, SegmentName("required"),
                                   kMaxSlotBytes, kNoOwner, step.io);
  REQUIRE(absl::IsFailedPrecondition(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("zcc.r00001.rng"));
}

TEST_CASE("ranks restoring one step together on a node read each box once between them") {
  SyntheticRank rank(0, 1, Specs());
  CountedStep step(rank);
  const uint64_t tensor_bytes = TensorBytes(rank);
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step.dir, step.io, &grouped));
  const uint64_t metadata_bytes = step.counting.bytes_read();

  // Four replicas of one rank's tensors (a data-parallel job), at once.
  constexpr int kRanks = 4;
  SharedReads shared;
  std::vector<absl::StatusOr<RestoreBuffer>> buffers =
      RestoreTogether(kRanks, step.dir, *grouped, rank, step.io, &shared, "shared");
  uint64_t read_by_ranks = 0;
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE_OK(buffers[r]);
    CHECK(SameAsSlot(rank, *buffers[r]));
    read_by_ranks += buffers[r]->bytes_read;
  }
  CHECK(read_by_ranks == tensor_bytes);
  const uint64_t files = grouped->index.files.size();
  const uint64_t slack = files * 2 * (64 << 10) +
                         rank.shards().tensors.size() * 2 * storage::kDirectIoAlignment;
  const uint64_t disk = step.counting.bytes_read() - metadata_bytes;
  INFO("tensor bytes " << tensor_bytes << ", read from disk " << disk);
  CHECK(disk >= tensor_bytes);
  CHECK(disk <= tensor_bytes + slack);

  // A rank that comes later (within the linger) copies too, even after the
  // others released their buffers.
  buffers.clear();
  auto late = ReadRestoreBuffer(step.dir, *grouped, Registered(rank), SegmentName("late"),
                                kMaxSlotBytes, kNoOwner, step.io, nullptr, false, &shared);
  REQUIRE_OK(late);
  CHECK(late->bytes_read == 0);
  CHECK(SameAsSlot(rank, *late));
}

TEST_CASE("shared boxes are let go after their linger, and then read again") {
  SyntheticRank rank(0, 1, Specs());
  const std::string step_dir = WriteStep(zcc::testing::TempDir(), 10, rank);
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step_dir, checkpoint::IoOptions(), &grouped));
  SharedReads shared(absl::Milliseconds(50));
  auto first = ReadRestoreBuffer(step_dir, *grouped, Registered(rank), SegmentName("linger1"),
                                 kMaxSlotBytes, kNoOwner, checkpoint::IoOptions(), nullptr, false,
                                 &shared);
  REQUIRE_OK(first);
  CHECK(first->bytes_read == TensorBytes(rank));
  absl::SleepFor(absl::Milliseconds(100));
  shared.Expire();
  auto second = ReadRestoreBuffer(step_dir, *grouped, Registered(rank), SegmentName("linger2"),
                                  kMaxSlotBytes, kNoOwner, checkpoint::IoOptions(), nullptr, false,
                                  &shared);
  REQUIRE_OK(second);
  CHECK(second->bytes_read == TensorBytes(rank));
  CHECK(SameAsSlot(rank, *second));
}

TEST_CASE("a shared read whose reader finds a damaged piece fails every rank, none copies it") {
  SyntheticRank rank(0, 1, Specs());
  const std::string step_dir = WriteStep(zcc::testing::TempDir(), 10, rank);
  const std::string damaged = DamageLargestPiece(step_dir);
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step_dir, checkpoint::IoOptions(), &grouped));
  SharedReads shared;
  std::vector<absl::StatusOr<RestoreBuffer>> buffers =
      RestoreTogether(3, step_dir, *grouped, rank, checkpoint::IoOptions(), &shared, "bad");
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE_STATUS_CODE(buffers[r], absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(buffers[r].status().message(), damaged));
  }
}

TEST_CASE("a piece that fails its checksum fails the read; no restore buffer is left") {
  SyntheticRank rank(0, 1, Specs());
  const std::string step_dir = WriteStep(zcc::testing::TempDir(), 10, rank);
  const std::string damaged = DamageLargestPiece(step_dir);

  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step_dir, checkpoint::IoOptions(), &grouped));
  const std::string name = SegmentName("damaged");
  auto buffer = ReadRestoreBuffer(step_dir, *grouped, Registered(rank), name, kMaxSlotBytes,
                                  kNoOwner, checkpoint::IoOptions());
  REQUIRE_STATUS_CODE(buffer, absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(buffer.status().message(), "checksum mismatch"));
  CHECK(absl::StrContains(buffer.status().message(), damaged));
  CHECK(shm::Segment::ListWithPrefix(name).empty());
  CHECK_FALSE(shm::Segment::Open(name, 1).ok());
}

// Flips a byte in the middle of piece `name`'s bytes.
void DamagePiece(const std::string& step_dir, const std::string& name) {
  auto index = checkpoint::LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  const auto piece = std::find_if(index->pieces.begin(), index->pieces.end(),
                                  [&name](const format::ManifestTensor& p) { return p.name == name; });
  REQUIRE(piece != index->pieces.end());
  FlipByteIn(step_dir, *piece);
}

TEST_CASE("a read into a slot reports each tensor once its bytes are in place and checked, never "
          "a damaged one") {
  SyntheticRank rank(0, 1, Specs());
  const std::string step_dir = WriteStep(zcc::testing::TempDir(), 10, rank);
  const std::vector<RegisteredTensor> registered = Registered(rank);
  uint64_t slot_bytes = 0;
  for (const RegisteredTensor& t : registered) {
    slot_bytes = std::max(slot_bytes, t.slot_offset + t.nbytes);
  }
  storage::AlignedBuffer slot = storage::AlignedBuffer::Uninitialized(slot_bytes);
  auto read = [&](std::vector<size_t>* checked) {
    std::shared_ptr<const checkpoint::GroupedIndex> grouped;
    REQUIRE_OK(checkpoint::CheckStepMetadata(step_dir, checkpoint::IoOptions(), &grouped));
    return ReadIntoSlot(step_dir, *grouped, registered, slot.data(), checkpoint::IoOptions(),
                        nullptr, [&](size_t i) {
                          // In place and intact when reported.
                          const checkpoint::RankTensor& t = rank.shards().tensors[i];
                          CHECK(std::memcmp(slot.data() + registered[i].slot_offset,
                                            rank.slot() + t.slot_offset, t.nbytes) == 0);
                          checked->push_back(i);
                        });
  };
  std::vector<size_t> checked;
  REQUIRE_OK(read(&checked));
  std::sort(checked.begin(), checked.end());
  std::vector<size_t> all(registered.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  CHECK(checked == all);  // each once

  // A damaged piece: the read fails, and that tensor is never reported.
  DamagePiece(step_dir, "r0/embed.exp_avg");
  size_t damaged = registered.size();
  for (size_t i = 0; i < registered.size(); ++i) {
    if (registered[i].name == "r0/embed.exp_avg") damaged = i;
  }
  REQUIRE(damaged < registered.size());
  checked.clear();
  auto failed = read(&checked);
  REQUIRE_STATUS_CODE(failed, absl::StatusCode::kDataLoss);
  CHECK(std::find(checked.begin(), checked.end(), damaged) == checked.end());
}

TEST_CASE("a restore buffer can be made of memory made ready before") {
  SyntheticRank rank(0, 1, Specs());
  CountedStep step(rank);
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step.dir, checkpoint::IoOptions(), &grouped));
  const std::string name = SegmentName("made");
  std::vector<std::string> asked;
  auto buffer = ReadRestoreBuffer(
      step.dir, *grouped, Registered(rank), name, kMaxSlotBytes, kNoOwner, step.io, nullptr,
      false, nullptr, [&](const std::string& n, uint64_t bytes, uid_t owner) {
        asked.push_back(n);
        return shm::Segment::Create(n, bytes, owner);
      });
  REQUIRE_OK(buffer);
  CHECK(asked == std::vector<std::string>{name});
  CHECK(SameAsSlot(rank, *buffer));
  // A maker that hands back the wrong size is refused, its segment removed.
  auto wrong = ReadRestoreBuffer(
      step.dir, *grouped, Registered(rank), SegmentName("wrong"), kMaxSlotBytes, kNoOwner, step.io,
      nullptr, false, nullptr, [&](const std::string& n, uint64_t bytes, uid_t owner) {
        return shm::Segment::Create(n, bytes + 4096, owner);
      });
  REQUIRE_STATUS_CODE(wrong, absl::StatusCode::kInternal);
  CHECK(shm::Segment::ListWithPrefix(SegmentName("wrong")).empty());
}

TEST_CASE("a restore cancelled while it reads stops within a chunk; no restore buffer is left") {
  SyntheticRank rank(0, 1, Specs());
  CountedStep step(rank);
  const uint64_t tensor_bytes = TensorBytes(rank);
  step.io.chunk_bytes = 64 << 10;
  std::shared_ptr<const checkpoint::GroupedIndex> grouped;
  REQUIRE_OK(checkpoint::CheckStepMetadata(step.dir, step.io, &grouped));
  step.counting.SetPlan({});
  // The client goes away once the read is under way (the fourth look).
  int looks = 0;
  const std::function<bool()> cancelled = [&looks] { return ++looks > 3; };
  const std::string name = SegmentName("cancelled");
  auto buffer = ReadRestoreBuffer(step.dir, *grouped, Registered(rank), name, kMaxSlotBytes,
                                  kNoOwner, step.io, cancelled);
  REQUIRE_STATUS_CODE(buffer, absl::StatusCode::kCancelled);
  // At most the chunks in flight past the cancellation: far from the step.
  INFO("read " << step.counting.bytes_read() << " of " << tensor_bytes << " bytes");
  CHECK(step.counting.bytes_read() <= (step.io.queue_depth + 4) * step.io.chunk_bytes);
  CHECK(step.counting.bytes_read() < tensor_bytes / 4);
  CHECK(shm::Segment::ListWithPrefix(name).empty());
}

}  // namespace
}  // namespace zcc::daemon
