// The slot protocol between a trainer's client and zccd over the slot headers
// of one staging segment. Both sides change slot states only through SlotRing.
//
// States, and who moves a slot between them (the client claims and publishes,
// zccd takes and frees; each move is one compare-and-swap or, by the slot's
// single owner, one release store):
//
//   kFree      --Claim (client)----------------------------------> kFilling
//   kReady     --Claim of a due step (client) takes over a slot
//                that holds an ordinary snapshot zccd has not
//                taken yet; that snapshot is dropped -------------> kFilling
//   kFilling   --Publish (client): step, kind, seq, doorbell------> kReady
//   kFilling   --Abandon (client): the copy failed----------------> kFree
//   kReady     --Take (zccd)-------------------------------------> kIngesting
//   kIngesting --Free (zccd): ingested, or its shards written-----> kFree (free bell)
//   kFree      --ClaimForWrite (zccd): a trainer that died left
//                its newest snapshot here; persist it-------------> kIngesting
//   kFree      --TakeFree (zccd): filled with a restore for the
//                client to copy out----------------------------------> kIngesting
//   (new)      --Hold (zccd, before the client attaches): a segment
//                adopted from the rank's previous trainer keeps a
//                snapshot for a restore from memory---------------> kIngesting
//   (new)      --HoldBack (zccd, before the client attaches): the
//                slot's memory is still being reserved (then Free)-> kIngesting
//
// No slot is held back: an ordinary snapshot takes any free slot, and a step
// due for a checkpoint takes a free slot or, failing that, one whose snapshot
// is still waiting to be ingested. So with one slot held by a checkpoint being
// written, one being ingested and one free, every step finds a slot; a due step
// is only missed when every other slot is being written, ingested or filled.
//
// A slot's step, kind and seq are written by the client before its release
// store of kReady and read by zccd after its acquiring CAS to kIngesting, so
// zccd always reads what was published, even for a slot taken over and
// published again between zccd's first look and its CAS.
//
// Trust: zccd validates every word it reads (a client can write anything
// here); the number of slots is each side's own copy, never read from shared
// memory.
//
// Thread-safety: the client's calls come from its own threads (Claim from the
// training thread, Publish/Abandon from the notifier); zccd's from its ingest
// and writer threads. Every operation is lock-free.
#ifndef ZCC_SHM_SLOT_RING_H_
#define ZCC_SHM_SLOT_RING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "shm/control_block.h"

namespace zcc::shm {

class SlotRing {
 public:
  // `cb` must outlive the ring; `num_slots` is the caller's own count.
  SlotRing(ControlBlock* cb, uint32_t num_slots) : cb_(cb), num_slots_(num_slots) {}

  // ---- client side ----
  struct Claimed {
    uint32_t index = 0;
    // Set when a due step took over a slot holding an ordinary snapshot,
    // which is then lost (counted by the caller as skipped).
    std::optional<int64_t> replaced_step;
  };
  // A slot for a snapshot (now kFilling, its step -1 until Publish: a copy
  // abandoned half written leaves no step there to be taken for intact),
  // or nullopt when none can be had: the free slot holding the oldest
  // snapshot.
  // `due`: the step is due for a checkpoint, and `save_every` (> 0) tells
  // which published steps are ordinary and may be taken over.
  std::optional<Claimed> Claim(bool due, uint32_t save_every);
  // Publishes a filled slot and rings the doorbell.
  void Publish(uint32_t index, int64_t step, SnapshotKind kind);
  // Returns a slot whose copy failed.
  void Abandon(uint32_t index);
  // Slots currently kFree.
  uint32_t FreeCount() const;

  // ---- daemon side ----
  // Slots published and not yet taken, oldest publication first. DataLoss
  // entries name slots whose words are out of range.
  // `after_read` (tests): called with each slot's index once it is read.
  std::vector<ReadySlot> Ready(std::vector<absl::Status>* bad = nullptr,
                               const std::function<void(uint32_t)>& after_read = nullptr) const;
  // Takes a published slot (-> kIngesting) and reads what it holds after the
  // take. NotFound when it was not kReady any more (the client took it over,
  // or another caller took it); DataLoss for out-of-range words (the slot is
  // then kIngesting: the caller frees it).
  absl::StatusOr<ReadySlot> Take(uint32_t index);
  // Frees a slot zccd holds, and rings the free bell.
  void Free(uint32_t index);
  // Claims the free slot `index` for a write of the snapshot of `step` it
  // still holds (the trainer is gone). False when the slot is no longer free
  // or holds another step.
  bool ClaimForWrite(uint32_t index, int64_t step);
  // Before any client attaches to a freshly initialised control block: marks
  // slot `index` as holding the FULL snapshot of `step` that a previous
  // trainer left there (kIngesting: zccd holds it for a restore from memory
  // until it frees it).
  void Hold(uint32_t index, int64_t step);
  // Before any client attaches: keeps slot `index` from the client until
  // zccd frees it (kIngesting, holding no step): its memory is reserved in
  // the background, so that a registration does not wait for all of it.
  void HoldBack(uint32_t index);
  // Takes a free slot for zccd to fill with a restore (kIngesting until
  // Free): the one holding the oldest snapshot. nullopt when none is free.
  std::optional<uint32_t> TakeFree();
  // The step slot `index` holds when it is kFree (the snapshot zccd last
  // ingested from it, unless the trainer claimed it since), else nullopt.
  std::optional<int64_t> FreeSlotStep(uint32_t index) const;
  // Slots not kFree (status).
  uint32_t InUse() const;

 private:
  // A claimed slot holds no step until it is published again.
  void ForgetStep(uint32_t index);

  ControlBlock* cb_;
  uint32_t num_slots_;
};

}  // namespace zcc::shm

#endif  // ZCC_SHM_SLOT_RING_H_
