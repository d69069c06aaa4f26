#include "daemon/control/request_limits.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/testing/status_matchers.h"
#include "common/validate.h"
#include "proto/parse_cost.h"
#include "proto/zcc.pb.h"

namespace zcc::daemon {
namespace {

// The largest TensorSpec zccd takes (and larger: every dimension a 10-byte
// varint, which validation refuses).
v1::TensorSpec LargestSpec(int i) {
  v1::TensorSpec t;
  std::string name(kMaxTensorNameBytes, 'n');
  name.replace(0, std::to_string(i).size(), std::to_string(i));
  t.set_name(name);
  t.set_dtype(v1::BF16);
  t.set_kind(v1::EXTRA);
  t.set_ema_eligible(true);
  t.set_optional(true);
  for (int d = 0; d < 16; ++d) {
    t.add_shape(-1);
    t.add_global_shape(-1);
    t.add_box_offset(-1);
  }
  t.mutable_replica()->set_group_size(~0u);
  t.mutable_replica()->set_rank_in_group(~0u);
  t.mutable_replica()->set_expert_id(-1);
  return t;
}

TEST_CASE("a registration of the most tensors the config allows, each the largest, is within "
          "Register's limit") {
  for (uint32_t tensors : {1u, 1000u, 20000u}) {
    INFO(tensors << " tensors");
    v1::RegisterRequest req;
    req.set_job_id(std::string(128, 'j'));
    req.set_checkpoint_root(std::string(4096, 'r'));
    req.set_upload_root(std::string(4096, 'u'));
    req.set_run_id(std::string(128, 'x'));
    for (uint32_t i = 0; i < tensors; ++i) *req.add_tensors() = LargestSpec(static_cast<int>(i));
    const std::string encoded = req.SerializeAsString();
    const RequestLimit limit = RegisterRequestLimit(tensors);
    CHECK(encoded.size() <= limit.max_bytes);
    auto cost = proto::ParseCost(*v1::RegisterRequest::descriptor(), encoded,
                                 proto::ParseCostLimits{limit.max_cost, 32});
    REQUIRE_OK(cost);
    CHECK(*cost <= limit.max_cost);
    CHECK(*cost / tensors <= kRegisterCostPerTensor + (1 << 20) / tensors);
  }
  // The default max_tensors_per_rank (1 << 20) reaches gRPC's own limit.
  CHECK(RegisterRequestLimit(1 << 20).max_bytes == v1::kMaxMessageBytes);
}

TEST_CASE("the small methods' requests fit their limit with the longest names they carry") {
  v1::ListCheckpointsRequest list;
  list.set_job_id(std::string(128, 'j'));
  list.set_checkpoint_root(std::string(4096, 'r'));
  CHECK(list.ByteSizeLong() <= kSmallRequest.max_bytes);
  v1::PutJobFileRequest file;
  file.set_job_id(std::string(128, 'j'));
  file.set_name(std::string(128, 'f'));
  file.set_content(std::string(16 << 20, 'c'));
  CHECK(file.ByteSizeLong() <= kPutJobFileRequest.max_bytes);
  REQUIRE_OK(proto::ParseCost(*v1::PutJobFileRequest::descriptor(), file.SerializeAsString(),
                              proto::ParseCostLimits{kPutJobFileRequest.max_cost, 32}));
  v1::SetJobPeersRequest peers;
  peers.set_job_id(std::string(128, 'j'));
  // The largest job's, every address as long as may be (at 1/16 of the
  // ranks, scaled).
  const uint32_t ranks = kMaxWorldSize / 16;
  for (uint32_t r = 0; r < ranks; ++r) {
    v1::JobPeer* p = peers.add_peers();
    p->set_rank(kMaxWorldSize - 1 - r);
    p->set_address(std::string(kMaxPeerAddressBytes - 6, 'h') + ":65535");
  }
  const RequestLimit sixteenth{kSetJobPeersRequest.max_bytes / 16,
                               kSetJobPeersRequest.max_cost / 16};
  CHECK(peers.ByteSizeLong() <= sixteenth.max_bytes);
  REQUIRE_OK(proto::ParseCost(*v1::SetJobPeersRequest::descriptor(), peers.SerializeAsString(),
                              proto::ParseCostLimits{sixteenth.max_cost, 32}));
}

}  // namespace
}  // namespace zcc::daemon
