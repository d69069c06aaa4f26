#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "daemon/peer/buddies.h"
#include "daemon/peer/job_peers.h"

namespace zcc::daemon::peer {
namespace {

using Names = std::vector<std::string>;

TEST_CASE("buddies: the next nodes in another failure domain, the same on every zccd") {
  const std::vector<NodeInfo> nodes = {
      {"10.0.0.1:7071", "rack-1"}, {"10.0.0.2:7071", "rack-1"},
      {"10.0.0.3:7071", "rack-2"}, {"10.0.0.4:7071", "rack-2"}};
  // From .1 the ring is .2 .3 .4: .2 shares rack-1, so .3 comes first.
  CHECK(ChooseBuddies(nodes[0], nodes, 1) == Names{"10.0.0.3:7071"});
  CHECK(ChooseBuddies(nodes[0], nodes, 2) == Names{"10.0.0.3:7071", "10.0.0.4:7071"});
  // Too few other domains: the node's own rack fills in, last.
  CHECK(ChooseBuddies(nodes[0], nodes, 3) ==
        Names{"10.0.0.3:7071", "10.0.0.4:7071", "10.0.0.2:7071"});
  // From .4 the ring wraps: .1 .2 (rack-1) before .3 (its own rack).
  CHECK(ChooseBuddies(nodes[3], nodes, 1) == Names{"10.0.0.1:7071"});
  // The order the membership was listed in does not matter.
  std::vector<NodeInfo> shuffled = {nodes[2], nodes[0], nodes[3], nodes[1]};
  for (const NodeInfo& self : nodes) {
    CHECK(ChooseBuddies(self, shuffled, 2) == ChooseBuddies(self, nodes, 2));
  }
}

TEST_CASE("buddies: unknown domains count as domains of their own; never self; one node alone") {
  const NodeInfo a{"a:1", ""}, b{"b:1", ""}, c{"c:1", ""};
  CHECK(ChooseBuddies(b, {a, b, c}, 1) == Names{"c:1"});
  CHECK(ChooseBuddies(c, {a, b, c}, 5) == Names{"a:1", "b:1"});
  CHECK(ChooseBuddies(a, {a}, 1).empty());
  CHECK(ChooseBuddies(a, {a, b, b}, 2) == Names{"b:1"});
  CHECK(ChooseBuddies(a, {a, b}, 0).empty());
}

TEST_CASE("job peers: the membership the trainers report, checked") {
  JobPeers peers;
  REQUIRE_OK(peers.Set({{1, "node-b:7071"}, {0, "node-a:7071"}, {2, "node-a:7071"}}, 3));
  const auto members = peers.members();
  REQUIRE(members.size() == 3);
  CHECK(members[0].rank == 0);
  CHECK(members[2].address == "node-a:7071");
  const auto nodes = peers.Nodes();
  REQUIRE(nodes.size() == 2);
  CHECK(nodes.at("node-a:7071") == std::vector<uint32_t>{0, 2});
  CHECK(nodes.at("node-b:7071") == std::vector<uint32_t>{1});

  CHECK(peers.Set({{3, "x:1"}}, 3).code() == absl::StatusCode::kInvalidArgument);
  CHECK(peers.Set({{0, "x:1"}, {0, "y:1"}}, 3).code() == absl::StatusCode::kInvalidArgument);
  CHECK(peers.Set({{0, "no-port"}}, 3).code() == absl::StatusCode::kInvalidArgument);
  CHECK(peers.Set({{0, "x:0"}}, 3).code() == absl::StatusCode::kInvalidArgument);
  CHECK(peers.Set({{0, "x y:1"}}, 3).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_OK(peers.Set({{0, "[::1]:7071"}}, 1));
  // A refused list leaves the last good one.
  CHECK(peers.Set({{0, "bad"}}, 1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(peers.members().size() == 1);
  CHECK(peers.members()[0].address == "[::1]:7071");
}

}  // namespace
}  // namespace zcc::daemon::peer
