#include "checkpoint/testing/sliced_step.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/committer.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/shard_writer.h"
#include "common/status.h"
#include "format/manifest.h"
#include "format/tensor_kind.h"
#include "shm/slot_layout.h"
#include "storage/aligned_buffer.h"

namespace zcc::checkpoint::testing {
namespace {

using format::DType;

uint32_t Fnv1a32(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

uint64_t BitsFromSeed(uint32_t seed, DType dtype, uint64_t flat) {
  const uint32_t u = static_cast<uint32_t>(seed + flat * 2654435761u);
  switch (dtype) {
    case DType::kF32: {
      const float f = (static_cast<float>(u % 65536) - 32768.0f) / 256.0f;
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      return bits;
    }
    case DType::kBF16:
      return 0x3c00u + u % 0x800u;
    case DType::kF16:
      return 0x3000u + u % 0x1000u;
    default:
      return static_cast<uint64_t>(static_cast<int64_t>(u) - (int64_t{1} << 31));
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [r * chunk, (r + 1) * chunk) of n, clipped (possibly empty).
std::pair<int64_t, int64_t> Chunk(int64_t n, int64_t parts, int64_t r) {
  const int64_t chunk = CeilDiv(n, parts);
  const int64_t begin = std::min(n, r * chunk);
  return {begin, std::min(n, begin + chunk) - begin};
}

}  // namespace

std::vector<SlicedTensor> SlicedModelTensors(const SlicedModel& m) {
  const int64_t h = m.hidden;
  std::vector<SlicedTensor> params = {
      {"param", "model.embed_tokens.weight", DType::kBF16, {m.vocab, h}, Split::kRows},
      {"param", "model.logit_scale", DType::kF32, {}, Split::kWhole, m.world - 1},
      {"param", "model.norm.weight", DType::kF32, {h}, Split::kWhole, 0},
      {"param", "model.step_count", DType::kI64, {3}, Split::kWhole, 1 % m.world},
  };
  for (int i = 0; i < m.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const uint32_t r = static_cast<uint32_t>(i) % m.world;
    params.push_back({"param", p + "input_layernorm.weight", DType::kF32, {h}, Split::kWhole, r});
    params.push_back(
        {"param", p + "mlp.down_proj.weight", DType::kF32, {h, m.intermediate}, Split::kGrid});
    params.push_back(
        {"param", p + "mlp.up_proj.weight", DType::kF32, {m.intermediate, h}, Split::kColumns});
    params.push_back({"param", p + "self_attn.k_proj.weight", DType::kF16, {h, h}, Split::kWhole,
                      (r + 1) % m.world});
    params.push_back({"param", p + "self_attn.q_proj.weight", DType::kBF16, {h, h}, Split::kRows});
  }
  std::vector<SlicedTensor> all = params;
  for (const SlicedTensor& t : params) {
    if (t.dtype == DType::kI64) continue;
    if (m.optim) {
      SlicedTensor o = t;
      o.kind = "optim";
      o.name += ".exp_avg";
      o.dtype = DType::kF32;
      all.push_back(o);
    }
    if (m.ema) {
      SlicedTensor e = t;
      e.kind = "ema";
      e.dtype = DType::kF32;
      all.push_back(e);
    }
  }
  std::sort(all.begin(), all.end(), [](const SlicedTensor& a, const SlicedTensor& b) {
    return std::tie(a.kind, a.name) < std::tie(b.kind, b.name);
  });
  return all;
}

std::optional<format::Box> PieceOf(const SlicedTensor& t, uint32_t rank, uint32_t world) {
  format::Box box = format::WholeBox(t.global_shape);
  switch (t.split) {
    case Split::kWhole:
      if (rank != t.owner) return std::nullopt;
      return box;
    case Split::kRows:
      std::tie(box.offset[0], box.shape[0]) = Chunk(t.global_shape[0], world, rank);
      return box;
    case Split::kColumns:
      std::tie(box.offset[1], box.shape[1]) = Chunk(t.global_shape[1], world, rank);
      return box;
    case Split::kGrid:
      std::tie(box.offset[0], box.shape[0]) = Chunk(t.global_shape[0], 2, rank / (world / 2));
      std::tie(box.offset[1], box.shape[1]) = Chunk(t.global_shape[1], world / 2, rank % (world / 2));
      return box;
  }
  return std::nullopt;
}

uint64_t ElementBits(const std::string& kind, const std::string& name, DType dtype, uint64_t flat) {
  return BitsFromSeed(Fnv1a32(kind + ":" + name), dtype, flat);
}

void FillBox(const SlicedTensor& t, const format::Box& box, uint8_t* dst) {
  const uint64_t n = format::Volume(box);
  if (n == 0) return;
  const uint32_t seed = Fnv1a32(t.kind + ":" + t.name);
  const size_t elem = format::DTypeSize(t.dtype);
  const size_t dims = box.shape.size();
  std::vector<int64_t> index(dims, 0);  // position inside the box
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) {
      flat = flat * static_cast<uint64_t>(t.global_shape[d]) +
             static_cast<uint64_t>(box.offset[d] + index[d]);
    }
    const uint64_t bits = BitsFromSeed(seed, t.dtype, flat);
    std::memcpy(dst + i * elem, &bits, elem);  // little-endian
    for (size_t d = dims; d-- > 0;) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
}

absl::Status WriteSlicedStep(const std::string& job_dir, const std::string& job_id, int64_t step,
                             const SlicedModel& model) {
  if (model.world < 2 || model.world % 2 != 0 || model.hidden % model.world != 0) {
    return absl::InvalidArgumentError("world must be even and divide hidden");
  }
  const std::vector<SlicedTensor> tensors = SlicedModelTensors(model);
  for (uint32_t rank = 0; rank < model.world; ++rank) {
    RankShards shards;
    shards.job_id = job_id;
    shards.rank = rank;
    shards.world_size = model.world;
    shards.manifest_hash = 0x5eed;
    std::vector<std::pair<const SlicedTensor*, format::Box>> slot_pieces, ema_pieces;
    for (const SlicedTensor& t : tensors) {
      std::optional<format::Box> box = PieceOf(t, rank, model.world);
      if (!box.has_value()) continue;
      if (t.kind == format::kEmaKindName) {
        ema_pieces.emplace_back(&t, *std::move(box));
        continue;
      }
      RankTensor rt;
      rt.name = t.name;
      rt.dtype = t.dtype;
      rt.shape = box->shape;
      ZCC_ASSIGN_OR_RETURN(rt.kind, format::ParseTensorKindName(t.kind));
      rt.nbytes = format::Volume(*box) * format::DTypeSize(t.dtype);
      if (!format::IsWhole(*box, t.global_shape)) {
        rt.global_shape = t.global_shape;
        rt.box_offset = box->offset;
      }
      shards.tensors.push_back(std::move(rt));
      slot_pieces.emplace_back(&t, *std::move(box));
    }
    std::vector<shm::LayoutInput> in;
    for (const RankTensor& t : shards.tensors) in.push_back({t.name, t.nbytes, t.kind});
    ZCC_ASSIGN_OR_RETURN(shards.layout, shm::ComputeSlotLayout(in, uint64_t{1} << 40));
    storage::AlignedBuffer slot(std::max<uint64_t>(shards.layout.slot_bytes, 1));
    for (size_t i = 0; i < shards.tensors.size(); ++i) {
      shards.tensors[i].slot_offset = shards.layout.placements[i].offset;
      FillBox(*slot_pieces[i].first, slot_pieces[i].second,
              slot.data() + shards.tensors[i].slot_offset);
    }
    uint64_t ema_bytes = 0;
    for (const auto& [t, box] : ema_pieces) ema_bytes += format::Volume(box) * 4;
    storage::AlignedBuffer ema(std::max<uint64_t>(ema_bytes, 1));
    ExtraShard ema_shard{format::kEmaKindName, format::ShardFileName("ema", rank), {}};
    uint64_t at = 0;
    for (const auto& [t, box] : ema_pieces) {
      ExtraTensor e;
      e.name = t->name;
      e.dtype = t->dtype;
      e.shape = box.shape;
      e.data = ema.data() + at;
      e.nbytes = format::Volume(box) * 4;
      if (!format::IsWhole(box, t->global_shape)) {
        e.global_shape = t->global_shape;
        e.box_offset = box.offset;
      }
      FillBox(*t, box, ema.data() + at);
      at += e.nbytes;
      ema_shard.tensors.push_back(std::move(e));
    }
    std::vector<ExtraShard> extra;
    if (!ema_shard.tensors.empty()) extra.push_back(std::move(ema_shard));
    ZCC_RETURN_IF_ERROR(
        WriteRankShards(job_dir, step, shards, slot.data(), IoOptions(), extra).status());
  }
  ZCC_ASSIGN_OR_RETURN(CommitResult result, TryCommit(job_dir, job_id, step, model.world));
  if (result.outcome != CommitOutcome::kCommitted) {
    return absl::InternalError("the step did not commit");
  }
  return absl::OkStatus();
}

}  // namespace zcc::checkpoint::testing
