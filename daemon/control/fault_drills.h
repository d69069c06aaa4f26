// Fault drills set through zccd's environment, for drills and the
// integration tests (never in production; zccd logs a warning when one is on):
//   ZCCD_INJECT_STORAGE_FAULTS=<plan>   every checkpoint file operation goes
//       through a storage that fails or stalls as planned
//       (storage::ParseFaultPlan, e.g. "path=model-,op_delay_ms=1000");
//   ZCCD_INJECT_RESERVE_DELAY_MS=N      reserving a staging segment whose
//       name contains ZCCD_INJECT_RESERVE_DELAY_MATCH (any, when unset) first
//       waits N ms.
//
// Thread-safety: FaultDrillsFromEnvironment runs once, before the server.
#ifndef ZCC_DAEMON_CONTROL_FAULT_DRILLS_H_
#define ZCC_DAEMON_CONTROL_FAULT_DRILLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/fault_storage.h"

namespace zcc::daemon {

struct FaultDrills {
  // Null when off; wraps the default POSIX storage.
  std::unique_ptr<storage::FaultInjectingStorage> storage;
  // Null when off; for ServerOptions::before_reserve.
  std::function<void(const std::string& segment, uint64_t bytes)> before_reserve;
};

// InvalidArgument naming the variable when one is set to something unusable.
absl::StatusOr<FaultDrills> FaultDrillsFromEnvironment();

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_FAULT_DRILLS_H_
