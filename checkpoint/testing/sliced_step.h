// A small model checkpointed by several ranks in sliced pieces, for the tests
// and the benchmark of the layout-free read paths (export, resharding
// restore): a row-split embedding with an uneven last piece, column-split and
// 2-d grid-split projections, whole tensors written by one rank, a scalar and
// an integer tensor, in param, optim and EMA kinds, with the dtypes a model
// has (F32, BF16, F16, I64).
//
// Every element's value is a function of (kind, name, dtype, row-major index
// in the global tensor) alone (ElementBits), so a reader can check any box of
// any tensor without the writer's help; tools/export_python_test.py computes
// the same function in Python (keep the two in sync).
//
// Thread-safety: pure functions; WriteSlicedStep writes only under job_dir.
#ifndef ZCC_CHECKPOINT_TESTING_SLICED_STEP_H_
#define ZCC_CHECKPOINT_TESTING_SLICED_STEP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "format/box.h"
#include "format/dtype.h"

namespace zcc::checkpoint::testing {

struct SlicedModel {
  uint32_t world = 4;          // even, >= 2 (the grid split is 2 x world/2)
  int layers = 1;
  int64_t hidden = 12;         // a multiple of `world` (column splits)
  int64_t intermediate = 8;
  int64_t vocab = 10;          // rows of the row-split embedding (uneven when
                               // not a multiple of `world`)
  bool optim = true;           // an F32 "<name>.exp_avg" per floating parameter
  bool ema = true;             // an F32 EMA tensor per floating parameter
};

// How a global tensor is cut into the ranks' pieces.
enum class Split {
  kWhole,    // written whole by `owner`
  kRows,     // dim 0 in world pieces of ceil(n / world) rows (the last ones shorter or empty)
  kColumns,  // dim 1 in world equal pieces
  kGrid,     // 2 x (world / 2) blocks, rank r = row block * (world / 2) + column block
};

struct SlicedTensor {
  std::string kind;  // "param", "optim", "ema"
  std::string name;
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> global_shape;
  Split split = Split::kWhole;
  uint32_t owner = 0;  // kWhole only
};

// Every global tensor of `model`, sorted by (kind, name).
std::vector<SlicedTensor> SlicedModelTensors(const SlicedModel& model);

// The box of `tensor` that `rank` writes; nullopt when it writes none of it.
std::optional<format::Box> PieceOf(const SlicedTensor& tensor, uint32_t rank, uint32_t world);

// The bits of element `flat` (row-major index in the global tensor), in the
// low DTypeSize(dtype) bytes. With u = (FNV-1a-32(kind + ":" + name) +
// flat * 2654435761) mod 2^32:
//   F32: the float (u mod 65536 - 32768) / 256 (exact; a BF16 or F16
//        conversion must round, ties included);
//   BF16: 0x3c00 + u mod 0x800;  F16: 0x3000 + u mod 0x1000;
//   I64: u - 2^31.
uint64_t ElementBits(const std::string& kind, const std::string& name, format::DType dtype,
                     uint64_t flat);

// The row-major bytes of `box` of `tensor` (Volume(box) x DTypeSize bytes).
void FillBox(const SlicedTensor& tensor, const format::Box& box, uint8_t* dst);

// Writes every rank's shards and manifest of step `step` of `model` under
// job_dir (as zccd's writers would) and commits it (TryCommit).
absl::Status WriteSlicedStep(const std::string& job_dir, const std::string& job_id, int64_t step,
                             const SlicedModel& model);

}  // namespace zcc::checkpoint::testing

#endif  // ZCC_CHECKPOINT_TESTING_SLICED_STEP_H_
