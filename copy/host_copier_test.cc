#include "copy/host_copier.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "copy/copier_conformance.h"

namespace zcc {
namespace {

// common/testing's REQUIRE_STATUS_CODE cannot be used: its macro parameter
// `code` also replaces the `.code()` call in its body.
template <typename T>
absl::StatusCode StatusCodeOf(const T& status_or) {
  return ::zcc::testing::ToStatus(status_or).code();
}

std::unique_ptr<DeviceCopier> MakeHostCopier(const HostCopierOptions& options) {
  auto copier = HostCopier::Create(options);
  REQUIRE_OK(copier);
  return *std::move(copier);
}

TEST_CASE("HostCopier meets the DeviceCopier contract") {
  // A small chunk so that chunk boundaries fall inside most regions.
  const size_t chunk = GENERATE(size_t{4096}, size_t{64} << 10);
  INFO("chunk_bytes " << chunk);
  HostCopierOptions options;
  options.chunk_bytes = chunk;
  testing::RunCopierConformance(
      testing::HostMemoryConformanceEnv([options] { return MakeHostCopier(options); }, chunk));
}

TEST_CASE("HostCopier rejects bad options") {
  HostCopierOptions options;
  options.chunk_bytes = 0;
  REQUIRE(StatusCodeOf(HostCopier::Create(options)) == absl::StatusCode::kInvalidArgument);
  options = HostCopierOptions();
  options.per_chunk_delay = absl::Milliseconds(-1);
  REQUIRE(StatusCodeOf(HostCopier::Create(options)) == absl::StatusCode::kInvalidArgument);
  auto copier = HostCopier::Create(HostCopierOptions());
  REQUIRE_OK(copier);
  CHECK((*copier)->name() == "host");
}

TEST_CASE("HostCopier::Enqueue returns before a slow copy has moved the bytes") {
  constexpr size_t kChunk = 4096;
  constexpr size_t kBytes = 4 * kChunk;
  HostCopierOptions options;
  options.chunk_bytes = kChunk;
  // Each chunk lands only after its delay, so right after Enqueue returns the
  // destination cannot be complete unless Enqueue itself copied.
  options.per_chunk_delay = absl::Milliseconds(200);
  auto copier = HostCopier::Create(options);
  REQUIRE_OK(copier);
  const std::vector<unsigned char> src(kBytes, 0xAB);
  std::vector<unsigned char> dst(kBytes, 0);
  const CopyRegion region{src.data(), dst.data(), kBytes};

  auto ticket = (*copier)->Enqueue({&region, 1}, nullptr);
  REQUIRE_OK(ticket);
  CHECK(dst[kBytes - 1] == 0);  // The last chunk lands after 4 delays.
  REQUIRE_OK((*copier)->Wait(*ticket));
  CHECK(std::memcmp(dst.data(), src.data(), kBytes) == 0);

  // FenceBeforeUpdate has to block on the host backend until the copy is done.
  std::vector<unsigned char> dst2(kBytes, 0);
  const CopyRegion region2{src.data(), dst2.data(), kBytes};
  auto ticket2 = (*copier)->Enqueue({&region2, 1}, nullptr);
  REQUIRE_OK(ticket2);
  CHECK(dst2[kBytes - 1] == 0);
  REQUIRE_OK((*copier)->FenceBeforeUpdate(nullptr));
  CHECK(std::memcmp(dst2.data(), src.data(), kBytes) == 0);
  REQUIRE_OK((*copier)->Wait(*ticket2));
}

TEST_CASE("HostCopier::FenceBeforeUpdate finishes a large copy together with the copy thread") {
  // 96 MiB in 4 KiB pieces: enough left at the fence for helper threads, and
  // pieces small enough that the copy thread, the fencing thread and the
  // helpers all take some. Every byte must land, each round, and the ticket
  // must complete exactly when the last piece has.
  constexpr size_t kBytes = size_t{96} << 20;
  HostCopierOptions options;
  options.chunk_bytes = 4096;
  auto copier = HostCopier::Create(options);
  REQUIRE_OK(copier);
  std::vector<unsigned char> src(kBytes);
  for (size_t i = 0; i < kBytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    std::vector<unsigned char> dst(kBytes, 0);
    // Two regions, the second not a multiple of the piece size.
    const CopyRegion regions[] = {{src.data(), dst.data(), kBytes / 2},
                                  {src.data() + kBytes / 2, dst.data() + kBytes / 2,
                                   kBytes / 2 - 123}};
    auto ticket = (*copier)->Enqueue(regions, nullptr);
    REQUIRE_OK(ticket);
    REQUIRE_OK((*copier)->FenceBeforeUpdate(nullptr));
    CHECK(std::memcmp(dst.data(), src.data(), kBytes - 123) == 0);
    CHECK(dst[kBytes - 123] == 0);  // Past the second region: untouched.
    REQUIRE_OK((*copier)->Wait(*ticket));
    src[round] ^= 0xFF;  // The next round's source differs.
  }
}

}  // namespace
}  // namespace zcc
