#include "checkpoint/export_layout.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace zcc::checkpoint {

absl::StatusOr<ExportLayout> ParseExportLayout(absl::string_view json, absl::string_view what) {
  auto bad = [&what](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object()) return bad("not a JSON object");
  ExportLayout layout;
  for (const auto& [key, value] : doc.items()) {
    if (key != "transpose") {
      return bad(absl::StrCat("unknown key \"", key,
                              "\" (this zccctl understands \"transpose\" only)"));
    }
    if (!value.is_array()) return bad("\"transpose\" is not an array of tensor names");
    for (const nlohmann::json& name : value) {
      if (!name.is_string() || name.get_ref<const std::string&>().empty()) {
        return bad("\"transpose\" holds something other than a tensor name");
      }
      layout.transpose.insert(name.get<std::string>());
    }
  }
  return layout;
}

namespace {

template <size_t kSize>
void TransposeElements(const uint8_t* src, uint64_t rows, uint64_t cols, uint64_t first,
                       uint64_t count, uint8_t* dst) {
  // Output element e is row e / rows, column e % rows of the transpose:
  // input row e % rows, column e / rows.
  uint64_t out_row = first / rows;
  uint64_t out_col = first % rows;
  for (uint64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * kSize, src + (out_col * cols + out_row) * kSize, kSize);
    if (++out_col == rows) {
      out_col = 0;
      ++out_row;
    }
  }
}

}  // namespace

void TransposeRange(const uint8_t* src, uint64_t rows, uint64_t cols, size_t elem_size,
                    uint64_t first, uint64_t count, uint8_t* dst) {
  switch (elem_size) {
    case 1: TransposeElements<1>(src, rows, cols, first, count, dst); break;
    case 2: TransposeElements<2>(src, rows, cols, first, count, dst); break;
    case 4: TransposeElements<4>(src, rows, cols, first, count, dst); break;
    default: TransposeElements<8>(src, rows, cols, first, count, dst); break;
  }
}

}  // namespace zcc::checkpoint
