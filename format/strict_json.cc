#include "format/strict_json.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zcc::format::internal {
namespace {

using nlohmann::json;

// Builds the DOM from nlohmann's SAX events, enforcing the rules nlohmann's
// own DOM parser does not: a key seen twice in one object stops the parse, and
// so does an array or object opened deeper than `max_depth` (the parser calls
// start_object/start_array before it allocates anything for the level).
//
// Linear in the document: every key goes into its object with one map
// insertion, which also finds duplicates; nothing is rescanned. (nlohmann's
// parser-callback DOM parser, used here before, rescans the parent object at
// every object end to drop discarded values, which is quadratic in the number
// of child objects.)
//
// Not thread-safe; one instance per parse.
class StrictDomBuilder {
 public:
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  // `streamed` (may be null) names a root member whose array elements go to
  // its callback instead of into the document.
  // `members` (may be null): the root object's members go to its callback.
  StrictDomBuilder(int max_depth, const StreamedArray* streamed, const StreamedMembers* members)
      : max_depth_(max_depth), streamed_(streamed), members_(members) {}

  bool null() { return Put(nullptr) != nullptr; }
  bool boolean(bool v) { return Put(v) != nullptr; }
  bool number_integer(json::number_integer_t v) { return Put(v) != nullptr; }
  bool number_unsigned(json::number_unsigned_t v) { return Put(v) != nullptr; }
  bool number_float(json::number_float_t v, const string_t& /*text*/) { return Put(v) != nullptr; }
  bool string(string_t& v) { return Put(std::move(v)) != nullptr; }
  bool binary(binary_t& /*v*/) { return Fail("holds binary data, which JSON text cannot"); }

  bool start_object(std::size_t /*elements*/) { return Open(json::value_t::object); }
  bool start_array(std::size_t /*elements*/) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(string_t& k) {
    if (StreamingRootMembers()) {
      // The root's members are not stored: their keys are tracked apart.
      if (!root_keys_.insert(k).second) {
        return Fail(absl::StrCat("has the key '", PrintableForError(k), "' twice in one object"));
      }
      member_key_ = std::move(k);
      next_member_ = &element_;
      return true;
    }
    json::object_t& object = *open_.back()->get_ptr<json::object_t*>();
    auto [it, inserted] = object.emplace(std::move(k), nullptr);
    if (!inserted) {
      return Fail(absl::StrCat("has the key '", PrintableForError(it->first),
                               "' twice in one object"));
    }
    next_member_ = &it->second;
    next_member_streamed_ =
        streamed_ != nullptr && open_.size() == 1 && it->first == streamed_->key;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& e) {
    return Fail(absl::StrCat("is not valid JSON: ", PrintableForError(e.what(), 256)));
  }

  json& root() { return root_; }
  // Set once a rule is broken; the parse stopped there.
  const std::string& error() const { return error_; }
  // Set when the streamed elements' callback failed; the parse stopped there.
  const absl::Status& element_error() const { return element_error_; }

 private:
  // Stores `value` where the grammar puts it: the root, the end of the open
  // array, or the member whose key came last. Returns where it went.
  template <typename Value>
  json* Put(Value&& value) {
    if (open_.empty()) {
      root_ = json(std::forward<Value>(value));
      return &root_;
    }
    json& parent = *open_.back();
    if (&parent == streamed_array_) {
      // An element of the streamed array: held apart, and handed over as
      // soon as it is complete (a scalar now, a container when it closes).
      element_ = json(std::forward<Value>(value));
      if (element_.is_structured()) return &element_;
      return Deliver() ? &element_ : nullptr;
    }
    if (parent.is_array()) {
      json::array_t& array = *parent.get_ptr<json::array_t*>();
      array.emplace_back(std::forward<Value>(value));
      return &array.back();
    }
    *next_member_ = json(std::forward<Value>(value));
    if (next_member_ == &element_ && !element_.is_structured()) {
      return DeliverMember() ? &element_ : nullptr;
    }
    return next_member_;
  }

  bool StreamingRootMembers() const {
    return members_ != nullptr && open_.size() == 1 && open_.back() == &root_;
  }

  bool Open(json::value_t type) {
    if (open_.size() >= static_cast<size_t>(max_depth_)) {
      return Fail(absl::StrCat("nests arrays/objects deeper than ", max_depth_, " levels"));
    }
    // Children are only added to the innermost open container, so the
    // pointers held in open_ stay valid until their container closes.
    const bool streamed = type == json::value_t::array && open_.size() == 1 &&
                          open_.back()->is_object() && next_member_streamed_;
    json* opened = Put(type);
    if (opened == nullptr) return false;
    if (streamed) streamed_array_ = opened;
    open_.push_back(opened);
    return true;
  }

  bool Close() {
    const json* closed = open_.back();
    open_.pop_back();
    if (closed == &element_) return members_ != nullptr ? DeliverMember() : Deliver();
    return true;
  }

  bool DeliverMember() {
    absl::Status status = members_->on_member(std::move(member_key_), std::move(element_));
    member_key_.clear();
    element_ = json();
    if (!status.ok()) {
      element_error_ = std::move(status);
      return false;
    }
    return true;
  }

  bool Deliver() {
    absl::Status status = streamed_->on_element(next_element_++, std::move(element_));
    element_ = json();
    if (!status.ok()) {
      element_error_ = std::move(status);
      return false;
    }
    return true;
  }

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  const int max_depth_;
  json root_;
  std::vector<json*> open_;       // open arrays/objects, outermost first
  json* next_member_ = nullptr;   // value slot of the last key of the innermost object
  std::string error_;

  const StreamedArray* const streamed_;
  bool next_member_streamed_ = false;  // the last key is the streamed member of the root
  json* streamed_array_ = nullptr;     // that member, once its array opened (stays empty)
  const StreamedMembers* const members_;
  absl::flat_hash_set<std::string> root_keys_;  // keys of the streamed root members
  std::string member_key_;                      // key of the member being built
  json element_;                       // the streamed element or member being built
  size_t next_element_ = 0;
  absl::Status element_error_;
};

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

namespace {

absl::StatusOr<nlohmann::json> Parse(absl::string_view text, int max_depth,
                                     absl::string_view what, const StreamedArray* streamed,
                                     const StreamedMembers* members) {
  StrictDomBuilder builder(max_depth, streamed, members);
  try {
    const bool ok = json::sax_parse(text.begin(), text.end(), &builder,
                                    json::input_format_t::json, /*strict=*/true);
    if (!builder.element_error().ok()) return builder.element_error();
    if (!ok || !builder.error().empty()) {
      return absl::DataLossError(absl::StrCat(
          what, " ", builder.error().empty() ? "is not valid JSON" : builder.error()));
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(what, " is not valid JSON: ", PrintableForError(e.what(), 256)));
  }
  return std::move(builder.root());
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what) {
  return Parse(text, max_depth, what, nullptr, nullptr);
}

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what,
                                               const StreamedArray& streamed) {
  return Parse(text, max_depth, what, &streamed, nullptr);
}

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, int max_depth,
                                               absl::string_view what,
                                               const StreamedMembers& streamed) {
  return Parse(text, max_depth, what, nullptr, &streamed);
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
