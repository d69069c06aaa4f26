// RestoreTiers::IntactElsewhere: a step whose copy on the tier being read is
// damaged is taken from the other tier's copy only where that copy is the
// same step (committed from the same manifests) and intact, and, for an
// explicit step, only that step.
#include "daemon/restore/restore_tiers.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "checkpoint/reader.h"
#include "checkpoint/testing/sliced_step.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"

namespace zcc::daemon {
namespace {

std::string Step(const std::string& dir, int64_t step) {
  return JoinPath(dir, format::StepDirName(step));
}

// A job's steps 10 and 20 on a "local" root, and the same steps uploaded (copied)
// to a "store" root.
struct TwoTiers {
  TwoTiers() {
    checkpoint::testing::SlicedModel model;
    model.world = 2;
    for (int64_t step : {10, 20}) {
      REQUIRE_OK(checkpoint::testing::WriteSlicedStep(local, "job", step, model));
    }
    REQUIRE(std::system(("cp -a " + local + "/. " + store + "/").c_str()) == 0);
  }
  // Rejects the step directories in `bad`, as a damaged copy's check would.
  std::function<absl::Status(const std::string&)> Verify() const {
    return [this](const std::string& dir) {
      return bad.count(dir) > 0 ? absl::DataLossError("damaged") : absl::OkStatus();
    };
  }
  const std::string local = testing::TempDir();
  const std::string store = testing::TempDir();
  std::set<std::string> bad;
};

TEST_CASE("a damaged local step is read from the store's copy of it, not an older step") {
  TwoTiers t;
  RestoreTiers tiers(t.local, t.store, -1, nullptr);
  REQUIRE(tiers.current() == t.local);
  // Nothing damaged: nothing to take elsewhere.
  CHECK_FALSE(tiers.IntactElsewhere(20, -1, INT64_MAX, t.Verify(), nullptr).has_value());
  t.bad.insert(Step(t.local, 20));
  auto there = tiers.IntactElsewhere(10, -1, INT64_MAX, t.Verify(), nullptr);
  REQUIRE(there.has_value());
  CHECK(there->step == 20);
  CHECK(there->step_dir == Step(t.store, 20));
  // Not above what the restore may take (a fallback from step 20).
  CHECK_FALSE(tiers.IntactElsewhere(10, -1, 19, t.Verify(), nullptr).has_value());
  // Not where the store's copy is damaged too.
  t.bad.insert(Step(t.store, 20));
  CHECK_FALSE(tiers.IntactElsewhere(10, -1, INT64_MAX, t.Verify(), nullptr).has_value());
}

TEST_CASE("an explicit step is taken from the other tier only as that step") {
  TwoTiers t;
  // Step 20 is the store's only; the local step 10 is damaged.
  REQUIRE_OK(RemoveTree(Step(t.local, 20)));
  t.bad.insert(Step(t.local, 10));
  RestoreTiers tiers(t.local, t.store, 20, nullptr);
  CHECK_FALSE(tiers.IntactElsewhere(-1, 20, INT64_MAX, t.Verify(), nullptr).has_value());
  auto ten = tiers.IntactElsewhere(-1, 10, INT64_MAX, t.Verify(), nullptr);
  REQUIRE(ten.has_value());
  CHECK(ten->step_dir == Step(t.store, 10));
}

TEST_CASE("another run's step under the same number in the other tier is not taken") {
  TwoTiers t;
  // The store's step 20 written again by another run (another model).
  REQUIRE_OK(RemoveTree(Step(t.store, 20)));
  checkpoint::testing::SlicedModel other;
  other.world = 2;
  other.hidden = 16;
  REQUIRE_OK(checkpoint::testing::WriteSlicedStep(t.store, "job", 20, other));
  t.bad.insert(Step(t.local, 20));
  RestoreTiers tiers(t.local, t.store, -1, nullptr);
  CHECK_FALSE(tiers.IntactElsewhere(10, -1, INT64_MAX, t.Verify(), nullptr).has_value());
}

}  // namespace
}  // namespace zcc::daemon
