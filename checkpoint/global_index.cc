#include "checkpoint/global_index.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "format/box.h"

namespace zcc::checkpoint {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::vector<GlobalTensor>> GroupPieces(const format::StepIndex& index) {
  std::vector<const format::ManifestTensor*> order;
  order.reserve(index.pieces.size());
  for (const format::ManifestTensor& p : index.pieces) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->kind, a->name, a->box_offset) < std::tie(b->kind, b->name, b->box_offset);
  });
  std::vector<GlobalTensor> out;
  std::vector<format::Box> boxes;
  auto check = [&](const GlobalTensor& g) -> absl::Status {
    boxes.clear();
    for (const format::ManifestTensor* p : g.pieces) boxes.push_back({p->box_offset, p->shape});
    absl::Status st = format::CheckTiling(boxes, g.global_shape);
    if (st.ok()) return st;
    return absl::FailedPreconditionError(absl::StrCat(g.kind, " tensor '", g.name, "' ",
                                                      ShapeText(g.global_shape),
                                                      ": its pieces do not tile it: ",
                                                      st.message()));
  };
  for (const format::ManifestTensor* p : order) {
    if (out.empty() || out.back().kind != p->kind || out.back().name != p->name) {
      if (!out.empty()) ZCC_RETURN_IF_ERROR(check(out.back()));
      out.push_back(GlobalTensor{p->kind, p->name, p->dtype, p->global_shape, {}});
    }
    GlobalTensor& g = out.back();
    if (p->dtype != g.dtype || p->global_shape != g.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          g.kind, " tensor '", g.name, "': one piece (in ", p->file, ") is ",
          format::DTypeName(p->dtype), " ", ShapeText(p->global_shape), ", another (in ",
          g.pieces.front()->file, ") ", format::DTypeName(g.dtype), " ",
          ShapeText(g.global_shape)));
    }
    g.pieces.push_back(p);
  }
  if (!out.empty()) ZCC_RETURN_IF_ERROR(check(out.back()));
  return out;
}

format::StepIndex BuildStepIndex(const std::vector<format::RankManifest>& manifests) {
  format::StepIndex index;
  if (!manifests.empty()) {
    index.job_id = manifests.front().job_id;
    index.step = manifests.front().step;
    index.world_size = manifests.front().world_size;
  }
  for (const format::RankManifest& m : manifests) {
    index.files.insert(index.files.end(), m.files.begin(), m.files.end());
    index.pieces.insert(index.pieces.end(), m.tensors.begin(), m.tensors.end());
  }
  return index;
}

}  // namespace zcc::checkpoint
