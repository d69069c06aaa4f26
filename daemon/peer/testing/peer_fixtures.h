// Test fixtures of the peer tier: a Peer service on loopback over its own
// replica store, and a rank's step files as a write makes them, held in a
// store (damaged on demand).
#ifndef ZCC_DAEMON_PEER_TESTING_PEER_FIXTURES_H_
#define ZCC_DAEMON_PEER_TESTING_PEER_FIXTURES_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/rank_step_bytes.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_service.h"
#include "daemon/peer/replica_store.h"

namespace zcc::daemon::peer::testing {

// A Peer service on 127.0.0.1 with the given credentials, on `at_port`
// (0: any free port).
struct PeerServer {
  // One on `port` exactly (not shared with another listener: SO_REUSEPORT
  // off), or null when the port is taken.
  static std::unique_ptr<PeerServer> At(const PeerConfig& config, int port);

  ReplicaStore store;
  PeerService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  explicit PeerServer(const PeerConfig& config, uint64_t budget = 64 << 20, int at_port = 0);
  ~PeerServer();
  std::string target() const;
};

// Rank `rank` of 2 of job "job" at `step`, as the files a write makes;
// the tensors filled as at step `fill` (default: `step`), so that another
// run's step of the same number can be made, its manifest naming `timeline`.
checkpoint::RankStepBytes StepFiles(uint32_t rank, int64_t step, int64_t fill = -1,
                                    const std::string& timeline = "");

// Puts `step`'s files into `store` for uid 1000; with `damage_shards` the
// shard files' bytes differ from the checksum they are held with (memory
// gone bad after they arrived), the manifest's do not.
void Hold(ReplicaStore& store, const checkpoint::RankStepBytes& step, bool damage_shards);

}  // namespace zcc::daemon::peer::testing

#endif  // ZCC_DAEMON_PEER_TESTING_PEER_FIXTURES_H_
