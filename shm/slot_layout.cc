#include "shm/slot_layout.h"

#include "absl/strings/str_cat.h"
#include "shm/control_block.h"

namespace zcc::shm {

absl::StatusOr<SlotLayout> ComputeSlotLayout(const std::vector<LayoutInput>& tensors,
                                             uint64_t max_slot_bytes) {
  SlotLayout layout;
  layout.placements.resize(tensors.size());
  uint64_t cursor = 0;
  for (uint32_t g = 0; g < format::kNumTensorKinds; ++g) {
    cursor = RoundUpToPage(cursor);
    layout.groups[g].begin = cursor;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (static_cast<uint32_t>(tensors[i].kind) != g) continue;
      if (tensors[i].nbytes > max_slot_bytes || cursor > max_slot_bytes - tensors[i].nbytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "registered tensors need more than the staging limit of ", max_slot_bytes,
            " bytes per slot (at tensor '", tensors[i].name, "')"));
      }
      layout.placements[i] = Placement{cursor, tensors[i].nbytes};
      cursor += tensors[i].nbytes;
    }
    layout.groups[g].end = cursor;
  }
  layout.slot_bytes = RoundUpToPage(cursor == 0 ? 1 : cursor);
  if (layout.slot_bytes > max_slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a slot would need ", layout.slot_bytes,
                                                   " bytes; the limit is ", max_slot_bytes));
  }
  return layout;
}

}  // namespace zcc::shm
