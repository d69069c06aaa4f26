// Internal to format/: parsing of JSON read back from disk, where the bytes may
// be corrupt or hostile. Stricter than nlohmann's defaults: duplicate object
// keys are an error instead of "last one wins", nesting is bounded before any
// allocation, and no exception escapes.
#ifndef ZCC_FORMAT_STRICT_JSON_H_
#define ZCC_FORMAT_STRICT_JSON_H_

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zcc::format::internal {

// Parses `text` (which must be valid UTF-8 JSON; trailing whitespace allowed).
// DataLoss, with `what` naming the document in the message, for syntax errors,
// invalid UTF-8, duplicate keys in any object, or nesting deeper than
// `max_depth` arrays/objects.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what);

// One array member of the root object whose elements are handed over one at
// a time, as each is complete, instead of being kept in the document (where
// the member is left an empty array): a million-element array then never
// exists as a DOM, which would take gigabytes and seconds to build and free.
struct StreamedArray {
  std::string key;
  // Called with each element's index and value; an error stops the parse and
  // is what ParseStrictJson returns.
  std::function<absl::Status(size_t index, nlohmann::json element)> on_element;
};

// ParseStrictJson, streaming the elements of `streamed.key` when the root is
// an object with that member and the member is an array.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what,
                                               const StreamedArray& streamed);

// The members of the root object handed over one at a time, as each value is
// complete, instead of being kept in the document (which is left an empty
// object). Keys are still checked for duplicates.
struct StreamedMembers {
  // Called with each member's key and value; an error stops the parse and is
  // what ParseStrictJson returns.
  std::function<absl::Status(std::string key, nlohmann::json value)> on_member;
};

// ParseStrictJson, streaming the members of the root object when it is one.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what,
                                               const StreamedMembers& streamed);

// Printable form of untrusted text for an error message: control and
// non-ASCII bytes as \xNN, cut to `max_len` bytes.
std::string PrintableForError(absl::string_view text, size_t max_len = 64);

// Human name of a JSON value's type for error messages ("string", "array", ...).
absl::string_view JsonTypeName(const nlohmann::json& value);

}  // namespace zcc::format::internal

#endif  // ZCC_FORMAT_STRICT_JSON_H_
