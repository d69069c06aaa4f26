#include "format/strict_json.h"

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"

namespace zcc::format::internal {
namespace {

using nlohmann::json;

// The message of a parse that must fail with DataLoss.
std::string FailureOf(absl::string_view text, int max_depth = 8) {
  absl::StatusOr<json> parsed = ParseStrictJson(text, max_depth, "doc");
  INFO("text: " << text.substr(0, 200));
  REQUIRE_STATUS_CODE(parsed, absl::StatusCode::kDataLoss);
  return std::string(parsed.status().message());
}

TEST_CASE("strict JSON builds the same document as nlohmann's parser") {
  const std::string text =
      R"({"a": [1, -2, 3.5, true, false, null, "s\u00e9\n"], "b": {"c": {}, "d": []},)"
      R"( "e": 18446744073709551615, "f": [[{"g": "h"}], {}]})"
      "  \n\t";
  absl::StatusOr<json> parsed = ParseStrictJson(text, 4, "doc");
  REQUIRE_OK(parsed);
  CHECK(*parsed == json::parse(text));
  CHECK((*parsed)["e"].is_number_unsigned());
  CHECK((*parsed)["a"][1].get<int64_t>() == -2);
  CHECK((*parsed)["a"][6].get<std::string>() == "s\xc3\xa9\n");

  for (const char* scalar : {"0", "\"x\"", "null", "[]", "{}"}) {
    absl::StatusOr<json> s = ParseStrictJson(scalar, 1, "doc");
    REQUIRE_OK(s);
    CHECK(*s == json::parse(scalar));
  }
}

TEST_CASE("strict JSON rejects a key repeated in any object, at any depth") {
  CHECK(FailureOf(R"({"a": 1, "a": 1})") == "doc has the key 'a' twice in one object");
  CHECK(FailureOf(R"({"x": {"y": {"k": 1, "j": 2, "k": 3}}})") ==
        "doc has the key 'k' twice in one object");
  // In an object inside an array, after many distinct keys.
  std::string wide = R"({"list": [{"z": 0}, {)";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&wide, "\"k", i, "\": ", i, ", ");
  absl::StrAppend(&wide, "\"k17\": 1}]}");
  CHECK(FailureOf(wide) == "doc has the key 'k17' twice in one object");
  // Non-printable keys are shown escaped.
  CHECK(FailureOf("{\"\\u0001\xc3\xa9\": 1, \"\\u0001\xc3\xa9\": 2}") ==
        "doc has the key '\\x01\\xc3\\xa9' twice in one object");

  // The same key in sibling or nested objects is fine.
  absl::StatusOr<json> ok = ParseStrictJson(
      R"({"a": {"a": {"a": 1}}, "b": [{"a": 1}, {"a": 2}], "c": {"a": 3}})", 4, "doc");
  REQUIRE_OK(ok);
  CHECK((*ok)["b"][1]["a"] == 2);
  CHECK((*ok)["a"]["a"]["a"] == 1);
}

TEST_CASE("strict JSON bounds the nesting of arrays and objects") {
  // Exactly the limit parses; one more level does not.
  REQUIRE_OK(ParseStrictJson(R"({"a": [{"b": []}]})", 4, "doc"));
  CHECK(FailureOf(R"({"a": [{"b": [[]]}]})", 4) == "doc nests arrays/objects deeper than 4 levels");
  CHECK(FailureOf("[[[1]]]", 2) == "doc nests arrays/objects deeper than 2 levels");
  REQUIRE_OK(ParseStrictJson("[[1], [2], {\"x\": 3}]", 2, "doc"));
  // Brackets inside strings are text, not nesting.
  absl::StatusOr<json> quoted = ParseStrictJson(R"({"a": "[[[{{{", "b": "\"]]"})", 1, "doc");
  REQUIRE_OK(quoted);
  CHECK((*quoted)["a"] == "[[[{{{");
  // A document of ten million opening brackets fails at the limit, without
  // building anything deeper.
  const std::string deep(10'000'000, '[');
  CHECK(FailureOf(deep, 8) == "doc nests arrays/objects deeper than 8 levels");
}

TEST_CASE("strict JSON rejects invalid UTF-8, bad syntax and unrepresentable numbers") {
  // Invalid UTF-8: a lone continuation byte, an overlong encoding, a
  // truncated sequence, an encoded surrogate, and a lone escaped surrogate.
  for (const std::string& bad : {std::string("{\"a\": \"\x80\"}"), std::string("[\"\xc0\xaf\"]"),
                                 std::string("[\"\xe2\x82\"]"), std::string("[\"\xed\xa0\x80\"]"),
                                 std::string(R"(["\ud800"])"), std::string("{\"\xff\": 1}")}) {
    CHECK_THAT(FailureOf(bad), Catch::StartsWith("doc is not valid JSON: "));
  }
  for (const char* bad : {"", " ", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "{} {}", "{}x",
                          "nul", "[01]", "1e999", "-1e999", "{'a': 1}", "/* c */ {}"}) {
    CHECK_THAT(FailureOf(bad), Catch::StartsWith("doc is not valid JSON: "));
  }
}

TEST_CASE("a streamed array's elements go to the callback, in order, and nowhere else") {
  std::vector<std::pair<size_t, json>> got;
  StreamedArray streamed;
  streamed.key = "items";
  streamed.on_element = [&](size_t i, json element) {
    got.emplace_back(i, std::move(element));
    return absl::OkStatus();
  };
  absl::StatusOr<json> parsed = ParseStrictJson(
      R"({"a": {"items": [9]}, "items": [{"x": [1]}, 2, "s", [3, {}], null], "z": 1})", 4, "doc",
      streamed);
  REQUIRE_OK(parsed);
  // The member stays, empty; a member of the same name deeper down is not streamed.
  CHECK(*parsed == json::parse(R"({"a": {"items": [9]}, "items": [], "z": 1})"));
  REQUIRE(got.size() == 5);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].first == i);
  CHECK(got[0].second == json::parse(R"({"x": [1]})"));
  CHECK(got[1].second == 2);
  CHECK(got[2].second == "s");
  CHECK(got[3].second == json::parse("[3, {}]"));
  CHECK(got[4].second.is_null());

  // Not an array, or the root not an object: nothing is streamed.
  got.clear();
  parsed = ParseStrictJson(R"({"items": {"k": [1]}})", 4, "doc", streamed);
  REQUIRE_OK(parsed);
  CHECK((*parsed)["items"]["k"][0] == 1);
  parsed = ParseStrictJson(R"([{"items": [1]}])", 4, "doc", streamed);
  REQUIRE_OK(parsed);
  CHECK((*parsed)[0]["items"][0] == 1);
  CHECK(got.empty());

  // The rules hold inside streamed elements.
  CHECK(FailureOf(R"({"items": [{"k": 1, "k": 2}]})") == "doc has the key 'k' twice in one object");
  CHECK(ParseStrictJson(R"({"items": [{"k": [[1]]}]})", 4, "doc", streamed).status().message() ==
        "doc nests arrays/objects deeper than 4 levels");
  CHECK(ParseStrictJson(R"({"items": [{"k": 1, "k": 2}]})", 4, "doc", streamed).status().message() ==
        "doc has the key 'k' twice in one object");
  CHECK(ParseStrictJson("{\"items\": [\"\xff\"]}", 4, "doc", streamed).status().code() ==
        absl::StatusCode::kDataLoss);
}

TEST_CASE("an error from the streamed elements' callback stops the parse and is returned") {
  int calls = 0;
  StreamedArray streamed;
  streamed.key = "items";
  streamed.on_element = [&](size_t i, const json& element) {
    ++calls;
    if (element == "bad") return absl::InvalidArgumentError(absl::StrCat("element ", i));
    return absl::OkStatus();
  };
  absl::StatusOr<json> parsed =
      ParseStrictJson(R"({"items": [1, {"a": 2}, "bad", 4, 5]})", 4, "doc", streamed);
  REQUIRE_STATUS_CODE(parsed, absl::StatusCode::kInvalidArgument);
  CHECK(parsed.status().message() == "element 2");
  CHECK(calls == 3);
  // A syntax error after good elements is still a syntax error.
  calls = 0;
  CHECK_THAT(std::string(ParseStrictJson(R"({"items": [1, 2 x]})", 4, "doc", streamed)
                             .status()
                             .message()),
             Catch::StartsWith("doc is not valid JSON: "));
  CHECK(calls == 2);
}

TEST_CASE("streamed root members go to the callback, keys still unique") {
  std::vector<std::pair<std::string, json>> got;
  StreamedMembers streamed;
  streamed.on_member = [&](std::string key, json value) {
    const bool stop = value == "stop";
    got.emplace_back(std::move(key), std::move(value));
    return stop ? absl::FailedPreconditionError("stopped") : absl::OkStatus();
  };
  absl::StatusOr<json> parsed =
      ParseStrictJson(R"({"b": {"x": {"b": 1}}, "a": [1, [2]], "c": 3, "d": null})", 4, "doc",
                      streamed);
  REQUIRE_OK(parsed);
  CHECK(*parsed == json::object());
  REQUIRE(got.size() == 4);  // in document order
  CHECK(got[0].first == "b");
  CHECK(got[0].second == json::parse(R"({"x": {"b": 1}})"));
  CHECK(got[1].first == "a");
  CHECK(got[1].second == json::parse("[1, [2]]"));
  CHECK(got[2].second == 3);
  CHECK(got[3].first == "d");

  // A root that is not an object is parsed as usual.
  got.clear();
  parsed = ParseStrictJson(R"([{"a": 1}])", 4, "doc", streamed);
  REQUIRE_OK(parsed);
  CHECK((*parsed)[0]["a"] == 1);
  CHECK(got.empty());

  const auto message = [&](absl::string_view text) {
    return std::string(ParseStrictJson(text, 3, "doc", streamed).status().message());
  };
  CHECK(message(R"({"a": 1, "b": {}, "a": 2})") == "doc has the key 'a' twice in one object");
  CHECK(message(R"({"a": {"k": 1, "k": 1}})") == "doc has the key 'k' twice in one object");
  CHECK(message(R"({"a": {"k": [[1]]}})") == "doc nests arrays/objects deeper than 3 levels");
  CHECK_THAT(message("{\"a\": 1, \"\xc3\": 2}"), Catch::StartsWith("doc is not valid JSON: "));
  got.clear();
  CHECK(message(R"({"a": 1, "b": "stop", "c": 3})") == "stopped");
  CHECK(got.size() == 2);
}

TEST_CASE("strict JSON parses an object of 200k objects, and finds a duplicate at its end") {
  // nlohmann's callback parser took time quadratic in the child objects of
  // one object; this size would take minutes there and is a fraction of a
  // second now. The result is checked in full instead of timed.
  constexpr int kEntries = 200'000;
  std::string text = "{";
  for (int i = 0; i < kEntries; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ",", "\"tensor.", i, "\":{\"shape\":[", i,
                    "],\"data_offsets\":[", i, ",", i + 1, "]}");
  }
  absl::StatusOr<json> parsed = ParseStrictJson(absl::StrCat(text, "}"), 3, "doc");
  REQUIRE_OK(parsed);
  REQUIRE(parsed->size() == kEntries);
  uint64_t sum = 0;
  for (const auto& [key, value] : parsed->items()) sum += value["data_offsets"][1].get<uint64_t>();
  CHECK(sum == uint64_t{kEntries} * (kEntries + 1) / 2);
  CHECK((*parsed)["tensor.123456"]["shape"][0] == 123456);

  CHECK(FailureOf(absl::StrCat(text, ",\"tensor.7\":{}}"), 3) ==
        "doc has the key 'tensor.7' twice in one object");
}

}  // namespace
}  // namespace zcc::format::internal
