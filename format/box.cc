#include "format/box.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zcc::format {
namespace {

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckGlobalShape(absl::Span<const int64_t> global_shape) {
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " of the global shape ",
                                                     ShapeToString(global_shape), " is negative"));
    }
  }
  return absl::OkStatus();
}

// ValidateBox for a global shape that CheckGlobalShape has accepted.
absl::Status CheckBoxInside(const Box& box, absl::Span<const int64_t> global_shape) {
  const auto invalid = [&](const auto&... what) {
    return absl::InvalidArgumentError(absl::StrCat("box ", BoxToString(box), " of global shape ",
                                                   ShapeToString(global_shape), ": ", what...));
  };
  if (box.offset.size() != box.shape.size()) {
    return invalid("its offset has ", box.offset.size(), " dimensions but its shape has ",
                   box.shape.size());
  }
  if (box.shape.size() != global_shape.size()) {
    return invalid("it has ", box.shape.size(), " dimensions but the global shape has ",
                   global_shape.size());
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    const int64_t offset = box.offset[d];
    const int64_t length = box.shape[d];
    if (offset < 0) return invalid("offset ", offset, " of dimension ", d, " is negative");
    if (length < 0) return invalid("length ", length, " of dimension ", d, " is negative");
    // offset + length <= global, written so that it cannot overflow (all three are >= 0).
    if (length > global_shape[d] || offset > global_shape[d] - length) {
      return invalid("dimension ", d, " ends past the global dimension ", global_shape[d]);
    }
  }
  return absl::OkStatus();
}

// Validated boxes only: offset + length <= a global dimension cannot overflow.
int64_t End(const Box& box, size_t d) { return box.offset[d] + box.shape[d]; }

bool HoldsElements(const Box& box) {
  return std::all_of(box.shape.begin(), box.shape.end(), [](int64_t len) { return len > 0; });
}

// Whether two valid, non-empty boxes of the same global tensor share an element.
bool Overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    if (std::max(a.offset[d], b.offset[d]) >= std::min(End(a, d), End(b, d))) return false;
  }
  return true;
}

[[maybe_unused]] bool Contains(const Box& outer, const Box& inner) {
  if (outer.shape.size() != inner.shape.size()) return false;
  for (size_t d = 0; d < inner.shape.size(); ++d) {
    if (inner.offset[d] < outer.offset[d] || End(inner, d) > End(outer, d)) return false;
  }
  return true;
}

// The product of the dims, or nullopt past 2^64 - 1 (0 if any dim is 0).
std::optional<uint64_t> CheckedVolume(absl::Span<const int64_t> shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return uint64_t{0};
  uint64_t product = 1;
  for (int64_t dim : shape) {
    const uint64_t d = static_cast<uint64_t>(dim);
    if (product > UINT64_MAX / d) return std::nullopt;
    product *= d;
  }
  return product;
}

// The dimension with the most distinct offsets among `boxes[indices]`: sweeping
// along it keeps the set of boxes crossing the sweep line smallest for the
// usual splits (dim-0 shards, column shards, grids). Needs at least one dim.
size_t ChooseSweepDim(absl::Span<const Box> boxes, const std::vector<size_t>& indices,
                      size_t dims) {
  size_t best_dim = 0;
  size_t best_distinct = 0;
  std::vector<int64_t> offsets(indices.size());
  for (size_t d = 0; d < dims; ++d) {
    for (size_t k = 0; k < indices.size(); ++k) offsets[k] = boxes[indices[k]].offset[d];
    std::sort(offsets.begin(), offsets.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > best_distinct) {
      best_distinct = distinct;
      best_dim = d;
    }
  }
  return best_dim;
}

// An overlapping pair among the non-empty boxes `boxes[nonempty]`, lower index
// first, or nullopt. Sorts by the start in the sweep dimension and compares
// each box only with the boxes still open at its start.
std::optional<std::pair<size_t, size_t>> FindOverlap(absl::Span<const Box> boxes,
                                                     std::vector<size_t> nonempty, size_t dims) {
  if (dims == 0) {
    // Every scalar box holds the one element.
    if (nonempty.size() < 2) return std::nullopt;
    return std::make_pair(nonempty[0], nonempty[1]);
  }
  const size_t d = ChooseSweepDim(boxes, nonempty, dims);
  std::sort(nonempty.begin(), nonempty.end(), [&](size_t i, size_t j) {
    return std::make_pair(boxes[i].offset[d], i) < std::make_pair(boxes[j].offset[d], j);
  });
  std::vector<size_t> open;  // boxes whose interval in d has not ended yet
  for (size_t i : nonempty) {
    const int64_t start = boxes[i].offset[d];
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](size_t j) { return End(boxes[j], d) <= start; }),
               open.end());
    for (size_t j : open) {
      if (Overlap(boxes[i], boxes[j])) return std::make_pair(std::min(i, j), std::max(i, j));
    }
    open.push_back(i);
  }
  return std::nullopt;
}

// The first element in row-major order that no box of `boxes[nonempty]` holds,
// given that these do not overlap and hold fewer elements than the global
// tensor (so every global dim is >= 1 and every partial volume below fits).
// Dimension by dimension: the first coordinate whose slab the boxes crossing
// it fill less than fully, then only those boxes for the next dimension.
// O(dims * n log n).
std::optional<std::vector<int64_t>> FirstUncovered(absl::Span<const Box> boxes,
                                                   std::vector<size_t> candidates,
                                                   absl::Span<const int64_t> global_shape) {
  const size_t dims = global_shape.size();
  std::vector<int64_t> element;
  std::vector<std::pair<int64_t, uint64_t>> events;  // (coordinate, volume added mod 2^64)
  for (size_t d = 0; d < dims; ++d) {
    const auto slab_volume = [&](absl::Span<const int64_t> shape) {
      uint64_t v = 1;
      for (size_t e = d + 1; e < dims; ++e) v *= static_cast<uint64_t>(shape[e]);
      return v;
    };
    const uint64_t needed = slab_volume(global_shape);
    events.clear();
    for (size_t i : candidates) {
      const uint64_t v = slab_volume(boxes[i].shape);
      events.emplace_back(boxes[i].offset[d], v);
      events.emplace_back(End(boxes[i], d), uint64_t{0} - v);
    }
    std::sort(events.begin(), events.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    // Coverage is constant between event coordinates; find the first stretch
    // inside [0, global) that is covered less than fully.
    std::optional<int64_t> found;
    uint64_t covered = 0;
    int64_t pos = 0;
    size_t e = 0;
    while (pos < global_shape[d]) {
      const int64_t next = e < events.size() ? events[e].first : global_shape[d];
      if (next > pos && covered < needed) {
        found = pos;
        break;
      }
      if (e == events.size()) break;
      for (; e < events.size() && events[e].first == next; ++e) covered += events[e].second;
      pos = next;
    }
    if (!found) return std::nullopt;  // cannot happen when the preconditions hold
    element.push_back(*found);
    candidates.erase(
        std::remove_if(
            candidates.begin(), candidates.end(),
            [&](size_t i) { return boxes[i].offset[d] > *found || End(boxes[i], d) <= *found; }),
        candidates.end());
  }
  return element;
}

}  // namespace

bool operator==(const Box& a, const Box& b) { return a.offset == b.offset && a.shape == b.shape; }

bool operator!=(const Box& a, const Box& b) { return !(a == b); }

std::string BoxToString(const Box& box) {
  std::string out = "[";
  const size_t dims = std::max(box.offset.size(), box.shape.size());
  for (size_t d = 0; d < dims; ++d) {
    if (d > 0) out += ", ";
    // An invalid box may miss an offset or length, or overflow its end.
    const bool has_offset = d < box.offset.size();
    const bool has_length = d < box.shape.size();
    int64_t end = 0;
    if (!has_offset || !has_length) {
      absl::StrAppend(&out, has_offset ? absl::StrCat(box.offset[d]) : "?", ":",
                      has_length ? absl::StrCat("+", box.shape[d]) : "?");
    } else if (__builtin_add_overflow(box.offset[d], box.shape[d], &end)) {
      absl::StrAppend(&out, box.offset[d], ":+", box.shape[d]);
    } else {
      absl::StrAppend(&out, box.offset[d], ":", end);
    }
  }
  out += "]";
  return out;
}

Box WholeBox(absl::Span<const int64_t> global_shape) {
  return Box{std::vector<int64_t>(global_shape.size(), 0),
             std::vector<int64_t>(global_shape.begin(), global_shape.end())};
}

bool IsWhole(const Box& box, absl::Span<const int64_t> global_shape) {
  return box.shape.size() == global_shape.size() &&
         std::equal(box.shape.begin(), box.shape.end(), global_shape.begin()) &&
         box.offset.size() == global_shape.size() &&
         std::all_of(box.offset.begin(), box.offset.end(), [](int64_t o) { return o == 0; });
}

absl::Status ValidateBox(const Box& box, absl::Span<const int64_t> global_shape) {
  if (absl::Status status = CheckGlobalShape(global_shape); !status.ok()) return status;
  return CheckBoxInside(box, global_shape);
}

uint64_t Volume(const Box& box) {
  if (!HoldsElements(box)) return 0;  // a length of 0 (a scalar holds one element)
  uint64_t volume = 1;
  for (int64_t len : box.shape) volume *= static_cast<uint64_t>(len);
  return volume;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  assert(a.shape.size() == b.shape.size());
  if (a.shape.size() != b.shape.size()) return std::nullopt;
  Box out;
  out.offset.resize(a.shape.size());
  out.shape.resize(a.shape.size());
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t start = std::max(a.offset[d], b.offset[d]);
    const int64_t end = std::min(End(a, d), End(b, d));
    if (start >= end) return std::nullopt;
    out.offset[d] = start;
    out.shape[d] = end - start;
  }
  return out;
}

absl::Status CheckTiling(absl::Span<const Box> boxes, absl::Span<const int64_t> global_shape) {
  if (boxes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no boxes for the global shape ",
                                                   ShapeToString(global_shape),
                                                   "; at least one is required"));
  }
  if (absl::Status status = CheckGlobalShape(global_shape); !status.ok()) return status;
  const std::optional<uint64_t> global_volume = CheckedVolume(global_shape);
  if (!global_volume) {
    return absl::InvalidArgumentError(absl::StrCat("the global shape ", ShapeToString(global_shape),
                                                   " holds 2^64 elements or more"));
  }
  for (size_t i = 0; i < boxes.size(); ++i) {
    const absl::Status status = CheckBoxInside(boxes[i], global_shape);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("box ", i, ": ", status.message()));
    }
  }
  std::vector<size_t> nonempty;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (HoldsElements(boxes[i])) nonempty.push_back(i);
  }
  const size_t dims = global_shape.size();
  if (auto pair = FindOverlap(boxes, nonempty, dims)) {
    const auto [i, j] = *pair;
    const Box overlap = *Intersect(boxes[i], boxes[j]);
    return absl::FailedPreconditionError(
        absl::StrCat("boxes ", i, " ", BoxToString(boxes[i]), " and ", j, " ",
                     BoxToString(boxes[j]), " of global shape ", ShapeToString(global_shape),
                     " overlap in ", BoxToString(overlap), " (", Volume(overlap), " elements)"));
  }
  // The boxes lie inside the global tensor and do not overlap, so their
  // volumes add up to at most the global volume (no overflow), and to exactly
  // it iff they cover every element.
  uint64_t covered = 0;
  for (size_t i : nonempty) covered += Volume(boxes[i]);
  if (covered != *global_volume) {
    std::string message =
        absl::StrCat(boxes.size(), " boxes hold ", covered, " of the ", *global_volume,
                     " elements of global shape ", ShapeToString(global_shape), ": ",
                     *global_volume - covered, " elements are not covered");
    if (auto element = FirstUncovered(boxes, std::move(nonempty), global_shape)) {
      absl::StrAppend(&message, ", the first at ", ShapeToString(*element));
    }
    return absl::FailedPreconditionError(message);
  }
  return absl::OkStatus();
}

void CopyBoxRegion(const uint8_t* src, const Box& src_box, uint8_t* dst, const Box& dst_box,
                   const Box& region, size_t elem_size) {
  assert(Contains(src_box, region) && Contains(dst_box, region));
  if (!HoldsElements(region)) return;
  const size_t dims = region.shape.size();

  // Byte strides of both boxes, and the byte offsets of the region's first element.
  // Inline storage: no allocation for up to 8 dims (callers copy many small regions).
  absl::InlinedVector<size_t, 8> src_stride(dims), dst_stride(dims);
  size_t src_pos = 0, dst_pos = 0;
  size_t src_step = elem_size, dst_step = elem_size;
  for (size_t d = dims; d-- > 0;) {
    src_stride[d] = src_step;
    dst_stride[d] = dst_step;
    src_pos += static_cast<size_t>(region.offset[d] - src_box.offset[d]) * src_step;
    dst_pos += static_cast<size_t>(region.offset[d] - dst_box.offset[d]) * dst_step;
    src_step *= static_cast<size_t>(src_box.shape[d]);
    dst_step *= static_cast<size_t>(dst_box.shape[d]);
  }

  // One memcpy covers the innermost dims the region spans whole in both boxes,
  // plus the next dim out (consecutive rows of whole inner blocks are adjacent).
  size_t run = elem_size;
  size_t outer = dims;  // dims [0, outer) are iterated
  while (outer > 0) {
    const size_t d = outer - 1;
    run *= static_cast<size_t>(region.shape[d]);
    outer = d;
    if (region.shape[d] != src_box.shape[d] || region.shape[d] != dst_box.shape[d]) break;
  }

  // Odometer over the outer dims, innermost fastest.
  absl::InlinedVector<int64_t, 8> index(outer, 0);
  for (;;) {
    std::memcpy(dst + dst_pos, src + src_pos, run);
    for (size_t d = outer;;) {
      if (d == 0) return;  // every outer dim has wrapped: done
      --d;
      if (++index[d] < region.shape[d]) {
        src_pos += src_stride[d];
        dst_pos += dst_stride[d];
        break;
      }
      // Rewind this dim to its first index and carry into the next one out.
      const size_t rewound = static_cast<size_t>(region.shape[d] - 1);
      src_pos -= rewound * src_stride[d];
      dst_pos -= rewound * dst_stride[d];
      index[d] = 0;
    }
  }
}

}  // namespace zcc::format
