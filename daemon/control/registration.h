// Turning a RegisterRequest into what a rank session needs: the validated
// tensors, which of them this rank stages and writes, and the slot layout.
// Everything here reads untrusted input (the RPC), so every field is checked
// and errors are InvalidArgument with the offending tensor named.
//
// Thread-safety: stateless functions.
#ifndef ZCC_DAEMON_CONTROL_REGISTRATION_H_
#define ZCC_DAEMON_CONTROL_REGISTRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/rank_shards.h"
#include "config/daemon_config.h"
#include "daemon/rank/rank_session.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {

inline constexpr int kMaxDims = 16;

// Validates the request's tensors (names, dtypes, kinds, shapes, sizes,
// duplicates) and returns them in request order, with the hash identifying
// the registration (names, dtypes, shapes and kinds, in order).
absl::StatusOr<std::vector<RegisteredTensor>> ParseTensors(const v1::RegisterRequest& req,
                                                           const DaemonConfig& config,
                                                           uint64_t* manifest_hash);

// Marks the tensors this rank writes: its own, and the replicated ones the
// shard assigner gives it. Validates the replica groups.
absl::Status AssignStaged(const v1::RegisterRequest& req, std::vector<RegisteredTensor>* tensors);

// The checkpoint description of the staged tensors with their slot layout;
// fills in each staged tensor's slot offset.
absl::StatusOr<checkpoint::RankShards> ShardsFor(const v1::RegisterRequest& req,
                                                 std::vector<RegisteredTensor>* registered,
                                                 uint64_t manifest_hash,
                                                 const DaemonConfig& config);

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_REGISTRATION_H_
