// The largest request each control and status method takes: its encoding,
// and what parsing it may allocate (proto/parse_cost.h). gRPC's own limit is
// one for every method of a server and must let the largest registration in
// (proto/message_limits.h); these are the per-method ones, checked before a
// request is parsed (daemon/control/raw_calls.h).
#ifndef ZCC_DAEMON_CONTROL_REQUEST_LIMITS_H_
#define ZCC_DAEMON_CONTROL_REQUEST_LIMITS_H_

#include <algorithm>
#include <cstdint>

#include "proto/message_limits.h"

namespace zcc::daemon {

struct RequestLimit {
  uint64_t max_bytes = 0;  // encoded
  uint64_t max_cost = 0;   // parsed
};

// Requests of a few names and numbers (every method but the three below).
inline constexpr RequestLimit kSmallRequest{64 << 10, 1 << 20};
// A job file's content is at most 16 MiB (PutJobFileRequest).
inline constexpr RequestLimit kPutJobFileRequest{(16 << 20) + (64 << 10), (16 << 20) + (1 << 20)};
// Ranks in a job (RegisterRequest.world_size), at most.
inline constexpr uint32_t kMaxWorldSize = 1 << 20;
// A peer address is at most 300 bytes (daemon/peer/job_peers.cc).
inline constexpr uint64_t kMaxPeerAddressBytes = 300;
// One address per rank of the largest job: each JobPeer is the address, the
// rank and the tags and lengths encoded; parsed, a JobPeer object and the
// address's string (request_limits_test checks both).
inline constexpr RequestLimit kSetJobPeersRequest{
    (64 << 10) + kMaxWorldSize * (kMaxPeerAddressBytes + 16),
    (1 << 20) + kMaxWorldSize * (kMaxPeerAddressBytes + 256)};

// Per registered tensor, at most: its encoding (a 512-byte name, three
// 16-dimension shapes, the replica group: about 715 bytes for the largest
// TensorSpec zccd accepts, 1,040 with every dimension a negative 10-byte
// varint, which it refuses), and what the parse of such a TensorSpec
// allocates, with room (request_limits_test checks both).
inline constexpr uint64_t kRegisterBytesPerTensor = 1536;
inline constexpr uint64_t kRegisterCostPerTensor = 2560;

// A registration of up to `max_tensors_per_rank` tensors (zccd's config).
inline RequestLimit RegisterRequestLimit(uint32_t max_tensors_per_rank) {
  const uint64_t tensors = max_tensors_per_rank;
  return RequestLimit{
      std::min<uint64_t>(v1::kMaxMessageBytes, (64 << 10) + tensors * kRegisterBytesPerTensor),
      (1 << 20) + tensors * kRegisterCostPerTensor};
}

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_REQUEST_LIMITS_H_
