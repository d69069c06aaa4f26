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

// Whether a target and the tensor checkpointed under its name are both
// 1-D U8 EXTRA blobs: their sizes may differ (blobs are sized by what they
// hold; the leading length says how much of one is used).
bool BothBlobs(const BoxTarget& t, const GlobalTensor& g) {
  return t.kind == format::TensorKindName(format::TensorKind::kExtra) &&
         t.dtype == format::DType::kU8 && g.dtype == format::DType::kU8 &&
         t.global_shape.size() == 1 && g.global_shape.size() == 1;
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
  // Zeroed once every target is checked (nothing is written before): the
  // targets of optional tensors the step lacks, and blobs' tails.
  std::vector<std::pair<uint8_t*, size_t>> zeroed;
  for (size_t i = 0; i < targets.size(); ++i) {
    const BoxTarget& t = targets[i];
    const auto it = by_key.find(std::make_pair(t.kind, t.name));
    if (it == by_key.end() && t.optional) {
      zeroed.emplace_back(t.dst, format::Volume(t.box) * format::DTypeSize(t.dtype));
      done_at_once.push_back(i);
      continue;
    }
    if (it == by_key.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.kind, " tensor '", t.name, "' is not in ", step_dir));
    }
    const GlobalTensor& g = *it->second;
    // The box of the checkpointed tensor this target takes: the target's,
    // except for a blob registered larger than the one checkpointed, which
    // takes the checkpointed blob whole and zeros after it.
    format::Box want = t.box;
    if (BothBlobs(t, g) && g.global_shape != t.global_shape) {
      const int64_t saved = g.global_shape[0];
      const int64_t registered = t.global_shape[0];
      if (saved > registered || t.box.offset != std::vector<int64_t>{0} ||
          t.box.shape != t.global_shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "extra tensor '", t.name, "' holds ", saved, " bytes in ", step_dir,
            "; this rank registered it with ", registered,
            " (blob too small: register it with at least ", saved, " bytes)"));
      }
      ZCC_RETURN_IF_ERROR(format::ValidateBox(t.box, t.global_shape));
      zeroed.emplace_back(t.dst + saved, static_cast<size_t>(registered - saved));
      want = format::Box{{0}, {saved}};
    } else if (g.dtype != t.dtype || g.global_shape != t.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          t.kind, " tensor '", t.name, "' was checkpointed as ", format::DTypeName(g.dtype), " ",
          ShapeText(g.global_shape), "; registered as ", format::DTypeName(t.dtype), " ",
          ShapeText(t.global_shape)));
    } else {
      ZCC_RETURN_IF_ERROR(format::ValidateBox(t.box, t.global_shape));
    }
    uint64_t covered = 0;
    for (const format::ManifestTensor* p : g.pieces) {
      if (p->box_offset == want.offset && p->shape == want.shape) {
        direct.push_back({p, t.dst});
        direct_targets[p].push_back(i);
        covered = format::Volume(want);
        break;
      }
      std::optional<format::Box> region = format::Intersect({p->box_offset, p->shape}, want);
      if (!region.has_value()) continue;
      covered += format::Volume(*region);
      staged[p].push_back({i, *std::move(region)});
      ++copies_left[i];
    }
    if (covered == 0 && format::Volume(want) == 0) done_at_once.push_back(i);
    // The pieces tile the global tensor (GroupPieces), so their
    // intersections with the box cover it exactly; anything else is a bug.
    if (covered != format::Volume(want)) {
      return absl::InternalError(absl::StrCat(t.kind, " tensor '", t.name, "': the pieces cover ",
                                              covered, " of the box's ", format::Volume(want),
                                              " elements"));
    }
  }

  for (const auto& [dst, bytes] : zeroed) std::memset(dst, 0, bytes);

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
