#include "sharding/shard_assigner.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace zcc::sharding {
namespace {

// More members than any real replica group; keeps the per-member vectors small.
constexpr uint32_t kMaxMembers = uint32_t{1} << 20;

std::string GroupName(const GroupKey& key) {
  if (key.kind == ReplicaKind::kExpertDataParallel) {
    return absl::StrCat(ReplicaKindName(key.kind), " group of expert ", key.expert_id);
  }
  return absl::StrCat(ReplicaKindName(key.kind), " group");
}

// Adds `b` to `*sum`; false on overflow.
bool AddBytes(uint64_t* sum, uint64_t b) {
  if (b > UINT64_MAX - *sum) return false;
  *sum += b;
  return true;
}

}  // namespace

absl::string_view ReplicaKindName(ReplicaKind kind) {
  switch (kind) {
    case ReplicaKind::kNone:
      return "none";
    case ReplicaKind::kDataParallel:
      return "dp";
    case ReplicaKind::kExpertDataParallel:
      return "expert_dp";
  }
  return "unknown";
}

absl::StatusOr<GroupAssignment> AssignShards(absl::Span<const SizedTensor> tensors,
                                             uint32_t members) {
  if (members == 0 || members > kMaxMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("a replica group needs 1 to ", kMaxMembers, " members, got ", members));
  }
  absl::flat_hash_set<absl::string_view> names;
  uint64_t total = 0;
  for (const SizedTensor& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("a replicated tensor has an empty name");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\" appears twice in one replica group"));
    }
    if (!AddBytes(&total, t.nbytes)) {
      return absl::InvalidArgumentError("the tensors of a replica group exceed 2^64 bytes");
    }
  }

  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].nbytes != tensors[b].nbytes) return tensors[a].nbytes > tensors[b].nbytes;
    return tensors[a].name < tensors[b].name;
  });

  GroupAssignment out;
  out.owner.resize(tensors.size());
  out.member_bytes.assign(members, 0);
  // (bytes so far, member): the top is the least-loaded member, lowest index first.
  using Load = std::pair<uint64_t, uint32_t>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least_loaded;
  for (uint32_t m = 0; m < std::min<uint64_t>(members, tensors.size()); ++m)
    least_loaded.push({0, m});
  for (size_t i : order) {
    Load load = least_loaded.top();
    least_loaded.pop();
    out.owner[i] = load.second;
    load.first += tensors[i].nbytes;  // cannot overflow: bounded by `total`
    out.member_bytes[load.second] = load.first;
    least_loaded.push(load);
  }
  return out;
}

absl::StatusOr<RankWritePlan> PlanRankWrites(absl::Span<const ShardTensor> tensors) {
  struct Group {
    uint32_t group_size;
    uint32_t rank_in_group;
    std::vector<size_t> members_of_manifest;  // indices into `tensors`
  };
  RankWritePlan plan;
  plan.writes.assign(tensors.size(), false);
  absl::flat_hash_set<absl::string_view> names;
  std::map<GroupKey, Group> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ShardTensor& t = tensors[i];
    if (t.name.empty())
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has an empty name"));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" appears twice"));
    }
    if (!AddBytes(&plan.bytes_total, t.nbytes)) {
      return absl::InvalidArgumentError("the manifest's tensors exceed 2^64 bytes");
    }
    const ReplicaGroup& g = t.group;
    if (g.kind == ReplicaKind::kNone) {
      plan.writes[i] = true;
      continue;
    }
    if (g.kind != ReplicaKind::kDataParallel && g.kind != ReplicaKind::kExpertDataParallel) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\" has replica kind ", static_cast<int>(g.kind)));
    }
    const GroupKey key{g.kind, g.kind == ReplicaKind::kExpertDataParallel ? g.expert_id : 0};
    if (g.group_size == 0 || g.group_size > kMaxMembers) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", GroupName(key),
                                                     " size must be 1 to ", kMaxMembers, ", got ",
                                                     g.group_size));
    }
    if (g.rank_in_group >= g.group_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": rank ", g.rank_in_group, " in the ",
                       GroupName(key), " is not below the group size ", g.group_size));
    }
    auto [it, inserted] = groups.try_emplace(key, Group{g.group_size, g.rank_in_group, {}});
    if (!inserted &&
        (it->second.group_size != g.group_size || it->second.rank_in_group != g.rank_in_group)) {
      const size_t first = it->second.members_of_manifest.front();
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name, "\" puts this rank at ", g.rank_in_group, " of ", g.group_size,
          " in the ", GroupName(key), ", but tensor \"", tensors[first].name, "\" says ",
          it->second.rank_in_group, " of ", it->second.group_size));
    }
    it->second.members_of_manifest.push_back(i);
  }

  for (const auto& [key, group] : groups) {
    std::vector<SizedTensor> sized;
    sized.reserve(group.members_of_manifest.size());
    for (size_t i : group.members_of_manifest)
      sized.push_back({tensors[i].name, tensors[i].nbytes});
    absl::StatusOr<GroupAssignment> assignment = AssignShards(sized, group.group_size);
    if (!assignment.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(GroupName(key), ": ", assignment.status().message()));
    }
    for (size_t j = 0; j < sized.size(); ++j) {
      if (assignment->owner[j] == group.rank_in_group) {
        plan.writes[group.members_of_manifest[j]] = true;
      }
    }
    plan.groups.push_back(GroupLoad{key, group.group_size, group.rank_in_group,
                                    group.members_of_manifest.size(),
                                    std::move(assignment->member_bytes)});
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (plan.writes[i]) plan.bytes_written += tensors[i].nbytes;
  }
  return plan;
}

}  // namespace zcc::sharding
