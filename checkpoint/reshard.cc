#include "checkpoint/reshard.h"

#include <cstring>
#include <map>
#include <new>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/read_progress.h"
#include "checkpoint/reader.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"

namespace zcc::checkpoint {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Where one staged piece's intersection with one target goes.
struct Copy {
  size_t target = 0;
  format::Box region;
};

}  // namespace

absl::StatusOr<ReshardStats> ReadBoxes(const std::string& step_dir,
                                       const format::StepIndex& index,
                                       const std::vector<GlobalTensor>& tensors,
                                       const std::vector<BoxTarget>& targets,
                                       const IoOptions& options, uint64_t staging_bytes,
                                       const std::function<bool()>& cancelled,
                                       const std::function<void(size_t target)>& target_done) {
  auto check_cancelled = [&cancelled]() -> absl::Status {
    if (cancelled && cancelled()) return absl::CancelledError("read of the checkpoint cancelled");
    return absl::OkStatus();
  };
  absl::flat_hash_map<std::pair<absl::string_view, absl::string_view>, const GlobalTensor*> by_key;
  by_key.reserve(tensors.size());
  for (const GlobalTensor& g : tensors) by_key[{g.kind, g.name}] = &g;

  // Plan every read before doing any.
  std::vector<PieceRead> direct;
  std::map<const format::ManifestTensor*, std::vector<Copy>> staged;  // piece -> copies
  // For target_done: the targets each direct piece fills, the staged copies
  // each target still waits for, and those complete before any read.
  absl::flat_hash_map<const format::ManifestTensor*, std::vector<size_t>> direct_targets;
  std::vector<size_t> copies_left(targets.size(), 0);
  std::vector<size_t> done_at_once;
  for (size_t i = 0; i < targets.size(); ++i) {
    const BoxTarget& t = targets[i];
    const auto it = by_key.find(std::make_pair(t.kind, t.name));
    if (it == by_key.end() && t.optional) {
      std::memset(t.dst, 0, format::Volume(t.box) * format::DTypeSize(t.dtype));
      done_at_once.push_back(i);
      continue;
    }
    if (it == by_key.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.kind, " tensor '", t.name, "' is not in ", step_dir));
    }
    const GlobalTensor& g = *it->second;
    if (g.dtype != t.dtype || g.global_shape != t.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          t.kind, " tensor '", t.name, "' was checkpointed as ", format::DTypeName(g.dtype), " ",
          ShapeText(g.global_shape), "; registered as ", format::DTypeName(t.dtype), " ",
          ShapeText(t.global_shape)));
    }
    ZCC_RETURN_IF_ERROR(format::ValidateBox(t.box, t.global_shape));
    uint64_t covered = 0;
    for (const format::ManifestTensor* p : g.pieces) {
      if (p->box_offset == t.box.offset && p->shape == t.box.shape) {
        direct.push_back({p, t.dst});
        direct_targets[p].push_back(i);
        covered = format::Volume(t.box);
        break;
      }
      std::optional<format::Box> region = format::Intersect({p->box_offset, p->shape}, t.box);
      if (!region.has_value()) continue;
      covered += format::Volume(*region);
      staged[p].push_back({i, *std::move(region)});
      ++copies_left[i];
    }
    if (covered == 0 && format::Volume(t.box) == 0) done_at_once.push_back(i);
    // The pieces tile the global tensor (GroupPieces), so their
    // intersections with the box cover it exactly; anything else is a bug.
    if (covered != format::Volume(t.box)) {
      return absl::InternalError(absl::StrCat(t.kind, " tensor '", t.name, "': the pieces cover ",
                                              covered, " of the box's ", format::Volume(t.box),
                                              " elements"));
    }
  }

  if (options.progress != nullptr) {
    uint64_t planned = 0;
    for (const PieceRead& r : direct) planned += r.piece->nbytes;
    for (const auto& [piece, copies] : staged) planned += piece->nbytes;
    options.progress->AddPlanned(planned);
  }

  ReshardStats stats;
  ZCC_RETURN_IF_ERROR(check_cancelled());
  IoOptions read_options = options;
  std::function<void(const format::ManifestTensor&)> verified;
  if (target_done) {
    for (size_t i : done_at_once) target_done(i);
    verified = [&](const format::ManifestTensor& piece) {
      if (options.verified != nullptr) (*options.verified)(piece);
      const auto it = direct_targets.find(&piece);
      if (it == direct_targets.end()) return;  // a staged piece: done once copied
      for (size_t i : it->second) target_done(i);
    };
    read_options.verified = &verified;
  }
  const PiecesByFile by_file = IndexPiecesByFile(index);
  ZCC_RETURN_IF_ERROR(ReadPieces(step_dir, index, by_file, direct, read_options));
  stats.direct_pieces = direct.size();
  for (const PieceRead& r : direct) stats.bytes_read += r.piece->nbytes;

  // Staged pieces in batches that fit the staging budget.
  auto next = staged.begin();
  while (next != staged.end()) {
    std::vector<std::pair<const format::ManifestTensor*, const std::vector<Copy>*>> batch;
    uint64_t batch_bytes = 0;
    while (next != staged.end() &&
           (batch.empty() || batch_bytes + next->first->nbytes <= staging_bytes)) {
      batch_bytes += next->first->nbytes;
      batch.emplace_back(next->first, &next->second);
      ++next;
    }
    ZCC_RETURN_IF_ERROR(check_cancelled());
    storage::AlignedBuffer buffer;
    try {
      buffer = storage::AlignedBuffer::Uninitialized(std::max<uint64_t>(batch_bytes, 1));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", batch_bytes, " bytes of staging to reassemble pieces"));
    }
    std::vector<PieceRead> reads;
    uint64_t offset = 0;
    for (const auto& [piece, copies] : batch) {
      reads.push_back({piece, buffer.data() + offset});
      offset += piece->nbytes;
    }
    ZCC_RETURN_IF_ERROR(ReadPieces(step_dir, index, by_file, reads, read_options));
    for (size_t k = 0; k < batch.size(); ++k) {
      const format::ManifestTensor* piece = batch[k].first;
      const format::Box piece_box{piece->box_offset, piece->shape};
      const size_t elem = format::DTypeSize(piece->dtype);
      for (const Copy& c : *batch[k].second) {
        const BoxTarget& t = targets[c.target];
        format::CopyBoxRegion(reads[k].dst, piece_box, t.dst, t.box, c.region, elem);
        if (target_done && --copies_left[c.target] == 0) target_done(c.target);
      }
      stats.bytes_read += piece->nbytes;
    }
    stats.staged_pieces += batch.size();
  }
  return stats;
}

}  // namespace zcc::checkpoint
