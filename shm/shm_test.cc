#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/testing/status_matchers.h"
#include "shm/control_block.h"
#include "shm/restore_progress.h"
#include "shm/segment.h"
#include "shm/slot_layout.h"
#include "shm/slot_ring.h"

namespace zcc::shm {
namespace {

std::string UniqueName(const char* tag) { return absl::StrCat("zcctest.", tag, ".", getpid()); }

TEST_CASE("slot layout groups tensors by file on page boundaries, without gaps inside a group") {
  std::vector<LayoutInput> in = {
      {"a", 10, format::TensorKind::kParam},  {"m", 100, format::TensorKind::kOptim},
      {"b", 4096, format::TensorKind::kParam}, {"x", 3, format::TensorKind::kExtra},
      {"z", 0, format::TensorKind::kParam},
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
  std::vector<LayoutInput> in = {{"big", 1 << 20, format::TensorKind::kParam}, {"more", 1, format::TensorKind::kParam}};
  CHECK(ComputeSlotLayout(in, 1 << 20).status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<LayoutInput> huge = {{"h", ~uint64_t{0}, format::TensorKind::kParam}};
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
  // Removing what is not there says so (zccd counts only what it removed).
  CHECK(Segment::Remove(name).code() == absl::StatusCode::kNotFound);
}

// Bytes of /dev/shm/<name> actually allocated.
uint64_t AllocatedBytes(const std::string& name) {
  struct stat st;
  REQUIRE(stat(("/dev/shm/" + name).c_str(), &st) == 0);
  return uint64_t{static_cast<uint64_t>(st.st_blocks)} * 512;
}

TEST_CASE("a segment reserves a prefix now and the rest on request; what cannot fit is refused") {
  const std::string name = UniqueName("reserve");
  const uint64_t bytes = ControlBlockBytes() + 8 * kPageBytes;
  auto seg = Segment::Create(name, bytes, static_cast<uid_t>(-1), ControlBlockBytes() + kPageBytes);
  REQUIRE_OK(seg);
  CHECK(AllocatedBytes(name) == ControlBlockBytes() + kPageBytes);
  REQUIRE_OK(seg->Reserve(ControlBlockBytes() + kPageBytes, 7 * kPageBytes));
  CHECK(AllocatedBytes(name) == bytes);
  REQUIRE_OK(seg->Reserve(0, bytes));  // again: nothing new
  CHECK(seg->Reserve(bytes - kPageBytes, 2 * kPageBytes).code() ==
        absl::StatusCode::kInvalidArgument);

  // More than /dev/shm could ever hold, with only the control block now.
  const std::string huge = UniqueName("huge");
  auto refused = Segment::Create(huge, uint64_t{1} << 50, static_cast<uid_t>(-1),
                                 ControlBlockBytes());
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("more bytes; /dev/shm has"));
  CHECK(access(("/dev/shm/" + huge).c_str(), F_OK) != 0);  // removed again
}

TEST_CASE("a segment renamed and resized keeps its memory, its mapping and its bytes") {
  const std::string pooled = UniqueName("pooled");
  const std::string named = UniqueName("named");
  const std::string taken = UniqueName("taken");
  const uint64_t bytes = ControlBlockBytes() + 4 * kPageBytes;
  auto seg = Segment::Create(pooled, bytes);
  REQUIRE_OK(seg);
  const absl::Status populated = seg->Populate(0, bytes);
  CHECK((populated.ok() || absl::IsUnimplemented(populated)));
  CHECK(seg->Populate(kPageBytes, bytes).code() == absl::StatusCode::kInvalidArgument);
  seg->base()[bytes - 1] = 0x5a;

  // A taken name is never replaced.
  auto other = Segment::Create(taken, bytes);
  REQUIRE_OK(other);
  CHECK(seg->Rename(taken, static_cast<uid_t>(-1)).code() == absl::StatusCode::kAlreadyExists);
  CHECK(seg->name() == pooled);

  REQUIRE_OK(seg->Rename(named, geteuid()));
  CHECK(seg->name() == named);
  CHECK(Segment::ListWithPrefix(pooled).empty());
  // Larger: what was written stays, the new part is zero and reserved as asked.
  REQUIRE_OK(seg->Resize(bytes + 8 * kPageBytes, bytes + 2 * kPageBytes));
  CHECK(seg->size() == bytes + 8 * kPageBytes);
  CHECK(AllocatedBytes(named) == bytes + 2 * kPageBytes);
  CHECK(seg->base()[bytes - 1] == 0x5a);
  CHECK(seg->base()[bytes + 8 * kPageBytes - 1] == 0);
  {
    auto opened = Segment::Open(named, bytes + 8 * kPageBytes);
    REQUIRE_OK(opened);
    CHECK(opened->base()[bytes - 1] == 0x5a);
  }
  // Smaller: the tail goes, with its memory.
  REQUIRE_OK(seg->Resize(ControlBlockBytes() + kPageBytes, ~uint64_t{0}));
  CHECK(seg->size() == ControlBlockBytes() + kPageBytes);
  CHECK(AllocatedBytes(named) == ControlBlockBytes() + kPageBytes);
  seg->base()[seg->size() - 1] = 1;
  CHECK(seg->Resize(16, 16).code() == absl::StatusCode::kInvalidArgument);
  // Only the creator renames or resizes.
  auto opened = Segment::Open(named, ControlBlockBytes() + kPageBytes);
  REQUIRE_OK(opened);
  CHECK(opened->Rename(pooled, static_cast<uid_t>(-1)).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(opened->Resize(bytes, bytes).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("restore progress: each read is an attempt of its own, and a stale one publishes "
          "nothing") {
  ControlBlock cb;
  InitControlBlock(&cb, 3, kPageBytes, 1, 2);
  CHECK(ReadRestoreProgress(cb).attempt == 0);
  const uint32_t bell = cb.restore_bell.load();
  const uint64_t first = BeginRestoreRead(&cb, 1);
  CHECK(cb.restore_bell.load() != bell);  // a waiting client wakes
  PublishRestoreReady(&cb, first, 4);
  RestoreProgress p = ReadRestoreProgress(cb);
  CHECK((p.attempt == first && p.slot == 1 && p.ready == 4));
  // A fallback's read into slot 2: counted from 0 again.
  const uint64_t second = BeginRestoreRead(&cb, 2);
  CHECK(second > first);
  p = ReadRestoreProgress(cb);
  CHECK((p.attempt == second && p.slot == 2 && p.ready == 0));
  PublishRestoreReady(&cb, first, 9);  // the old read, late: ignored
  CHECK(ReadRestoreProgress(cb).ready == 0);
  PublishRestoreReady(&cb, second, 2);
  CHECK(ReadRestoreProgress(cb).ready == 2);

  // A sleeping client wakes at the next publication; one that would sleep
  // on a bell already moved does not sleep.
  const uint32_t seen = cb.restore_bell.load();
  std::thread waiter([&] { WaitForRestoreProgress(&cb, seen); });
  while (cb.restore_waiters.load() == 0) std::this_thread::yield();
  PublishRestoreReady(&cb, second, 3);
  waiter.join();
  CHECK(cb.restore_waiters.load() == 0);
  WaitForRestoreProgress(&cb, seen);  // returns at once
}

TEST_CASE("slot ring: a held-back slot is the daemon's until it frees it") {
  alignas(ControlBlock) unsigned char mem[sizeof(ControlBlock)];
  auto* cb = reinterpret_cast<ControlBlock*>(mem);
  InitControlBlock(cb, 3, kPageBytes, 1, 0);
  SlotRing ring(cb, 3);
  ring.HoldBack(1);
  ring.HoldBack(2);
  CHECK(ring.FreeCount() == 1);
  auto first = ring.Claim(false, 0);
  REQUIRE(first.has_value());
  CHECK(first->index == 0);
  CHECK_FALSE(ring.Claim(false, 0).has_value());
  CHECK_FALSE(ring.TakeFree().has_value());
  ring.Free(2);
  auto second = ring.Claim(false, 0);
  REQUIRE(second.has_value());
  CHECK(second->index == 2);
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

SlotState StateOf(const ControlBlock& cb, uint32_t i) {
  return static_cast<SlotState>(cb.slots[i].state.load());
}

TEST_CASE("one check of a slot count, with the caller's name for it") {
  CHECK_OK(ValidateNumSlots(kMinSlots));
  CHECK_OK(ValidateNumSlots(kMaxSlots));
  const absl::Status low = ValidateNumSlots(1, "default_num_slots");
  CHECK(low.code() == absl::StatusCode::kInvalidArgument);
  CHECK(low.message() == "default_num_slots must be in [2, 8], got 1");
  CHECK(ValidateNumSlots(9, "").message() == "must be in [2, 8], got 9");
}

TEST_CASE("slot ring: a snapshot reuses the free slot holding the oldest one, so the slots keep "
          "the newest snapshots; a held slot is never claimed") {
  ControlBlock cb;
  InitControlBlock(&cb, 3, kPageBytes, 1, 0);
  SlotRing client(&cb, 3);
  SlotRing daemon(&cb, 3);
  // Steps 1..6, each ingested and freed before the next: every slot is free
  // at each claim, and the one reused is always the least recently published.
  std::vector<uint32_t> used;
  for (int64_t step = 1; step <= 6; ++step) {
    auto claimed = client.Claim(false, 0);
    REQUIRE(claimed.has_value());
    used.push_back(claimed->index);
    client.Publish(claimed->index, step, SnapshotKind::kFull);
    REQUIRE(daemon.Take(claimed->index).ok());
    daemon.Free(claimed->index);
  }
  CHECK(used == std::vector<uint32_t>{0, 1, 2, 0, 1, 2});
  std::vector<int64_t> kept;
  for (uint32_t i = 0; i < 3; ++i) kept.push_back(*daemon.FreeSlotStep(i));
  CHECK(kept == std::vector<int64_t>{4, 5, 6});

  // Held for a restore from memory (kIngesting): claims pass it over.
  InitControlBlock(&cb, 3, kPageBytes, 2, 0);
  daemon.Hold(1, 41);
  CHECK(StateOf(cb, 1) == SlotState::kIngesting);
  CHECK(cb.slots[1].step.load() == 41);
  CHECK_FALSE(daemon.FreeSlotStep(1).has_value());
  auto a = client.Claim(false, 0);
  auto b = client.Claim(false, 0);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a->index != 1);
  CHECK(b->index != 1);
  CHECK_FALSE(client.Claim(false, 0).has_value());
}

TEST_CASE("slot ring: claim, publish, take and free, oldest publication first") {
  ControlBlock cb;
  InitControlBlock(&cb, 3, kPageBytes, 1, 0);
  SlotRing client(&cb, 3);
  SlotRing daemon(&cb, 3);
  const uint32_t doorbell = cb.doorbell.load();
  auto a = client.Claim(/*due=*/false, 10);
  auto b = client.Claim(false, 10);
  auto c = client.Claim(false, 10);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE(c.has_value());
  CHECK_FALSE(client.Claim(false, 10).has_value());  // all three taken, none held back
  CHECK(StateOf(cb, a->index) == SlotState::kFilling);
  client.Publish(b->index, 7, SnapshotKind::kFull);
  client.Publish(a->index, 8, SnapshotKind::kEmaOnly);
  client.Abandon(c->index);  // its copy failed
  CHECK(cb.doorbell.load() == doorbell + 2);
  CHECK(client.FreeCount() == 1);
  auto ready = daemon.Ready();
  REQUIRE(ready.size() == 2);
  CHECK(ready[0].step == 7);  // publication order, not slot order
  CHECK(ready[1].step == 8);
  auto taken = daemon.Take(ready[0].index);
  REQUIRE_OK(taken);
  CHECK(taken->step == 7);
  CHECK(taken->kind == SnapshotKind::kFull);
  CHECK(daemon.Take(ready[0].index).status().code() == absl::StatusCode::kNotFound);
  CHECK(daemon.InUse() == 2);
  const uint32_t free_bell = cb.free_bell.load();
  daemon.Free(taken->index);
  CHECK(cb.free_bell.load() == free_bell + 1);
  CHECK(client.FreeCount() == 2);
}

TEST_CASE("slot ring: a due step takes over the oldest ordinary snapshot, never a due one") {
  ControlBlock cb;
  InitControlBlock(&cb, 2, kPageBytes, 1, 0);
  SlotRing client(&cb, 2);
  SlotRing daemon(&cb, 2);
  auto first = client.Claim(false, 5);
  auto second = client.Claim(false, 5);
  REQUIRE(first.has_value());
  REQUIRE(second.has_value());
  client.Publish(first->index, 3, SnapshotKind::kFull);
  client.Publish(second->index, 4, SnapshotKind::kFull);
  // zccd looks at both slots before the due step takes one over.
  const std::vector<ReadySlot> seen = daemon.Ready();
  REQUIRE(seen.size() == 2);
  CHECK_FALSE(client.Claim(false, 5).has_value());  // an ordinary step skips
  auto due = client.Claim(/*due=*/true, 5);
  REQUIRE(due.has_value());
  CHECK(due->index == first->index);  // the older of the two
  REQUIRE(due->replaced_step.has_value());
  CHECK(*due->replaced_step == 3);
  client.Publish(due->index, 5, SnapshotKind::kFull);
  // What zccd takes is what the slot holds now, not what it saw.
  for (const ReadySlot& s : seen) {
    CHECK(s.step == (s.index == first->index ? 3 : 4));
    auto taken = daemon.Take(s.index);
    REQUIRE_OK(taken);
    CHECK(taken->step == (s.index == first->index ? 5 : 4));
    daemon.Free(s.index);
  }
  // Both slots now hold published due steps 10 and 15: neither gives way.
  auto x = client.Claim(true, 5);
  auto y = client.Claim(true, 5);
  REQUIRE(x.has_value());
  REQUIRE(y.has_value());
  client.Publish(x->index, 10, SnapshotKind::kFull);
  client.Publish(y->index, 15, SnapshotKind::kFull);
  CHECK_FALSE(client.Claim(true, 5).has_value());
  // Nor is a slot zccd holds (ingesting).
  REQUIRE_OK(daemon.Take(x->index));
  CHECK_FALSE(client.Claim(true, 5).has_value());
}

TEST_CASE("slot ring: a write after the trainer died claims only the slot still holding its step") {
  ControlBlock cb;
  InitControlBlock(&cb, 2, kPageBytes, 1, 0);
  SlotRing client(&cb, 2);
  SlotRing daemon(&cb, 2);
  auto c = client.Claim(false, 0);
  REQUIRE(c.has_value());
  client.Publish(c->index, 9, SnapshotKind::kFull);
  REQUIRE_OK(daemon.Take(c->index));
  daemon.Free(c->index);
  CHECK_FALSE(daemon.ClaimForWrite(c->index, 8));  // holds another step
  CHECK(daemon.ClaimForWrite(c->index, 9));
  CHECK(StateOf(cb, c->index) == SlotState::kIngesting);
  CHECK_FALSE(daemon.ClaimForWrite(c->index, 9));  // not free any more
  daemon.Free(c->index);
  // The trainer was filling it again: a torn copy is never claimed.
  auto again = client.Claim(false, 0);
  REQUIRE(again.has_value());
  CHECK_FALSE(daemon.ClaimForWrite(again->index, 9));
  // Nor once its copy failed and it was given back half written.
  client.Abandon(again->index);
  CHECK(StateOf(cb, again->index) == SlotState::kFree);
  CHECK_FALSE(daemon.ClaimForWrite(again->index, 9));
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
