#include "format/strict_json.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zcc::format::internal {
namespace {

// Deepest array/object nesting of `text`, scanning strings so that brackets
// inside them do not count. Stops early once `limit` is exceeded. Only needs to
// be exact for well-formed JSON: anything else fails to parse afterwards.
int NestingDepthUpTo(absl::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return depth;
}

}  // namespace

std::string PrintableForError(absl::string_view text, size_t max_len) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max_len) out += "...";
  return out;
}

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what) {
  if (NestingDepthUpTo(text, max_depth) > max_depth) {
    return absl::DataLossError(
        absl::StrCat(what, " nests arrays/objects deeper than ", max_depth, " levels"));
  }
  // One set of keys per open object; keys always belong to the innermost one.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const nlohmann::json::parser_callback_t on_event =
      [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        switch (event) {
          case nlohmann::json::parse_event_t::object_start:
            open_objects.emplace_back();
            break;
          case nlohmann::json::parse_event_t::object_end:
            if (!open_objects.empty()) open_objects.pop_back();
            break;
          case nlohmann::json::parse_event_t::key:
            if (!open_objects.empty() && parsed.is_string() && duplicate.empty() &&
                !open_objects.back().insert(parsed.get_ref<const std::string&>()).second) {
              duplicate = parsed.get_ref<const std::string&>();
            }
            break;
          default:
            break;
        }
        return true;
      };
  try {
    nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), on_event,
                                                 /*allow_exceptions=*/true);
    if (!duplicate.empty()) {
      return absl::DataLossError(absl::StrCat(what, " has the key '", PrintableForError(duplicate),
                                              "' twice in one object"));
    }
    return value;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(what, " is not valid JSON: ", PrintableForError(e.what(), 256)));
  }
}

absl::string_view JsonTypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "object";
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::string:
      return "string";
    case nlohmann::json::value_t::boolean:
      return "boolean";
    case nlohmann::json::value_t::number_integer:
      return value.get<int64_t>() < 0 ? "negative integer" : "integer";
    case nlohmann::json::value_t::number_unsigned:
      return "integer";
    case nlohmann::json::value_t::number_float:
      return "non-integer number";
    default:
      return "unexpected value";
  }
}

}  // namespace zcc::format::internal
