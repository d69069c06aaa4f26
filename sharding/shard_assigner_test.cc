#include "sharding/shard_assigner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"

namespace zcc::sharding {
namespace {

// The rule written the plain way: a stable sort and a linear scan for the
// least-loaded member, O(tensors * members).
std::vector<uint32_t> ReferenceGreedy(const std::vector<SizedTensor>& tensors, uint32_t members) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].nbytes != tensors[b].nbytes) return tensors[a].nbytes > tensors[b].nbytes;
    return tensors[a].name < tensors[b].name;
  });
  std::vector<uint64_t> load(members, 0);
  std::vector<uint32_t> owner(tensors.size());
  for (size_t i : order) {
    uint32_t best = 0;
    for (uint32_t m = 1; m < members; ++m) {
      if (load[m] < load[best]) best = m;
    }
    owner[i] = best;
    load[best] += tensors[i].nbytes;
  }
  return owner;
}

uint64_t RandomSize(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0:
      return 0;  // empty tensors
    case 1:
      return 4096 * (1 + rng() % 4);  // many duplicates
    case 2:
      return rng() % 100;
    default:
      return rng() % (uint64_t{1} << (10 + rng() % 24));
  }
}

std::vector<SizedTensor> RandomGroupTensors(std::mt19937_64& rng, size_t n) {
  std::vector<SizedTensor> t;
  for (size_t i = 0; i < n; ++i)
    t.push_back({absl::StrCat("t", rng() % 1000000, "_", i), RandomSize(rng)});
  return t;
}

std::map<std::string, uint32_t> OwnersByName(const std::vector<SizedTensor>& tensors,
                                             const GroupAssignment& a) {
  std::map<std::string, uint32_t> m;
  for (size_t i = 0; i < tensors.size(); ++i) m[tensors[i].name] = a.owner[i];
  return m;
}

TEST_CASE("a small group is assigned largest first onto the least-loaded member") {
  const std::vector<SizedTensor> tensors = {{"a", 10}, {"b", 70}, {"c", 30}, {"d", 30},
                                            {"e", 0},  {"f", 25}, {"g", 0}};
  auto a = AssignShards(tensors, 3);
  REQUIRE_OK(a);
  // Order: b70 c30 d30 f25 a10 e0 g0.
  // b->0 (70); c->1 (30); d->2 (30); f->1 (55, tie 1<2); a->2 (40); e->2; g->2.
  CHECK(a->owner == std::vector<uint32_t>{2, 0, 1, 2, 2, 1, 2});
  CHECK(a->member_bytes == std::vector<uint64_t>{70, 55, 40});
}

TEST_CASE("groups of one member and groups larger than the tensor count") {
  const std::vector<SizedTensor> tensors = {{"x", 5}, {"y", 0}, {"z", 5}};
  auto one = AssignShards(tensors, 1);
  REQUIRE_OK(one);
  CHECK(one->owner == std::vector<uint32_t>{0, 0, 0});
  CHECK(one->member_bytes == std::vector<uint64_t>{10});
  auto many = AssignShards(tensors, 8);
  REQUIRE_OK(many);
  CHECK(many->owner == std::vector<uint32_t>{0, 2, 1});
  CHECK(many->member_bytes == std::vector<uint64_t>{5, 5, 0, 0, 0, 0, 0, 0});
  auto none = AssignShards({}, 4);
  REQUIRE_OK(none);
  CHECK(none->owner.empty());
  CHECK(none->member_bytes == std::vector<uint64_t>(4, 0));
}

TEST_CASE("AssignShards refuses bad input") {
  REQUIRE_STATUS_CODE(AssignShards({{"a", 1}}, 0), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(AssignShards({{"a", 1}, {"a", 2}}, 2), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(AssignShards({{"", 1}}, 2), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(AssignShards({{"a", UINT64_MAX}, {"b", 1}}, 2),
                      absl::StatusCode::kInvalidArgument);
}

TEST_CASE("random groups: every tensor once, balanced, equal to the reference, order-free") {
  std::mt19937_64 rng(12345);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    const size_t n = rng() % 5 == 0 ? rng() % 4 : rng() % 80;
    const uint32_t members = rng() % 6 == 0 ? 1 : 1 + static_cast<uint32_t>(rng() % 100);
    std::vector<SizedTensor> tensors = RandomGroupTensors(rng, n);
    INFO("iteration " << iteration << " tensors " << n << " members " << members);
    auto a = AssignShards(tensors, members);
    REQUIRE_OK(a);
    REQUIRE(a->owner.size() == n);
    REQUIRE(a->member_bytes.size() == members);

    // Exactly one owner per tensor (by construction of `owner`), within
    // range, and the loads add up.
    std::vector<uint64_t> load(members, 0);
    uint64_t total = 0, largest = 0;
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(a->owner[i] < members);
      load[a->owner[i]] += tensors[i].nbytes;
      total += tensors[i].nbytes;
      largest = std::max(largest, tensors[i].nbytes);
    }
    CHECK(load == a->member_bytes);

    // Greedy bound: max load <= total / members + largest tensor.
    const uint64_t max_load = *std::max_element(load.begin(), load.end());
    CHECK(max_load * members <= total + uint64_t{members} * largest);

    // The same as the plain reference.
    CHECK(a->owner == ReferenceGreedy(tensors, members));

    // Any input order gives the same tensor -> member map (each member
    // computing alone from its own copy of the list).
    const auto by_name = OwnersByName(tensors, *a);
    for (int shuffle = 0; shuffle < 3; ++shuffle) {
      std::vector<SizedTensor> copy = tensors;
      std::shuffle(copy.begin(), copy.end(), rng);
      auto b = AssignShards(copy, members);
      REQUIRE_OK(b);
      CHECK(OwnersByName(copy, *b) == by_name);
      CHECK(b->member_bytes == a->member_bytes);
    }
  }
}

// ---------------------------------------------------------------- rank plans

// A synthetic job: a dense DP group of `dp` ranks; experts, each replicated
// across its own subset of ranks; per-rank tensors that are not replicated.
struct World {
  uint32_t dp = 1;
  std::vector<std::vector<ShardTensor>> manifests;  // per rank
  // name -> the ranks that hold a replica (for replicated tensors) or the owner.
  std::map<std::string, std::vector<uint32_t>> holders;
};

World RandomWorld(std::mt19937_64& rng) {
  World w;
  w.dp = 1 + static_cast<uint32_t>(rng() % 9);
  w.manifests.resize(w.dp);
  const size_t dense = rng() % 4 == 0 ? rng() % 3 : rng() % 60;
  for (size_t i = 0; i < dense; ++i) {
    const std::string name = absl::StrCat("layers.", i, ".weight");
    const uint64_t nbytes = RandomSize(rng);
    for (uint32_t r = 0; r < w.dp; ++r) {
      w.manifests[r].push_back({name, nbytes, {ReplicaKind::kDataParallel, w.dp, r, 0}});
      w.holders[name].push_back(r);
    }
  }
  const uint32_t experts = static_cast<uint32_t>(rng() % 6);
  for (uint32_t e = 0; e < experts; ++e) {
    const uint32_t expert_id = e * 7 + 3;
    // The expert's data-parallel group: a random subset of the ranks.
    std::vector<uint32_t> ranks(w.dp);
    for (uint32_t r = 0; r < w.dp; ++r) ranks[r] = r;
    std::shuffle(ranks.begin(), ranks.end(), rng);
    ranks.resize(1 + rng() % w.dp);
    const size_t count = rng() % 12;
    for (size_t i = 0; i < count; ++i) {
      const std::string name = absl::StrCat("experts.", expert_id, ".w", i);
      const uint64_t nbytes = RandomSize(rng);
      for (uint32_t m = 0; m < ranks.size(); ++m) {
        w.manifests[ranks[m]].push_back({name,
                                         nbytes,
                                         {ReplicaKind::kExpertDataParallel,
                                          static_cast<uint32_t>(ranks.size()), m, expert_id}});
        w.holders[name].push_back(ranks[m]);
      }
    }
  }
  for (uint32_t r = 0; r < w.dp; ++r) {
    const size_t own = rng() % 5;
    for (size_t i = 0; i < own; ++i) {
      const std::string name = absl::StrCat("rank", r, ".optim.shard", i);
      // kNone tensors carry arbitrary group fields: they are ignored.
      w.manifests[r].push_back({name, RandomSize(rng), {ReplicaKind::kNone, 0, 5, 9}});
      w.holders[name].push_back(r);
    }
    std::shuffle(w.manifests[r].begin(), w.manifests[r].end(), rng);
  }
  return w;
}

TEST_CASE("random jobs: every tensor is written by exactly one of its holders") {
  std::mt19937_64 rng(777);
  for (int iteration = 0; iteration < 500; ++iteration) {
    World w = RandomWorld(rng);
    INFO("iteration " << iteration << " dp " << w.dp);
    std::map<std::string, std::vector<uint32_t>> writers;
    // Member loads per group as each member reports them; all members must agree.
    std::map<GroupKey, std::vector<uint64_t>> reported;
    std::map<GroupKey, std::vector<uint64_t>> actual;
    for (uint32_t r = 0; r < w.dp; ++r) {
      auto plan = PlanRankWrites(w.manifests[r]);
      REQUIRE_OK(plan);
      REQUIRE(plan->writes.size() == w.manifests[r].size());
      uint64_t written = 0, total = 0;
      for (size_t i = 0; i < w.manifests[r].size(); ++i) {
        const ShardTensor& t = w.manifests[r][i];
        total += t.nbytes;
        if (!plan->writes[i]) continue;
        written += t.nbytes;
        writers[t.name].push_back(r);
        if (t.group.kind != ReplicaKind::kNone) {
          const GroupKey key{t.group.kind, t.group.kind == ReplicaKind::kExpertDataParallel
                                               ? t.group.expert_id
                                               : 0};
          auto& loads = actual[key];
          loads.resize(t.group.group_size);
          loads[t.group.rank_in_group] += t.nbytes;
        }
      }
      CHECK(plan->bytes_written == written);
      CHECK(plan->bytes_total == total);
      for (const GroupLoad& g : plan->groups) {
        auto [it, inserted] = reported.emplace(g.key, g.member_bytes);
        if (!inserted) CHECK(it->second == g.member_bytes);
        CHECK(g.member_bytes.size() == g.group_size);
      }
      for (size_t g = 1; g < plan->groups.size(); ++g) {
        CHECK(plan->groups[g - 1].key < plan->groups[g].key);
      }
    }
    // Every tensor exactly once, and by a rank that holds it.
    REQUIRE(writers.size() == w.holders.size());
    for (const auto& [name, holders] : w.holders) {
      INFO(name);
      REQUIRE(writers[name].size() == 1);
      CHECK(std::find(holders.begin(), holders.end(), writers[name][0]) != holders.end());
    }
    // What the members report is what they write (members that write nothing
    // from a group still report its loads).
    for (auto& [key, loads] : actual) {
      loads.resize(reported[key].size());
      CHECK(loads == reported[key]);
    }
  }
}

TEST_CASE("with DP=1 and no experts a rank writes everything") {
  std::vector<ShardTensor> tensors = {
      {"w", 100, {ReplicaKind::kDataParallel, 1, 0, 0}},
      {"z", 0, {ReplicaKind::kDataParallel, 1, 0, 0}},
      {"rng", 16, {}},
      {"e", 7, {ReplicaKind::kExpertDataParallel, 1, 0, 4}},
  };
  auto plan = PlanRankWrites(tensors);
  REQUIRE_OK(plan);
  CHECK(plan->writes == std::vector<bool>{true, true, true, true});
  CHECK(plan->bytes_written == 123);
  REQUIRE(plan->groups.size() == 2);
  CHECK(plan->groups[0].key == GroupKey{ReplicaKind::kDataParallel, 0});
  CHECK(plan->groups[0].member_bytes == std::vector<uint64_t>{100});
  CHECK(plan->groups[1].key == GroupKey{ReplicaKind::kExpertDataParallel, 4});
  CHECK(plan->groups[1].tensors == 1);
}

TEST_CASE("PlanRankWrites refuses inconsistent manifests, naming the tensor") {
  const ReplicaGroup dp4_r1{ReplicaKind::kDataParallel, 4, 1, 0};
  auto refused = [](std::vector<ShardTensor> tensors, const std::string& needle) {
    auto plan = PlanRankWrites(tensors);
    INFO(plan.status().ToString());
    REQUIRE_STATUS_CODE(plan, absl::StatusCode::kInvalidArgument);
    CHECK(plan.status().message().find(needle) != absl::string_view::npos);
  };
  refused({{"a", 1, {ReplicaKind::kDataParallel, 4, 4, 0}}}, "\"a\"");
  refused({{"a", 1, {ReplicaKind::kDataParallel, 0, 0, 0}}}, "\"a\"");
  refused({{"a", 1, dp4_r1}, {"b", 1, {ReplicaKind::kDataParallel, 8, 1, 0}}}, "\"b\"");
  refused({{"a", 1, dp4_r1}, {"b", 1, {ReplicaKind::kDataParallel, 4, 2, 0}}}, "\"b\"");
  refused({{"a", 1, dp4_r1}, {"a", 1, dp4_r1}}, "\"a\"");
  refused({{"", 1, dp4_r1}}, "empty name");
  refused({{"x", 1, {ReplicaKind::kExpertDataParallel, 2, 0, 5}},
           {"y", 1, {ReplicaKind::kExpertDataParallel, 3, 0, 5}}},
          "expert 5");
  refused({{"x", 1, {static_cast<ReplicaKind>(9), 2, 0, 5}}}, "\"x\"");
  // Different experts are different groups: sizes may differ.
  REQUIRE_OK(PlanRankWrites({{"x", 1, {ReplicaKind::kExpertDataParallel, 2, 0, 5}},
                             {"y", 1, {ReplicaKind::kExpertDataParallel, 3, 2, 6}},
                             {"d", 1, dp4_r1}}));
}

}  // namespace
}  // namespace zcc::sharding
