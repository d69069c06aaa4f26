// Box geometry: a registered tensor is a box (an offset and a length per
// dimension) of a global tensor. Tensor-parallel row and column splits, FSDP
// dim-0 shards (an uneven last shard, empty shards of length 0), experts and
// whole tensors are all boxes; these functions check that boxes are valid and
// tile their global tensor, and copy data between boxes.
//
// Every function here is a pure function of its arguments: thread-safe, no
// state, nothing retained after the call.
#ifndef ZCC_FORMAT_BOX_H_
#define ZCC_FORMAT_BOX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace zcc::format {

// Elements [offset[d], offset[d] + shape[d]) of each dimension d of a global
// tensor. A scalar's box has no dimensions (and holds one element).
struct Box {
  std::vector<int64_t> offset;  // per dimension
  std::vector<int64_t> shape;   // lengths per dimension (the local tensor's shape)
};

bool operator==(const Box& a, const Box& b);
bool operator!=(const Box& a, const Box& b);

// "[0:4, 8:16]" (start:end per dimension, end exclusive), "[]" for a scalar;
// for error messages, so it prints invalid boxes too.
std::string BoxToString(const Box& box);

// The box covering all of a tensor of `global_shape`.
Box WholeBox(absl::Span<const int64_t> global_shape);

// True iff `box` is the whole of a tensor of `global_shape`.
bool IsWhole(const Box& box, absl::Span<const int64_t> global_shape);

// InvalidArgument, saying what is wrong, unless every dimension of
// `global_shape` is >= 0 and `box` has as many dimensions, every offset and
// length >= 0 and offset + length <= the global dimension. An empty dimension
// (length 0) may start anywhere in [0, global dimension].
absl::Status ValidateBox(const Box& box, absl::Span<const int64_t> global_shape);

// Number of elements: the product of the lengths, 1 for a scalar. The caller
// has validated `box` against a global shape whose byte size fits in uint64
// (format::TensorBytes checks that), so the product cannot overflow.
uint64_t Volume(const Box& box);

// The elements `a` and `b` (valid boxes of the same global tensor) both hold;
// nullopt when there is none.
std::optional<Box> Intersect(const Box& a, const Box& b);

// OK iff `boxes` tile a tensor of `global_shape` exactly once: each is valid,
// no two that hold elements overlap, and together they hold every element.
// Boxes of no elements are allowed wherever they are valid.
//   InvalidArgument: no boxes, a negative global dimension, a global shape
//     of 2^64 elements or more, or an invalid box (its index is named).
//   FailedPrecondition: two boxes overlap (both indices and boxes are named,
//     and the overlap), or elements are not covered (how many, and the first
//     uncovered element in row-major order).
// Sweeps along the dimension with the most distinct box offsets, comparing a
// box only with the boxes that cross its start in that dimension: n dim-0
// shards or n column shards take O(n log n), an r x c grid of blocks
// O(n min(r, c)) comparisons.
absl::Status CheckTiling(absl::Span<const Box> boxes, absl::Span<const int64_t> global_shape);

// Copies the elements of `region` from `src`, the row-major (C-contiguous) data
// of `src_box`, to `dst`, the row-major data of `dst_box`; `elem_size` bytes
// per element. `region` lies inside both boxes (an Intersect result; checked by
// a debug assert only). The innermost dimensions over which both sides are
// contiguous for the whole region become one memcpy, so a whole box to a whole
// box or a dim-0 shard to a whole box is a single memcpy.
void CopyBoxRegion(const uint8_t* src, const Box& src_box, uint8_t* dst, const Box& dst_box,
                   const Box& region, size_t elem_size);

}  // namespace zcc::format

#endif  // ZCC_FORMAT_BOX_H_
