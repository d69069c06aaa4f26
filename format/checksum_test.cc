#include "format/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <utility>

namespace zcc::format {
namespace {

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_CASE("Xxh3 is libxxhash's XXH3-64 and sees single bit flips") {
  // The spec's hash of nothing; and on x86-64 the run-time dispatched entry
  // points Xxh3 uses hash as the baseline ones do, at every length class.
  CHECK(Xxh3(nullptr, 0) == 0x2D06800538D394C2ULL);
  const std::string input = "zcc checkpoint tensor bytes";
  CHECK(Xxh3(input.data(), input.size()) == XXH3_64bits(input.data(), input.size()));
  CHECK(Xxh3(nullptr, 0) == XXH3_64bits(nullptr, 0));

  std::mt19937_64 rng(7);
  for (size_t n : {size_t{1}, size_t{16}, size_t{128}, size_t{240}, size_t{241}, size_t{1024},
                   size_t{4099}}) {
    const std::string small = RandomBytes(rng, n);
    CHECK(Xxh3(small.data(), n) == XXH3_64bits(small.data(), n));
  }
  const std::string big = RandomBytes(rng, 1 << 20);
  const uint64_t h = Xxh3(big.data(), big.size());
  CHECK(h == XXH3_64bits(big.data(), big.size()));
  for (size_t pos : {size_t{0}, big.size() / 2, big.size() - 1}) {
    std::string flipped = big;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0x10);
    CHECK(Xxh3(flipped.data(), flipped.size()) != h);
  }
}

TEST_CASE("streaming in any chunking equals one-shot") {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 50; ++round) {
    const std::string data = RandomBytes(rng, rng() % 20000);
    Xxh3Stream stream;
    size_t pos = 0;
    while (pos < data.size()) {
      // Mix tiny, empty and large chunks to cross XXH3's internal buffer edges.
      const size_t max_chunk = (rng() % 3 == 0) ? 7 : 5000;
      const size_t n = std::min(data.size() - pos, static_cast<size_t>(rng() % (max_chunk + 1)));
      stream.Update(data.data() + pos, n);
      pos += n;
    }
    INFO("round " << round << ", " << data.size() << " bytes");
    CHECK(stream.Digest() == Xxh3(data.data(), data.size()));
  }
}

TEST_CASE("an empty stream digests like empty input; Digest does not end the stream") {
  Xxh3Stream stream;
  CHECK(stream.Digest() == Xxh3(nullptr, 0));
  stream.Update("ab", 2);
  CHECK(stream.Digest() == Xxh3("ab", 2));
  stream.Update("cd", 2);
  CHECK(stream.Digest() == Xxh3("abcd", 4));
}

TEST_CASE("streams move with their state") {
  Xxh3Stream a;
  a.Update("hello ", 6);
  Xxh3Stream b = std::move(a);
  b.Update("world", 5);
  CHECK(b.Digest() == Xxh3("hello world", 11));
  Xxh3Stream c;
  c = std::move(b);
  CHECK(c.Digest() == Xxh3("hello world", 11));
  // A moved-from stream starts over rather than crashing.
  CHECK(a.Digest() == Xxh3(nullptr, 0));  // NOLINT(bugprone-use-after-move)
  a.Update("x", 1);
  CHECK(a.Digest() == Xxh3("x", 1));
}

}  // namespace
}  // namespace zcc::format
