#include "fuzz/fuzz_targets.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "shm/control_block.h"

namespace zcc::fuzz {

using internal::ByteReader;

int FuzzControlBlock(const uint8_t* data, size_t size) {
  // The bytes a client could have written over the whole block; the daemon
  // maps it at a page boundary, so alignment is as in production. (On the
  // heap: sanitizer fake stacks do not always honour alignas(64).)
  struct alignas(shm::ControlBlock) Storage {
    unsigned char bytes[sizeof(shm::ControlBlock)];
  };
  const auto block = std::make_unique<Storage>();
  unsigned char* storage = block->bytes;
  std::memset(storage, 0, sizeof(block->bytes));
  if (size > 0) std::memcpy(storage, data, std::min(size, sizeof(block->bytes)));
  const auto* cb = reinterpret_cast<const shm::ControlBlock*>(storage);

  for (uint32_t index = 0; index < shm::kMaxSlots; ++index) {
    shm::ReadySlot slot{};
    const absl::Status st = shm::ReadReadySlot(*cb, index, &slot);
    const uint32_t word = cb->slots[index].state.load();
    if (st.ok()) {
      FUZZ_CHECK(word == static_cast<uint32_t>(shm::SlotState::kReady), absl::StrCat(word));
      FUZZ_CHECK(slot.index == index && slot.step >= 0 &&
                     static_cast<uint32_t>(slot.kind) <= static_cast<uint32_t>(shm::SnapshotKind::kFull),
                 absl::StrCat("slot ", index, " step ", slot.step));
    } else if (st.code() == absl::StatusCode::kNotFound) {
      FUZZ_CHECK(word < shm::kNumSlotStates && word != static_cast<uint32_t>(shm::SlotState::kReady),
                 absl::StrCat(word));
    } else {
      FUZZ_CHECK(st.code() == absl::StatusCode::kDataLoss, st.ToString());
    }
    FUZZ_CHECK(shm::ValidateSlotWord(word).ok() == (word < shm::kNumSlotStates), absl::StrCat(word));
  }

  // The client's geometry check against what the daemon announced: the bytes
  // after the block, if any, are the announced values.
  ByteReader rest(data + std::min(size, sizeof(block->bytes)),
                  size - std::min(size, sizeof(block->bytes)));
  const uint32_t num_slots = rest.empty() ? cb->num_slots : rest.U8();
  const uint64_t slot_bytes = rest.empty() ? cb->slot_bytes : rest.U64();
  const uint64_t generation = rest.empty() ? cb->generation : rest.U64();
  const absl::Status geometry = shm::ValidateGeometry(*cb, num_slots, slot_bytes, generation);
  if (geometry.ok()) {
    FUZZ_CHECK(cb->magic == shm::kMagic && cb->version == shm::kLayoutVersion &&
                   cb->num_slots == num_slots && cb->slot_bytes == slot_bytes,
               "geometry accepted with wrong values");
  }
  return 0;
}

}  // namespace zcc::fuzz
