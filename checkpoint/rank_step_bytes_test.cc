#include "checkpoint/rank_step_bytes.h"

#include <catch2/catch.hpp>
#include <string>

#include "checkpoint/step_dirs.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "format/manifest.h"
#include "storage/memory_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {
namespace {

using testing::SyntheticRank;

TEST_CASE("a rank's step in memory is, byte for byte, what a write makes, the manifest last") {
  SyntheticRank rank(2, 4,
                     {{"w", format::DType::kF32, {64, 33}},
                      {"b", format::DType::kBF16, {7}},
                      {"adam", format::DType::kF32, {64, 33}, format::TensorKind::kOptim},
                      {"rng", format::DType::kU8, {5000}, format::TensorKind::kExtra}});
  rank.Fill(12);
  auto bytes = SerializeRankStep(12, rank.shards(), rank.slot(), {});
  REQUIRE_OK(bytes.status());
  CHECK(bytes->rank == 2);
  CHECK(bytes->step == 12);
  REQUIRE(bytes->files.size() >= 2);
  CHECK(bytes->files.back().name == format::ManifestFileName(2));

  // The same step written by the writer.
  storage::MemoryStorage disk;
  IoOptions io;
  io.storage = &disk;
  io.direct_io = false;
  REQUIRE_OK(WriteRankShards("/ckpt/job", 12, rank.shards(), rank.slot(), io).status());
  const std::string dir = WritingStepDir(disk, "/ckpt/job", 12);
  auto names = disk.List(dir);
  REQUIRE_OK(names.status());
  CHECK(names->size() == bytes->files.size());
  uint64_t total = 0;
  for (const RankStepFile& f : bytes->files) {
    auto written = storage::ReadWholeFile(disk, JoinPath(dir, f.name), uint64_t{1} << 30);
    REQUIRE_OK(written.status());
    CHECK(*written == f.bytes);
    total += f.bytes.size();
  }
  CHECK(bytes->total_bytes() == total);
  // The manifest parses and names the rank's tensors.
  auto manifest = format::DecodeRankManifest(bytes->files.back().bytes);
  REQUIRE_OK(manifest.status());
  CHECK(manifest->rank == 2);
  CHECK(manifest->tensors.size() == 4);
}

}  // namespace
}  // namespace zcc::checkpoint
