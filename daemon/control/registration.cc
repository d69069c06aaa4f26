#include "daemon/control/registration.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/box.h"
#include "format/checksum.h"
#include "proto/convert.h"
#include "sharding/shard_assigner.h"

namespace zcc::daemon {

// Validates the registration's tensors and returns them in request order,
// with the hash that identifies the registration (names, types, shapes, kinds).
absl::StatusOr<std::vector<RegisteredTensor>> ParseTensors(const v1::RegisterRequest& req,
                                                           const DaemonConfig& config,
                                                           uint64_t* manifest_hash) {
  if (static_cast<uint64_t>(req.tensors_size()) > config.max_tensors_per_rank) {
    return absl::InvalidArgumentError(absl::StrCat("registration has ", req.tensors_size(),
                                                   " tensors; the limit is ",
                                                   config.max_tensors_per_rank));
  }
  std::set<std::string> names;
  std::vector<RegisteredTensor> out;
  format::Xxh3Stream hash;
  for (const v1::TensorSpec& spec : req.tensors()) {
    ZCC_RETURN_IF_ERROR(ValidateTensorName(spec.name()));
    auto fail = [&](const absl::Status& st) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name(), "': ", st.message()));
    };
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", spec.name(), "' is registered twice"));
    }
    RegisteredTensor t;
    t.name = spec.name();
    auto dtype = proto::FromProto(spec.dtype());
    if (!dtype.ok()) return fail(dtype.status());
    t.dtype = *dtype;
    auto kind = proto::FromProto(spec.kind());
    if (!kind.ok()) return fail(kind.status());
    t.kind = *kind;
    if (spec.shape_size() > kMaxDims) {
      return fail(absl::InvalidArgumentError(absl::StrCat(spec.shape_size(), " dimensions; at most ",
                                                          kMaxDims)));
    }
    t.shape.assign(spec.shape().begin(), spec.shape().end());
    auto nbytes = format::TensorBytes(t.dtype, t.shape, config.max_slot_bytes);
    if (!nbytes.ok()) return fail(nbytes.status());
    t.nbytes = *nbytes;
    t.ema_eligible = spec.ema_eligible();
    t.optional = spec.optional();
    if (t.optional && t.kind != format::TensorKind::kExtra) {
      // A parameter or optimizer state restored as zeros would train on
      // silently from a model that is not the checkpoint's.
      return fail(absl::InvalidArgumentError("only EXTRA tensors may be optional"));
    }
    const bool sliced = spec.global_shape_size() != 0 || spec.box_offset_size() != 0;
    if (!sliced) {
      t.global_shape = t.shape;
      t.box_offset.assign(t.shape.size(), 0);
    } else {
      if (spec.global_shape_size() != spec.shape_size() ||
          spec.box_offset_size() != spec.shape_size()) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "a piece of a global tensor needs global_shape and box_offset with one entry per "
            "dimension (", spec.shape_size(), "); got ", spec.global_shape_size(), " and ",
            spec.box_offset_size())));
      }
      t.global_shape.assign(spec.global_shape().begin(), spec.global_shape().end());
      t.box_offset.assign(spec.box_offset().begin(), spec.box_offset().end());
      auto global_bytes = format::TensorBytes(t.dtype, t.global_shape);
      if (!global_bytes.ok()) return fail(global_bytes.status());
      if (absl::Status st = format::ValidateBox(format::Box{t.box_offset, t.shape}, t.global_shape);
          !st.ok()) {
        return fail(st);
      }
    }
    hash.Update(t.name.data(), t.name.size() + 1);
    const int64_t header[3] = {static_cast<int64_t>(t.dtype), static_cast<int64_t>(t.kind),
                               static_cast<int64_t>(t.shape.size())};
    hash.Update(header, sizeof(header));
    hash.Update(t.shape.data(), t.shape.size() * sizeof(int64_t));
    if (sliced) {  // whole tensors hash as before
      hash.Update(t.global_shape.data(), t.global_shape.size() * sizeof(int64_t));
      hash.Update(t.box_offset.data(), t.box_offset.size() * sizeof(int64_t));
    }
    out.push_back(std::move(t));
  }
  *manifest_hash = hash.Digest();
  return out;
}

// Decides which tensors this rank writes (and therefore stages): its own, and
// the replicated ones the shard assigner gives it.
absl::Status AssignStaged(const v1::RegisterRequest& req, std::vector<RegisteredTensor>* tensors) {
  if (static_cast<size_t>(req.tensors_size()) != tensors->size()) {
    return absl::InternalError("AssignStaged: tensors do not match the request");
  }
  std::vector<sharding::ShardTensor> specs;
  specs.reserve(tensors->size());
  for (size_t i = 0; i < tensors->size(); ++i) {
    const v1::ReplicaGroup& r = req.tensors(static_cast<int>(i)).replica();
    sharding::ShardTensor s;
    s.name = (*tensors)[i].name;
    s.nbytes = (*tensors)[i].nbytes;
    switch (r.kind()) {
      case v1::ReplicaGroup::NONE:
        s.group.kind = sharding::ReplicaKind::kNone;
        break;
      case v1::ReplicaGroup::DATA_PARALLEL:
        s.group.kind = sharding::ReplicaKind::kDataParallel;
        break;
      case v1::ReplicaGroup::EXPERT_DATA_PARALLEL:
        s.group.kind = sharding::ReplicaKind::kExpertDataParallel;
        if (r.expert_id() < 0 || r.expert_id() > std::numeric_limits<uint32_t>::max()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor '", s.name, "': expert_id ", r.expert_id(), " is not a global expert id"));
        }
        s.group.expert_id = static_cast<uint32_t>(r.expert_id());
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", s.name, "': unknown replica kind ", static_cast<int>(r.kind())));
    }
    if (s.group.kind != sharding::ReplicaKind::kNone) {
      s.group.group_size = r.group_size();
      s.group.rank_in_group = r.rank_in_group();
    }
    specs.push_back(std::move(s));
  }
  // Bound what the assigner allocates (per group, one load per declared
  // member): a group cannot be larger than the job, and the members declared
  // over all groups are capped, so a small request cannot ask for gigabytes.
  constexpr uint64_t kMaxDeclaredMembers = uint64_t{1} << 22;
  std::set<std::pair<int, uint32_t>> groups;
  uint64_t declared = 0;
  for (const sharding::ShardTensor& t : specs) {
    if (t.group.kind == sharding::ReplicaKind::kNone) continue;
    if (t.group.group_size > req.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': replica group of ", t.group.group_size,
          " members in a job of world_size ", req.world_size()));
    }
    if (groups.emplace(static_cast<int>(t.group.kind), t.group.expert_id).second) {
      declared += t.group.group_size;
      if (declared > kMaxDeclaredMembers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the registration's replica groups declare more than ", kMaxDeclaredMembers,
            " members in total"));
      }
    }
  }
  auto plan = sharding::PlanRankWrites(specs);
  if (!plan.ok()) return absl::InvalidArgumentError(plan.status().message());
  for (size_t i = 0; i < tensors->size(); ++i) (*tensors)[i].staged = plan->writes[i];
  return absl::OkStatus();
}

// Per replica group of the rank, a digest of the group's tensors (sorted by
// name: members may register them in any order), so the committer can check
// that the members of each group registered the same replicated state.
std::vector<format::ReplicaDigest> ReplicaDigests(const v1::RegisterRequest& req,
                                                  const std::vector<RegisteredTensor>& registered) {
  struct Group {
    format::ReplicaDigest digest;
    std::vector<size_t> tensors;
  };
  std::map<std::pair<int, int64_t>, Group> groups;
  for (size_t i = 0; i < registered.size(); ++i) {
    const v1::ReplicaGroup& r = req.tensors(static_cast<int>(i)).replica();
    if (r.kind() == v1::ReplicaGroup::NONE) continue;
    const bool expert = r.kind() == v1::ReplicaGroup::EXPERT_DATA_PARALLEL;
    Group& g = groups[{static_cast<int>(r.kind()), expert ? r.expert_id() : -1}];
    g.digest.kind = expert ? "expert_dp" : "dp";
    g.digest.expert_id = expert ? r.expert_id() : -1;
    g.digest.size = r.group_size();
    g.digest.member = r.rank_in_group();
    g.tensors.push_back(i);
  }
  std::vector<format::ReplicaDigest> out;
  for (auto& [key, g] : groups) {
    std::sort(g.tensors.begin(), g.tensors.end(),
              [&](size_t a, size_t b) { return registered[a].name < registered[b].name; });
    format::Xxh3Stream hash;
    for (size_t i : g.tensors) {
      const RegisteredTensor& t = registered[i];
      hash.Update(t.name.data(), t.name.size() + 1);
      const int64_t header[3] = {static_cast<int64_t>(t.dtype), static_cast<int64_t>(t.kind),
                                 static_cast<int64_t>(t.shape.size())};
      hash.Update(header, sizeof(header));
      hash.Update(t.shape.data(), t.shape.size() * sizeof(int64_t));
      hash.Update(t.global().data(), t.global().size() * sizeof(int64_t));
      const format::Box box = t.box();
      hash.Update(box.offset.data(), box.offset.size() * sizeof(int64_t));
    }
    g.digest.hash = hash.Digest();
    out.push_back(g.digest);
  }
  return out;
}

// The checkpoint description of the staged tensors, with their slot layout.
absl::StatusOr<checkpoint::RankShards> ShardsFor(const v1::RegisterRequest& req,
                                                 std::vector<RegisteredTensor>* registered,
                                                 uint64_t manifest_hash,
                                                 const DaemonConfig& config) {
  checkpoint::RankShards shards;
  shards.job_id = req.job_id();
  shards.rank = req.rank();
  shards.world_size = req.world_size();
  shards.manifest_hash = manifest_hash;
  shards.run_id = req.run_id();
  std::vector<shm::LayoutInput> inputs;
  for (const RegisteredTensor& t : *registered) {
    if (!t.staged) continue;
    inputs.push_back({t.name, t.nbytes, t.kind});
    checkpoint::RankTensor rt;
    rt.name = t.name;
    rt.dtype = t.dtype;
    rt.shape = t.shape;
    rt.global_shape = t.global_shape;
    rt.box_offset = t.box_offset;
    rt.kind = t.kind;
    rt.nbytes = t.nbytes;
    shards.tensors.push_back(std::move(rt));
  }
  ZCC_ASSIGN_OR_RETURN(shards.layout, shm::ComputeSlotLayout(inputs, config.max_slot_bytes));
  shards.replica_groups = ReplicaDigests(req, *registered);
  size_t k = 0;
  for (RegisteredTensor& t : *registered) {
    if (!t.staged) continue;
    t.slot_offset = shards.layout.placements[k].offset;
    shards.tensors[k].slot_offset = t.slot_offset;
    ++k;
  }
  return shards;
}

}  // namespace zcc::daemon
