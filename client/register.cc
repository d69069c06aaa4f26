// Registering with zccd: the request made of the client's options and
// tensors, the checks of zccd's reply (another process's words) before any
// offset in it is trusted, the staging segment mapped and the copier that
// fills it chosen.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "client/default_copier.h"
#include "client/proto_convert.h"
#include "common/log.h"
#include "common/status.h"
#include "cuda/ipc_pull_copier.h"
#include "format/dtype.h"
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/pull_channel.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"

namespace zcc {
namespace {

using client_internal::ToProto;

v1::RegisterRequest MakeRegisterRequest(const ClientOptions& options,
                                        const std::vector<TensorRef>& refs, bool user_copier,
                                        bool prefetch_restore, uint64_t replaces_generation,
                                        uint64_t instance, const std::string& timeline) {
  v1::RegisterRequest req;
  req.set_timeline(timeline);
  req.set_replaces_generation(replaces_generation);
  req.set_client_instance(instance);
  req.set_job_id(options.job_id);
  req.set_rank(options.rank);
  req.set_world_size(options.world_size);
  req.set_num_slots(options.num_slots);
  req.set_save_every(options.save_every);
  req.set_keep_last(options.keep_last);
  req.set_checkpoint_root(options.checkpoint_root);
  req.set_upload_root(options.upload_root);
  req.set_upload_keep_last(options.upload_keep_last);
  req.set_node_local_root(options.node_local_root);
  req.set_run_id(options.run_id);
  if (!options.store_credentials.access_key_id.empty()) {
    v1::StoreCredentials* c = req.mutable_store_credentials();
    c->set_access_key_id(options.store_credentials.access_key_id);
    c->set_secret_access_key(options.store_credentials.secret_access_key);
    c->set_session_token(options.store_credentials.session_token);
  }
  req.set_pid(::getpid());
  req.set_ema_decay(options.ema_decay);
  req.set_ema_interval(options.ema_interval);
  req.set_persist_on_failure(options.persist_on_failure);
  req.set_prefetch_restore(prefetch_restore);
  if (user_copier) {
    req.set_daemon_pull(v1::DAEMON_PULL_OFF);
  } else if (options.copy_backend == ClientOptions::CopyBackend::kCudaIpc) {
    req.set_daemon_pull(v1::DAEMON_PULL_REQUIRED);
  } else if (options.copy_backend == ClientOptions::CopyBackend::kAuto) {
    req.set_daemon_pull(v1::DAEMON_PULL_IF_ENABLED);
  }
  req.set_cuda_device(options.cuda_device);
  for (const TensorRef& t : refs) {
    v1::TensorSpec* spec = req.add_tensors();
    spec->set_name(t.name);
    spec->set_dtype(ToProto(t.dtype));
    for (int64_t d : t.shape) spec->add_shape(d);
    for (int64_t d : t.global_shape) spec->add_global_shape(d);
    for (int64_t d : t.box_offset) spec->add_box_offset(d);
    spec->set_kind(ToProto(t.kind));
    spec->set_ema_eligible(t.ema_eligible);
    spec->set_optional(t.optional);
    v1::ReplicaGroup* replica = spec->mutable_replica();
    replica->set_kind(ToProto(t.replica.kind));
    replica->set_group_size(t.replica.group_size);
    replica->set_rank_in_group(t.replica.rank_in_group);
    replica->set_expert_id(t.replica.expert_id);
  }
  return req;
}

// The reply comes from another process: checked before its offsets are used.
absl::Status CheckRegisterReply(const v1::RegisterRequest& req, const v1::RegisterResponse& resp,
                                const std::vector<TensorRef>& refs, bool have_copier) {
  const uint32_t n = resp.num_slots();
  const shm::PullGeometry pull = shm::PullGeometryFor(static_cast<uint32_t>(refs.size()));
  // (Bounded first: the sums below must not wrap to a small segment whose
  // slots lie outside the mapping.)
  if (resp.slot_bytes() > shm::kMaxSlotBytes) {
    return absl::DataLossError(absl::StrCat("zccd's registration reply has slots of ",
                                            resp.slot_bytes(), " bytes"));
  }
  const uint64_t pull_offset = shm::SegmentBytes(n, resp.slot_bytes());
  if (!shm::ValidateNumSlots(n).ok() || resp.slot_bytes() % shm::kPageBytes != 0 ||
      resp.slots_offset() != shm::ControlBlockBytes() ||
      resp.segment_bytes() != pull_offset + (resp.daemon_pull() ? pull.bytes : 0) ||
      static_cast<size_t>(resp.placements_size()) != refs.size() ||
      (resp.daemon_pull() &&
       (resp.pull_channel_offset() != pull_offset || resp.pull_channel_bytes() != pull.bytes ||
        resp.pull_max_sources() != pull.max_sources ||
        resp.pull_regions_per_request() != pull.regions_per_request))) {
    return absl::DataLossError("zccd's registration reply has an inconsistent geometry");
  }
  if (resp.daemon_pull() && req.daemon_pull() == v1::DAEMON_PULL_OFF) {
    return absl::DataLossError("zccd granted daemon-pull, which this client did not ask for");
  }
  if (!resp.daemon_pull() && !have_copier) {
    return absl::DataLossError("zccd did not grant the daemon-pull this client requires");
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    const uint64_t nbytes = *format::TensorBytes(refs[i].dtype, refs[i].shape);
    if (p.name() != refs[i].name || p.nbytes() != nbytes ||
        (p.staged() && (p.offset() > resp.slot_bytes() || p.nbytes() > resp.slot_bytes() - p.offset()))) {
      return absl::DataLossError(
          absl::StrCat("zccd's placement of tensor '", refs[i].name, "' is inconsistent"));
    }
  }
  return absl::OkStatus();
}

// The copies of each slot: a region per staged tensor (all of them, and the
// EMA's).
void PlanRegions(const std::vector<TensorRef>& refs, client_internal::Session* s) {
  const uint32_t n = s->num_slots();
  s->full_regions.resize(n);
  s->ema_regions.resize(n);
  for (uint32_t slot = 0; slot < n; ++slot) {
    for (size_t i = 0; i < refs.size(); ++i) {
      const v1::TensorPlacement& p = s->resp.placements(i);
      if (!p.staged()) continue;  // another replica writes it
      CopyRegion region{refs[i].data, s->slot(slot) + p.offset(), p.nbytes()};
      s->full_regions[slot].push_back(region);
      if (refs[i].ema_eligible) s->ema_regions[slot].push_back(region);
    }
  }
}

// The copier of a registration zccd granted daemon-pull: zccd copies the
// device tensors through the segment's pull channel.
absl::StatusOr<std::shared_ptr<DeviceCopier>> DaemonPullCopierFor(const ClientOptions& options,
                                                                  const v1::RegisterResponse& resp,
                                                                  const shm::Segment& segment,
                                                                  size_t num_tensors) {
  const shm::PullGeometry pull = shm::PullGeometryFor(static_cast<uint32_t>(num_tensors));
  const uint64_t pull_offset = shm::SegmentBytes(resp.num_slots(), resp.slot_bytes());
  IpcPullCopierOptions pull_options;
  pull_options.device = options.cuda_device;
  pull_options.mapping.segment_base = segment.base();
  pull_options.mapping.staging_begin = resp.slots_offset();
  pull_options.mapping.staging_end = pull_offset;
  pull_options.mapping.channel = reinterpret_cast<shm::PullChannel*>(segment.base() + pull_offset);
  pull_options.mapping.geometry = pull;
  shm::ControlBlock* cb = segment.control();
  pull_options.daemon_alive =
      [cb, timeout = client_internal::EffectiveDaemonTimeout(options.daemon_timeout, resp)] {
        if (cb->closed.load(std::memory_order_acquire) != 0) return false;
        const uint64_t beat = cb->daemon_heartbeat_ns.load(std::memory_order_relaxed);
        const uint64_t now = shm::MonotonicNanos();
        return beat == 0 || beat > now || absl::Nanoseconds(now - beat) < timeout;
      };
  return options.daemon_pull_copier ? options.daemon_pull_copier(std::move(pull_options))
                                    : client_internal::DaemonPullCopier(std::move(pull_options));
}

}  // namespace

absl::StatusOr<std::shared_ptr<client_internal::Session>> Client::Impl::RegisterOnce(
    const std::vector<TensorRef>& refs, const client_internal::Stubs& via, bool prefetch_restore,
    uint64_t replaces_generation) {
  std::string on_timeline;
  {
    zcc::MutexLock lock(&mu);
    on_timeline = timeline;
  }
  const v1::RegisterRequest req =
      MakeRegisterRequest(options, refs, user_copier, prefetch_restore, replaces_generation,
                          instance, on_timeline);
  v1::RegisterResponse resp;
  auto ctx = Context();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(via.control->Register(ctx.get(), req, &resp)));
  ZCC_RETURN_IF_ERROR(CheckRegisterReply(req, resp, refs, copier != nullptr));
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       shm::Segment::Open(resp.shm_name(), resp.segment_bytes()));
  ZCC_RETURN_IF_ERROR(shm::ValidateGeometry(*segment.control(), resp.num_slots(),
                                            resp.slot_bytes(), resp.generation()));
  std::shared_ptr<DeviceCopier> session_copier = copier;
  if (resp.daemon_pull()) {
    // zccd copies this registration's device tensors; the copier is its own.
    ZCC_ASSIGN_OR_RETURN(session_copier, DaemonPullCopierFor(options, resp, segment, refs.size()));
    ZCC_LOG(INFO) << "zcc client: zccd copies this rank's device tensors (daemon-pull, CUDA device "
                  << options.cuda_device << ")";
  } else if (!resp.daemon_pull_unavailable().empty()) {
    ZCC_LOG(INFO) << "zcc client: copying on the trainer's side: "
                  << resp.daemon_pull_unavailable();
  }
  {
    // (The timeline zccd put the registration on: the client names it when
    // it registers again.)
    zcc::MutexLock lock(&mu);
    timeline = resp.timeline();
  }
  // Pinning starts here and goes on in the background (StagingPins).
  auto s = std::make_shared<client_internal::Session>(std::move(resp), std::move(segment),
                                                      session_copier);
  PlanRegions(refs, s.get());
  // Daemon-pull exports the tensors' IPC handles now, not in the first snapshot.
  ZCC_RETURN_IF_ERROR(s->copier->Prepare(s->full_regions[0]));
  return s;
}

}  // namespace zcc
