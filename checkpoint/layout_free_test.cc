// Layout-free checkpoints at the library level: ranks write pieces of global
// tensors, the committer checks that they tile and writes the step's index,
// and ReadBoxes reassembles any other tiling from it.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/committer.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "checkpoint/reshard.h"
#include "checkpoint/shard_writer.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/box.h"
#include "format/manifest.h"
#include "shm/slot_layout.h"
#include "storage/aligned_buffer.h"

namespace zcc::checkpoint {
namespace {

using format::Box;
using format::DType;

// A global tensor whose element i holds a value derived from (name, i, step).
struct Global {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  format::TensorKind kind = format::TensorKind::kParam;
};

uint8_t ByteOf(const std::string& name, uint64_t element, size_t byte, int64_t step) {
  return static_cast<uint8_t>(name.size() * 31 + element * 7 + byte * 13 + step * 101);
}

// The bytes of `box` of `g` at `step`, row-major.
std::vector<uint8_t> PieceBytes(const Global& g, const Box& box, int64_t step) {
  const size_t elem = format::DTypeSize(g.dtype);
  std::vector<uint8_t> out(format::Volume(box) * elem);
  std::vector<int64_t> local(box.shape.size(), 0);
  for (uint64_t i = 0; i < format::Volume(box); ++i) {
    uint64_t global = 0;
    for (size_t d = 0; d < box.shape.size(); ++d) {
      global = global * g.shape[d] + box.offset[d] + local[d];
    }
    for (size_t b = 0; b < elem; ++b) out[i * elem + b] = ByteOf(g.name, global, b, step);
    for (size_t d = box.shape.size(); d-- > 0;) {
      if (++local[d] < box.shape[d]) break;
      local[d] = 0;
    }
  }
  return out;
}

// One rank's pieces, written with the real shard writer.
struct PieceRank {
  RankShards shards;
  storage::AlignedBuffer slot;

  PieceRank(uint32_t rank, uint32_t world, const std::vector<std::pair<Global, Box>>& pieces,
            int64_t step) {
    shards.job_id = "job";
    shards.rank = rank;
    shards.world_size = world;
    std::vector<shm::LayoutInput> in;
    for (const auto& [g, box] : pieces) {
      RankTensor t;
      t.name = g.name;
      t.dtype = g.dtype;
      t.shape = box.shape;
      t.kind = g.kind;
      t.nbytes = format::Volume(box) * format::DTypeSize(g.dtype);
      t.global_shape = g.shape;
      t.box_offset = box.offset;
      in.push_back({t.name, t.nbytes, t.kind});
      shards.tensors.push_back(t);
    }
    shards.layout = *shm::ComputeSlotLayout(in, uint64_t{1} << 30);
    slot = storage::AlignedBuffer(shards.layout.slot_bytes);
    for (size_t i = 0; i < pieces.size(); ++i) {
      shards.tensors[i].slot_offset = shards.layout.placements[i].offset;
      const std::vector<uint8_t> bytes = PieceBytes(pieces[i].first, pieces[i].second, step);
      if (!bytes.empty()) std::memcpy(slot.data() + shards.tensors[i].slot_offset, bytes.data(), bytes.size());
    }
  }
};

const Global kCol{"layers.0.proj.weight", DType::kF32, {4, 6}};
const Global kRow{"embed.weight", DType::kBF16, {5, 3}};
const Global kNorm{"norm.weight", DType::kF32, {6}};
const Global kOptim{"optim.embed.exp_avg", DType::kF32, {5, 3}, format::TensorKind::kOptim};

// Three ranks: kCol split by columns 2/2/2, kRow by rows 2/2/1 (uneven),
// kNorm whole on rank 0, kOptim rows 5/0/0 (two empty pieces).
std::vector<std::vector<std::pair<Global, Box>>> ThreeRankLayout() {
  return {
      {{kCol, {{0, 0}, {4, 2}}}, {kRow, {{0, 0}, {2, 3}}}, {kNorm, {{0}, {6}}},
       {kOptim, {{0, 0}, {5, 3}}}},
      {{kCol, {{0, 2}, {4, 2}}}, {kRow, {{2, 0}, {2, 3}}}, {kOptim, {{5, 0}, {0, 3}}}},
      {{kCol, {{0, 4}, {4, 2}}}, {kRow, {{4, 0}, {1, 3}}}, {kOptim, {{5, 0}, {0, 3}}}},
  };
}

absl::Status WriteStep(const std::string& root, int64_t step,
                       const std::vector<std::vector<std::pair<Global, Box>>>& layout) {
  for (size_t r = 0; r < layout.size(); ++r) {
    PieceRank rank(static_cast<uint32_t>(r), static_cast<uint32_t>(layout.size()), layout[r], step);
    ZCC_RETURN_IF_ERROR(WriteRankShards(root, step, rank.shards, rank.slot.data()).status());
  }
  return absl::OkStatus();
}

TEST_CASE("pieces that tile commit with a global index; any other tiling reads back exactly") {
  const std::string root = zcc::testing::TempDir();
  REQUIRE_OK(WriteStep(root, 7, ThreeRankLayout()));
  auto commit = TryCommit(root, "job", 7, 3);
  REQUIRE_OK(commit);
  REQUIRE(commit->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000007");
  auto report = VerifyStep(step_dir);
  REQUIRE_OK(report);
  CHECK(report->tensors == 10);
  CHECK(report->global_tensors == 4);

  // The HF weight map names whole tensors only.
  auto weight_map = format::DecodeWeightMapIndex(
      *ReadFileToString(JoinPath(step_dir, format::kModelIndexFileName), 1 << 20));
  REQUIRE_OK(weight_map);
  CHECK(weight_map->size() == 1);
  CHECK(weight_map->count("norm.weight") == 1);

  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  CHECK(index->pieces.size() == 10);
  auto tensors = GroupPieces(*index);
  REQUIRE_OK(tensors);
  CHECK(tensors->size() == 4);

  // Two ranks now: kCol by rows, kRow by columns (uneven), kOptim whole on
  // one rank; plus a target the same as a saved piece (read in place).
  struct Want {
    Global g;
    Box box;
  };
  const std::vector<Want> wants = {
      {kCol, {{0, 0}, {3, 6}}}, {kCol, {{3, 0}, {1, 6}}}, {kRow, {{0, 0}, {5, 2}}},
      {kRow, {{0, 2}, {5, 1}}}, {kOptim, {{0, 0}, {5, 3}}}, {kNorm, {{2}, {3}}},
      {kRow, {{2, 0}, {2, 3}}},
  };
  std::vector<std::vector<uint8_t>> got(wants.size());
  std::vector<BoxTarget> targets;
  for (size_t i = 0; i < wants.size(); ++i) {
    got[i].assign(format::Volume(wants[i].box) * format::DTypeSize(wants[i].g.dtype), 0xEE);
    targets.push_back({format::TensorKindName(wants[i].g.kind), wants[i].g.name,
                       wants[i].g.dtype, wants[i].g.shape, wants[i].box, got[i].data()});
  }
  // A small staging budget: the staged pieces go in several batches.
  auto stats = ReadBoxes(step_dir, *index, *tensors, targets, IoOptions(), 64);
  REQUIRE_OK(stats);
  CHECK(stats->direct_pieces == 2);  // kRow rows 2..4 and kOptim whole
  CHECK(stats->staged_pieces > 3);
  for (size_t i = 0; i < wants.size(); ++i) {
    INFO(wants[i].g.name << " " << format::BoxToString(wants[i].box));
    CHECK(got[i] == PieceBytes(wants[i].g, wants[i].box, 7));
  }
}

TEST_CASE("a tensor the step lacks or holds with another shape is refused before any read") {
  const std::string root = zcc::testing::TempDir();
  REQUIRE_OK(WriteStep(root, 3, ThreeRankLayout()));
  REQUIRE(TryCommit(root, "job", 3, 3)->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000003");
  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  auto tensors = GroupPieces(*index);
  REQUIRE_OK(tensors);
  std::vector<uint8_t> a(4 * 6 * 4, 0xEE), b(16, 0xEE);
  std::vector<BoxTarget> targets = {
      {"param", kCol.name, DType::kF32, kCol.shape, {{0, 0}, {4, 6}}, a.data()},
      {"param", "missing.weight", DType::kF32, {4}, {{0}, {4}}, b.data()}};
  auto st = ReadBoxes(step_dir, *index, *tensors, targets, IoOptions());
  REQUIRE_STATUS_CODE(st, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(st.status().message(), "missing.weight"));
  CHECK(a == std::vector<uint8_t>(a.size(), 0xEE));  // nothing read
  targets = {{"param", kCol.name, DType::kF32, {4, 7}, {{0, 0}, {4, 6}}, a.data()}};
  st = ReadBoxes(step_dir, *index, *tensors, targets, IoOptions());
  REQUIRE_STATUS_CODE(st, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(st.status().message(), "[4, 6]"));
  targets = {{"param", kCol.name, DType::kBF16, {4, 6}, {{0, 0}, {4, 6}}, a.data()}};
  REQUIRE_STATUS_CODE(ReadBoxes(step_dir, *index, *tensors, targets, IoOptions()),
                      absl::StatusCode::kFailedPrecondition);
  CHECK(a == std::vector<uint8_t>(a.size(), 0xEE));
}

TEST_CASE("an EXTRA blob reads into a larger one with zeros after it, never into a smaller one") {
  // Blobs (1-D U8 EXTRA tensors: a length, then a pickle) are sized by what
  // they held when registered: a restore may register them larger or
  // smaller than the step holds them.
  const Global blob{"zcc.r00000.rank_state", DType::kU8, {40}, format::TensorKind::kExtra};
  const std::string root = zcc::testing::TempDir();
  REQUIRE_OK(WriteStep(root, 5, {{{kNorm, {{0}, {6}}}, {blob, {{0}, {40}}}}}));
  REQUIRE(TryCommit(root, "job", 5, 1)->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000005");
  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  auto tensors = GroupPieces(*index);
  REQUIRE_OK(tensors);
  const std::string extra(format::TensorKindName(format::TensorKind::kExtra));
  std::vector<uint8_t> norm(6 * 4, 0xEE), larger(100, 0xEE);
  std::vector<BoxTarget> targets = {
      {"param", kNorm.name, DType::kF32, kNorm.shape, {{0}, {6}}, norm.data()},
      {extra, blob.name, DType::kU8, {100}, {{0}, {100}}, larger.data()}};
  REQUIRE_OK(ReadBoxes(step_dir, *index, *tensors, targets, IoOptions()));
  std::vector<uint8_t> want = PieceBytes(blob, {{0}, {40}}, 5);
  want.resize(100, 0);
  CHECK(larger == want);
  CHECK(norm == PieceBytes(kNorm, {{0}, {6}}, 5));
  // Staged too (a budget smaller than the blob).
  larger.assign(100, 0xEE);
  REQUIRE_OK(ReadBoxes(step_dir, *index, *tensors, {targets[1]}, IoOptions(), 8));
  CHECK(larger == want);

  // Smaller: refused before anything is written, saying how large it must be.
  std::vector<uint8_t> smaller(16, 0xEE);
  norm.assign(norm.size(), 0xEE);
  targets = {{"param", kNorm.name, DType::kF32, kNorm.shape, {{0}, {6}}, norm.data()},
             {extra, blob.name, DType::kU8, {16}, {{0}, {16}}, smaller.data()}};
  auto st = ReadBoxes(step_dir, *index, *tensors, targets, IoOptions());
  REQUIRE_STATUS_CODE(st, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(st.status().message(), "at least 40 bytes"));
  CHECK(norm == std::vector<uint8_t>(norm.size(), 0xEE));
  CHECK(smaller == std::vector<uint8_t>(smaller.size(), 0xEE));
  // A part of a blob, or a blob of another kind or dtype, is not a blob.
  targets = {{extra, blob.name, DType::kU8, {100}, {{0}, {50}}, larger.data()}};
  REQUIRE_STATUS_CODE(ReadBoxes(step_dir, *index, *tensors, targets, IoOptions()),
                      absl::StatusCode::kFailedPrecondition);
  targets = {{"param", kNorm.name, DType::kF32, {8}, {{0}, {8}}, larger.data()}};
  REQUIRE_STATUS_CODE(ReadBoxes(step_dir, *index, *tensors, targets, IoOptions()),
                      absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a step whose pieces leave a gap, overlap or disagree is not committed") {
  const std::string root = zcc::testing::TempDir();
  REQUIRE_OK(WriteStep(root, 1, ThreeRankLayout()));
  REQUIRE(TryCommit(root, "job", 1, 3)->outcome == CommitOutcome::kCommitted);

  struct Case {
    std::string what;
    std::vector<std::vector<std::pair<Global, Box>>> layout;
    std::string message;
  };
  auto layout = ThreeRankLayout();
  auto gap = layout;
  gap[2].erase(gap[2].begin());  // rank 2 leaves out its columns of kCol
  auto overlap = layout;
  overlap[1][0].second = {{0, 1}, {4, 3}};  // columns 1..3 overlap rank 0's
  auto twice = layout;
  twice[1].push_back({kNorm, {{0}, {6}}});  // the norm written by two ranks
  auto shape = layout;
  shape[1][1].first.shape = {6, 3};  // one rank thinks the embedding has 6 rows
  const std::vector<Case> cases = {
      {"gap", gap, "not covered"},
      {"overlap", overlap, "overlap"},
      {"written twice", twice, "overlap"},
      {"shape", shape, "[6, 3]"},
  };
  int64_t step = 2;
  for (const Case& c : cases) {
    INFO(c.what);
    REQUIRE_OK(WriteStep(root, step, c.layout));
    auto commit = TryCommit(root, "job", step, 3);
    REQUIRE_STATUS_CODE(commit, absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(commit.status().message(), c.message));
    CHECK(*ReadLatest(root) == 1);  // the older step stays latest
    CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{1});
    ++step;
  }
}

TEST_CASE("an EMA that one rank has not started leaves that EMA out, not the step") {
  const std::string root = zcc::testing::TempDir();
  const Global w{"w", DType::kF32, {4, 4}};
  std::vector<float> ema(8, 0.5f);
  for (uint32_t r = 0; r < 2; ++r) {
    PieceRank rank(r, 2, {{w, {{0, 2 * r}, {4, 2}}}}, 9);
    std::vector<ExtraShard> extra;
    if (r == 0) {  // rank 1's EMA has not started: it writes none
      ExtraShard shard{format::kEmaKindName, format::ShardFileName("ema", r), {}};
      shard.tensors.push_back({"w", DType::kF32, {4, 2}, reinterpret_cast<uint8_t*>(ema.data()),
                               ema.size() * 4, {4, 4}, {0, 0}});
      extra.push_back(std::move(shard));
    }
    REQUIRE_OK(WriteRankShards(root, 9, rank.shards, rank.slot.data(), IoOptions(), extra).status());
  }
  auto commit = TryCommit(root, "job", 9, 2);
  REQUIRE_OK(commit);
  CHECK(commit->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000009");
  auto report = VerifyStep(step_dir);
  REQUIRE_OK(report);
  CHECK(report->global_tensors == 1);  // the parameter; its EMA is incomplete
  auto index = LoadStepIndex(step_dir);
  REQUIRE_OK(index);
  REQUIRE_STATUS_CODE(GroupPieces(*index), absl::StatusCode::kFailedPrecondition);
  std::vector<std::string> dropped;
  auto tolerant = GroupPieces(*index, &dropped);
  REQUIRE_OK(tolerant);
  CHECK(tolerant->size() == 1);
  REQUIRE(dropped.size() == 1);
  CHECK(absl::StartsWith(dropped[0], "w: "));
}

TEST_CASE("a step whose replicas registered different replicated tensors is not committed") {
  const std::string root = zcc::testing::TempDir();
  // Ranks 0 and 1 are a DP group replicating kNorm (rank 0 writes it); each
  // rank owns one row of a [2, 3] tensor.
  const Global row{"embed.weight", DType::kF32, {2, 3}};
  auto write = [&](int64_t step, uint64_t hash1) -> absl::Status {
    for (uint32_t r = 0; r < 2; ++r) {
      std::vector<std::pair<Global, Box>> pieces = {{row, {{r, 0}, {1, 3}}}};
      if (r == 0) pieces.push_back({kNorm, {{0}, {6}}});
      PieceRank rank(r, 2, pieces, step);
      rank.shards.replica_groups = {{"dp", -1, 2, r, r == 0 ? 0xabcdULL : hash1}};
      ZCC_RETURN_IF_ERROR(WriteRankShards(root, step, rank.shards, rank.slot.data()).status());
    }
    return absl::OkStatus();
  };
  REQUIRE_OK(write(1, 0xabcd));
  auto agreed = TryCommit(root, "job", 1, 2);
  REQUIRE_OK(agreed);
  CHECK(agreed->outcome == CommitOutcome::kCommitted);
  REQUIRE_OK(write(2, 0x1234));
  auto disagreed = TryCommit(root, "job", 2, 2);
  REQUIRE_STATUS_CODE(disagreed, absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(disagreed.status().message(), "replica group dp"));
  CHECK(*ReadLatest(root) == 1);
  // The digests survive the manifest round trip.
  auto text = ReadFileToString(JoinPath(root, "step-00000001/r00001.manifest.json"), 1 << 20);
  REQUIRE_OK(text);
  auto m = format::DecodeRankManifest(*text);
  REQUIRE_OK(m);
  REQUIRE(m->replica_groups.size() == 1);
  CHECK(m->replica_groups[0].member == 1);
  CHECK(m->replica_groups[0].hash == 0xabcd);
}

TEST_CASE("verify refuses a step index that differs from the manifests") {
  const std::string root = zcc::testing::TempDir();
  REQUIRE_OK(WriteStep(root, 5, ThreeRankLayout()));
  REQUIRE(TryCommit(root, "job", 5, 3)->outcome == CommitOutcome::kCommitted);
  const std::string step_dir = JoinPath(root, "step-00000005");
  const std::string path = JoinPath(step_dir, format::kStepIndexFileName);
  auto text = ReadFileToString(path, 1 << 20);
  REQUIRE_OK(text);
  // One checksum changed: the index no longer matches the manifests.
  std::string changed = *text;
  const size_t xxh = changed.find("\"xxh3\": \"");
  REQUIRE(xxh != std::string::npos);
  changed[xxh + 9] = changed[xxh + 9] == '0' ? '1' : '0';
  REQUIRE_OK(WriteFileAtomic(path, changed));
  auto st = VerifyStep(step_dir);
  REQUIRE_STATUS_CODE(st, absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(st.status().message(), "zcc.index.json"));
}

TEST_CASE("manifests carry a piece's box; hostile boxes are refused") {
  format::RankManifest m;
  m.job_id = "job";
  m.world_size = 2;
  m.files = {{"model-r00000.safetensors", 4096}};
  format::ManifestTensor t;
  t.name = "w";
  t.dtype = DType::kF32;
  t.shape = {2, 3};
  t.kind = "param";
  t.file = "model-r00000.safetensors";
  t.offset = 128;
  t.nbytes = 24;
  t.global_shape = {4, 3};
  t.box_offset = {2, 0};
  m.tensors = {t};
  std::string text = format::EncodeRankManifest(m);
  CHECK(absl::StrContains(text, "global_shape"));
  // A zcc that predates pieces refuses the manifest (version 1 readers).
  CHECK(absl::StrContains(text, "\"format_version\": 2"));
  auto back = format::DecodeRankManifest(text);
  REQUIRE_OK(back);
  CHECK(back->tensors[0].global_shape == std::vector<int64_t>{4, 3});
  CHECK(back->tensors[0].box_offset == std::vector<int64_t>{2, 0});

  // A whole tensor says nothing of boxes; the decoder fills the whole box in.
  m.tensors[0].global_shape = {2, 3};
  m.tensors[0].box_offset = {0, 0};
  text = format::EncodeRankManifest(m);
  CHECK_FALSE(absl::StrContains(text, "global_shape"));
  CHECK(absl::StrContains(text, "\"format_version\": 1"));
  back = format::DecodeRankManifest(text);
  REQUIRE_OK(back);
  CHECK(back->tensors[0].global_shape == std::vector<int64_t>{2, 3});
  CHECK(back->tensors[0].box_offset == std::vector<int64_t>{0, 0});

  for (const auto& [global, offset] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{4, 3}, {3, 0}}, {{4}, {0}}, {{4, 3}, {0}}, {{4, 3}, {-1, 0}}}) {
    m.tensors[0].global_shape = global;
    m.tensors[0].box_offset = offset;
    text = format::EncodeRankManifest(m);
    INFO(text);
    REQUIRE_STATUS_CODE(format::DecodeRankManifest(text), absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace zcc::checkpoint
