// Where each registered tensor lives inside a staging slot. The daemon computes
// the layout at registration and sends it to the client; both sides then agree
// on it without further communication.
//
// Tensors are grouped by the shard file they go to (model, optim, extra), each
// group starting on a page boundary and packed without gaps in registration
// order, so that a group is byte-for-byte the data section of its safetensors
// file and can be written straight from the slot.
#ifndef ZCC_SHM_SLOT_LAYOUT_H_
#define ZCC_SHM_SLOT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/tensor_kind.h"

namespace zcc::shm {


struct LayoutInput {
  std::string name;
  uint64_t nbytes = 0;
  format::TensorKind kind = format::TensorKind::kParam;  // picks the file group
};

struct Placement {
  uint64_t offset = 0;  // from the slot start
  uint64_t nbytes = 0;
};

struct GroupRange {
  uint64_t begin = 0;  // from the slot start; page aligned
  uint64_t end = 0;    // begin + sum of the group's tensor bytes
};

struct SlotLayout {
  std::vector<Placement> placements;  // same order as the input
  GroupRange groups[format::kNumTensorKinds];  // indexed by format::TensorKind
  uint64_t slot_bytes = 0;            // page multiple, >= one page
};

// InvalidArgument if the total would exceed `max_slot_bytes`.
absl::StatusOr<SlotLayout> ComputeSlotLayout(const std::vector<LayoutInput>& tensors,
                                             uint64_t max_slot_bytes);

}  // namespace zcc::shm

#endif  // ZCC_SHM_SLOT_LAYOUT_H_
