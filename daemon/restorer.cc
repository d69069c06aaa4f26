#include "daemon/restorer.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/global_index.h"
#include "checkpoint/read_progress.h"
#include "checkpoint/reshard.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/slot_layout.h"

namespace zcc::daemon {

namespace {

// Reads `registered[i]` into base + offsets[i] for every `wanted[i]`.
absl::StatusOr<uint64_t> ReadInto(const std::string& step_dir, const checkpoint::GroupedIndex& step,
                                  const std::vector<RegisteredTensor>& registered,
                                  const std::vector<bool>& wanted,
                                  const std::vector<uint64_t>& offsets, uint8_t* base,
                                  const checkpoint::IoOptions& io,
                                  const std::function<bool()>& cancelled) {
  std::vector<checkpoint::BoxTarget> targets;
  for (size_t i = 0; i < registered.size(); ++i) {
    if (!wanted[i]) continue;
    const RegisteredTensor& t = registered[i];
    targets.push_back({format::TensorKindName(t.kind), t.name, t.dtype, t.global(), t.box(),
                       base + offsets[i]});
  }
  // A restore of hundreds of GB takes minutes: say how far it has come.
  checkpoint::ReadProgress progress(absl::StrCat("restore of ", step_dir));
  checkpoint::IoOptions read_io = io;
  if (read_io.progress == nullptr) read_io.progress = &progress;
  ZCC_ASSIGN_OR_RETURN(checkpoint::ReshardStats stats,
                       checkpoint::ReadBoxes(step_dir, step.index, step.tensors, targets, read_io,
                                             uint64_t{256} << 20, cancelled));
  if (cancelled && cancelled()) {
    return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
  }
  return stats.bytes_read;
}

}  // namespace

absl::StatusOr<uint64_t> ReadIntoSlot(const std::string& step_dir,
                                      const checkpoint::GroupedIndex& step,
                                      const std::vector<RegisteredTensor>& registered,
                                      uint8_t* slot, const checkpoint::IoOptions& io,
                                      const std::function<bool()>& cancelled) {
  std::vector<bool> wanted;
  std::vector<uint64_t> offsets;
  for (const RegisteredTensor& t : registered) {
    wanted.push_back(t.staged);
    offsets.push_back(t.staged ? t.slot_offset : 0);
  }
  return ReadInto(step_dir, step, registered, wanted, offsets, slot, io, cancelled);
}

absl::StatusOr<RestoreBuffer> ReadRestoreBuffer(const std::string& step_dir,
                                                const checkpoint::GroupedIndex& step,
                                                const std::vector<RegisteredTensor>& registered,
                                                const std::string& shm_name,
                                                uint64_t max_bytes, uid_t owner,
                                                const checkpoint::IoOptions& io,
                                                const std::function<bool()>& cancelled,
                                                bool owned_only) {
  auto check_cancelled = [&cancelled]() -> absl::Status {
    if (cancelled && cancelled()) {
      return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
    }
    return absl::OkStatus();
  };
  // Through the step's global index, each registered box is filled from the
  // saved pieces that overlap it, whatever layout wrote them.
  ZCC_RETURN_IF_ERROR(check_cancelled());

  std::vector<bool> wanted;
  std::vector<shm::LayoutInput> inputs;
  for (const RegisteredTensor& t : registered) {
    wanted.push_back(!owned_only || t.staged);
    if (wanted.back()) inputs.push_back({t.name, t.nbytes, t.kind});
  }
  ZCC_ASSIGN_OR_RETURN(shm::SlotLayout layout, shm::ComputeSlotLayout(inputs, max_bytes));
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       shm::Segment::Create(shm_name, shm::SegmentBytes(1, layout.slot_bytes), owner));
  RestoreBuffer buffer{std::move(segment), shm::ControlBlockBytes(), {}, wanted};
  uint8_t* base = buffer.segment.base() + buffer.data_offset;

  size_t placed = 0;
  for (size_t i = 0; i < registered.size(); ++i) {
    buffer.offsets.push_back(wanted[i] ? layout.placements[placed++].offset : 0);
  }
  ZCC_ASSIGN_OR_RETURN(buffer.bytes_read, ReadInto(step_dir, step, registered, wanted,
                                                   buffer.offsets, base, io, cancelled));
  return buffer;
}

}  // namespace zcc::daemon
