#include "tests/test_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace zcc::testing {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

struct Xorshift {
  uint64_t x;
  uint64_t Next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
};

Xorshift Stream(const std::string& name, int64_t step) {
  return Xorshift{(Fnv1a(name) ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL)) | 1};
}

ModelTensor Make(std::string name, DType dtype, std::vector<int64_t> shape, TensorKind kind,
                 bool ema, ReplicaGroup replica = {}) {
  ModelTensor t{std::move(name), dtype, std::move(shape), kind, ema, replica, 0};
  t.nbytes = *format::TensorBytes(t.dtype, t.shape);
  return t;
}

}  // namespace

std::vector<ModelTensor> BuildModel(const std::string& topology, int rank, int world, int tensors,
                                    int kib) {
  std::vector<ModelTensor> model;
  const int64_t elems = std::max<int64_t>(64, int64_t{kib} * 1024 / 4) / 64 * 64;
  if (topology == "moe") {
    const int tp = rank / 4, dp = rank % 4, ep_rank = dp % 2, edp_rank = dp / 2;
    ReplicaGroup dense{ReplicaGroup::Kind::kDataParallel, 4, static_cast<uint32_t>(dp), -1};
    for (int i = 0; i < tensors; ++i) {
      // Different sizes, so the byte balance has something to do.
      model.push_back(Make(absl::StrCat("tp", tp, ".layers.", i, ".dense.weight"), DType::kF32,
                           {elems / 64 * (1 + i % 3), 64}, TensorKind::kParam, true, dense));
    }
    for (int e = ep_rank * 2; e < ep_rank * 2 + 2; ++e) {
      const int64_t expert_id = tp * 100 + e;  // global over the whole model
      ReplicaGroup group{ReplicaGroup::Kind::kExpertDataParallel, 2, static_cast<uint32_t>(edp_rank),
                         expert_id};
      model.push_back(Make(absl::StrCat("tp", tp, ".experts.", e, ".w1"), DType::kF32,
                           {elems / 64, 64}, TensorKind::kParam, true, group));
      model.push_back(Make(absl::StrCat("tp", tp, ".experts.", e, ".w2"), DType::kF32,
                           {elems / 32, 32}, TensorKind::kParam, true, group));
    }
    // ZeRO: each rank owns a slice of the optimizer state.
    model.push_back(Make(absl::StrCat("optim.tp", tp, ".dp", dp, ".exp_avg_shard"), DType::kF32,
                         {elems}, TensorKind::kOptim, false));
    model.push_back(Make(absl::StrCat("rng.rank", rank), DType::kU8, {33}, TensorKind::kExtra, false));
    (void)world;
    return model;
  }
  for (int i = 0; i < tensors; ++i) {
    const std::string name = absl::StrCat("rank", rank, ".layers.", i, ".weight");
    model.push_back(Make(name, DType::kF32, {elems / 64, 64}, TensorKind::kParam, true));
    model.push_back(Make("optim/" + name + ".exp_avg", DType::kBF16, {elems}, TensorKind::kOptim, false));
  }
  model.push_back(Make(absl::StrCat("rank", rank, ".rng"), DType::kU8, {33}, TensorKind::kExtra, false));
  return model;
}

void FillTensor(const ModelTensor& t, int64_t step, uint8_t* out) {
  Xorshift rng = Stream(t.name, step);
  if (t.dtype == DType::kF32 && t.kind == TensorKind::kParam) {
    for (uint64_t i = 0; i < t.nbytes / 4; ++i) {
      const float v = static_cast<float>(rng.Next() >> 40) * (1.0f / 8388608.0f) - 1.0f;
      std::memcpy(out + 4 * i, &v, 4);
    }
    return;
  }
  for (uint64_t i = 0; i < t.nbytes; ++i) out[i] = static_cast<uint8_t>(rng.Next() >> 24);
}

std::vector<float> ReferenceEma(const ModelTensor& t, int64_t last_step, float decay) {
  const size_t n = t.nbytes / 4;
  std::vector<float> ema(n), p(n);
  const float d = decay, one_minus_d = 1.0f - d;
  for (int64_t step = 1; step <= last_step; ++step) {
    FillTensor(t, step, reinterpret_cast<uint8_t*>(p.data()));
    for (size_t i = 0; i < n; ++i) {
      if (step == 1) {
        ema[i] = p[i];
      } else {
        const float a = d * ema[i];
        const float b = one_minus_d * p[i];
        ema[i] = a + b;
      }
    }
  }
  return ema;
}

}  // namespace zcc::testing
