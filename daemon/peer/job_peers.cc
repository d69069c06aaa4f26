#include "daemon/peer/job_peers.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zcc::daemon::peer {
namespace {

// host:port, the host a name, an IPv4 address or a bracketed IPv6 one.
bool IsHostPort(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || a.size() > 300) return false;
  uint32_t port = 0;
  if (!absl::SimpleAtoi(a.substr(colon + 1), &port) || port == 0 || port > 65535) return false;
  for (char c : a.substr(0, colon)) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == ':' || c == '[' || c == ']')) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status JobPeers::Set(std::vector<JobPeer> peers, uint32_t world_size) {
  std::set<uint32_t> seen;
  for (const JobPeer& p : peers) {
    if (p.rank >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer of rank ", p.rank, ": the job has ", world_size, " ranks"));
    }
    if (!seen.insert(p.rank).second) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", p.rank, " is listed twice"));
    }
    if (!IsHostPort(p.address)) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer address of rank ", p.rank, " is not host:port: '", p.address, "'"));
    }
  }
  std::sort(peers.begin(), peers.end(),
            [](const JobPeer& a, const JobPeer& b) { return a.rank < b.rank; });
  zcc::MutexLock lock(&mu_);
  peers_ = std::move(peers);
  return absl::OkStatus();
}

std::vector<JobPeer> JobPeers::members() const {
  zcc::MutexLock lock(&mu_);
  return peers_;
}

std::map<std::string, std::vector<uint32_t>> JobPeers::Nodes() const {
  std::map<std::string, std::vector<uint32_t>> nodes;
  for (const JobPeer& p : members()) nodes[p.address].push_back(p.rank);
  return nodes;
}

}  // namespace zcc::daemon::peer
