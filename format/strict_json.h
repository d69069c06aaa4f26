// Internal to format/: parsing of JSON read back from disk, where the bytes may
// be corrupt or hostile. Stricter than nlohmann's defaults: duplicate object
// keys are an error instead of "last one wins", nesting is bounded before any
// allocation, and no exception escapes.
#ifndef ZCC_FORMAT_STRICT_JSON_H_
#define ZCC_FORMAT_STRICT_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::format::internal {

// Parses `text` (which must be valid UTF-8 JSON; trailing whitespace allowed).
// DataLoss, with `what` naming the document in the message, for syntax errors,
// invalid UTF-8, duplicate keys in any object, or nesting deeper than
// `max_depth` arrays/objects.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what);

// Printable form of untrusted text for an error message: control and
// non-ASCII bytes as \xNN, cut to `max_len` bytes.
std::string PrintableForError(absl::string_view text, size_t max_len = 64);

// Human name of a JSON value's type for error messages ("string", "array", ...).
absl::string_view JsonTypeName(const nlohmann::json& value);

}  // namespace zcc::format::internal

#endif  // ZCC_FORMAT_STRICT_JSON_H_
