#include "daemon/peer/memory_tier.h"

#include "common/log.h"
#include "format/manifest.h"

namespace zcc::daemon::peer {
namespace {

void Note(Holdings& h, const std::string& holder, const ReplicaInfo& info) {
  h[info.key.step][info.key.rank][holder].insert(info.key.piece);
}

}  // namespace

Holdings ListHoldings(const std::string& job_id, uint32_t uid, const TierSources& sources,
                      absl::Duration timeout, size_t* asked) {
  Holdings held;
  if (asked != nullptr) *asked = 0;
  for (const ReplicaInfo& info : sources.own->List(job_id, uid)) Note(held, kThisZccd, info);
  for (const std::string& peer : sources.peers) {
    auto listed = sources.directory->Client(peer)->List(job_id, uid, timeout, sources.cancel);
    if (!listed.ok()) {
      ZCC_LOG(WARNING) << "job " << job_id << ": peer " << peer
                       << " cannot be asked for its replicas: " << listed.status();
      continue;
    }
    if (asked != nullptr) ++*asked;
    for (const ReplicaInfo& info : *listed) Note(held, peer, info);
  }
  return held;
}

std::optional<int64_t> NewestWholeStep(const Holdings& held, uint32_t world) {
  if (world == 0) return std::nullopt;
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    const auto& ranks = it->second;
    uint32_t whole = 0;
    for (uint32_t rank = 0; rank < world; ++rank) {
      auto r = ranks.find(rank);
      if (r == ranks.end()) break;
      const std::string manifest = format::ManifestFileName(rank);
      bool found = false;
      for (const auto& [holder, files] : r->second) found = found || files.count(manifest) > 0;
      if (!found) break;
      ++whole;
    }
    if (whole == world) return it->first;
  }
  return std::nullopt;
}

}  // namespace zcc::daemon::peer
