// The global view of a checkpoint step: which pieces (boxes written by some
// rank) make up each global tensor, and the rule they obey: the pieces of a
// global tensor share its dtype and global shape and tile it exactly once.
// The committer refuses a step that breaks the rule; restore and export read
// the step's index (format::StepIndex) and trust nothing in it they have not
// checked here. (Reading a step's index: checkpoint::LoadStepIndex, reader.h.)
#ifndef ZCC_CHECKPOINT_GLOBAL_INDEX_H_
#define ZCC_CHECKPOINT_GLOBAL_INDEX_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/manifest.h"

namespace zcc::checkpoint {

// One global tensor and the pieces of the index that hold it.
struct GlobalTensor {
  std::string kind;  // format::TensorKindName or kEmaKindName
  std::string name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> global_shape;
  std::vector<const format::ManifestTensor*> pieces;  // into the index
};

// The global tensors of `index` in the order they first appear in it, each
// with its pieces in index order, and each checked: one
// dtype, one global shape, boxes that tile it exactly once. Otherwise
// FailedPrecondition naming the tensor and the fault (a gap, an overlap, the
// conflicting shapes). The result points into `index`.
// With `dropped_ema`, an EMA tensor ("ema") whose pieces do not tile it (a
// rank whose EMA had not started wrote none) is left out and named there
// instead of failing the step; without it, it fails like any other.
absl::StatusOr<std::vector<GlobalTensor>> GroupPieces(
    const format::StepIndex& index, std::vector<std::string>* dropped_ema = nullptr);

// A step's index with its pieces grouped (and checked) per global tensor, in
// one immutable object: `tensors` points into `index`. Shared between the
// verification of a step and the restores that read it.
struct GroupedIndex {
  format::StepIndex index;
  std::vector<GlobalTensor> tensors;
};

// Groups `index` (GroupPieces) into a GroupedIndex.
absl::StatusOr<std::shared_ptr<const GroupedIndex>> GroupIndex(format::StepIndex index);

// The replica groups the manifests declare agree: grouping the ranks' digests
// by (kind, expert id, size, digest), every member index of a group appears
// equally often. A rank that registered other replicated tensors than its
// group's other members (another box, shape or dtype, a missing tensor)
// breaks that; FailedPrecondition naming the group and the ranks.
absl::Status CheckReplicaGroups(const std::vector<format::RankManifest>& manifests);

// The index of a step from its rank manifests (what the committer writes).
format::StepIndex BuildStepIndex(std::vector<format::RankManifest> manifests);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_GLOBAL_INDEX_H_
