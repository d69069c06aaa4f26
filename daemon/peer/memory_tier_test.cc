#include "daemon/peer/memory_tier.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "format/manifest.h"

namespace zcc::daemon::peer {
namespace {

void Put(ReplicaStore& store, uint32_t rank, int64_t step, const std::string& piece,
         const std::string& job = "job") {
  Replica r;
  r.info.key = ReplicaKey{job, 1000, rank, step, piece};
  r.info.received = absl::Now();
  r.bytes = "bytes";
  REQUIRE_OK(store.Put(std::move(r)));
}

TEST_CASE("memory tier: the newest step whose every rank is whole somewhere") {
  ReplicaStore store(1 << 20);
  // Step 10: both ranks whole. Step 20: rank 1's data without its manifest
  // (still arriving). Step 30: rank 1 alone.
  for (uint32_t rank : {0u, 1u}) {
    Put(store, rank, 10, "model.safetensors");
    Put(store, rank, 10, format::ManifestFileName(rank));
  }
  Put(store, 0, 20, "model.safetensors");
  Put(store, 0, 20, format::ManifestFileName(0));
  Put(store, 1, 20, "model.safetensors");
  Put(store, 1, 30, format::ManifestFileName(1));
  Put(store, 0, 40, format::ManifestFileName(0), "other-job");
  TierSources sources;
  sources.own = &store;
  size_t asked = 7;
  const Holdings held = ListHoldings("job", 1000, sources, absl::Seconds(1), &asked);
  CHECK(asked == 0);  // no peers
  CHECK(held.size() == 3);
  CHECK(held.at(10).at(1).at(kThisZccd).count(format::ManifestFileName(1)) == 1);
  CHECK(NewestWholeStep(held, 2) == 10);
  // One rank: its newest whole step. Three: rank 2 is held nowhere.
  CHECK(NewestWholeStep(held, 1) == 20);
  CHECK_FALSE(NewestWholeStep(held, 3).has_value());
  CHECK_FALSE(NewestWholeStep(held, 0).has_value());
  // Another uid sees nothing.
  CHECK(ListHoldings("job", 1001, sources, absl::Seconds(1)).empty());
}

}  // namespace
}  // namespace zcc::daemon::peer
