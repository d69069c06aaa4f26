#include "proto/parse_cost.h"

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "proto/zcc.pb.h"

namespace zcc::proto {
namespace {

constexpr ParseCostLimits kNoLimit{uint64_t{1} << 40, 32};

// What parsing `encoded` as a T really takes.
template <typename T>
uint64_t ParsedBytes(const std::string& encoded) {
  T parsed;
  REQUIRE(parsed.ParseFromString(encoded));
  return parsed.SpaceUsedLong();
}

template <typename T>
uint64_t Estimate(const std::string& encoded) {
  auto cost = ParseCost(*T::descriptor(), encoded, kNoLimit);
  REQUIRE_OK(cost);
  return *cost;
}

v1::TensorSpec Spec(std::mt19937_64& rng, int i) {
  v1::TensorSpec t;
  t.set_name(std::string(1 + rng() % 500, static_cast<char>('a' + i % 26)));
  t.set_dtype(v1::BF16);
  t.set_kind(v1::PARAM);
  const int dims = static_cast<int>(rng() % 17);
  for (int d = 0; d < dims; ++d) {
    t.add_shape(static_cast<int64_t>(rng() >> (rng() % 63)));
    if (rng() % 2) t.add_global_shape(static_cast<int64_t>(rng() % 100000));
    if (rng() % 3) t.add_box_offset(static_cast<int64_t>(rng() % 100000));
  }
  if (rng() % 2) {
    t.mutable_replica()->set_group_size(8);
    t.mutable_replica()->set_expert_id(-1);
  }
  return t;
}

TEST_CASE("the estimate bounds what the parse allocates, and not by much, for real requests") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 60; ++round) {
    INFO("round " << round);
    v1::RegisterRequest req;
    req.set_job_id("job-" + std::to_string(round));
    req.set_world_size(64);
    req.set_run_id(std::string(rng() % 128, 'r'));
    const int tensors = round == 0 ? 0 : static_cast<int>(rng() % 3000);
    for (int i = 0; i < tensors; ++i) *req.add_tensors() = Spec(rng, i);
    const std::string encoded = req.SerializeAsString();
    const uint64_t parsed = ParsedBytes<v1::RegisterRequest>(encoded);
    const uint64_t estimate = Estimate<v1::RegisterRequest>(encoded);
    INFO(tensors << " tensors, " << encoded.size() << " bytes: parsed " << parsed << ", estimate "
                 << estimate);
    CHECK(estimate >= parsed);
    CHECK(estimate <= 4 * parsed);
  }
}

TEST_CASE("encodings that make the parse allocate many times their size are bounded too") {
  struct Case {
    std::string what;
    std::string encoded;  // a RegisterRequest
    double amplification; // at least this many parsed bytes per encoded byte
  };
  std::string empty_specs;  // field 4 (tensors), length 0, over and over
  for (int i = 0; i < 200000; ++i) empty_specs += std::string("\x22\x00", 2);
  std::string packed_zeros;  // one spec whose shape is 400000 one-byte varints
  {
    v1::TensorSpec spec;
    for (int i = 0; i < 400000; ++i) spec.add_shape(0);
    v1::RegisterRequest req;
    *req.add_tensors() = spec;
    packed_zeros = req.SerializeAsString();
  }
  std::string unknown_varints;  // field 1000, varint 0, over and over
  for (int i = 0; i < 200000; ++i) unknown_varints += std::string("\xc0\x3e\x00", 3);
  std::string empty_strings;  // field 1001, length 0, over and over
  for (int i = 0; i < 200000; ++i) empty_strings += std::string("\xca\x3e\x00", 3);
  const Case cases[] = {
      {"empty sub-messages", empty_specs, 30},
      {"a packed array of one-byte varints", packed_zeros, 7},
      {"unknown varint fields", unknown_varints, 4},
      {"unknown empty strings", empty_strings, 4},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const uint64_t parsed = ParsedBytes<v1::RegisterRequest>(c.encoded);
    // The attack is real: the parse takes many times the encoding's size.
    CHECK(static_cast<double>(parsed) >= c.amplification * static_cast<double>(c.encoded.size()));
    const uint64_t estimate = Estimate<v1::RegisterRequest>(c.encoded);
    CHECK(estimate >= parsed);
    CHECK(estimate <= 4 * parsed);
    // Refused under a limit the parse would pass, before reading it all.
    google::protobuf::io::ArrayInputStream in(c.encoded.data(),
                                              static_cast<int>(c.encoded.size()));
    auto refused = ParseCost(*v1::RegisterRequest::descriptor(), &in, c.encoded.size(),
                             ParseCostLimits{parsed / 2, 32});
    REQUIRE_STATUS_CODE(refused, absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(refused.status().message(), "more than"));
  }
}

TEST_CASE("encodings the parse would refuse are refused with the reason") {
  v1::RegisterRequest good;
  good.set_job_id("j");
  *good.add_tensors() = v1::TensorSpec();
  good.mutable_tensors(0)->set_name("w");
  const std::string whole = good.SerializeAsString();
  struct Case {
    std::string what;
    std::string encoded;
    std::string reason;
  };
  const Case cases[] = {
      {"truncated", whole.substr(0, whole.size() - 1), "past the end"},
      {"a group", std::string("\x0b\x0c", 2), "group"},
      {"field 0", std::string("\x00\x01", 2), "bad tag"},
      {"wire type 7", std::string("\x0f\x01", 2), "wire type"},
      {"a truncated varint", std::string("\x10\xff", 2), "truncated"},
      {"a length past the end", std::string("\x0a\x05" "ab", 4), "past the end"},
      {"a packed array ending inside an element",
       std::string("\x22\x03\x1a\x01\xff", 5), "inside an element"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto cost = ParseCost(*v1::RegisterRequest::descriptor(), c.encoded, kNoLimit);
    REQUIRE_STATUS_CODE(cost, absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(cost.status().message(), c.reason));
  }
}

TEST_CASE("messages nested deeper than the limit are refused without recursing further") {
  // DescriptorProto holds DescriptorProtos (nested_type, field 3).
  google::protobuf::DescriptorProto nested;
  google::protobuf::DescriptorProto* at = &nested;
  for (int i = 0; i < 40; ++i) at = at->add_nested_type();
  const std::string encoded = nested.SerializeAsString();
  auto deep = ParseCost(*google::protobuf::DescriptorProto::descriptor(), encoded,
                        ParseCostLimits{uint64_t{1} << 30, 32});
  REQUIRE_STATUS_CODE(deep, absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(deep.status().message(), "deeper than 32"));
  REQUIRE_OK(ParseCost(*google::protobuf::DescriptorProto::descriptor(), encoded,
                       ParseCostLimits{uint64_t{1} << 30, 64}));
}

}  // namespace
}  // namespace zcc::proto
