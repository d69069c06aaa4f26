#include "daemon/peer/testing/peer_fixtures.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/testing/status_matchers.h"
#include "format/checksum.h"

namespace zcc::daemon::peer::testing {

PeerServer::PeerServer(const PeerConfig& config, uint64_t budget, int at_port)
    : store(budget), service("node-a", "rack-1", &store) {
  auto creds = LoadPeerCredentials(config);
  REQUIRE_OK(creds.status());
  grpc::ServerBuilder b;
  b.AddListeningPort(absl::StrCat("127.0.0.1:", at_port), creds->server, &port);
  b.RegisterService(&service);
  if (at_port != 0) b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server = b.BuildAndStart();
  if (at_port != 0 && server == nullptr) return;  // taken: At says so
  REQUIRE(server != nullptr);
  REQUIRE(port != 0);
}

std::unique_ptr<PeerServer> PeerServer::At(const PeerConfig& config, int port) {
  auto s = std::make_unique<PeerServer>(config, 64 << 20, port);
  if (s->server == nullptr) return nullptr;
  return s;
}

PeerServer::~PeerServer() {
  if (server != nullptr) server->Shutdown();
}

std::string PeerServer::target() const { return absl::StrCat("127.0.0.1:", port); }

checkpoint::RankStepBytes StepFiles(uint32_t rank, int64_t step, int64_t fill,
                                    const std::string& timeline) {
  checkpoint::testing::SyntheticRank r(
      rank, 2,
      {{"w", format::DType::kF32, {32, 17}},
       {"m", format::DType::kF32, {32, 17}, format::TensorKind::kOptim}},
      0, "job");
  r.Fill(fill < 0 ? step : fill);
  auto bytes = checkpoint::SerializeRankStep(step, r.shards(), r.slot(), {}, timeline);
  REQUIRE_OK(bytes.status());
  return *bytes;
}

void Hold(ReplicaStore& store, const checkpoint::RankStepBytes& step, bool damage_shards) {
  for (const checkpoint::RankStepFile& f : step.files) {
    Replica r;
    r.info.key = ReplicaKey{"job", 1000, step.rank, step.step, f.name};
    r.bytes = f.bytes;
    r.info.xxh3 = format::Xxh3(r.bytes.data(), r.bytes.size());
    if (damage_shards && f.name.find("manifest") == std::string::npos) {
      r.bytes[r.bytes.size() / 2] ^= 1;
    }
    REQUIRE_OK(store.Put(std::move(r)));
  }
}

}  // namespace zcc::daemon::peer::testing
