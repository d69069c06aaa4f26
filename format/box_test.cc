#include "format/box.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/status_matchers.h"

namespace Catch {
template <>
struct StringMaker<zcc::format::Box> {
  static std::string convert(const zcc::format::Box& box) { return zcc::format::BoxToString(box); }
};
}  // namespace Catch

namespace zcc::format {
namespace {

using Shape = std::vector<int64_t>;

Box MakeBox(Shape offset, Shape shape) { return Box{std::move(offset), std::move(shape)}; }

std::string Message(const absl::Status& status) { return std::string(status.message()); }

int64_t Uniform(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

Shape RandomGlobalShape(std::mt19937& rng, size_t dims) {
  Shape global(dims);
  // One dim in ~12 is 0, so that whole tensors are sometimes empty.
  for (int64_t& d : global) d = Uniform(rng, 0, 11) == 0 ? 0 : Uniform(rng, 1, 7);
  return global;
}

// A random tiling of `global`: the whole box, split `splits` times, each time a
// random piece along a random dim at a random point (0 and the full length
// included, which leave an empty piece), then shuffled.
std::vector<Box> RandomTiling(std::mt19937& rng, const Shape& global, int splits) {
  std::vector<Box> pieces = {WholeBox(global)};
  if (global.empty()) return pieces;
  for (int s = 0; s < splits; ++s) {
    const size_t p = static_cast<size_t>(Uniform(rng, 0, pieces.size() - 1));
    const size_t d = static_cast<size_t>(Uniform(rng, 0, global.size() - 1));
    Box lower = pieces[p];
    Box upper = pieces[p];
    const int64_t cut = Uniform(rng, 0, lower.shape[d]);
    lower.shape[d] = cut;
    upper.offset[d] += cut;
    upper.shape[d] -= cut;
    pieces[p] = lower;
    pieces.push_back(upper);
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  return pieces;
}

bool HoldsElements(const Box& box) { return Volume(box) > 0; }

// Calls f(coordinates) for every element of `box` in row-major order; one
// element at a time, independently of CopyBoxRegion.
template <typename F>
void ForEachElement(const Box& box, F f) {
  if (!HoldsElements(box)) return;
  Shape coord = box.offset;
  for (;;) {
    f(coord);
    size_t d = coord.size();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++coord[d] < box.offset[d] + box.shape[d]) break;
      coord[d] = box.offset[d];
    }
  }
}

// Row-major position of `coord` inside `box`.
size_t IndexIn(const Box& box, const Shape& coord) {
  size_t index = 0;
  for (size_t d = 0; d < coord.size(); ++d) {
    index =
        index * static_cast<size_t>(box.shape[d]) + static_cast<size_t>(coord[d] - box.offset[d]);
  }
  return index;
}

// The bytes of `piece` taken from `global_data`, element by element.
std::vector<uint8_t> NaiveCut(const std::vector<uint8_t>& global_data, const Shape& global,
                              const Box& piece, size_t elem_size) {
  const Box whole = WholeBox(global);
  std::vector<uint8_t> out(Volume(piece) * elem_size);
  ForEachElement(piece, [&](const Shape& coord) {
    std::memcpy(&out[IndexIn(piece, coord) * elem_size],
                &global_data[IndexIn(whole, coord) * elem_size], elem_size);
  });
  return out;
}

// Whether `status` names box `index` as `box` in an overlap ("boxes I B and J B").
bool NamesOverlapping(const absl::Status& status, size_t index, const Box& box) {
  const std::string named = absl::StrCat(index, " ", BoxToString(box));
  const std::string message = Message(status);
  return message.find("overlap") != std::string::npos &&
         (message.find("boxes " + named) != std::string::npos ||
          message.find("and " + named) != std::string::npos);
}

TEST_CASE("boxes print as start:end ranges, compare and cover whole tensors") {
  CHECK(BoxToString(MakeBox({0, 8}, {4, 8})) == "[0:4, 8:16]");
  CHECK(BoxToString(Box{}) == "[]");
  // Invalid boxes print too: missing lengths, overflowing ends.
  CHECK(BoxToString(MakeBox({1, 2}, {3})) == "[1:4, 2:?]");
  CHECK(BoxToString(MakeBox({INT64_MAX}, {1})) == "[9223372036854775807:+1]");

  CHECK(MakeBox({1}, {2}) == MakeBox({1}, {2}));
  CHECK(MakeBox({1}, {2}) != MakeBox({1}, {3}));
  CHECK(MakeBox({1}, {2}) != MakeBox({0}, {2}));

  CHECK(WholeBox({3, 4}) == MakeBox({0, 0}, {3, 4}));
  CHECK(WholeBox({}) == Box{});
  CHECK(IsWhole(MakeBox({0, 0}, {3, 4}), {3, 4}));
  CHECK(IsWhole(Box{}, {}));
  CHECK(IsWhole(MakeBox({0}, {0}), {0}));
  CHECK_FALSE(IsWhole(MakeBox({0, 0}, {3, 3}), {3, 4}));
  CHECK_FALSE(IsWhole(MakeBox({0, 1}, {3, 3}), {3, 4}));
  CHECK_FALSE(IsWhole(MakeBox({0}, {3}), {3, 4}));
  CHECK_FALSE(IsWhole(MakeBox({0, 0}, {3}), {3}));
}

TEST_CASE("ValidateBox accepts boxes inside the global shape") {
  CHECK_OK(ValidateBox(MakeBox({0, 0}, {8, 6}), {8, 6}));
  CHECK_OK(ValidateBox(MakeBox({2, 3}, {4, 3}), {8, 6}));
  // Empty boxes may start anywhere up to the end of the dimension.
  CHECK_OK(ValidateBox(MakeBox({8, 0}, {0, 6}), {8, 6}));
  CHECK_OK(ValidateBox(MakeBox({5, 6}, {0, 0}), {8, 6}));
  CHECK_OK(ValidateBox(MakeBox({0, 0}, {0, 6}), {0, 6}));
  // A scalar's box has no dimensions.
  CHECK_OK(ValidateBox(Box{}, {}));
  // The largest dimensions, without overflow.
  CHECK_OK(ValidateBox(MakeBox({0}, {INT64_MAX}), {INT64_MAX}));
  CHECK_OK(ValidateBox(MakeBox({INT64_MAX - 1}, {1}), {INT64_MAX}));
  CHECK_OK(ValidateBox(MakeBox({INT64_MAX}, {0}), {INT64_MAX}));
  CHECK(Volume(MakeBox({2, 3}, {4, 3})) == 12);
  CHECK(Volume(Box{}) == 1);
  CHECK(Volume(MakeBox({8, 0}, {0, 6})) == 0);
  CHECK(Volume(MakeBox({0, 0, 0}, {INT64_MAX, INT64_MAX, 0})) == 0);
}

TEST_CASE("ValidateBox refuses boxes that do not fit the global shape") {
  const auto refused = [](const Box& box, const Shape& global, const char* why) {
    INFO(BoxToString(box) << " of " << global.size() << " dims, expecting: " << why);
    const absl::Status status = ValidateBox(box, global);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(status), Catch::Contains(why));
  };
  refused(MakeBox({0}, {8}), {8, 6}, "1 dimensions but the global shape has 2");
  refused(MakeBox({0, 0, 0}, {8, 6, 1}), {8, 6}, "3 dimensions but the global shape has 2");
  refused(MakeBox({0}, {1}), {}, "1 dimensions but the global shape has 0");
  refused(Box{}, {1}, "0 dimensions but the global shape has 1");
  refused(MakeBox({0, 0}, {8}), {8, 6}, "offset has 2 dimensions but its shape has 1");
  refused(MakeBox({0, -1}, {8, 6}), {8, 6}, "offset -1 of dimension 1 is negative");
  refused(MakeBox({0, 0}, {-1, 6}), {8, 6}, "length -1 of dimension 0 is negative");
  refused(MakeBox({5, 0}, {4, 6}), {8, 6}, "dimension 0 ends past the global dimension 8");
  refused(MakeBox({0, 0}, {8, 7}), {8, 6}, "dimension 1 ends past the global dimension 6");
  refused(MakeBox({9, 0}, {0, 6}), {8, 6}, "dimension 0 ends past");
  refused(MakeBox({0, 0}, {0, 0}), {-1, 6}, "dimension 0 of the global shape [-1, 6] is negative");
  // offset + length overflows int64: refused, not wrapped around.
  refused(MakeBox({INT64_MAX}, {1}), {INT64_MAX}, "ends past");
  refused(MakeBox({1}, {INT64_MAX}), {INT64_MAX}, "ends past");
  refused(MakeBox({INT64_MAX}, {INT64_MAX}), {INT64_MAX}, "ends past");
  refused(MakeBox({INT64_MAX}, {INT64_MAX}), {1}, "ends past");
  refused(MakeBox({2}, {INT64_MAX - 1}), {INT64_MAX}, "ends past");
  refused(MakeBox({INT64_MIN}, {INT64_MAX}), {INT64_MAX}, "is negative");
  refused(MakeBox({0}, {INT64_MIN}), {INT64_MAX}, "is negative");
}

TEST_CASE("Intersect returns the shared elements or nothing") {
  CHECK(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({2, 1}, {4, 2})) == MakeBox({2, 1}, {2, 2}));
  CHECK(Intersect(MakeBox({2, 1}, {4, 2}), MakeBox({0, 0}, {4, 4})) == MakeBox({2, 1}, {2, 2}));
  // Containment.
  CHECK(Intersect(MakeBox({0, 0}, {8, 8}), MakeBox({3, 2}, {1, 5})) == MakeBox({3, 2}, {1, 5}));
  CHECK(Intersect(MakeBox({1, 1}, {2, 2}), MakeBox({1, 1}, {2, 2})) == MakeBox({1, 1}, {2, 2}));
  // Touching boxes share no element; neither do boxes apart in one dim only.
  CHECK_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({4, 0}, {4, 4})).has_value());
  CHECK_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({0, 4}, {4, 4})).has_value());
  CHECK_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({1, 6}, {2, 1})).has_value());
  // A zero-length dim holds nothing, even inside the other box.
  CHECK_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({2, 2}, {0, 1})).has_value());
  CHECK_FALSE(Intersect(MakeBox({2, 2}, {1, 0}), MakeBox({0, 0}, {4, 4})).has_value());
  CHECK_FALSE(Intersect(MakeBox({0, 0}, {0, 4}), MakeBox({0, 0}, {0, 4})).has_value());
  // Scalars: both boxes hold the one element.
  CHECK(Intersect(Box{}, Box{}) == Box{});
  // 3-D, overlapping by one element.
  CHECK(Intersect(MakeBox({0, 0, 0}, {2, 2, 2}), MakeBox({1, 1, 1}, {2, 2, 2})) ==
        MakeBox({1, 1, 1}, {1, 1, 1}));
}

TEST_CASE("CheckTiling accepts the usual splits") {
  const Shape global = {8, 6};
  SECTION("tensor parallel rows") {
    CHECK_OK(CheckTiling({MakeBox({0, 0}, {4, 6}), MakeBox({4, 0}, {4, 6})}, global));
  }
  SECTION("tensor parallel columns") {
    CHECK_OK(CheckTiling(
        {MakeBox({0, 4}, {8, 2}), MakeBox({0, 0}, {8, 2}), MakeBox({0, 2}, {8, 2})}, global));
  }
  SECTION("a grid of blocks") {
    std::vector<Box> boxes;
    for (int64_t r = 0; r < 8; r += 2) {
      for (int64_t c = 0; c < 6; c += 3) boxes.push_back(MakeBox({r, c}, {2, 3}));
    }
    CHECK_OK(CheckTiling(boxes, global));
  }
  SECTION("FSDP: an uneven last shard and an empty shard past the end") {
    // 10 rows over 5 ranks in chunks of 3: 3, 3, 3, 1, 0.
    CHECK_OK(CheckTiling({MakeBox({0, 0}, {3, 4}), MakeBox({3, 0}, {3, 4}), MakeBox({6, 0}, {3, 4}),
                          MakeBox({9, 0}, {1, 4}), MakeBox({10, 0}, {0, 4})},
                         {10, 4}));
  }
  SECTION("the whole tensor") { CHECK_OK(CheckTiling({WholeBox(global)}, global)); }
  SECTION("empty boxes anywhere, even twice in the same place") {
    CHECK_OK(CheckTiling({MakeBox({3, 3}, {0, 2}), WholeBox(global), MakeBox({3, 3}, {0, 2}),
                          MakeBox({8, 6}, {0, 0})},
                         global));
  }
  SECTION("a global dimension of 0") {
    CHECK_OK(CheckTiling({WholeBox({0, 6})}, {0, 6}));
    CHECK_OK(CheckTiling({WholeBox({0, 6}), MakeBox({0, 2}, {0, 4}), WholeBox({0, 6})}, {0, 6}));
  }
  SECTION("a scalar with its one box") { CHECK_OK(CheckTiling({Box{}}, {})); }
  SECTION("the largest global shapes that fit") {
    CHECK_OK(CheckTiling({WholeBox({INT64_MAX, 2})}, {INT64_MAX, 2}));
    CHECK_OK(
        CheckTiling({MakeBox({0}, {INT64_MAX - 1}), MakeBox({INT64_MAX - 1}, {1})}, {INT64_MAX}));
  }
}

TEST_CASE("CheckTiling names what is wrong") {
  const Shape global = {8, 6};
  SECTION("no boxes") {
    REQUIRE_STATUS_CODE(CheckTiling({}, global), absl::StatusCode::kInvalidArgument);
  }
  SECTION("an invalid box, by index") {
    const absl::Status status =
        CheckTiling({MakeBox({0, 0}, {4, 6}), MakeBox({4, 0}, {5, 6})}, global);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(status), Catch::StartsWith("box 1: box [4:9, 0:6] of global shape [8, 6]"));
  }
  SECTION("a negative global dimension") {
    REQUIRE_STATUS_CODE(CheckTiling({MakeBox({0}, {0})}, {-2}), absl::StatusCode::kInvalidArgument);
  }
  SECTION("a global shape of 2^64 elements or more") {
    const Shape huge = {int64_t{1} << 32, int64_t{1} << 32};
    const absl::Status status = CheckTiling({WholeBox(huge)}, huge);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(status), Catch::Contains("2^64"));
    REQUIRE_STATUS_CODE(CheckTiling({WholeBox({INT64_MAX, 3})}, {INT64_MAX, 3}),
                        absl::StatusCode::kInvalidArgument);
  }
  SECTION("overlapping rows") {
    const absl::Status status =
        CheckTiling({MakeBox({4, 0}, {4, 6}), MakeBox({0, 0}, {5, 6})}, global);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
    CHECK(Message(status) ==
          "boxes 0 [4:8, 0:6] and 1 [0:5, 0:6] of global shape [8, 6] overlap in "
          "[4:5, 0:6] (6 elements)");
  }
  SECTION("a gap between column shards") {
    const absl::Status status =
        CheckTiling({MakeBox({0, 0}, {8, 2}), MakeBox({0, 3}, {8, 3})}, global);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
    CHECK(Message(status) ==
          "2 boxes hold 40 of the 48 elements of global shape [8, 6]: 8 elements are not "
          "covered, the first at [0, 2]");
  }
  SECTION("a missing FSDP shard") {
    const absl::Status status = CheckTiling(
        {MakeBox({0, 0}, {3, 4}), MakeBox({6, 0}, {3, 4}), MakeBox({9, 0}, {1, 4})}, {10, 4});
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(Message(status),
               Catch::EndsWith("12 elements are not covered, the first at [3, 0]"));
  }
  SECTION("a scalar with two boxes") {
    const absl::Status status = CheckTiling({Box{}, Box{}}, {});
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(Message(status),
               Catch::StartsWith("boxes 0 [] and 1 [] of global shape [] overlap"));
  }
  SECTION("a scalar with a box of one dimension") {
    REQUIRE_STATUS_CODE(CheckTiling({MakeBox({0}, {1})}, {}), absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("CheckTiling accepts random tilings and refuses each kind of damage to them") {
  std::mt19937 rng(20240607);
  int damaged = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const Shape global = RandomGlobalShape(rng, static_cast<size_t>(Uniform(rng, 2, 4)));
    const std::vector<Box> tiling =
        RandomTiling(rng, global, static_cast<int>(Uniform(rng, 0, 24)));
    INFO("trial " << trial << ": " << tiling.size() << " pieces of "
                  << BoxToString(WholeBox(global)));
    REQUIRE_OK(CheckTiling(tiling, global));

    // An empty box anywhere valid changes nothing.
    {
      Box empty = WholeBox(global);
      const size_t d = static_cast<size_t>(Uniform(rng, 0, global.size() - 1));
      empty.offset[d] = Uniform(rng, 0, global[d]);
      empty.shape[d] = 0;
      std::vector<Box> boxes = tiling;
      boxes.insert(boxes.begin() + Uniform(rng, 0, boxes.size()), empty);
      CHECK_OK(CheckTiling(boxes, global));
    }

    std::vector<size_t> nonempty, empty;
    for (size_t i = 0; i < tiling.size(); ++i) {
      (HoldsElements(tiling[i]) ? nonempty : empty).push_back(i);
    }
    if (!empty.empty() && tiling.size() > 1) {  // dropping an empty piece changes nothing
      std::vector<Box> boxes = tiling;
      boxes.erase(boxes.begin() + empty[Uniform(rng, 0, empty.size() - 1)]);
      CHECK_OK(CheckTiling(boxes, global));
    }
    if (nonempty.empty()) continue;  // an empty global tensor: nothing to damage
    ++damaged;
    const size_t k = nonempty[Uniform(rng, 0, nonempty.size() - 1)];
    const Box& piece = tiling[k];
    INFO("damaging piece " << k << " " << BoxToString(piece));

    if (tiling.size() > 1) {  // drop it: exactly its elements are missing
      std::vector<Box> boxes = tiling;
      boxes.erase(boxes.begin() + k);
      const absl::Status status = CheckTiling(boxes, global);
      REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
      CHECK_THAT(Message(status), Catch::EndsWith(absl::StrCat(
                                      Volume(piece), " elements are not covered, the first at [",
                                      absl::StrJoin(piece.offset, ", "), "]")));
    }
    {  // duplicate it
      std::vector<Box> boxes = tiling;
      boxes.push_back(piece);
      const absl::Status status = CheckTiling(boxes, global);
      REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
      CHECK(NamesOverlapping(status, k, piece));
      CHECK(NamesOverlapping(status, tiling.size(), piece));
    }
    // Grow it by one, or shift it by one, within the tensor: it then overlaps
    // whichever pieces held the newly taken elements.
    std::vector<size_t> can_move;
    for (size_t d = 0; d < global.size(); ++d) {
      if (piece.shape[d] < global[d]) can_move.push_back(d);
    }
    if (!can_move.empty()) {
      const size_t d = can_move[Uniform(rng, 0, can_move.size() - 1)];
      const bool at_start = piece.offset[d] == 0;
      const bool at_end = piece.offset[d] + piece.shape[d] == global[d];
      const bool forward = at_start || (!at_end && Uniform(rng, 0, 1) == 0);
      Box grown = piece;
      Box shifted = piece;
      grown.shape[d] += 1;
      shifted.offset[d] += forward ? 1 : -1;
      if (!forward) grown.offset[d] -= 1;
      for (const Box& changed : {grown, shifted}) {
        INFO("changed to " << BoxToString(changed));
        std::vector<Box> boxes = tiling;
        boxes[k] = changed;
        const absl::Status status = CheckTiling(boxes, global);
        REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
        CHECK(NamesOverlapping(status, k, changed));
      }
    }
    {  // shift it past the end: invalid
      const size_t d = static_cast<size_t>(Uniform(rng, 0, global.size() - 1));
      std::vector<Box> boxes = tiling;
      boxes[k].offset[d] = global[d] - piece.shape[d] + 1;
      const absl::Status status = CheckTiling(boxes, global);
      REQUIRE_STATUS_CODE(status, absl::StatusCode::kInvalidArgument);
      CHECK_THAT(Message(status), Catch::StartsWith(absl::StrCat("box ", k, ": ")));
    }
  }
  CHECK(damaged > 400);  // the generator rarely makes empty global tensors
}

TEST_CASE("CheckTiling is fast for many shards") {
  SECTION("4096 dim-0 shards, uneven last and an empty one") {
    // 12283 rows in chunks of 3: shard 4094 holds 1 row, shard 4095 none.
    const Shape global = {4096 * 3 - 5, 1024};
    std::vector<Box> shards;
    for (int64_t i = 0; i < 4096; ++i) {
      const int64_t start = std::min(3 * i, global[0]);
      const int64_t end = std::min(3 * i + 3, global[0]);
      shards.push_back(MakeBox({start, 0}, {end - start, global[1]}));
    }
    std::mt19937 rng(1);
    std::shuffle(shards.begin(), shards.end(), rng);
    CHECK_OK(CheckTiling(shards, global));
    // The same with one shard dropped finds the gap as fast.
    const auto dropped = std::find(shards.begin(), shards.end(), MakeBox({3000, 0}, {3, 1024}));
    REQUIRE(dropped != shards.end());
    shards.erase(dropped);
    const absl::Status status = CheckTiling(shards, global);
    REQUIRE_STATUS_CODE(status, absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(Message(status), Catch::EndsWith("the first at [3000, 0]"));
  }
  SECTION("4096 column shards") {
    const Shape global = {1024, 4096};
    std::vector<Box> shards;
    for (int64_t i = 0; i < 4096; ++i) shards.push_back(MakeBox({0, i}, {1024, 1}));
    CHECK_OK(CheckTiling(shards, global));
  }
  SECTION("a 64 x 64 grid") {
    const Shape global = {64 * 5, 64 * 7};
    std::vector<Box> blocks;
    for (int64_t r = 0; r < 64; ++r) {
      for (int64_t c = 0; c < 64; ++c) blocks.push_back(MakeBox({r * 5, c * 7}, {5, 7}));
    }
    CHECK_OK(CheckTiling(blocks, global));
  }
}

TEST_CASE("CopyBoxRegion copies hand-picked regions") {
  // A 4 x 6 tensor of bytes 0..23.
  const Shape global = {4, 6};
  std::vector<uint8_t> whole(24);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<uint8_t>(i);
  const Box all = WholeBox(global);

  SECTION("whole to whole") {
    std::vector<uint8_t> out(24, 0xEE);
    CopyBoxRegion(whole.data(), all, out.data(), all, all, 1);
    CHECK(out == whole);
  }
  SECTION("a column shard out of the whole and back") {
    const Box columns = MakeBox({0, 2}, {4, 3});
    std::vector<uint8_t> shard(12, 0xEE);
    CopyBoxRegion(whole.data(), all, shard.data(), columns, columns, 1);
    CHECK(shard == std::vector<uint8_t>{2, 3, 4, 8, 9, 10, 14, 15, 16, 20, 21, 22});
    std::vector<uint8_t> out(24, 0xEE);
    CopyBoxRegion(shard.data(), columns, out.data(), all, columns, 1);
    for (size_t i = 0; i < 24; ++i) {
      const size_t col = i % 6;
      CHECK(out[i] == (col >= 2 && col < 5 ? whole[i] : 0xEE));
    }
  }
  SECTION("between a row shard and a column shard") {
    const Box rows = MakeBox({1, 0}, {2, 6});     // elements 6..17
    const Box columns = MakeBox({0, 4}, {4, 2});  // columns 4 and 5
    std::vector<uint8_t> row_data(whole.begin() + 6, whole.begin() + 18);
    std::vector<uint8_t> column_data(8, 0xEE);
    CopyBoxRegion(row_data.data(), rows, column_data.data(), columns, *Intersect(rows, columns), 1);
    CHECK(column_data == std::vector<uint8_t>{0xEE, 0xEE, 10, 11, 16, 17, 0xEE, 0xEE});
  }
  SECTION("an empty region writes nothing") {
    std::vector<uint8_t> out(24, 0xEE);
    CopyBoxRegion(whole.data(), all, out.data(), all, MakeBox({2, 3}, {0, 2}), 1);
    CHECK(out == std::vector<uint8_t>(24, 0xEE));
  }
  SECTION("a scalar") {
    const uint64_t value = 0x0123456789abcdef;
    uint64_t out = 0;
    CopyBoxRegion(reinterpret_cast<const uint8_t*>(&value), Box{}, reinterpret_cast<uint8_t*>(&out),
                  Box{}, Box{}, sizeof(value));
    CHECK(out == value);
  }
}

TEST_CASE("CopyBoxRegion reassembles any tiling from any other") {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t elem_size = size_t{1} << Uniform(rng, 0, 3);  // 1, 2, 4, 8
    const Shape global = RandomGlobalShape(rng, static_cast<size_t>(Uniform(rng, 0, 4)));
    const std::vector<Box> src_tiling =
        RandomTiling(rng, global, static_cast<int>(Uniform(rng, 0, 12)));
    const std::vector<Box> dst_tiling =
        RandomTiling(rng, global, static_cast<int>(Uniform(rng, 0, 12)));
    INFO("trial " << trial << ": " << elem_size << "-byte elements of "
                  << BoxToString(WholeBox(global)) << ", " << src_tiling.size() << " -> "
                  << dst_tiling.size() << " pieces");
    const Box whole = WholeBox(global);

    // The reference: each element holds its index (little-endian, truncated
    // to the element size).
    const size_t count = Volume(whole);
    std::vector<uint8_t> reference(count * elem_size);
    for (size_t i = 0; i < count; ++i) {
      for (size_t b = 0; b < elem_size; ++b) {
        reference[i * elem_size + b] = static_cast<uint8_t>(i >> (8 * b));
      }
    }

    // Cut each source piece out of the reference.
    std::vector<std::vector<uint8_t>> src_data;
    for (const Box& piece : src_tiling) {
      std::vector<uint8_t> data(Volume(piece) * elem_size, 0xEE);
      CopyBoxRegion(reference.data(), whole, data.data(), piece, piece, elem_size);
      REQUIRE(data == NaiveCut(reference, global, piece, elem_size));
      src_data.push_back(std::move(data));
    }

    // Assemble each destination piece from the source pieces it intersects.
    std::vector<std::vector<uint8_t>> dst_data;
    for (const Box& piece : dst_tiling) {
      std::vector<uint8_t> data(Volume(piece) * elem_size, 0xEE);
      for (size_t s = 0; s < src_tiling.size(); ++s) {
        if (auto region = Intersect(src_tiling[s], piece)) {
          CopyBoxRegion(src_data[s].data(), src_tiling[s], data.data(), piece, *region, elem_size);
        }
      }
      dst_data.push_back(std::move(data));
    }

    // Put the destination pieces back together element by element: byte for
    // byte the reference.
    std::vector<uint8_t> reassembled(reference.size(), 0xEE);
    for (size_t p = 0; p < dst_tiling.size(); ++p) {
      const Box& piece = dst_tiling[p];
      ForEachElement(piece, [&](const Shape& coord) {
        std::memcpy(&reassembled[IndexIn(whole, coord) * elem_size],
                    &dst_data[p][IndexIn(piece, coord) * elem_size], elem_size);
      });
    }
    REQUIRE(reassembled == reference);
  }
}

}  // namespace
}  // namespace zcc::format
