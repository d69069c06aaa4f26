#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/testing/status_matchers.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_layout.h"

namespace zcc::shm {
namespace {

std::string UniqueName(const char* tag) { return absl::StrCat("zcctest.", tag, ".", getpid()); }

TEST_CASE("slot layout groups tensors by file on page boundaries, without gaps inside a group") {
  std::vector<LayoutInput> in = {
      {"a", 10, FileGroup::kModel},  {"m", 100, FileGroup::kOptim},
      {"b", 4096, FileGroup::kModel}, {"x", 3, FileGroup::kExtra},
      {"z", 0, FileGroup::kModel},
  };
  auto layout = ComputeSlotLayout(in, 1 << 20);
  REQUIRE_OK(layout);
  CHECK(layout->placements[0].offset == 0);
  CHECK(layout->placements[2].offset == 10);     // packed after "a"
  CHECK(layout->placements[4].offset == 4106);   // zero-size tensor at the group end
  CHECK(layout->groups[0].begin == 0);
  CHECK(layout->groups[0].end == 4106);
  CHECK(layout->groups[1].begin == 8192);        // next page
  CHECK(layout->placements[1].offset == 8192);
  CHECK(layout->groups[2].begin == 12288);
  CHECK(layout->placements[3].offset == 12288);
  CHECK(layout->slot_bytes == 16384);
  CHECK(layout->slot_bytes % kPageBytes == 0);
}

TEST_CASE("slot layout refuses more than the staging limit") {
  std::vector<LayoutInput> in = {{"big", 1 << 20, FileGroup::kModel}, {"more", 1, FileGroup::kModel}};
  CHECK(ComputeSlotLayout(in, 1 << 20).status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<LayoutInput> huge = {{"h", ~uint64_t{0}, FileGroup::kModel}};
  CHECK_FALSE(ComputeSlotLayout(huge, 1 << 20).ok());
  CHECK_OK(ComputeSlotLayout({}, 1 << 20));
}

TEST_CASE("a segment is created with mode 0600, opened by size, and removed by its creator only") {
  const std::string name = UniqueName("seg");
  const uint64_t bytes = SegmentBytes(2, kPageBytes);
  {
    auto created = Segment::Create(name, bytes);
    REQUIRE_OK(created);
    struct stat st;
    REQUIRE(stat(absl::StrCat("/dev/shm/", name).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(st.st_uid == geteuid());
    CHECK(Segment::Create(name, bytes).status().code() == absl::StatusCode::kAlreadyExists);
    InitControlBlock(created->control(), 2, kPageBytes, 7, 99);

    auto opened = Segment::Open(name, bytes);
    REQUIRE_OK(opened);
    CHECK_OK(ValidateGeometry(*opened->control(), 2, kPageBytes, 7));
    CHECK(ValidateGeometry(*opened->control(), 2, kPageBytes, 8).code() ==
          absl::StatusCode::kDataLoss);
    std::memset(opened->slot(1, kPageBytes), 0xab, kPageBytes);
    CHECK(created->slot(1, kPageBytes)[17] == 0xab);
    CHECK(Segment::Open(name, bytes + kPageBytes).status().code() == absl::StatusCode::kDataLoss);
    CHECK(Segment::ListWithPrefix(name).size() == 1);
  }
  CHECK(Segment::ListWithPrefix(name).empty());
  CHECK(Segment::Open(name, bytes).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("the daemon's view of a slot rejects out-of-range words") {
  ControlBlock cb;
  InitControlBlock(&cb, 2, kPageBytes, 1, 0);
  ReadySlot slot;
  CHECK(ReadReadySlot(cb, 0, &slot).code() == absl::StatusCode::kNotFound);
  cb.slots[0].step.store(42);
  cb.slots[0].kind.store(static_cast<uint32_t>(SnapshotKind::kFull));
  cb.slots[0].state.store(static_cast<uint32_t>(SlotState::kReady));
  REQUIRE_OK(ReadReadySlot(cb, 0, &slot));
  CHECK(slot.step == 42);
  CHECK(slot.kind == SnapshotKind::kFull);
  cb.slots[0].state.store(77);
  CHECK(ReadReadySlot(cb, 0, &slot).code() == absl::StatusCode::kDataLoss);
  cb.slots[0].state.store(static_cast<uint32_t>(SlotState::kReady));
  cb.slots[0].step.store(-5);
  CHECK(ReadReadySlot(cb, 0, &slot).code() == absl::StatusCode::kDataLoss);
  cb.slots[0].step.store(5);
  cb.slots[0].kind.store(9);
  CHECK(ReadReadySlot(cb, 0, &slot).code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("a futex doorbell in shared memory wakes another process") {
  const std::string name = UniqueName("bell");
  const uint64_t bytes = SegmentBytes(2, kPageBytes);
  auto seg = Segment::Create(name, bytes);
  REQUIRE_OK(seg);
  InitControlBlock(seg->control(), 2, kPageBytes, 1, 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto opened = Segment::Open(name, bytes);
    if (!opened.ok()) _exit(2);
    ControlBlock* cb = opened->control();
    while (cb->doorbell.load() == 0) FutexWait(&cb->doorbell, 0, absl::Seconds(30));
    cb->slots[0].step.store(1234);
    cb->free_bell.fetch_add(1);
    FutexWakeAll(&cb->free_bell);
    _exit(0);
  }
  ControlBlock* cb = seg->control();
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);
  while (cb->free_bell.load() == 0) FutexWait(&cb->free_bell, 0, absl::Seconds(30));
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(cb->slots[0].step.load() == 1234);
}

}  // namespace
}  // namespace zcc::shm
