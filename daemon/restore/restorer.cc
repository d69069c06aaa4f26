#include "daemon/restore/restorer.h"

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/global_index.h"
#include "checkpoint/read_progress.h"
#include "checkpoint/reshard.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/box.h"
#include "format/dtype.h"
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
                                  const std::function<bool()>& cancelled,
                                  const std::function<void(size_t registered)>& checked = nullptr) {
  std::vector<checkpoint::BoxTarget> targets;
  std::vector<size_t> registered_of;  // per target
  for (size_t i = 0; i < registered.size(); ++i) {
    if (!wanted[i]) continue;
    const RegisteredTensor& t = registered[i];
    targets.push_back({format::TensorKindName(t.kind), t.name, t.dtype, t.global(), t.box(),
                       base + offsets[i], t.optional});
    registered_of.push_back(i);
  }
  std::function<void(size_t)> target_done;
  if (checked) target_done = [&](size_t target) { checked(registered_of[target]); };
  // A restore of hundreds of GB takes minutes: say how far it has come.
  checkpoint::ReadProgress progress(absl::StrCat("restore of ", step_dir));
  checkpoint::IoOptions read_io = io;
  if (read_io.progress == nullptr) read_io.progress = &progress;
  // Stops within a chunk of being cancelled, not at the end of a shard file.
  if (read_io.cancelled == nullptr && cancelled) read_io.cancelled = &cancelled;
  ZCC_ASSIGN_OR_RETURN(checkpoint::ReshardStats stats,
                       checkpoint::ReadBoxes(step_dir, step.index, step.tensors, targets, read_io,
                                             uint64_t{256} << 20, cancelled, target_done));
  if (cancelled && cancelled()) {
    return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
  }
  return stats.bytes_read;
}

// What identifies a box of a step for SharedReads.
std::string BoxKey(const std::string& step_dir, const RegisteredTensor& t) {
  const format::Box box = t.box();
  return absl::StrCat(step_dir, "|", format::TensorKindName(t.kind), "|", t.name, "|",
                      format::DTypeName(t.dtype), "|", absl::StrJoin(t.global(), ","), "|",
                      format::BoxToString(box));
}

// ReadRestoreBuffer's read with the other ranks restoring the step on this
// node (daemon/restore/shared_reads.h): reads the boxes this rank claims, publishes
// them, then copies the others' boxes (reading any whose reader failed).
// Returns the bytes read from disk.
absl::StatusOr<uint64_t> ReadShared(const std::string& step_dir,
                                    const checkpoint::GroupedIndex& step,
                                    const std::vector<RegisteredTensor>& registered,
                                    const std::vector<bool>& wanted, const RestoreBuffer& buffer,
                                    const std::string& shm_name, SharedReads& shared,
                                    const checkpoint::IoOptions& io,
                                    const std::function<bool()>& cancelled) {
  uint8_t* base = buffer.segment.base() + buffer.data_offset;
  // A mapping of its own, which the ranks copying out of this buffer keep
  // for as long as they may need it.
  ZCC_ASSIGN_OR_RETURN(shm::Segment second, shm::Segment::Open(shm_name, buffer.segment.size()));
  auto holder = std::make_shared<const shm::Segment>(std::move(second));
  const uint8_t* held = holder->base() + buffer.data_offset;
  std::vector<std::string> keys(registered.size());
  std::vector<bool> mine(registered.size(), false);
  std::vector<bool> theirs(registered.size(), false);
  for (size_t i = 0; i < registered.size(); ++i) {
    if (!wanted[i]) continue;
    keys[i] = BoxKey(step_dir, registered[i]);
    (shared.Claim(keys[i]) ? mine : theirs)[i] = true;
  }
  absl::StatusOr<uint64_t> read =
      ReadInto(step_dir, step, registered, mine, buffer.offsets, base, io, cancelled);
  for (size_t i = 0; i < registered.size(); ++i) {
    if (!mine[i]) continue;
    if (read.ok()) {
      shared.Land(keys[i], holder, held + buffer.offsets[i], registered[i].nbytes);
    } else {
      shared.Fail(keys[i]);
    }
  }
  if (!read.ok()) return read.status();
  uint64_t bytes_read = *read;
  std::vector<bool> again(registered.size(), false);
  bool any_again = false;
  for (size_t i = 0; i < registered.size(); ++i) {
    if (!theirs[i]) continue;
    std::optional<SharedReads::Landed> landed = shared.Await(keys[i], cancelled);
    if (landed.has_value() && landed->bytes == registered[i].nbytes) {
      std::memcpy(base + buffer.offsets[i], landed->data, registered[i].nbytes);
    } else {
      again[i] = any_again = true;
    }
  }
  if (cancelled && cancelled()) {
    return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
  }
  if (any_again) {
    ZCC_ASSIGN_OR_RETURN(uint64_t more, ReadInto(step_dir, step, registered, again,
                                                 buffer.offsets, base, io, cancelled));
    bytes_read += more;
  }
  return bytes_read;
}

}  // namespace

absl::StatusOr<uint64_t> ReadIntoSlot(const std::string& step_dir,
                                      const checkpoint::GroupedIndex& step,
                                      const std::vector<RegisteredTensor>& registered,
                                      uint8_t* slot, const checkpoint::IoOptions& io,
                                      const std::function<bool()>& cancelled,
                                      const std::function<void(size_t registered)>& checked) {
  std::vector<bool> wanted;
  std::vector<uint64_t> offsets;
  for (const RegisteredTensor& t : registered) {
    wanted.push_back(t.staged);
    offsets.push_back(t.staged ? t.slot_offset : 0);
  }
  return ReadInto(step_dir, step, registered, wanted, offsets, slot, io, cancelled, checked);
}

absl::StatusOr<RestoreBuffer> ReadRestoreBuffer(const std::string& step_dir,
                                                const checkpoint::GroupedIndex& step,
                                                const std::vector<RegisteredTensor>& registered,
                                                const std::string& shm_name,
                                                uint64_t max_bytes, uid_t owner,
                                                const checkpoint::IoOptions& io,
                                                const std::function<bool()>& cancelled,
                                                bool owned_only, SharedReads* shared,
                                                const MakeSegment& make_segment) {
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
  const uint64_t segment_bytes = shm::SegmentBytes(1, layout.slot_bytes);
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       make_segment ? make_segment(shm_name, segment_bytes, owner)
                                    : shm::Segment::Create(shm_name, segment_bytes, owner));
  if (segment.size() != segment_bytes) {
    return absl::InternalError(absl::StrCat("restore buffer ", shm_name, " is ", segment.size(),
                                            " bytes, not ", segment_bytes));
  }
  RestoreBuffer buffer{std::move(segment), shm::ControlBlockBytes(), {}, wanted};
  uint8_t* base = buffer.segment.base() + buffer.data_offset;

  size_t placed = 0;
  for (size_t i = 0; i < registered.size(); ++i) {
    buffer.offsets.push_back(wanted[i] ? layout.placements[placed++].offset : 0);
  }
  if (shared == nullptr) {
    ZCC_ASSIGN_OR_RETURN(buffer.bytes_read, ReadInto(step_dir, step, registered, wanted,
                                                     buffer.offsets, base, io, cancelled));
    return buffer;
  }
  ZCC_ASSIGN_OR_RETURN(buffer.bytes_read,
                       ReadShared(step_dir, step, registered, wanted, buffer, shm_name, *shared,
                                  io, cancelled));
  return buffer;
}

std::vector<std::string> MissingOptional(const checkpoint::GroupedIndex& step,
                                         const std::vector<RegisteredTensor>& registered) {
  std::vector<std::string> missing;
  std::set<std::pair<absl::string_view, absl::string_view>> held;
  for (const RegisteredTensor& t : registered) {
    if (!t.optional) continue;
    if (held.empty()) {
      for (const checkpoint::GlobalTensor& g : step.tensors) held.emplace(g.kind, g.name);
    }
    if (held.count({format::TensorKindName(t.kind), t.name}) == 0) missing.push_back(t.name);
  }
  return missing;
}

}  // namespace zcc::daemon
