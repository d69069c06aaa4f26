#include "checkpoint/global_index.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
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

absl::StatusOr<std::vector<GlobalTensor>> GroupPieces(const format::StepIndex& index,
                                                      std::vector<std::string>* dropped_ema) {
  // Grouped by (kind, name) with a hash map, in the order tensors first appear
  // in the index (rank order, then each rank's order): no sort of a million
  // names on the restore path.
  std::vector<GlobalTensor> out;
  absl::flat_hash_map<std::pair<absl::string_view, absl::string_view>, size_t> where;
  where.reserve(index.pieces.size());
  for (const format::ManifestTensor& p : index.pieces) {
    const auto [it, added] = where.try_emplace(std::make_pair(absl::string_view(p.kind),
                                                              absl::string_view(p.name)),
                                               out.size());
    if (added) out.push_back(GlobalTensor{p.kind, p.name, p.dtype, p.global_shape, {}});
    GlobalTensor& g = out[it->second];
    if (p.dtype != g.dtype || p.global_shape != g.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          g.kind, " tensor '", g.name, "': one piece (in ", p.file, ") is ",
          format::DTypeName(p.dtype), " ", ShapeText(p.global_shape), ", another (in ",
          g.pieces.front()->file, ") ", format::DTypeName(g.dtype), " ",
          ShapeText(g.global_shape)));
    }
    g.pieces.push_back(&p);
  }
  std::vector<format::Box> boxes;
  std::vector<GlobalTensor> kept;
  kept.reserve(out.size());
  for (GlobalTensor& g : out) {
    // The common case, a whole tensor in one piece, needs no geometry.
    const format::ManifestTensor& first = *g.pieces.front();
    if (g.pieces.size() == 1 && first.shape == g.global_shape &&
        std::all_of(first.box_offset.begin(), first.box_offset.end(),
                    [](int64_t o) { return o == 0; })) {
      kept.push_back(std::move(g));
      continue;
    }
    boxes.clear();
    for (const format::ManifestTensor* p : g.pieces) boxes.push_back({p->box_offset, p->shape});
    if (absl::Status st = format::CheckTiling(boxes, g.global_shape); !st.ok()) {
      // A rank whose EMA had not started yet (its first update skipped for a
      // non-finite value) writes none: that EMA tensor is incomplete, not the
      // checkpoint. It is left out (its restore starts the EMA afresh).
      if (g.kind == format::kEmaKindName && dropped_ema != nullptr) {
        dropped_ema->push_back(absl::StrCat(g.name, ": ", st.message()));
        continue;
      }
      return absl::FailedPreconditionError(absl::StrCat(g.kind, " tensor '", g.name, "' ",
                                                        ShapeText(g.global_shape),
                                                        ": its pieces do not tile it: ",
                                                        st.message()));
    }
    kept.push_back(std::move(g));
  }
  return kept;
}

absl::StatusOr<std::shared_ptr<const GroupedIndex>> GroupIndex(format::StepIndex index) {
  auto grouped = std::make_shared<GroupedIndex>();
  grouped->index = std::move(index);  // before grouping: the pointers go into it
  std::vector<std::string> dropped;  // reported by the committer when it commits
  ZCC_ASSIGN_OR_RETURN(grouped->tensors, GroupPieces(grouped->index, &dropped));
  return std::shared_ptr<const GroupedIndex>(std::move(grouped));
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
    index.timeline = manifests.front().timeline;  // (every rank's: the commit checked)
  }
  // The EMA's step: every rank's that has EMA pieces (a rank whose trainer
  // skipped the snapshot of an EMA step holds an older one: the oldest is
  // taken, and a restore's next update folds in the whole gap for all).
  for (const format::RankManifest& m : manifests) {
    if (m.ema_step < 0) continue;
    index.ema_step = index.ema_step < 0 ? m.ema_step : std::min(index.ema_step, m.ema_step);
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
