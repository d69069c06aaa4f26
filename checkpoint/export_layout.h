// How an export writes some tensors otherwise than the trainer held them, as
// the trainer's framework integration stored it with the job: the job file
// kExportLayoutFileName (Client::PutJobFile; <job dir>/metadata/), read by
// ExportStep and not copied into the export.
//
//   {"transpose": ["model.layers.0.mlp.gate_proj.weight", ...]}
//
// "transpose" names 2-D tensors written transposed, [a, b] as [b, a]:
// Paddle keeps a Linear layer's weight as [in, out], while Hugging Face's
// checkpoints (and PaddleFormers' from_pretrained, which reads them) hold
// [out, in]. The checkpoint itself keeps the trainer's layout (a restore
// gives the trainer its tensors as they were); only the export turns them.
//
// Thread-safety: stateless functions.
#ifndef ZCC_CHECKPOINT_EXPORT_LAYOUT_H_
#define ZCC_CHECKPOINT_EXPORT_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::checkpoint {

inline constexpr char kExportLayoutFileName[] = "zcc_export.json";

struct ExportLayout {
  std::set<std::string> transpose;  // tensor names
};

// The layout a kExportLayoutFileName file holds. InvalidArgument (naming
// `what`, the file, and the problem) for anything but a JSON object whose
// optional "transpose" is an array of non-empty strings; other keys are
// refused too (a newer layout this export does not understand).
absl::StatusOr<ExportLayout> ParseExportLayout(absl::string_view json, absl::string_view what);

// Elements [first, first + count) of the transpose ([cols, rows], row-major)
// of the row-major [rows, cols] tensor at `src` whose elements are
// `elem_size` bytes (1, 2, 4 or 8), into `dst` (count * elem_size bytes).
// Requires first + count <= rows * cols.
void TransposeRange(const uint8_t* src, uint64_t rows, uint64_t cols, size_t elem_size,
                    uint64_t first, uint64_t count, uint8_t* dst);

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_EXPORT_LAYOUT_H_
