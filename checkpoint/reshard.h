// Reading boxes of global tensors out of a committed step, whatever layout
// wrote it: each box a caller wants is filled from the saved pieces that
// overlap it (n-dimensional intersection, strided copy). A piece whose box is
// the wanted box (restoring into the layout that wrote the step) is read
// straight into place, as fast as a plain restore; other pieces are read into
// a bounded staging buffer, verified, and their intersections copied out.
// Every piece read is checked against its checksum.
#ifndef ZCC_CHECKPOINT_RESHARD_H_
#define ZCC_CHECKPOINT_RESHARD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "format/box.h"
#include "format/manifest.h"

namespace zcc::checkpoint {

// A box a caller wants: `box` of the global tensor (kind, name), which must
// have this dtype and global shape in the step; its bytes (row-major, the
// box's shape) land at `dst`. `kind` and `name` are views: the caller keeps
// the strings alive for the call.
struct BoxTarget {
  absl::string_view kind;  // format::TensorKindName or kEmaKindName
  absl::string_view name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> global_shape;
  format::Box box;
  uint8_t* dst = nullptr;
  // A step that lacks the tensor fills `dst` with zeros instead of failing.
  bool optional = false;
};

struct ReshardStats {
  uint64_t direct_pieces = 0;   // read straight into a target
  uint64_t staged_pieces = 0;   // read into staging and copied from
  uint64_t bytes_read = 0;
};

// Fills every target. All targets are checked against `tensors` (from
// GroupPieces over `index`) before anything is read: a tensor the step lacks,
// or holds with another dtype or global shape, is a FailedPrecondition naming
// it, and nothing is written to any target. Staged pieces are read in batches
// of at most `staging_bytes` (one piece larger than that is read alone, into
// a buffer of its size: ResourceExhausted when that cannot be allocated).
// Cancelled once `cancelled()` (when given) turns true, checked between
// batches. With options.progress, the bytes it is going to read are added to
// its plan and reported as they are read. `target_done` (when given) is called
// with each target's index once all of its bytes are in place and checked,
// from the reading thread, as the read goes on.
absl::StatusOr<ReshardStats> ReadBoxes(const std::string& step_dir,
                                       const format::StepIndex& index,
                                       const std::vector<GlobalTensor>& tensors,
                                       const std::vector<BoxTarget>& targets,
                                       const IoOptions& options,
                                       uint64_t staging_bytes = uint64_t{256} << 20,
                                       const std::function<bool()>& cancelled = nullptr,
                                       const std::function<void(size_t target)>& target_done =
                                           nullptr);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_RESHARD_H_
