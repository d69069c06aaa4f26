#include "checkpoint/export_layout.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"

namespace zcc::checkpoint {
namespace {

TEST_CASE("an export layout names the tensors to transpose; anything else is refused") {
  auto layout = ParseExportLayout(R"({"transpose": ["a.weight", "b.weight", "a.weight"]})", "f");
  REQUIRE_OK(layout);
  CHECK(layout->transpose == std::set<std::string>{"a.weight", "b.weight"});
  REQUIRE_OK(ParseExportLayout("{}", "f"));
  CHECK(ParseExportLayout("{}", "f")->transpose.empty());
  for (const char* bad : {"", "[]", "not json", R"({"transpose": "a"})",
                          R"({"transpose": [1]})", R"({"transpose": [""]})",
                          R"({"transpose": [], "rename": {}})"}) {
    INFO(bad);
    auto st = ParseExportLayout(bad, "job/metadata/zcc_export.json");
    CHECK(st.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(st.status().message(), "job/metadata/zcc_export.json"));
  }
}

TEST_CASE("TransposeRange gives any run of the transpose, for every element size") {
  constexpr uint64_t kRows = 3, kCols = 5;
  for (size_t size : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
    INFO(size);
    // Element (r, c) holds the value r * kCols + c in its first byte.
    std::vector<uint8_t> src(kRows * kCols * size, 0);
    for (uint64_t i = 0; i < kRows * kCols; ++i) src[i * size] = static_cast<uint8_t>(i + 1);
    std::vector<uint8_t> want(src.size());
    for (uint64_t r = 0; r < kCols; ++r) {
      for (uint64_t c = 0; c < kRows; ++c) {
        std::memcpy(&want[(r * kRows + c) * size], &src[(c * kCols + r) * size], size);
      }
    }
    // Whole, and in runs that start and end mid-row.
    for (uint64_t step : {uint64_t{15}, uint64_t{4}, uint64_t{1}}) {
      std::vector<uint8_t> got(src.size(), 0xee);
      for (uint64_t first = 0; first < kRows * kCols; first += step) {
        const uint64_t n = std::min(step, kRows * kCols - first);
        TransposeRange(src.data(), kRows, kCols, size, first, n, &got[first * size]);
      }
      CHECK(got == want);
    }
  }
}

TEST_CASE("TransposeRange over tiles, partial rows and odd shapes equals the definition") {
  for (auto [rows, cols] : {std::pair<uint64_t, uint64_t>{37, 53}, {16, 16}, {1, 40}, {40, 1},
                            {33, 17}}) {
    INFO(rows << " x " << cols);
    std::vector<uint16_t> src(rows * cols);
    for (uint64_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7 + 1);
    std::vector<uint16_t> want(src.size());
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) want[c * rows + r] = src[r * cols + c];
    }
    for (uint64_t step : {rows * cols, uint64_t{100}, uint64_t{7}, rows + 1}) {
      std::vector<uint16_t> got(src.size(), 0xeeee);
      for (uint64_t first = 0; first < src.size(); first += step) {
        const uint64_t n = std::min(step, src.size() - first);
        TransposeRange(reinterpret_cast<const uint8_t*>(src.data()), rows, cols, 2, first, n,
                       reinterpret_cast<uint8_t*>(&got[first]));
      }
      CHECK(got == want);
    }
  }
}

}  // namespace
}  // namespace zcc::checkpoint
