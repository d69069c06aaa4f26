#include "daemon/peer/buddies.h"

#include <algorithm>
#include <map>

namespace zcc::daemon::peer {
namespace {

bool SameDomain(const NodeInfo& a, const NodeInfo& b) {
  return !a.failure_domain.empty() && a.failure_domain == b.failure_domain;
}

}  // namespace

std::vector<std::string> ChooseBuddies(const NodeInfo& self, const std::vector<NodeInfo>& nodes,
                                       uint32_t replicas) {
  std::map<std::string, NodeInfo> by_address;
  for (const NodeInfo& n : nodes) {
    if (n.address != self.address) by_address.emplace(n.address, n);
  }
  // Ring order from just after self.
  std::vector<NodeInfo> ring;
  for (auto it = by_address.upper_bound(self.address); it != by_address.end(); ++it) {
    ring.push_back(it->second);
  }
  for (auto it = by_address.begin(); it != by_address.end() && it->first < self.address; ++it) {
    ring.push_back(it->second);
  }
  std::vector<std::string> chosen;
  for (const NodeInfo& n : ring) {
    if (chosen.size() < replicas && !SameDomain(self, n)) chosen.push_back(n.address);
  }
  for (const NodeInfo& n : ring) {
    if (chosen.size() < replicas && SameDomain(self, n)) chosen.push_back(n.address);
  }
  return chosen;
}

}  // namespace zcc::daemon::peer
