// ReplicaKey and ReplicaInfo to and from their protocol messages (proto/peer.proto).
#ifndef ZCC_DAEMON_PEER_REPLICA_PROTO_H_
#define ZCC_DAEMON_PEER_REPLICA_PROTO_H_

#include "absl/status/status.h"
#include "daemon/peer/replica_store.h"
#include "proto/peer.pb.h"

namespace zcc::daemon::peer {

inline v1::ReplicaKey ToProto(const ReplicaKey& k) {
  v1::ReplicaKey p;
  p.set_job_id(k.job_id);
  p.set_uid(k.uid);
  p.set_rank(k.rank);
  p.set_step(k.step);
  p.set_piece(k.piece);
  return p;
}

inline ReplicaKey FromProto(const v1::ReplicaKey& p) {
  return ReplicaKey{p.job_id(), p.uid(), p.rank(), p.step(), p.piece()};
}

// A key from a peer or a caller: a valid job id and piece name, a step >= 0.
absl::Status ValidateReplicaKey(const ReplicaKey& key);

// The largest chunk either side sends (the bytes of one ReplicaChunk).
inline constexpr size_t kReplicaChunkBytes = 1 << 20;

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_REPLICA_PROTO_H_
