// Which zccds hold a node's replicas: chosen the same way by every zccd of a
// job, from the job's membership alone, so that no coordinator is needed.
#ifndef ZCC_DAEMON_PEER_BUDDIES_H_
#define ZCC_DAEMON_PEER_BUDDIES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zcc::daemon::peer {

struct NodeInfo {
  std::string address;         // host:port of its peer service
  std::string failure_domain;  // empty: unknown, a domain of its own
};

// Up to `replicas` buddies for `self` among `nodes` (self may be listed; it
// is never chosen): the nodes in address order, starting after self's place
// and wrapping around, those in another failure domain than self's first;
// nodes of self's own domain only when too few others exist (all the
// job's nodes in one rack). Duplicate addresses count once.
std::vector<std::string> ChooseBuddies(const NodeInfo& self, const std::vector<NodeInfo>& nodes,
                                       uint32_t replicas);

}  // namespace zcc::daemon::peer

#endif  // ZCC_DAEMON_PEER_BUDDIES_H_
