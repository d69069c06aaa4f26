#include "fuzz/fuzz_targets.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/rank_shards.h"
#include "config/daemon_config.h"
#include "daemon/control/registration.h"
#include "format/dtype.h"
#include "fuzz/fuzz_util.h"
#include "proto/parse_cost.h"
#include "proto/zcc.pb.h"
#include "shm/control_block.h"
#include "shm/slot_layout.h"

namespace zcc::fuzz {

using internal::ByteReader;

namespace {

// The outcome of running one request through the registration functions in
// Registry::Register's order.
struct Registered {
  absl::Status status;
  uint64_t manifest_hash = 0;
  std::vector<daemon::RegisteredTensor> tensors;
  checkpoint::RankShards shards;
};

// The layout promises that RankSession, the shard writer and the client rely
// on: every staged tensor lies inside one slot, inside its file group's range,
// without overlapping another.
void CheckShards(const Registered& r, const daemon::DaemonConfig& config) {
  const shm::SlotLayout& layout = r.shards.layout;
  FUZZ_CHECK(layout.slot_bytes >= shm::kPageBytes && layout.slot_bytes % shm::kPageBytes == 0 &&
                 layout.slot_bytes <= config.max_slot_bytes,
             absl::StrCat("slot_bytes ", layout.slot_bytes));
  size_t staged = 0;
  for (const daemon::RegisteredTensor& t : r.tensors) staged += t.staged ? 1 : 0;
  FUZZ_CHECK(r.shards.tensors.size() == staged && layout.placements.size() == staged,
             absl::StrCat(r.shards.tensors.size(), " shard tensors, ", layout.placements.size(),
                          " placements, ", staged, " staged"));
  for (uint32_t g = 0; g < format::kNumTensorKinds; ++g) {
    const shm::GroupRange& range = layout.groups[g];
    FUZZ_CHECK(range.begin % shm::kPageBytes == 0 && range.begin <= range.end &&
                   range.end <= layout.slot_bytes,
               absl::StrCat("group ", g, " [", range.begin, ", ", range.end, ")"));
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  size_t k = 0;
  for (const daemon::RegisteredTensor& t : r.tensors) {
    if (!t.staged) continue;
    const checkpoint::RankTensor& rt = r.shards.tensors[k];
    FUZZ_CHECK(rt.name == t.name && rt.nbytes == t.nbytes && rt.slot_offset == t.slot_offset &&
                   rt.kind == t.kind,
               t.name);
    const auto bytes = format::TensorBytes(t.dtype, t.shape, config.max_slot_bytes);
    FUZZ_CHECK(bytes.ok() && *bytes == t.nbytes, t.name);
    FUZZ_CHECK(t.slot_offset <= layout.slot_bytes && t.nbytes <= layout.slot_bytes - t.slot_offset,
               absl::StrCat(t.name, " at ", t.slot_offset, " +", t.nbytes));
    const shm::GroupRange& range = layout.groups[static_cast<uint32_t>(t.kind)];
    FUZZ_CHECK(t.slot_offset >= range.begin && t.slot_offset + t.nbytes <= range.end,
               absl::StrCat(t.name, " outside its file group"));
    if (t.nbytes > 0) ranges.emplace_back(t.slot_offset, t.slot_offset + t.nbytes);
    ++k;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second,
               absl::StrCat("tensors overlap at slot offset ", ranges[i].first));
  }
}

Registered RunRegistration(const v1::RegisterRequest& req, const daemon::DaemonConfig& config) {
  Registered r;
  auto tensors = daemon::ParseTensors(req, config, &r.manifest_hash);
  if (!tensors.ok()) {
    r.status = tensors.status();
    return r;
  }
  // The hash identifies the registration: it must not depend on anything but
  // the request.
  uint64_t hash_again = 0;
  const auto again = daemon::ParseTensors(req, config, &hash_again);
  FUZZ_CHECK(again.ok() && hash_again == r.manifest_hash, "ParseTensors is not deterministic");
  FUZZ_CHECK(tensors->size() == static_cast<size_t>(req.tensors_size()),
             absl::StrCat(tensors->size(), " of ", req.tensors_size(), " tensors"));
  r.tensors = std::move(*tensors);
  r.status = daemon::AssignStaged(req, &r.tensors);
  if (!r.status.ok()) return r;
  auto shards = daemon::ShardsFor(req, &r.tensors, r.manifest_hash, config);
  if (!shards.ok()) {
    r.status = shards.status();
    return r;
  }
  r.shards = std::move(*shards);
  CheckShards(r, config);
  return r;
}

daemon::DaemonConfig FuzzConfig() {
  daemon::DaemonConfig config;
  config.max_slot_bytes = uint64_t{1} << 34;  // 16 GiB: small enough to reach the limit
  config.max_tensors_per_rank = 4096;
  return config;
}

}  // namespace

int FuzzRegisterRequest(const uint8_t* data, size_t size) {
  // zccd checks what the parse would allocate before it parses
  // (daemon/control/raw_calls.h): the estimate must bound the parse, and
  // refuse nothing the parse takes but a group.
  const absl::StatusOr<uint64_t> cost =
      proto::ParseCost(*v1::RegisterRequest::descriptor(),
                       absl::string_view(reinterpret_cast<const char*>(data), size),
                       proto::ParseCostLimits{uint64_t{1} << 40, 32});
  v1::RegisterRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (cost.ok()) {
    FUZZ_CHECK(req.SpaceUsedLong() <= *cost,
               absl::StrCat("parsed ", req.SpaceUsedLong(), " bytes, estimated ", *cost));
  } else {
    FUZZ_CHECK(absl::StrContains(cost.status().message(), "group"), cost.status().ToString());
  }
  const daemon::DaemonConfig config = FuzzConfig();
  const Registered r = RunRegistration(req, config);
  if (!r.status.ok()) {
    FUZZ_CHECK(r.status.code() == absl::StatusCode::kInvalidArgument, r.status.ToString());
  }
  return 0;
}

namespace {

struct TensorDraft {
  std::string name;
  int dtype = v1::F32;
  std::vector<int64_t> shape;
  int kind = v1::PARAM;
  bool ema = false;
  int replica = v1::ReplicaGroup::NONE;
  int64_t expert_id = -1;
};

constexpr const char* kNameStems[] = {
    "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.experts.3.w1", "lm_head.weight", "optim/exp_avg", "rng", "é/ü.名前",
};

}  // namespace

int FuzzRegisterStructured(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const uint32_t world = 1 + in.Below(4);
  const uint32_t num_tensors = in.Below(10);
  // One input in four also breaks a field; the rest are valid registrations.
  const bool corrupt = in.Below(4) == 0;

  std::vector<TensorDraft> drafts;
  for (uint32_t i = 0; i < num_tensors; ++i) {
    TensorDraft d;
    d.name = absl::StrCat(kNameStems[in.Below(std::size(kNameStems))], ".", i);
    d.dtype = 1 + static_cast<int>(in.Below(10));
    const uint32_t dims = in.Below(4);
    for (uint32_t k = 0; k < dims; ++k) d.shape.push_back(in.Below(48));
    d.kind = 1 + static_cast<int>(in.Below(3));
    d.ema = in.Bool();
    d.replica = static_cast<int>(in.Below(3));
    if (d.replica == v1::ReplicaGroup::EXPERT_DATA_PARALLEL) d.expert_id = in.Below(4);
    drafts.push_back(std::move(d));
  }

  // The same model registered by every rank of one data-parallel group.
  std::vector<v1::RegisterRequest> requests(world);
  for (uint32_t rank = 0; rank < world; ++rank) {
    v1::RegisterRequest& req = requests[rank];
    req.set_job_id("fuzzjob");
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_pid(1000 + rank);
    for (const TensorDraft& d : drafts) {
      v1::TensorSpec* spec = req.add_tensors();
      spec->set_name(d.name);
      spec->set_dtype(static_cast<v1::DType>(d.dtype));
      for (int64_t dim : d.shape) spec->add_shape(dim);
      spec->set_kind(static_cast<v1::TensorKind>(d.kind));
      spec->set_ema_eligible(d.ema);
      v1::ReplicaGroup* group = spec->mutable_replica();
      group->set_kind(static_cast<v1::ReplicaGroup::Kind>(d.replica));
      group->set_group_size(d.replica == v1::ReplicaGroup::NONE ? 1 : world);
      group->set_rank_in_group(d.replica == v1::ReplicaGroup::NONE ? 0 : rank);
      group->set_expert_id(d.expert_id);
    }
  }
  if (corrupt && num_tensors > 0) {
    v1::RegisterRequest& req = requests[in.Below(world)];
    v1::TensorSpec* spec = req.mutable_tensors(static_cast<int>(in.Below(num_tensors)));
    switch (in.Below(10)) {
      case 0: spec->set_dtype(static_cast<v1::DType>(in.U8())); break;
      case 1: spec->set_kind(static_cast<v1::TensorKind>(in.U8())); break;
      case 2: spec->add_shape(static_cast<int64_t>(in.U64())); break;
      case 3: spec->set_name(in.Bytes(600)); break;
      case 4: spec->mutable_replica()->set_group_size(in.U8() % 3); break;
      case 5: spec->mutable_replica()->set_rank_in_group(static_cast<uint32_t>(in.U64())); break;
      case 6: spec->mutable_replica()->set_kind(static_cast<v1::ReplicaGroup::Kind>(in.U8())); break;
      case 7: spec->mutable_replica()->set_expert_id(static_cast<int64_t>(in.U64())); break;
      case 8: *req.add_tensors() = *spec; break;  // duplicate name
      default:
        for (int k = 0; k < 8; ++k) spec->add_shape(1 << 12);  // absurdly large
        break;
    }
  }

  const daemon::DaemonConfig config = FuzzConfig();
  std::vector<Registered> results;
  for (const v1::RegisterRequest& req : requests) {
    results.push_back(RunRegistration(req, config));
    const absl::Status& st = results.back().status;
    FUZZ_CHECK(st.ok() || st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
  }
  if (corrupt) return 0;

  // A valid registration is accepted by every member, and identical
  // manifests give every member the same hash.
  for (const Registered& r : results) {
    if (!r.status.ok()) return 0;  // e.g. a slot over the limit: same for all
    FUZZ_CHECK(r.manifest_hash == results[0].manifest_hash, "members disagree on the hash");
    FUZZ_CHECK(r.tensors.size() == drafts.size(), "tensor count changed");
  }

  // IO sharding (DESIGN.md section 4): a tensor of no group, or of a group of
  // one, is written by its rank; a replicated tensor by exactly one member.
  // daemon::AssignStaged still stages everything (the shard assigner is not
  // wired in yet), which writes every replicated tensor once per member; the
  // exactly-once half is checked only once some member declines a tensor,
  // i.e. once an assignment is in effect.
  bool assignment_in_effect = false;
  for (const Registered& r : results) {
    for (const daemon::RegisteredTensor& t : r.tensors) assignment_in_effect |= !t.staged;
  }
  for (size_t i = 0; i < drafts.size(); ++i) {
    const bool replicated = drafts[i].replica != v1::ReplicaGroup::NONE && world > 1;
    uint32_t writers = 0;
    for (const Registered& r : results) writers += r.tensors[i].staged ? 1 : 0;
    if (!replicated) {
      FUZZ_CHECK(writers == world, absl::StrCat("'", drafts[i].name, "' is not replicated but only ",
                                                writers, " of ", world, " ranks write their copy"));
    } else if (assignment_in_effect) {
      FUZZ_CHECK(writers == 1, absl::StrCat("replicated '", drafts[i].name, "' is written by ",
                                            writers, " of ", world, " members"));
    }
  }
  return 0;
}

}  // namespace zcc::fuzz
