// A job's membership in the peer tier: for each rank, the peer address of
// the zccd it registered with, as the job's trainers reported it after
// exchanging the addresses their zccds gave them (SetJobPeers). No
// coordinator: every zccd of the job learns the same list.
//
// Thread-safety: every method may be called from any thread.
#ifndef ZCC_DAEMON_PEER_JOB_PEERS_H_
#define ZCC_DAEMON_PEER_JOB_PEERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"

namespace zcc::daemon::peer {

struct JobPeer {
  uint32_t rank = 0;
  std::string address;  // host:port
};

class JobPeers {
 public:
  // Replaces the membership. InvalidArgument (keeping the old one) for a
  // rank listed twice or not below `world_size`, or an address that is not
  // host:port.
  absl::Status Set(std::vector<JobPeer> peers, uint32_t world_size);
  std::vector<JobPeer> members() const;
  // Each distinct address with its ranks, in address order.
  std::map<std::string, std::vector<uint32_t>> Nodes() const;

 private:
  mutable zcc::Mutex mu_;
  std::vector<JobPeer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_JOB_PEERS_H_
