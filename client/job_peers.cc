// Client: the job's membership in the peer tier (SetJobPeers).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "common/grpc_status.h"
#include "common/status.h"

namespace zcc {

using client_internal::Session;

std::string Client::PeerAddress() const {
  std::shared_ptr<Session> s = impl_->CurrentSession();
  return s == nullptr ? std::string() : s->resp.peer_address();
}

absl::StatusOr<std::vector<std::string>> Client::SetJobPeers(
    const std::vector<std::string>& by_rank) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) return absl::UnavailableError("not registered with zccd");
  if (by_rank.size() != im.options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("SetJobPeers: ", by_rank.size(),
                                                   " addresses for a job of ",
                                                   im.options.world_size, " ranks"));
  }
  auto req = im.AddressedTo<v1::SetJobPeersRequest>(*s);
  for (uint32_t r = 0; r < by_rank.size(); ++r) {
    if (by_rank[r].empty()) continue;
    v1::JobPeer* p = req.add_peers();
    p->set_rank(r);
    p->set_address(by_rank[r]);
  }
  v1::SetJobPeersResponse resp;
  auto ctx = im.Context();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(im.GetStubs()->control->SetJobPeers(ctx.get(), req, &resp)));
  return std::vector<std::string>(resp.buddies().begin(), resp.buddies().end());
}

absl::StatusOr<std::vector<std::string>> Client::ShareJobPeers(Collective& collective) {
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> by_rank, collective.AllGather(PeerAddress()));
  bool any = false;
  for (const std::string& a : by_rank) any = any || !a.empty();
  if (!any) return std::vector<std::string>();
  // The zccd of this rank takes part only with a peer service of its own.
  if (PeerAddress().empty()) return std::vector<std::string>();
  return SetJobPeers(by_rank);
}

}  // namespace zcc
