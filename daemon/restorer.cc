#include "daemon/restorer.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/rank_shards.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/slot_layout.h"

namespace zcc::daemon {

absl::StatusOr<RestoreBuffer> ReadRestoreBuffer(const std::string& step_dir, uint32_t world_size,
                                                const std::vector<RegisteredTensor>& registered,
                                                const std::string& shm_name,
                                                uint64_t max_bytes, uid_t owner,
                                                const std::function<bool()>& cancelled) {
  auto check_cancelled = [&cancelled]() -> absl::Status {
    if (cancelled && cancelled()) {
      return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
    }
    return absl::OkStatus();
  };
  // Which rank's shards hold each tensor.
  std::map<std::string, uint32_t> source;
  for (uint32_t r = 0; r < world_size; ++r) {
    ZCC_RETURN_IF_ERROR(check_cancelled());
    const std::string path = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
    auto manifest = format::DecodeRankManifest(text);
    if (!manifest.ok()) return absl::DataLossError(absl::StrCat(path, ": ", manifest.status().message()));
    for (const format::ManifestTensor& t : manifest->tensors) {
      source.emplace(absl::StrCat(t.kind, "/", t.name), r);
    }
  }

  std::vector<shm::LayoutInput> inputs;
  for (const RegisteredTensor& t : registered) inputs.push_back({t.name, t.nbytes, t.group});
  ZCC_ASSIGN_OR_RETURN(shm::SlotLayout layout, shm::ComputeSlotLayout(inputs, max_bytes));
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       shm::Segment::Create(shm_name, shm::SegmentBytes(1, layout.slot_bytes), owner));
  RestoreBuffer buffer{std::move(segment), shm::ControlBlockBytes(), {}};
  uint8_t* base = buffer.segment.base() + buffer.data_offset;

  std::map<uint32_t, std::vector<checkpoint::ReadTarget>> by_rank;
  for (size_t i = 0; i < registered.size(); ++i) {
    const RegisteredTensor& t = registered[i];
    const std::string kind = checkpoint::KindForGroup(t.group);
    auto it = source.find(absl::StrCat(kind, "/", t.name));
    if (it == source.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", t.name, "' (", kind, ") is not in ", step_dir));
    }
    buffer.offsets.push_back(layout.placements[i].offset);
    by_rank[it->second].push_back(
        {t.name, kind, t.dtype, t.shape, base + layout.placements[i].offset, t.nbytes});
  }
  for (const auto& [rank, targets] : by_rank) {
    ZCC_RETURN_IF_ERROR(check_cancelled());
    ZCC_RETURN_IF_ERROR(checkpoint::ReadRankTensors(step_dir, rank, targets));
  }
  return buffer;
}

}  // namespace zcc::daemon
