#include "daemon/peer/piece_assembly.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "format/checksum.h"

namespace zcc::daemon::peer {
namespace {

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 251);
  return s;
}

PieceAssembly::Whole WholeOf(const std::string& bytes, const std::string& from = "node-a",
                             int64_t step = 5) {
  return {ReplicaKey{"job", 1000, 0, step, "optim.safetensors"}, bytes.size(),
          format::Xxh3(bytes.data(), bytes.size()), from};
}

// Writes part [offset, +length) of `bytes` and ends it: the whole piece's
// bytes where this part completed it.
absl::StatusOr<std::optional<std::string>> Send(PieceAssembly& a, const std::string& bytes,
                                                uint64_t offset, uint64_t length,
                                                const PieceAssembly::Reserve& reserve = nullptr) {
  auto part = a.Begin(WholeOf(bytes), offset, length, uint64_t{1} << 30, reserve);
  if (!part.ok()) return part.status();
  std::memcpy(part->data, bytes.data() + offset, length);
  auto done = a.End(*part, true);
  if (!done.ok()) return done.status();
  if (!done->has_value()) return std::optional<std::string>();
  return std::optional<std::string>(std::move((*done)->bytes));
}

TEST_CASE("piece assembly: parts in any order make the piece, handed over once, by its last part") {
  PieceAssembly a;
  const std::string bytes = Pattern(10000);
  auto third = Send(a, bytes, 8000, 2000);
  REQUIRE_OK(third.status());
  CHECK_FALSE(third->has_value());
  auto first = Send(a, bytes, 0, 4000);
  REQUIRE_OK(first.status());
  CHECK_FALSE(first->has_value());
  CHECK(a.pieces() == 1);
  CHECK(a.bytes() == 10000);
  auto second = Send(a, bytes, 4000, 4000);
  REQUIRE_OK(second.status());
  REQUIRE(second->has_value());
  CHECK(**second == bytes);
  CHECK(a.pieces() == 0);
  CHECK(a.bytes() == 0);
}

TEST_CASE("piece assembly: parts written side by side from threads") {
  PieceAssembly a;
  const std::string bytes = Pattern(1 << 20);
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<std::optional<std::string>>> results(8, absl::UnknownError(""));
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { results[i] = Send(a, bytes, i * (1 << 17), 1 << 17); });
  }
  for (std::thread& t : threads) t.join();
  int wholes = 0;
  for (const auto& r : results) {
    REQUIRE_OK(r.status());
    if (r->has_value()) {
      ++wholes;
      CHECK(**r == bytes);
    }
  }
  CHECK(wholes == 1);
}

TEST_CASE("piece assembly: what it refuses") {
  PieceAssembly a;
  const std::string bytes = Pattern(1000);
  SECTION("a part past the piece's end, or empty") {
    CHECK(Send(a, bytes, 900, 200).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Send(a, bytes, 1001, 1).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(a.Begin(WholeOf(bytes), 0, 0, 1 << 20).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("a part overlapping another, or one under way") {
    REQUIRE_OK(Send(a, bytes, 0, 500).status());
    CHECK(Send(a, bytes, 499, 100).status().code() == absl::StatusCode::kInvalidArgument);
    auto under_way = a.Begin(WholeOf(bytes), 500, 500, 1 << 20);
    REQUIRE_OK(under_way.status());
    CHECK(a.Begin(WholeOf(bytes), 500, 500, 1 << 20).status().code() ==
          absl::StatusCode::kInvalidArgument);
    std::memcpy(under_way->data, bytes.data() + 500, 500);
    auto last = a.End(*under_way, true);
    REQUIRE_OK(last.status());
    CHECK(last->has_value());  // (the refused parts changed nothing)
  }
  SECTION("a piece whose bytes do not match its checksum: dropped") {
    std::string damaged = bytes;
    auto part = a.Begin(WholeOf(bytes), 0, 1000, 1 << 20);
    REQUIRE_OK(part.status());
    damaged[10] ^= 1;
    std::memcpy(part->data, damaged.data(), 1000);
    CHECK(a.End(*part, true).status().code() == absl::StatusCode::kDataLoss);
    CHECK(a.pieces() == 0);
  }
  SECTION("a new piece past the bytes left for pieces being assembled") {
    CHECK(a.Begin(WholeOf(bytes), 0, 100, 999).status().code() ==
          absl::StatusCode::kResourceExhausted);
    REQUIRE_OK(a.Begin(WholeOf(bytes), 0, 100, 1000).status());
    const std::string other = Pattern(10);
    CHECK(a.Begin(WholeOf(other), 0, 10, 1005).status().code() ==
          absl::StatusCode::kResourceExhausted);
  }
}

TEST_CASE("piece assembly: a part of a piece kept already is answered without a buffer; each "
          "peer's pieces are its own") {
  PieceAssembly a;
  const std::string bytes = Pattern(1000);
  REQUIRE_OK(Send(a, bytes, 0, 500).status());
  // Another peer's parts of a piece of the same name and bytes do not mix.
  auto theirs = a.Begin(WholeOf(bytes, "node-c"), 0, 500, 1 << 20);
  REQUIRE_OK(theirs.status());
  CHECK(a.pieces() == 2);
  CHECK(a.End(*theirs, false).ok());
  auto whole = Send(a, bytes, 500, 500);
  REQUIRE_OK(whole.status());
  REQUIRE(whole->has_value());
  auto part = a.Begin(WholeOf(bytes), 500, 500, 1 << 20);
  REQUIRE_OK(part.status());
  CHECK(part->data != nullptr);  // (not kept yet: End handed it over, nothing said it was kept)
  CHECK(a.End(*part, false).ok());
  a.Kept(std::make_tuple(WholeOf(bytes).key, bytes.size(), WholeOf(bytes).xxh3,
                         std::string("node-a")));
  a.DropIdle();
  // A part of the push tried again arrives after the piece was kept.
  auto late = a.Begin(WholeOf(bytes), 0, 500, 1 << 20);
  REQUIRE_OK(late.status());
  CHECK(late->data == nullptr);
  auto ended = a.End(*late, true);
  REQUIRE_OK(ended.status());
  CHECK_FALSE(ended->has_value());
  CHECK(a.bytes() == 1000);  // (node-c's piece, waiting for its parts)
  // Forgotten (the store dropped it): its parts make it again.
  a.Forget(std::make_tuple(WholeOf(bytes).key, bytes.size(), WholeOf(bytes).xxh3,
                           std::string("node-a")));
  auto again = a.Begin(WholeOf(bytes), 0, 500, 1 << 20);
  REQUIRE_OK(again.status());
  CHECK(again->data != nullptr);
}

TEST_CASE("piece assembly: a part that failed is sent again; a piece left idle is dropped") {
  PieceAssembly a(absl::Milliseconds(50));
  const std::string bytes = Pattern(1000);
  auto part = a.Begin(WholeOf(bytes), 0, 600, 1 << 20);
  REQUIRE_OK(part.status());
  auto taken_back = a.End(*part, false);  // its push broke off
  REQUIRE_OK(taken_back.status());
  CHECK_FALSE(taken_back->has_value());
  REQUIRE_OK(Send(a, bytes, 0, 600).status());  // (no overlap with the part taken back)
  // The step pushed again after another part failed: the part that had
  // arrived comes again, and counts once.
  REQUIRE_OK(Send(a, bytes, 0, 600).status());
  CHECK(a.pieces() == 1);
  CHECK(a.bytes() == 1000);
  absl::SleepFor(absl::Milliseconds(100));
  a.DropIdle();  // (as at a peer's Hello)
  CHECK(a.pieces() == 0);
  CHECK(a.bytes() == 0);
  // Its last part, too late, begins a piece of its own that is never whole.
  auto late = Send(a, bytes, 600, 400);
  REQUIRE_OK(late.status());
  CHECK_FALSE(late->has_value());
}

TEST_CASE("piece assembly: a new piece takes its room in the replica store; one whose room a "
          "registration took back goes") {
  ReplicaStore store(1500);  // (outlives the pieces' room)
  PieceAssembly a;
  const std::string bytes = Pattern(1000);
  const PieceAssembly::Whole whole = WholeOf(bytes);
  const PieceAssembly::Reserve reserve = [&] { return store.Reserve(whole.key, whole.nbytes); };
  SECTION("counted from its first part until it is kept") {
    REQUIRE_OK(Send(a, bytes, 0, 500, reserve).status());
    CHECK(store.bytes_held() == 1000);
    CHECK(store.held().incoming_bytes == 1000);
    REQUIRE_OK(Send(a, bytes, 500, 100, reserve).status());  // (not counted twice)
    CHECK(store.bytes_held() == 1000);
    // No room beside it for another piece of 1000 bytes: refused before
    // any buffer is made.
    const PieceAssembly::Whole other = WholeOf(bytes, "node-a", 6);
    auto refused = a.Begin(other, 0, 10, uint64_t{1} << 30,
                           [&] { return store.Reserve(other.key, other.nbytes); });
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(a.pieces() == 1);
    auto part = a.Begin(whole, 600, 400, uint64_t{1} << 30, reserve);
    REQUIRE_OK(part.status());
    std::memcpy(part->data, bytes.data() + 600, 400);
    auto done = a.End(*part, true);
    REQUIRE_OK(done.status());
    REQUIRE(done->has_value());
    CHECK(store.held().incoming_bytes == 1000);  // (until the store keeps it)
    Replica kept;
    kept.info.key = whole.key;
    kept.info.xxh3 = whole.xxh3;
    kept.bytes = std::move((*done)->bytes);
    REQUIRE_OK(store.Put(std::move(kept), -1, (*done)->room.get()));
    done->reset();
    CHECK(store.bytes_held() == 1000);
    CHECK(store.held().incoming_bytes == 0);
  }
  SECTION("its first parts side by side take its room once") {
    std::vector<std::thread> threads;
    std::vector<absl::StatusOr<std::optional<std::string>>> results(8, absl::UnknownError(""));
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] { results[i] = Send(a, bytes, i * 125, 125, reserve); });
    }
    for (std::thread& t : threads) t.join();
    int wholes = 0;
    for (const auto& r : results) {
      REQUIRE_OK(r.status());
      wholes += r->has_value() ? 1 : 0;
    }
    CHECK(wholes == 1);
    CHECK(store.held().incoming_bytes == 0);  // (handed over, then let go of: not kept here)
  }
  SECTION("taken back while a part is under way: that part fails, and the piece goes") {
    auto part = a.Begin(whole, 0, 500, uint64_t{1} << 30, reserve);
    REQUIRE_OK(part.status());
    REQUIRE(part->room != nullptr);
    CHECK(store.ShrinkTo(0) == 1000);
    CHECK(store.bytes_held() == 0);
    CHECK(part->room->revoked());
    std::memcpy(part->data, bytes.data(), 500);
    CHECK(a.End(*part, true).status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(a.pieces() == 0);
    CHECK(a.bytes() == 0);
  }
  SECTION("taken back between its parts: refused at its next part, dropped at a Hello") {
    REQUIRE_OK(Send(a, bytes, 0, 500, reserve).status());
    CHECK(store.ShrinkTo(0) == 1000);
    CHECK(a.pieces() == 1);
    a.DropIdle();  // (as at a peer's Hello)
    CHECK(a.pieces() == 0);
    CHECK(a.bytes() == 0);
    CHECK(store.bytes_held() == 0);
  }
}

}  // namespace
}  // namespace zcc::daemon::peer
