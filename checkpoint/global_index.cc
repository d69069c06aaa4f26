#include "checkpoint/global_index.h"

#include <algorithm>
#include <iterator>
#include <map>
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
    // The common case, a whole tensor in one piece, needs no geometry.
    if (g.pieces.size() == 1 && g.pieces.front()->shape == g.global_shape &&
        std::all_of(g.pieces.front()->box_offset.begin(), g.pieces.front()->box_offset.end(),
                    [](int64_t o) { return o == 0; })) {
      return absl::OkStatus();
    }
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

absl::Status CheckReplicaGroups(const std::vector<format::RankManifest>& manifests) {
  // (kind, expert id, size, digest) -> member -> ranks declaring it.
  std::map<std::tuple<std::string, int64_t, uint32_t, uint64_t>,
           std::map<uint32_t, std::vector<uint32_t>>>
      clusters;
  for (const format::RankManifest& m : manifests) {
    for (const format::ReplicaDigest& d : m.replica_groups) {
      clusters[{d.kind, d.expert_id, d.size, d.hash}][d.member].push_back(m.rank);
    }
  }
  for (const auto& [key, members] : clusters) {
    const auto& [kind, expert_id, size, hash] = key;
    size_t copies = 0;
    for (const auto& [member, ranks] : members) copies = std::max(copies, ranks.size());
    bool complete = members.size() == size;
    for (const auto& [member, ranks] : members) complete = complete && ranks.size() == copies;
    if (complete) continue;
    std::vector<uint32_t> ranks;
    for (const auto& [member, r] : members) ranks.insert(ranks.end(), r.begin(), r.end());
    std::sort(ranks.begin(), ranks.end());
    return absl::FailedPreconditionError(absl::StrCat(
        "replica group ", kind, kind == "expert_dp" ? absl::StrCat(" of expert ", expert_id) : "",
        " (", size, " members): ranks ", absl::StrJoin(ranks, ", "),
        " registered replicated tensors that the group's other members did not (another name, "
        "dtype, shape or box), or the group lacks members; the replicas disagree"));
  }
  return absl::OkStatus();
}

format::StepIndex BuildStepIndex(std::vector<format::RankManifest> manifests) {
  format::StepIndex index;
  if (!manifests.empty()) {
    index.job_id = manifests.front().job_id;
    index.step = manifests.front().step;
    index.world_size = manifests.front().world_size;
  }
  size_t pieces = 0;
  for (const format::RankManifest& m : manifests) pieces += m.tensors.size();
  index.pieces.reserve(pieces);
  for (format::RankManifest& m : manifests) {
    index.files.insert(index.files.end(), m.files.begin(), m.files.end());
    std::move(m.tensors.begin(), m.tensors.end(), std::back_inserter(index.pieces));
  }
  return index;
}

}  // namespace zcc::checkpoint
