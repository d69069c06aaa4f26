#include "tests/test_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

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

// torch.chunk's split of n into `parts`: piece `i` as (start, length).
std::pair<int64_t, int64_t> Chunk(int64_t n, int parts, int i) {
  const int64_t size = (n + parts - 1) / parts;
  const int64_t start = std::min<int64_t>(n, size * i);
  return {start, std::min<int64_t>(size, n - start)};
}

struct Layout {
  int dp = 1, tp = 1, ep = 1;
};

std::optional<Layout> ParseLayout(const std::string& topology) {
  Layout l;
  if (std::sscanf(topology.c_str(), "dp%d.tp%d.ep%d", &l.dp, &l.tp, &l.ep) != 3) return std::nullopt;
  if (l.dp < 1 || l.tp < 1 || l.ep < 1) return std::nullopt;
  return l;
}

ModelTensor Piece(std::string name, DType dtype, std::vector<int64_t> global,
                  std::vector<int64_t> offset, std::vector<int64_t> shape, TensorKind kind,
                  bool ema, ReplicaGroup replica) {
  ModelTensor t = Make(std::move(name), dtype, std::move(shape), kind, ema, replica);
  t.global_shape = std::move(global);
  t.box_offset = std::move(offset);
  return t;
}

std::vector<ModelTensor> BuildSlicedModel(const Layout& l, int rank) {
  const int tp = rank % l.tp, ep = (rank / l.tp) % l.ep, dp = rank / (l.tp * l.ep);
  std::vector<ModelTensor> model;
  auto dense = [&]() -> ReplicaGroup {
    const int size = l.dp * l.ep;
    if (size == 1) return {};
    return {ReplicaGroup::Kind::kDataParallel, static_cast<uint32_t>(size),
            static_cast<uint32_t>(dp * l.ep + ep), -1};
  };
  auto add = [&](const std::string& name, std::vector<int64_t> global, std::vector<int64_t> offset,
                 std::vector<int64_t> shape, ReplicaGroup group) {
    model.push_back(Piece(name, DType::kF32, global, offset, shape, TensorKind::kParam, true, group));
    // ZeRO: the optimizer state of this piece, split over its replica group on dim 0.
    const int members = group.kind == ReplicaGroup::Kind::kNone ? 1 : group.group_size;
    const auto [start, len] = Chunk(shape[0], members, group.rank_in_group);
    std::vector<int64_t> o = offset, s = shape;
    o[0] += start;
    s[0] = len;
    model.push_back(Piece("optim." + name + ".exp_avg", DType::kBF16, global, o, s,
                          TensorKind::kOptim, false, {}));
  };
  {
    const auto [r0, rn] = Chunk(50, l.tp, tp);
    add("embed.weight", {50, 16}, {r0, 0}, {rn, 16}, dense());
  }
  {
    const auto [r0, rn] = Chunk(24, l.tp, tp);
    add("layers.0.qkv.weight", {24, 16}, {r0, 0}, {rn, 16}, dense());
  }
  {
    const auto [c0, cn] = Chunk(24, l.tp, tp);
    add("layers.0.proj.weight", {16, 24}, {0, c0}, {16, cn}, dense());
  }
  {
    const auto [n0, nn] = Chunk(16, l.tp, tp);
    add("layers.0.norm.weight", {16}, {n0}, {nn}, dense());
  }
  {
    const auto [e0, en] = Chunk(4, l.ep, ep);
    const auto [c0, cn] = Chunk(12, l.tp, tp);
    ReplicaGroup experts;
    if (l.dp > 1) {
      experts = {ReplicaGroup::Kind::kExpertDataParallel, static_cast<uint32_t>(l.dp),
                 static_cast<uint32_t>(dp), e0};
    }
    add("experts.w1", {4, 8, 12}, {e0, 0, c0}, {en, 8, cn}, experts);
  }
  model.push_back(Make(absl::StrCat("rng.rank", rank), DType::kU8, {33}, TensorKind::kExtra, false));
  return model;
}

// A stateless per-element hash: the value of element `index` of `name` at `step`.
uint64_t ElementHash(uint64_t name_hash, int64_t step, uint64_t index) {
  uint64_t z = name_hash ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ULL) ^
               (index * 0xbf58476d1ce4e5b9ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void FillPiece(const ModelTensor& t, int64_t step, uint8_t* out) {
  const size_t elem = format::DTypeSize(t.dtype);
  const size_t dims = t.shape.size();
  const uint64_t name_hash = Fnv1a(t.name);
  const uint64_t n = elem == 0 ? 0 : t.nbytes / elem;
  std::vector<int64_t> local(dims, 0);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t global = 0;
    for (size_t d = 0; d < dims; ++d) global = global * t.global_shape[d] + t.box_offset[d] + local[d];
    const uint64_t h = ElementHash(name_hash, step, global);
    if (t.dtype == DType::kF32) {
      const float v = static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
      std::memcpy(out + 4 * i, &v, 4);
    } else {
      std::memcpy(out + elem * i, &h, elem);
    }
    for (size_t d = dims; d-- > 0;) {
      if (++local[d] < t.shape[d]) break;
      local[d] = 0;
    }
  }
}

}  // namespace

int LayoutWorld(const std::string& topology) {
  const std::optional<Layout> l = ParseLayout(topology);
  return l.has_value() ? l->dp * l->tp * l->ep : 0;
}

std::vector<ModelTensor> BuildModel(const std::string& topology, int rank, int world, int tensors,
                                    int kib) {
  if (const std::optional<Layout> layout = ParseLayout(topology)) {
    return BuildSlicedModel(*layout, rank);
  }
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
  if (!t.global_shape.empty()) {
    FillPiece(t, step, out);
    return;
  }
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
