#include "daemon/peer/replica_store.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"

namespace zcc::daemon::peer {
namespace {

Replica Piece(int64_t step, const std::string& name, size_t n, uint32_t uid = 1000,
              const std::string& job = "job") {
  Replica r;
  r.info.key = ReplicaKey{job, uid, 0, step, name};
  r.info.received = absl::Now();
  r.bytes.assign(n, static_cast<char>('a' + step % 26));
  return r;
}

// A step of rank 0 replication sends whole: its data, then its manifest.
void PutWhole(ReplicaStore& store, int64_t step, size_t n) {
  REQUIRE_OK(store.Put(Piece(step, "w", n)));
  REQUIRE_OK(store.Put(Piece(step, "r00000.manifest.json", 1)));
}

TEST_CASE("replica store: keeps pieces within its budget, the oldest steps dropped first") {
  ReplicaStore store(100);
  PutWhole(store, 1, 40);
  PutWhole(store, 2, 40);
  CHECK(store.bytes_held() == 82);
  // Step 3 needs 41: step 1 (superseded by step 2, held whole) goes, its
  // manifest with its data.
  PutWhole(store, 3, 40);
  CHECK(store.bytes_held() == 82);
  CHECK(store.pieces_dropped() == 2);
  CHECK(store.List("job", 1000).size() == 4);
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status().code() == absl::StatusCode::kNotFound);
  auto two = store.Get(ReplicaKey{"job", 1000, 0, 2, "w"});
  REQUIRE_OK(two.status());
  CHECK((*two)->bytes == std::string(40, 'c'));
  CHECK((*two)->info.nbytes == 40);
}

TEST_CASE("replica store: this zccd's own copies are counted apart from what it holds for others") {
  std::vector<ReplicaStore::Held> seen;
  ReplicaStore store(1000, [&seen](const ReplicaStore::Held& h) { seen.push_back(h); });
  Replica own = Piece(1, "w", 100);
  own.info.own = true;
  REQUIRE_OK(store.Put(std::move(own)));
  REQUIRE_OK(store.Put(Piece(1, "x", 30, 1000, "other-job")));
  ReplicaStore::Held h = store.held();
  CHECK(h.bytes == 130);
  CHECK(h.pieces == 2);
  CHECK(h.own_bytes == 100);
  CHECK(h.own_pieces == 1);
  REQUIRE(seen.size() == 2);
  CHECK(seen.back().own_bytes == 100);
  // Dropped for room, the own copy leaves the count too.
  CHECK(store.ShrinkTo(50) == 100);
  h = store.held();
  CHECK(h.bytes == 30);
  CHECK(h.own_bytes == 0);
  CHECK(h.own_pieces == 0);
  CHECK(seen.back().own_bytes == 0);
}

TEST_CASE("replica store: the newest whole step of a rank stays until a newer one is whole") {
  ReplicaStore store(100);
  PutWhole(store, 1, 60);
  // Step 2's data would need step 1's room, but step 1 is the newest step
  // rank 0 has whole here: refused, step 1 kept.
  const absl::Status no_room = store.Put(Piece(2, "w", 60));
  CHECK(no_room.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(no_room.message()), Catch::Contains("replica_budget_bytes"));
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status());
  // Another rank's newer step does not supersede rank 0's.
  Replica other = Piece(3, "r00001.manifest.json", 1);
  other.info.key.rank = 1;
  REQUIRE_OK(store.Put(std::move(other)));
  CHECK(store.Put(Piece(4, "w", 60)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(store.bytes_held() == 62);
  // With the room for two steps the rotation works.
  ReplicaStore roomy(130);
  PutWhole(roomy, 1, 60);
  PutWhole(roomy, 2, 60);
  PutWhole(roomy, 3, 60);
  CHECK(roomy.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status().code() == absl::StatusCode::kNotFound);
  REQUIRE_OK(roomy.Get(ReplicaKey{"job", 1000, 0, 3, "w"}).status());
}

TEST_CASE("replica store: the job's pinned step (its newest whole in the tier) stays when newer "
          "pieces need room; the pin moves on, and registrations' room ignores it") {
  ReplicaStore store(100);
  PutWhole(store, 1, 40);
  PutWhole(store, 2, 40);
  // Rank 0 has step 2 whole, but another rank has only step 1 whole
  // anywhere: step 1 is the job's newest whole step, pinned.
  store.Pin("job", 1000, 1);
  CHECK(store.pinned("job", 1000) == 1);
  CHECK_FALSE(store.pinned("job", 1001).has_value());
  // Step 3 needs room that only step 1 could give: refused, step 1 kept.
  const absl::Status no_room = store.Put(Piece(3, "w", 40));
  CHECK(no_room.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(no_room.message()), Catch::Contains("newest step whole in the tier"));
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status());
  // Another uid's job of the same name is not pinned by it.
  store.Pin("job", 1001, 1);
  CHECK(store.pinned("job", 1000) == 1);
  // The job's newest whole step moves on to 2: step 1 gives way.
  store.Pin("job", 1000, 2);
  REQUIRE_OK(store.Put(Piece(3, "w", 40)));
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status().code() ==
        absl::StatusCode::kNotFound);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 2, "w"}).status());
  // A trainer's registration needing the memory takes it all the same.
  CHECK(store.ShrinkTo(0) > 0);
  CHECK(store.bytes_held() == 0);
  // A lifted pin is gone.
  store.Pin("job", 1000, -1);
  CHECK_FALSE(store.pinned("job", 1000).has_value());
}

TEST_CASE("replica store: a pin moves back only when every zccd answered") {
  ReplicaStore store(100);
  CHECK(store.PinIfNewer("job", 1000, 5, false));
  CHECK_FALSE(store.PinIfNewer("job", 1000, 5, true));   // the same: no change
  CHECK_FALSE(store.PinIfNewer("job", 1000, 3, false));  // back, not everyone asked
  CHECK(store.pinned("job", 1000) == 5);
  CHECK(store.PinIfNewer("job", 1000, 7, false));
  CHECK(store.PinIfNewer("job", 1000, 6, true));         // back: everyone answered
  CHECK(store.pinned("job", 1000) == 6);
  CHECK_FALSE(store.pinned("job", 1001).has_value());
}

TEST_CASE("replica store: a manifest another zccd pushed is told (a rank's step whole here); "
          "an own copy's is not") {
  std::vector<ReplicaKey> told;
  ReplicaStore store(1000, nullptr, [&told](const ReplicaKey& k) { told.push_back(k); });
  REQUIRE_OK(store.Put(Piece(1, "w", 10)));
  CHECK(told.empty());
  REQUIRE_OK(store.Put(Piece(1, "r00000.manifest.json", 1)));
  REQUIRE(told.size() == 1);
  CHECK(told.front() == ReplicaKey{"job", 1000, 0, 1, "r00000.manifest.json"});
  Replica own = Piece(2, "r00000.manifest.json", 1);
  own.info.own = true;
  REQUIRE_OK(store.Put(std::move(own)));
  CHECK(told.size() == 1);
}

TEST_CASE("replica store: a late piece of an old step never evicts newer ones") {
  ReplicaStore store(100);
  REQUIRE_OK(store.Put(Piece(5, "a", 60)));
  REQUIRE_OK(store.Put(Piece(6, "r00000.manifest.json", 1)));
  const absl::Status late = store.Put(Piece(4, "a", 60));
  CHECK(late.code() == absl::StatusCode::kResourceExhausted);
  CHECK(store.bytes_held() == 61);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 5, "a"}).status());
  // Larger than the whole budget: refused, nothing dropped.
  CHECK(store.Put(Piece(9, "b", 101)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(store.bytes_held() == 61);
}

TEST_CASE("replica store: a rank's first step after it went on from a restore drops its newer "
          "steps, pinned or not; another rank's stay") {
  std::vector<ReplicaStore::Held> seen;
  ReplicaStore store(1000, [&seen](const ReplicaStore::Held& h) { seen.push_back(h); });
  // The run left behind: steps 20 and 30 whole, 40 part-received.
  PutWhole(store, 20, 10);
  PutWhole(store, 30, 10);
  REQUIRE_OK(store.Put(Piece(40, "w", 10)));
  store.Pin("job", 1000, 30);
  Replica other = Piece(30, "r00001.manifest.json", 1);
  other.info.key.rank = 1;
  REQUIRE_OK(store.Put(std::move(other)));
  // A late piece of an older step, unflagged, drops nothing.
  REQUIRE_OK(store.Put(Piece(12, "w", 10)));
  CHECK(store.List("job", 1000).size() == 7);
  // The rank went back to step 10 and trained on: step 11 is flagged.
  REQUIRE_OK(store.Put(Piece(11, "w", 10), /*went_on_from=*/10));
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 20, "w"}).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 30, "r00000.manifest.json"}).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(store.pieces_dropped() == 4);
  CHECK_FALSE(store.pinned("job", 1000).has_value());  // (step 30, of the run left)
  // What is not whole (no restore takes it) and the other rank's steps stay.
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 40, "w"}).status());
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 1, 30, "r00001.manifest.json"}).status());
  CHECK(store.bytes_held() == 10 + 1 + 10 + 10);
  CHECK(seen.back().bytes == store.bytes_held());
}

TEST_CASE("replica store: a rank's first step after a going back, of the number of a step of the "
          "run left, drops what came of that step before it; the step gone back to stays") {
  constexpr char kManifest[] = "r00000.manifest.json";
  auto held = [](ReplicaStore& store, int64_t step, const std::string& piece) {
    return store.Get(ReplicaKey{"job", 1000, 0, step, piece});
  };
  for (const bool reserved : {false, true}) {
    INFO((reserved ? "its room reserved first" : "put at once"));
    ReplicaStore store(1000);
    PutWhole(store, 10, 10);
    // The run left: step 20 whole (two pieces), the job's pinned step.
    REQUIRE_OK(store.Put(Piece(20, "v", 10)));
    PutWhole(store, 20, 10);
    store.Pin("job", 1000, 20);
    const uint64_t count = store.went_back_count("job", 1000);
    // Back to step 10, a checkpoint every 10 steps: the first step after it
    // is step 20 again, its first piece on the way.
    std::shared_ptr<ReplicaStore::Incoming> room;
    if (reserved) {
      auto r = store.Reserve(ReplicaKey{"job", 1000, 0, 20, "w"}, 12, /*went_on_from=*/10);
      REQUIRE_OK(r.status());
      room = *r;
    }
    if (reserved) {
      CHECK(held(store, 20, kManifest).status().code() == absl::StatusCode::kNotFound);
      CHECK(held(store, 20, "v").status().code() == absl::StatusCode::kNotFound);
      CHECK(held(store, 20, "w").status().code() == absl::StatusCode::kNotFound);
    }
    REQUIRE_OK(store.Put(Piece(20, "w", 12), /*went_on_from=*/10, room.get()));
    // The run left's step 20 is gone (its manifest would have kept it
    // whole with the new run's pieces), pin and all; step 10 stays.
    CHECK(held(store, 20, kManifest).status().code() == absl::StatusCode::kNotFound);
    CHECK(held(store, 20, "v").status().code() == absl::StatusCode::kNotFound);
    REQUIRE_OK(held(store, 20, "w").status());
    CHECK((*held(store, 20, "w"))->bytes.size() == 12);
    CHECK_FALSE(store.pinned("job", 1000).has_value());
    CHECK(store.went_back_count("job", 1000) > count);
    REQUIRE_OK(held(store, 10, kManifest).status());
    // The new run's later pieces of the step drop nothing: it is whole again.
    REQUIRE_OK(store.Put(Piece(20, "v", 12), /*went_on_from=*/10));
    REQUIRE_OK(store.Put(Piece(20, kManifest, 1), /*went_on_from=*/10));
    REQUIRE_OK(held(store, 20, kManifest).status());
    CHECK(store.bytes_held() == 10 + 1 + 12 + 12 + 1);
  }
}

TEST_CASE("replica store: a second going back to the same step notes the rank's run anew, so a "
          "tell drops what the run in between sent") {
  ReplicaStore store(1000);
  PutWhole(store, 10, 10);
  // Back to step 10 a first time: that run's steps 11 and 12, and part of 13.
  REQUIRE_OK(store.Put(Piece(11, "w", 10), /*went_on_from=*/10));
  REQUIRE_OK(store.Put(Piece(11, "r00000.manifest.json", 1), /*went_on_from=*/10));
  PutWhole(store, 12, 10);
  REQUIRE_OK(store.Put(Piece(13, "w", 10)));
  // Back to step 10 again: the rank's first step after it arrives (its
  // step 12 of the run in between, whole, goes at once).
  REQUIRE_OK(store.Put(Piece(11, "w", 10), /*went_on_from=*/10));
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 12, "w"}).status().code() ==
        absl::StatusCode::kNotFound);
  // Another zccd of the job tells it went on (its own rank 1): rank 0's
  // part of step 13 came before rank 0's run went on this time.
  const std::set<uint32_t> told = {1};
  store.DropLeftBehind("job", 1000, 10, absl::Now(), &told);
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 13, "w"}).status().code() ==
        absl::StatusCode::kNotFound);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 11, "w"}).status());
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 10, "r00000.manifest.json"}).status());
}

TEST_CASE("replica store: a job that went on from a restore drops the steps of the run it left "
          "that arrived before each rank's run began") {
  std::vector<ReplicaStore::Held> seen;
  ReplicaStore store(10000, [&seen](const ReplicaStore::Held& h) { seen.push_back(h); });
  const absl::Time t = absl::Now();
  auto put = [&store, t](uint32_t rank, int64_t step, const std::string& name, double at_s,
                         int64_t went_on_from = -1) {
    Replica r = Piece(step, name, 10);
    r.info.key.rank = rank;
    r.info.received = t + absl::Seconds(at_s);
    REQUIRE_OK(store.Put(std::move(r), went_on_from));
  };
  auto held = [&store](uint32_t rank, int64_t step, const std::string& name) {
    return store.Get(ReplicaKey{"job", 1000, rank, step, name}).ok();
  };
  // Rank 0 (its node lost before its first step after the restore came):
  // the run it left, step 20 whole (pinned as the job's newest whole step)
  // and step 30 whole only after this zccd went on; step 8 is older than
  // the step restored.
  put(0, 8, "w", 1);
  put(0, 20, "w", 1);
  put(0, 20, "r00000.manifest.json", 1);
  put(0, 30, "w", 2);
  put(0, 30, "r00000.manifest.json", 6);
  // Rank 1: a piece of the run it left, then its first step after the
  // restore of step 10 (11, flagged), then its run's step 12.
  put(1, 25, "w", 3);
  put(1, 11, "w", 5, /*went_on_from=*/10);
  put(1, 12, "w", 6);
  // Rank 2: its first step after an earlier restore (of step 4), then a
  // piece of the run it left now.
  put(2, 5, "w", 2, /*went_on_from=*/4);
  put(2, 14, "w", 3);
  // Rank 3: a piece that arrived after this zccd's ranks went on.
  put(3, 15, "w", 7);
  // Rank 5: its first step after the restore (11), then, as 11 did not
  // reach every buddy, 12 flagged too: its run began with 11.
  put(5, 11, "w", 2, /*went_on_from=*/10);
  put(5, 12, "w", 3, /*went_on_from=*/10);
  store.Pin("job", 1000, 20);
  // Another job's step stays.
  Replica other = Piece(20, "w", 10, 1000, "other");
  other.info.received = t;
  REQUIRE_OK(store.Put(std::move(other)));

  const size_t told = seen.size();
  const auto dropped = store.DropLeftBehind("job", 1000, 10, t + absl::Seconds(4));
  CHECK(dropped == std::map<uint32_t, std::set<int64_t>>{{0, {20, 30}}, {1, {25}}, {2, {14}}});
  CHECK_FALSE(held(0, 20, "w"));
  CHECK_FALSE(held(0, 20, "r00000.manifest.json"));
  CHECK_FALSE(held(0, 30, "w"));
  CHECK_FALSE(held(0, 30, "r00000.manifest.json"));  // whole only with data of the run left
  CHECK_FALSE(held(1, 25, "w"));
  CHECK_FALSE(held(2, 14, "w"));
  CHECK(held(0, 8, "w"));
  CHECK(held(1, 11, "w"));  // rank 1's run, from its first step on
  CHECK(held(1, 12, "w"));
  CHECK(held(2, 5, "w"));
  CHECK(held(3, 15, "w"));
  CHECK(held(5, 11, "w"));
  CHECK(held(5, 12, "w"));
  CHECK(store.Get(ReplicaKey{"other", 1000, 0, 20, "w"}).ok());
  CHECK_FALSE(store.pinned("job", 1000).has_value());
  CHECK(store.bytes_held() == 8 * 10);
  REQUIRE(seen.size() == told + 1);
  CHECK(seen.back().bytes == store.bytes_held());
  // A first step after that restore arriving now is late for it, or of a
  // later going back to the same step: it counts for nothing. Such a later
  // going back drops what came before it (the owners push their run's
  // steps again).
  put(4, 11, "w", 8, /*went_on_from=*/10);
  CHECK(store.DropLeftBehind("job", 1000, 10, t + absl::Seconds(10)) ==
        std::map<uint32_t, std::set<int64_t>>{{1, {11, 12}}, {3, {15}}, {4, {11}}, {5, {11, 12}}});
}

TEST_CASE("replica store: a pin found before the job went back is not taken after it") {
  ReplicaStore store(1000);
  PutWhole(store, 20, 10);
  PutWhole(store, 30, 10);
  // A pin round lists the holdings (step 30 whole, of the run about to be
  // left), then the job goes back to step 10 before the round pins.
  const uint64_t as_of = store.went_back_count("job", 1000);
  CHECK(as_of == 0);
  store.DropLeftBehind("job", 1000, 10, absl::Now() + absl::Seconds(1));
  CHECK_FALSE(store.PinIfNewer("job", 1000, 30, false, as_of));
  CHECK_FALSE(store.pinned("job", 1000).has_value());
  // A round begun after it pins.
  const uint64_t now = store.went_back_count("job", 1000);
  CHECK(now == 1);
  PutWhole(store, 11, 10);
  CHECK(store.PinIfNewer("job", 1000, 11, false, now));
  CHECK(store.pinned("job", 1000) == 11);
  // A rank's first step after another restore, arriving from its owner,
  // counts as a going back too (its pin above the step is lifted)...
  REQUIRE_OK(store.Put(Piece(6, "w", 10), /*went_on_from=*/5));
  const uint64_t after = store.went_back_count("job", 1000);
  CHECK(after > now);
  CHECK_FALSE(store.pinned("job", 1000).has_value());
  CHECK_FALSE(store.PinIfNewer("job", 1000, 11, false, now));
  // ...once: the step's later pieces do not hold up the rounds after it.
  REQUIRE_OK(store.Put(Piece(6, "r00000.manifest.json", 1), /*went_on_from=*/5));
  CHECK(store.went_back_count("job", 1000) == after);
  CHECK(store.PinIfNewer("job", 1000, 6, false, after));
  CHECK(store.pinned("job", 1000) == 6);
  // Without `as_of` (a pin another zccd sends), as before.
  CHECK(store.PinIfNewer("job", 1000, 12, false));
}

TEST_CASE("replica store: a piece pushed again replaces the old bytes") {
  ReplicaStore store(100);
  REQUIRE_OK(store.Put(Piece(1, "a", 60)));
  Replica again = Piece(1, "a", 70);
  again.bytes.assign(70, 'z');
  REQUIRE_OK(store.Put(std::move(again)));
  CHECK(store.bytes_held() == 70);
  CHECK((*store.Get(ReplicaKey{"job", 1000, 0, 1, "a"}))->bytes == std::string(70, 'z'));
}

TEST_CASE("replica store: pieces are found only under the job and uid they came with") {
  ReplicaStore store(1000);
  REQUIRE_OK(store.Put(Piece(1, "a", 10, 1000, "job")));
  REQUIRE_OK(store.Put(Piece(1, "b", 10, 1000, "job")));
  REQUIRE_OK(store.Put(Piece(1, "a", 10, 1001, "job")));
  REQUIRE_OK(store.Put(Piece(1, "a", 10, 1000, "other")));
  CHECK(store.Get(ReplicaKey{"job", 1002, 0, 1, "a"}).status().code() == absl::StatusCode::kNotFound);
  const auto listed = store.List("job", 1000);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].key.piece == "a");
  CHECK(listed[1].key.piece == "b");
  CHECK(listed[0].nbytes == 10);
  CHECK(store.List("job", 1001).size() == 1);
  CHECK(store.List("nobody", 1000).empty());
}

TEST_CASE("replica store: shrinks to a target, oldest first") {
  ReplicaStore store(1000);
  for (int64_t step = 1; step <= 5; ++step) REQUIRE_OK(store.Put(Piece(step, "w", 100)));
  CHECK(store.ShrinkTo(250) == 300);
  CHECK(store.bytes_held() == 200);
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 3, "w"}).status().code() == absl::StatusCode::kNotFound);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 4, "w"}).status());
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 5, "w"}).status());
}

TEST_CASE("replica store: shrinking drops a step's manifest with its first piece") {
  ReplicaStore store(1000);
  PutWhole(store, 1, 100);
  PutWhole(store, 2, 100);
  // One piece of step 1 must go: step 1 is no longer whole here.
  CHECK(store.ShrinkTo(150) == 101);
  for (const ReplicaInfo& info : store.List("job", 1000)) CHECK(info.key.step == 2);
  CHECK(store.List("job", 1000).size() == 2);
}

TEST_CASE("replica store: shrinking for a registration drops the least needed first") {
  ReplicaStore store(10000);
  auto put = [&store](const std::string& job, int64_t step, bool whole) {
    REQUIRE_OK(store.Put(Piece(step, "w", 100, 1000, job)));
    if (whole) REQUIRE_OK(store.Put(Piece(step, "r00000.manifest.json", 1, 1000, job)));
  };
  auto held = [&store](const std::string& job, int64_t step) {
    return store.Get(ReplicaKey{job, 1000, 0, step, "w"}).ok();
  };
  put("mine", 1, true);    // the registering job's newest whole step, the oldest here
  put("other", 1, true);   // superseded by step 2
  put("other", 2, true);   // other's newest whole step, pinned
  put("other", 3, false);  // part-received
  store.Pin("other", 1000, 2);
  // Each shrink by a little: one piece (and its manifest) at a time.
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 101);
  CHECK_FALSE(held("other", 1));  // superseded, not pinned
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 100);
  CHECK_FALSE(held("other", 3));  // part-received
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 101);
  CHECK_FALSE(held("other", 2));  // another job's whole step, pinned and all
  CHECK(held("mine", 1));         // the registering job's own, last
  // A piece being received gives its room back before the registering
  // job's own pieces go.
  auto incoming = store.Reserve(ReplicaKey{"other", 1000, 0, 4, "w"}, 50);
  REQUIRE_OK(incoming.status());
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 50);
  CHECK((*incoming)->revoked());
  CHECK(held("mine", 1));
  CHECK(store.ShrinkTo(0, "mine", 1000) == 101);
  CHECK(store.bytes_held() == 0);
}

TEST_CASE("replica store: the room of a piece being received counts from Reserve until its Put") {
  std::vector<ReplicaStore::Held> seen;
  ReplicaStore store(100, [&seen](const ReplicaStore::Held& h) { seen.push_back(h); });
  PutWhole(store, 1, 40);
  {
    auto room = store.Reserve(ReplicaKey{"job", 1000, 0, 2, "w"}, 40);
    REQUIRE_OK(room.status());
    CHECK(store.bytes_held() == 81);
    CHECK(store.held().incoming_bytes == 40);
    CHECK(seen.back().bytes == 81);
    // Beside it, no room for another piece that nothing gives way to.
    CHECK(store.Put(Piece(1, "x", 20)).code() == absl::StatusCode::kResourceExhausted);
    CHECK(store.Reserve(ReplicaKey{"job", 1000, 0, 2, "x"}, 20).status().code() ==
          absl::StatusCode::kResourceExhausted);
    CHECK(store.bytes_held() == 81);  // (refused: nothing dropped)
    REQUIRE_OK(store.Put(Piece(2, "w", 40), -1, room->get()));
    CHECK(store.bytes_held() == 81);
    CHECK(store.held().incoming_bytes == 0);
  }  // (the room Put took is not let go of twice)
  CHECK(store.bytes_held() == 81);
  REQUIRE_OK(store.Put(Piece(2, "r00000.manifest.json", 1)));
  // A piece's room makes room as its Put would: step 1, superseded, goes.
  auto room = store.Reserve(ReplicaKey{"job", 1000, 0, 3, "w"}, 40);
  REQUIRE_OK(room.status());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).ok());
  CHECK(store.bytes_held() == 81);
  // Let go of unused (its push failed): no longer counted.
  room->reset();
  CHECK(store.bytes_held() == 41);
  CHECK(seen.back().bytes == 41);
  // A revoked room is no room: the piece is Put as one without any.
  auto revoked = store.Reserve(ReplicaKey{"job", 1000, 0, 3, "w"}, 40);
  REQUIRE_OK(revoked.status());
  CHECK(store.ShrinkTo(50, "job", 1000) == 40);
  CHECK((*revoked)->revoked());
  CHECK(store.bytes_held() == 41);
  REQUIRE_OK(store.Put(Piece(3, "w", 40), -1, revoked->get()));
  CHECK(store.bytes_held() == 81);
  revoked->reset();
  CHECK(store.bytes_held() == 81);
}

TEST_CASE("replica store: a going back another zccd tells drops what came before the going on, "
          "however late or often told; the new run's pieces of a step stay") {
  ReplicaStore store(1000);
  PutWhole(store, 8, 10);
  PutWhole(store, 12, 10);
  PutWhole(store, 14, 10);
  absl::SleepFor(absl::Milliseconds(5));
  // Rank 0 went on from step 10: the first piece of its first step after
  // it, 14, arrives (in place of the run left's, whose manifest goes with
  // it).
  const absl::Time rank0_went_on = absl::Now();
  REQUIRE_OK(store.Put(Piece(14, "w", 10), /*went_on_from=*/10));
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 14, "r00000.manifest.json"}).ok());
  absl::SleepFor(absl::Milliseconds(5));
  // Rank 1's zccd tells its own going on, later than rank 0's step: rank
  // 0's pieces go where they came before that step.
  const std::set<uint32_t> rank1 = {1};
  CHECK(store.DropLeftBehind("job", 1000, 10, absl::Now(), &rank1) ==
        std::map<uint32_t, std::set<int64_t>>{{0, {12}}});
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 8, "w"}).ok());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 12, "w"}).ok());
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 14, "w"}).ok());  // the new run's
  // Not whole until the new run's own manifest, sent after its data.
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 14, "r00000.manifest.json"}).ok());
  // Told again, late, and by rank 0's own zccd: nothing more goes.
  CHECK(store.DropLeftBehind("job", 1000, 10, absl::Now(), &rank1).empty());
  const std::set<uint32_t> rank0 = {0};
  CHECK(store.DropLeftBehind("job", 1000, 10, rank0_went_on, &rank0).empty());
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 14, "w"}).ok());
}

TEST_CASE("replica store: rooms a registration takes back go other jobs' first, the oldest step "
          "first") {
  ReplicaStore store(10000);
  auto mine = store.Reserve(ReplicaKey{"mine", 1000, 0, 5, "w"}, 10);
  auto later = store.Reserve(ReplicaKey{"other", 1000, 0, 7, "w"}, 10);
  auto older = store.Reserve(ReplicaKey{"other", 1000, 1, 6, "w"}, 10);
  REQUIRE_OK(mine.status());
  REQUIRE_OK(later.status());
  REQUIRE_OK(older.status());
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 10);
  CHECK((*older)->revoked());
  CHECK_FALSE((*later)->revoked());
  CHECK(store.ShrinkTo(store.bytes_held() - 1, "mine", 1000) == 10);
  CHECK((*later)->revoked());
  CHECK_FALSE((*mine)->revoked());
  CHECK(store.ShrinkTo(0, "mine", 1000) == 10);
  CHECK((*mine)->revoked());
}

TEST_CASE("replica store: the room of a rank's first step after it went back is made beside what "
          "stays, the run it left dropped") {
  ReplicaStore store(100);
  PutWhole(store, 3, 40);
  PutWhole(store, 4, 40);
  // Refused without it: nothing older than step 3 gives way.
  CHECK(store.Reserve(ReplicaKey{"job", 1000, 0, 3, "x"}, 40).status().code() ==
        absl::StatusCode::kResourceExhausted);
  // The rank restored step 2: its step 3 is the first after it, its steps
  // 3 and 4 held here are of the run it left.
  auto room = store.Reserve(ReplicaKey{"job", 1000, 0, 3, "x"}, 40, /*went_on_from=*/2);
  REQUIRE_OK(room.status());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 4, "w"}).ok());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 3, "w"}).ok());
  CHECK(store.bytes_held() == 40);
}

TEST_CASE("replica store: a manifest takes no room before it is kept, so one whose push fails "
          "drops nothing") {
  ReplicaStore store(100);
  PutWhole(store, 1, 40);
  REQUIRE_OK(store.Put(Piece(2, "w", 40)));
  const ReplicaKey manifest{"job", 1000, 0, 2, "r00000.manifest.json"};
  {
    auto room = store.Reserve(manifest, 30);
    REQUIRE_OK(room.status());
    CHECK((*room)->bytes() == 0);
    CHECK(store.bytes_held() == 81);
  }  // (its push failed)
  CHECK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).ok());  // step 1 still whole here
  // Kept, it completes step 2: step 1 gives way to it then.
  auto room = store.Reserve(manifest, 30);
  REQUIRE_OK(room.status());
  REQUIRE_OK(store.Put(Piece(2, "r00000.manifest.json", 30), -1, room->get()));
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).ok());
  CHECK(store.bytes_held() == 70);
}

TEST_CASE("replica store: a rank's manifest completes its step, so older steps give way to it") {
  // Step 2's data fits beside step 1; its manifest then needs step 1's room,
  // which it may take (step 2 is then whole), or the step never completes.
  ReplicaStore store(201);
  PutWhole(store, 1, 100);
  REQUIRE_OK(store.Put(Piece(2, "w", 100)));
  REQUIRE_OK(store.Put(Piece(2, "r00000.manifest.json", 1)));
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).ok());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 1, "r00000.manifest.json"}).ok());
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 2, "w"}).status());
}

TEST_CASE("replica store: a manifest whose step lost a piece on the way does not make the step "
          "whole, nor push out the rank's older whole step") {
  std::vector<ReplicaKey> whole;
  ReplicaStore store(201, nullptr, [&whole](const ReplicaKey& k) { whole.push_back(k); });
  PutWhole(store, 1, 100);
  whole.clear();
  REQUIRE_OK(store.Put(Piece(2, "w", 100)));
  // A registration takes step 2's data back (part-received goes first)
  // while its manifest is on its way.
  CHECK(store.ShrinkTo(101) == 100);
  Replica manifest = Piece(2, "r00000.manifest.json", 1);
  manifest.with_pieces = {"w"};
  const absl::Status refused = store.Put(std::move(manifest));
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("without piece 'w'"));
  CHECK(whole.empty());
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 2, "r00000.manifest.json"}).ok());
  // Step 1 is still the newest whole: a piece of step 3 may not take its room.
  CHECK(store.Put(Piece(3, "w", 150)).code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).status());
  CHECK(store.bytes_held() == 101);
  // Pushed again, data first: whole, and step 1 gives way to it.
  REQUIRE_OK(store.Put(Piece(2, "w", 100)));
  manifest = Piece(2, "r00000.manifest.json", 1);
  manifest.with_pieces = {"w"};
  REQUIRE_OK(store.Put(std::move(manifest)));
  REQUIRE(whole.size() == 1);
  CHECK(whole.front().step == 2);
  CHECK_FALSE(store.Get(ReplicaKey{"job", 1000, 0, 1, "w"}).ok());
  // Only a manifest names pieces.
  Replica data = Piece(4, "x", 1);
  data.with_pieces = {"w"};
  CHECK(store.Put(std::move(data)).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("replica store: a manifest of the run left, landing after the going back dropped its "
          "step, does not make the step whole again") {
  std::vector<ReplicaKey> whole;
  ReplicaStore store(1000, nullptr, [&whole](const ReplicaKey& k) { whole.push_back(k); });
  PutWhole(store, 10, 10);
  REQUIRE_OK(store.Put(Piece(20, "w", 10)));  // (its manifest still on the wire)
  whole.clear();
  // The job went back to step 10 (this zccd's own ranks went on).
  const auto dropped = store.DropLeftBehind("job", 1000, 10, absl::Now());
  REQUIRE(dropped.count(0) == 1);
  CHECK(dropped.at(0) == std::set<int64_t>{20});
  Replica late = Piece(20, "r00000.manifest.json", 1);
  late.with_pieces = {"w"};
  CHECK(store.Put(std::move(late)).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(whole.empty());
  CHECK(store.List("job", 1000).size() == 2);  // (step 10's)
}

TEST_CASE("replica store: holds no more than the room its memory budget leaves beside staging") {
  uint64_t room = 250;
  ReplicaStore store(1000, nullptr, nullptr, [&room] { return room; });
  REQUIRE_OK(store.Put(Piece(1, "w", 100)));
  REQUIRE_OK(store.Put(Piece(2, "w", 100)));
  // 300 would not fit the 250 left beside the trainers' staging, and no
  // step may give way (none is whole here): refused, the budget named.
  const absl::Status no_room = store.Put(Piece(3, "w", 100));
  CHECK(no_room.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(no_room.message()), Catch::Contains("staging_budget_bytes"));
  CHECK(store.bytes_held() == 200);
  // More room (a trainer left): held up to the replica budget again.
  room = 5000;
  for (int64_t step = 3; step <= 12; ++step) PutWhole(store, step, 100);
  CHECK(store.bytes_held() <= 1000);
  CHECK(store.bytes_held() > 900);
  // Less (a trainer came): older steps give way to a newer one within it.
  room = 350;
  PutWhole(store, 13, 100);
  CHECK(store.bytes_held() <= 350);
  REQUIRE_OK(store.Get(ReplicaKey{"job", 1000, 0, 13, "w"}).status());
}

TEST_CASE("replica store: asks its room again when an admission began meanwhile") {
  std::atomic<uint64_t> admissions{0};
  int asked = 0;
  // The first answer goes stale at once: a registration begins and takes
  // the room before the piece is kept.
  ReplicaStore store(
      1000, nullptr, nullptr,
      [&]() -> uint64_t {
        if (++asked > 1) return 50;
        admissions.fetch_add(1);
        return 1000;
      },
      &admissions);
  CHECK(store.Put(Piece(1, "w", 100)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(asked == 2);
  CHECK(store.bytes_held() == 0);
}

TEST_CASE("replica store: a piece handed out outlives its eviction") {
  ReplicaStore store(100);
  REQUIRE_OK(store.Put(Piece(1, "w", 80)));
  REQUIRE_OK(store.Put(Piece(2, "r00000.manifest.json", 1)));
  auto held = store.Get(ReplicaKey{"job", 1000, 0, 1, "w"});
  REQUIRE_OK(held.status());
  REQUIRE_OK(store.Put(Piece(3, "w", 80)));
  CHECK((*held)->bytes == std::string(80, 'b'));
}

}  // namespace
}  // namespace zcc::daemon::peer
