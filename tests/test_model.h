// The synthetic models the test trainers register, shared by the trainer
// process and the tests that check what it checkpointed. A tensor's bytes are
// a pure function of (name, step), so replicas on different ranks hold the
// same bytes and any process can recompute them; parameters are finite floats
// in [-1, 1) so that EMA updates always apply.
#ifndef ZCC_TESTS_TEST_MODEL_H_
#define ZCC_TESTS_TEST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"

namespace zcc::testing {

struct ModelTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  TensorKind kind = TensorKind::kParam;
  bool ema_eligible = false;
  ReplicaGroup replica;
  uint64_t nbytes = 0;
  // A piece of a global tensor (see TensorRef); both empty for whole tensors.
  // A sliced tensor's values are a function of (name, global element, step),
  // so any layout can recompute any piece.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
};

// "plain": every tensor owned by its rank (tensors x (F32 param, BF16 optimizer
// state), plus an RNG blob). "moe": world 8 = TP 2 x DP 4 with EP 2: dense
// parameters replicated over the DP group of 4, experts (two per expert-parallel
// rank, global ids) replicated over their expert-DP group of 2, ZeRO-sharded
// optimizer state and the RNG blob owned by each rank.
//
// "dpD.tpT.epE" (world D x T x E; rank = (dp * E + ep) * T + tp): a sliced
// model of global tensors, the same for every layout: embedding and qkv rows
// split over TP (dim 0), the output projection's columns split over TP (dim
// 1), the norm split over TP, stacked experts [4, 8, 12] split over EP (dim
// 0, by global expert) and TP (dim 2); dense pieces replicated over the
// D x E ranks of equal tp, expert pieces over the D ranks of equal (ep, tp).
// Optimizer state (BF16, same global shapes) is ZeRO-sharded: each rank owns
// a dim-0 slice of its parameter piece (uneven, some empty). Splits follow
// torch.chunk (ceil-sized, the last pieces smaller or empty).
std::vector<ModelTensor> BuildModel(const std::string& topology, int rank, int world, int tensors,
                                    int kib);

// The world size of a "dpD.tpT.epE" topology; 0 for any other topology.
int LayoutWorld(const std::string& topology);

// The tensor's bytes at `step`.
void FillTensor(const ModelTensor& t, int64_t step, uint8_t* out);

// The fp32 EMA of an F32 parameter after updates at steps 1..last_step with
// `decay`, computed as zccd does: ema = fl(fl(d * ema) + fl((1 - d) * p)),
// initialised from step 1.
std::vector<float> ReferenceEma(const ModelTensor& t, int64_t last_step, float decay);

}  // namespace zcc::testing

#endif  // ZCC_TESTS_TEST_MODEL_H_
