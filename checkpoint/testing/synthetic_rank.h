// SyntheticRank: one rank's registration built from a list of tensors, with a
// staging slot of deterministic bytes, for the checkpoint writer and reader
// tests. The slot is page-aligned (as the daemon's shared-memory slots are)
// unless the test asks for it to be shifted.
//
// Thread-safety: none needed (test-only, one thread). Owns its slot memory.
#ifndef ZCC_CHECKPOINT_TESTING_SYNTHETIC_RANK_H_
#define ZCC_CHECKPOINT_TESTING_SYNTHETIC_RANK_H_

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/reader.h"
#include "format/dtype.h"
#include "shm/slot_layout.h"
#include "storage/aligned_buffer.h"

namespace zcc::checkpoint::testing {

struct TensorSpec {
  std::string name;
  format::DType dtype = format::DType::kU8;
  std::vector<int64_t> shape;
  format::TensorKind kind = format::TensorKind::kParam;
};

class SyntheticRank {
 public:
  SyntheticRank(uint32_t rank, uint32_t world, const std::vector<TensorSpec>& specs,
                size_t slot_shift = 0, std::string job = "job") {
    shards_.job_id = std::move(job);
    shards_.rank = rank;
    shards_.world_size = world;
    shards_.manifest_hash = 0x1234;
    std::vector<shm::LayoutInput> in;
    for (const TensorSpec& s : specs) {
      RankTensor t;
      t.name = absl::StrCat("r", rank, "/", s.name);
      t.dtype = s.dtype;
      t.shape = s.shape;
      t.kind = s.kind;
      auto bytes = format::TensorBytes(s.dtype, s.shape);
      REQUIRE(bytes.ok());
      t.nbytes = *bytes;
      in.push_back({t.name, t.nbytes, t.kind});
      shards_.tensors.push_back(std::move(t));
    }
    auto layout = shm::ComputeSlotLayout(in, uint64_t{1} << 34);
    REQUIRE(layout.ok());
    shards_.layout = *layout;
    for (size_t i = 0; i < shards_.tensors.size(); ++i) {
      shards_.tensors[i].slot_offset = shards_.layout.placements[i].offset;
    }
    memory_ = storage::AlignedBuffer(shards_.layout.slot_bytes + slot_shift);
    slot_ = memory_.data() + slot_shift;
  }

  const RankShards& shards() const { return shards_; }
  uint8_t* slot() { return slot_; }
  uint64_t slot_bytes() const { return shards_.layout.slot_bytes; }

  // Bytes that depend on the step and rank.
  void Fill(int64_t step) {
    uint64_t x = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull + shards_.rank + 1;
    for (uint64_t i = 0; i < slot_bytes(); ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      slot_[i] = static_cast<uint8_t>(x);
    }
  }

  // Every tensor, read into `base` + its slot offset.
  std::vector<ReadTarget> Targets(uint8_t* base) const {
    std::vector<ReadTarget> targets;
    for (const RankTensor& t : shards_.tensors) {
      targets.push_back(
          {t.name, std::string(format::TensorKindName(t.kind)), t.dtype, t.shape, base + t.slot_offset, t.nbytes});
    }
    return targets;
  }

  // True when every tensor in `other` (laid out like the slot) equals ours.
  bool SameTensors(const uint8_t* other) const {
    for (const RankTensor& t : shards_.tensors) {
      if (std::memcmp(slot_ + t.slot_offset, other + t.slot_offset, t.nbytes) != 0) return false;
    }
    return true;
  }

 private:
  RankShards shards_;
  storage::AlignedBuffer memory_;
  uint8_t* slot_ = nullptr;
};

}  // namespace zcc::checkpoint::testing

#endif  // ZCC_CHECKPOINT_TESTING_SYNTHETIC_RANK_H_
