#include "daemon/control/fault_drills.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

absl::StatusOr<FaultDrills> FaultDrillsFromEnvironment() {
  FaultDrills drills;
  if (const char* spec = std::getenv("ZCCD_INJECT_STORAGE_FAULTS"); spec != nullptr) {
    auto plan = storage::ParseFaultPlan(spec);
    if (!plan.ok()) return Annotate(plan.status(), "ZCCD_INJECT_STORAGE_FAULTS");
    ZCC_LOG(WARNING) << "storage fault injection is ON for shard writes, commits and restore "
                        "reads (ZCCD_INJECT_STORAGE_FAULTS): "
                     << storage::DescribeFaultPlan(*plan);
    drills.storage = std::make_unique<storage::FaultInjectingStorage>(storage::DefaultStorage(),
                                                                      *std::move(plan));
  }
  if (const char* ms = std::getenv("ZCCD_INJECT_RESERVE_DELAY_MS"); ms != nullptr) {
    int delay_ms = 0;
    if (!absl::SimpleAtoi(ms, &delay_ms) || delay_ms < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZCCD_INJECT_RESERVE_DELAY_MS: not a number of ms: ", ms));
    }
    const char* match = std::getenv("ZCCD_INJECT_RESERVE_DELAY_MATCH");
    const std::string pattern = match == nullptr ? "" : match;
    ZCC_LOG(WARNING) << "staging reservations of segments matching '" << pattern
                     << "' are delayed by " << delay_ms << " ms (ZCCD_INJECT_RESERVE_DELAY_MS)";
    drills.before_reserve = [delay = absl::Milliseconds(delay_ms), pattern](
                                const std::string& segment, uint64_t) {
      if (!absl::StrContains(segment, pattern)) return;
      ZCC_LOG(WARNING) << "fault drill: the reservation of " << segment << " waits "
                       << absl::FormatDuration(delay);
      absl::SleepFor(delay);
    };
  }
  return drills;
}

}  // namespace zcc::daemon
