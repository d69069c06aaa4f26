// Which rank writes which tensor when tensors are replicated across ranks
// (DESIGN.md section 4, "IO sharding across DP replicas").
//
// Every tensor names its replica group: the dense data-parallel group, the
// expert-data-parallel group of one (global) expert, or none. A tensor
// replicated in a group is written by exactly one member, chosen by a
// deterministic byte-balanced greedy rule that every member evaluates alone
// from the identical list, so the members agree without communicating:
//   sort the group's tensors by size descending, ties by name ascending
//   (names are unique, so the order is total and independent of the input
//   order), then give each tensor to the member with the least bytes so far,
//   ties to the lowest member index.
// Tensors of no group, or of a group of one member, are written by their rank.
//
// The greedy (LPT) rule keeps every member's load within one tensor of the
// even share: max load <= total / members + largest tensor.
//
// Stateless functions; thread-safe.
#ifndef ZCC_SHARDING_SHARD_ASSIGNER_H_
#define ZCC_SHARDING_SHARD_ASSIGNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace zcc::sharding {

enum class ReplicaKind : uint8_t {
  kNone,                // not replicated (ZeRO shards, RNG state): the rank writes it
  kDataParallel,        // replicated across the dense data-parallel group
  kExpertDataParallel,  // replicated across the data-parallel group of one expert
};

absl::string_view ReplicaKindName(ReplicaKind kind);  // "none", "dp", "expert_dp"

struct ReplicaGroup {
  ReplicaKind kind = ReplicaKind::kNone;
  uint32_t group_size = 1;     // members of the group (>= 1); ignored for kNone
  uint32_t rank_in_group = 0;  // this rank's member index, < group_size; ignored for kNone
  uint32_t expert_id = 0;      // global expert id; only for kExpertDataParallel
};

// A group as the members see it: (kind) for kDataParallel, (kind, expert_id)
// for kExpertDataParallel. Ordered: dp first, then experts by id.
struct GroupKey {
  ReplicaKind kind = ReplicaKind::kNone;
  uint32_t expert_id = 0;  // 0 unless kind is kExpertDataParallel

  friend bool operator==(const GroupKey& a, const GroupKey& b) {
    return a.kind == b.kind && a.expert_id == b.expert_id;
  }
  friend bool operator<(const GroupKey& a, const GroupKey& b) {
    return a.kind != b.kind ? a.kind < b.kind : a.expert_id < b.expert_id;
  }
};

// A tensor of one group, as AssignShards sees it.
struct SizedTensor {
  std::string name;
  uint64_t nbytes = 0;
};

struct GroupAssignment {
  std::vector<uint32_t> owner;         // member that writes tensors[i], in input order
  std::vector<uint64_t> member_bytes;  // bytes each member writes
};

// Assigns the tensors of one replicated group among `members` members by the
// rule above. Every member calls it with the same tensors (in any order) and
// gets the same assignment. InvalidArgument when members is 0, a name is
// empty or repeated, or the byte total overflows.
absl::StatusOr<GroupAssignment> AssignShards(absl::Span<const SizedTensor> tensors,
                                             uint32_t members);

// A tensor of a rank's manifest with its replica group.
struct ShardTensor {
  std::string name;
  uint64_t nbytes = 0;
  ReplicaGroup group;
};

struct GroupLoad {
  GroupKey key;
  uint32_t group_size = 0;
  uint32_t rank_in_group = 0;
  uint64_t tensors = 0;                // tensors of the group in the manifest
  std::vector<uint64_t> member_bytes;  // bytes each member writes
};

struct RankWritePlan {
  std::vector<bool> writes;       // does this rank write tensors[i]?
  uint64_t bytes_written = 0;     // sum of nbytes over written tensors
  uint64_t bytes_total = 0;       // sum of nbytes over all tensors
  std::vector<GroupLoad> groups;  // one per replicated group, by GroupKey
};

// The write plan of one rank from its full manifest: tensors of kind kNone or
// of a group of one member are written; the tensors of each replicated group
// are assigned with AssignShards and written where this rank
// (group.rank_in_group) is the owner. InvalidArgument, naming the tensor,
// when a name is empty or repeated, rank_in_group >= group_size, group_size
// is 0, or the tensors of one group disagree on group_size or rank_in_group.
absl::StatusOr<RankWritePlan> PlanRankWrites(absl::Span<const ShardTensor> tensors);

}  // namespace zcc::sharding

#endif  // ZCC_SHARDING_SHARD_ASSIGNER_H_
