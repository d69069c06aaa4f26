#include "daemon/control/registrar.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/step_dirs.h"
#include "checkpoint/step_upload.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "daemon/control/job_placement.h"
#include "daemon/control/registration.h"
#include "daemon/control/relayout.h"
#include "daemon/control/request_limits.h"
#include "daemon/control/staging_setup.h"
#include "ema/ema_updater.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "proto/registration_waits.h"
#include "shm/control_block.h"
#include "shm/pull_channel.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

namespace {

// How often a failed write of a previous layout's snapshots is tried again.
constexpr int kRelayoutRetries = 2;

}  // namespace
namespace {

// Reserving this much takes tens of milliseconds: more, and the slots after
// the first are reserved in the background (RankSession::ReserveInBackground).
constexpr uint64_t kReserveAtOnceBytes = uint64_t{256} << 20;

// The request's fields that need nothing but the request and the config.
absl::Status CheckRequest(const v1::RegisterRequest& req, const Caller& caller,
                          const DaemonConfig& config, uint32_t* num_slots) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  const uid_t self = ::geteuid();
  if (self != 0 && caller.uid != self) {
    return absl::PermissionDeniedError(absl::StrCat(
        "zccd runs as uid ", self, " and serves only that user (uid ", caller.uid,
        " asked); run it as root to serve several users"));
  }
  if (req.world_size() == 0 || req.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", req.world_size(), " is outside [1, ", kMaxWorldSize, "]"));
  }
  if (req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", req.rank(), " is not below world_size ", req.world_size()));
  }
  ZCC_RETURN_IF_ERROR(ValidateRunTag(req.run_id(), "run_id"));
  ZCC_RETURN_IF_ERROR(ValidateRunTag(req.timeline(), "timeline"));
  *num_slots = req.num_slots() == 0 ? config.default_num_slots : req.num_slots();
  return shm::ValidateNumSlots(*num_slots);
}

// The EMA of the staged parameters the trainer marked eligible (none when it
// asked for no EMA), and their indices in `registered`.
struct EmaPlan {
  std::unique_ptr<ema::EmaUpdater> updater;
  std::vector<size_t> index;
};

absl::StatusOr<EmaPlan> PlanEma(const v1::RegisterRequest& req,
                                const std::vector<RegisteredTensor>& registered,
                                const std::function<absl::StatusOr<std::shared_ptr<ema::WorkerGroup>>()>& workers) {
  EmaPlan plan;
  if (req.ema_decay() == 0) return plan;
  if (!(req.ema_decay() > 0 && req.ema_decay() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ema_decay ", req.ema_decay(), " is outside (0, 1)"));
  }
  std::vector<ema::EmaTensorSpec> specs;
  for (size_t i = 0; i < registered.size(); ++i) {
    const RegisteredTensor& t = registered[i];
    if (!t.staged || !t.ema_eligible || t.kind != format::TensorKind::kParam) continue;
    if (t.dtype != format::DType::kF32 && t.dtype != format::DType::kBF16 &&
        t.dtype != format::DType::kF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' is EMA-eligible but ", format::DTypeName(t.dtype),
          "; an EMA needs F32, BF16 or F16 parameters"));
    }
    specs.push_back({t.name, t.dtype, t.nbytes / format::DTypeSize(t.dtype)});
    plan.index.push_back(i);
  }
  ema::EmaOptions options;
  options.decay = req.ema_decay();
  options.interval = std::max<uint32_t>(1, req.ema_interval());
  // zccd's EMA threads, shared by every rank's EMA.
  ZCC_ASSIGN_OR_RETURN(options.workers, workers());
  ZCC_ASSIGN_OR_RETURN(plan.updater, ema::EmaUpdater::Create(std::move(specs), options));
  return plan;
}

// Lays out the daemon-pull channel after the slots and attaches the rank to
// zccd's CUDA engine.
absl::StatusOr<std::unique_ptr<RankPuller>> AttachPuller(PullService& pull,
                                                         const v1::RegisterRequest& req,
                                                         const Caller& caller,
                                                         const shm::Segment& segment,
                                                         const Geometry& g) {
  auto* channel = reinterpret_cast<shm::PullChannel*>(segment.base() + g.pull_offset);
  shm::InitPullChannel(channel, g.pull, req.cuda_device());
  PullAttachment a;
  a.owner = absl::StrCat("job ", req.job_id(), " rank ", req.rank());
  a.uid = caller.uid;
  a.device = req.cuda_device();
  a.mapping.segment_base = segment.base();
  a.mapping.staging_begin = shm::ControlBlockBytes();
  a.mapping.staging_end = g.pull_offset;
  a.mapping.channel = channel;
  a.mapping.geometry = g.pull;
  a.on_failure = [owner = a.owner](uint64_t ticket, const absl::Status& why) {
    ZCC_LOG(WARNING) << owner << ": snapshot copy (ticket " << ticket
                     << ") failed and was dropped: " << why;
  };
  return pull.Attach(std::move(a));
}

void FillResponse(const Staging& staging, const Geometry& g, uint64_t generation,
                  const std::string& job_dir, const checkpoint::RankShards& shards,
                  const std::vector<RegisteredTensor>& registered,
                  const std::string& pull_unavailable, v1::RegisterResponse* resp) {
  resp->set_shm_name(staging.segment.name());
  resp->set_segment_bytes(g.segment_bytes);
  resp->set_num_slots(g.num_slots);
  resp->set_slot_bytes(g.slot_bytes);
  resp->set_slots_offset(shm::ControlBlockBytes());
  resp->set_generation(generation);
  resp->set_checkpoint_dir(job_dir);
  resp->set_manifest_hash(shards.manifest_hash);
  if (g.daemon_pull) {
    resp->set_daemon_pull(true);
    resp->set_pull_channel_offset(g.pull_offset);
    resp->set_pull_channel_bytes(g.pull.bytes);
    resp->set_pull_max_sources(g.pull.max_sources);
    resp->set_pull_regions_per_request(g.pull.regions_per_request);
  } else {
    resp->set_daemon_pull_unavailable(pull_unavailable);
  }
  for (const RegisteredTensor& t : registered) {
    v1::TensorPlacement* p = resp->add_placements();
    p->set_name(t.name);
    p->set_offset(t.staged ? t.slot_offset : 0);
    p->set_nbytes(t.nbytes);
    p->set_staged(t.staged);
  }
}

// What a registration will make, worked out from the request before any
// lock is taken.
struct RankPlan {
  Geometry g;
  std::vector<RegisteredTensor> registered;
  checkpoint::RankShards shards;
  std::string job_dir;  // <root>/<job_id>, made for the caller if new
  EmaPlan ema;
  std::string pull_unavailable;  // daemon-pull asked for if enabled, and why not
  // Owned by the trainer's uid, mode 0600: no other user can map the staging
  // segment (nor its restore and EMA buffers, made for the same owner).
  uid_t segment_owner = static_cast<uid_t>(-1);
  // The job's own route to its store, when it brought credentials.
  std::shared_ptr<void> store_route;
  // The tiered mode: the job's directory in the store (empty: none).
  std::string upload_dir;
};

absl::StatusOr<RankPlan> PlanRank(
    const v1::RegisterRequest& req, const Caller& caller, const Registrar::Deps& d,
    const std::function<absl::StatusOr<std::shared_ptr<ema::WorkerGroup>>()>& ema_workers) {
  const DaemonConfig& config = *d.config;
  RankPlan plan;
  ZCC_RETURN_IF_ERROR(CheckRequest(req, caller, config, &plan.g.num_slots));
  uint64_t manifest_hash = 0;
  ZCC_ASSIGN_OR_RETURN(plan.registered, ParseTensors(req, config, &manifest_hash));
  ZCC_RETURN_IF_ERROR(AssignStaged(req, &plan.registered));
  ZCC_ASSIGN_OR_RETURN(plan.shards, ShardsFor(req, &plan.registered, manifest_hash, config));
  ZCC_ASSIGN_OR_RETURN(JobPlacement place,
                       PlaceJob(req, caller, d.resolve_job_dir, d.route_job));
  plan.job_dir = std::move(place.job_dir);
  plan.upload_dir = std::move(place.upload_dir);
  plan.store_route = std::move(place.store_route);
  ZCC_ASSIGN_OR_RETURN(plan.ema, PlanEma(req, plan.registered, ema_workers));
  Geometry& g = plan.g;
  g.slot_bytes = plan.shards.layout.slot_bytes;
  if (g.slot_bytes > (~uint64_t{0}) / shm::kMaxSlots) {
    return absl::InvalidArgumentError("registration is too large");
  }
  ZCC_ASSIGN_OR_RETURN(g.daemon_pull, d.pull->Decide(req, &plan.pull_unavailable));
  g.pull = shm::PullGeometryFor(static_cast<uint32_t>(req.tensors_size()));
  g.pull_offset = shm::SegmentBytes(g.num_slots, g.slot_bytes);
  g.segment_bytes = g.pull_offset + (g.daemon_pull ? g.pull.bytes : 0);
  g.reserve_later = g.segment_bytes > kReserveAtOnceBytes;
  plan.segment_owner = ::geteuid() == 0 ? caller.uid : static_cast<uid_t>(-1);
  return plan;
}

// The job table's question: may this rank join (or found) its job?
AdmitRequest MakeAdmitRequest(const v1::RegisterRequest& req, const Caller& caller,
                              const RankPlan& plan, const Registrar::Deps& d) {
  const DaemonConfig& config = *d.config;
  AdmitRequest admit;
  admit.job_id = req.job_id();
  admit.rank = req.rank();
  admit.world_size = req.world_size();
  admit.job_dir = plan.job_dir;
  admit.upload_dir = plan.upload_dir;
  admit.node_local_root = req.node_local_root();
  admit.uid = caller.uid;
  admit.make_job = [&req, &caller, &plan, &d, &config] {
    JobOptions options;
    options.job_id = req.job_id();
    options.world_size = req.world_size();
    options.job_dir = plan.job_dir;
    options.retention.keep_last = req.keep_last() > 0 ? req.keep_last() : config.keep_last;
    options.retention.keep_every = config.keep_every;
    options.commit_timeout = config.commit_timeout;
    options.owner = {caller.uid, caller.gid};
    options.metrics = d.metrics;
    options.storage = d.shard_storage;
    options.store_route = plan.store_route;
    options.upload_dir = plan.upload_dir;
    options.upload_retention.keep_last =
        req.upload_keep_last() > 0 ? req.upload_keep_last() : config.keep_last;
    options.upload_retention.keep_every = config.keep_every;
    options.node_local_root = req.node_local_root();
    if (d.went_on) {
      options.on_went_on = [went_on = d.went_on, job_id = req.job_id(), uid = caller.uid,
                            job_dir = plan.job_dir](int64_t restored, absl::Time at) {
        went_on(job_id, uid, job_dir, restored, at);
      };
    }
    return std::make_shared<Job>(std::move(options));
  };
  admit.segment_bytes = plan.g.segment_bytes;
  admit.manifest_hash = plan.shards.manifest_hash;
  admit.num_slots = plan.g.num_slots;
  admit.slot_bytes = plan.g.slot_bytes;
  admit.ema_bytes = plan.ema.updater != nullptr ? plan.ema.updater->allocated_bytes() : 0;
  admit.segment_owner = plan.segment_owner;
  admit.reserve_now_bytes = plan.g.reserve_later
                                ? shm::ControlBlockBytes() + plan.g.slot_bytes
                                : plan.g.segment_bytes;
  admit.staging_budget_bytes = config.staging_budget_bytes;
  admit.pool = d.staging_pool;
  admit.replica_bytes = d.replica_bytes;
  if (d.shrink_replicas) {
    admit.shrink_replicas = [shrink = d.shrink_replicas, job_id = req.job_id()](
                                uint64_t target, uint32_t owner_uid,
                                std::vector<std::shared_ptr<const void>>* freed) {
      return shrink(target, job_id, owner_uid, freed);
    };
  }
  admit.alive = [&config, replaces = req.replaces_generation()](const RankSession& s) {
    // The registration this one replaces (its own trainer's) is taken over.
    if (replaces != 0 && s.options().generation == replaces) return false;
    return !s.ClientProcessGone() && s.ClientAlive(config.client_timeout);
  };
  return admit;
}

// Why `after` cannot replace `before` in place (empty: it can): only EXTRA
// tensors may differ, and only in size (DESIGN.md: state blobs grow).
std::string ReplacementRefused(const std::vector<RegisteredTensor>& before,
                               const std::vector<RegisteredTensor>& after) {
  if (before.size() != after.size()) {
    return absl::StrCat(after.size(), " tensors instead of ", before.size());
  }
  for (size_t i = 0; i < before.size(); ++i) {
    const RegisteredTensor& a = before[i];
    const RegisteredTensor& b = after[i];
    const bool blob = a.kind == format::TensorKind::kExtra && b.kind == a.kind &&
                      a.shape.size() == 1 && b.shape.size() == 1 && a.global() == a.shape &&
                      b.global() == b.shape;
    if (a.name != b.name || a.kind != b.kind || a.dtype != b.dtype ||
        a.optional != b.optional || a.ema_eligible != b.ema_eligible ||
        a.staged != b.staged || (!blob && (a.shape != b.shape || a.global() != b.global() ||
                                           a.box().offset != b.box().offset))) {
      return absl::StrCat("tensor ", i, " ('", b.name, "') differs from the registered '", a.name,
                          "' in more than an EXTRA blob's size");
    }
  }
  return "";
}

// The live session a registration replaces (RegisterRequest's
// replaces_generation: the same trainer process, only EXTRA blobs' sizes
// changed), still running; null when it replaces none. Refused:
// FailedPrecondition when there is no such session, PermissionDenied for
// another process, InvalidArgument when more than blob sizes changed.
absl::StatusOr<std::shared_ptr<RankSession>> FindReplaced(
    const v1::RegisterRequest& req, const std::vector<RegisteredTensor>& registered,
    const Caller& caller, const JobTable& jobs) {
  if (req.replaces_generation() == 0) return nullptr;
  std::shared_ptr<Job> job = jobs.Find(req.job_id());
  if (job == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", req.job_id(), "' is not registered: there is no registration to replace"));
  }
  ZCC_RETURN_IF_ERROR(job->Authorize(caller.uid));
  std::shared_ptr<RankSession> old = job->FindRank(req.rank());
  if (old == nullptr || old->options().generation != req.replaces_generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", req.rank(), " of job '", req.job_id(), "' holds no registration of generation ",
        req.replaces_generation(), " to replace"));
  }
  if (old->options().pid != caller.pid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", req.rank(), " of job '", req.job_id(), "' is registered by pid ",
        old->options().pid, "; only that process may replace its registration"));
  }
  if (std::string why = ReplacementRefused(old->registered(), registered); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot replace the registration of rank ", req.rank(), " of job '",
                     req.job_id(), "' in place: ", why));
  }
  return old;
}

RankSessionOptions SessionOptions(const v1::RegisterRequest& req, const Caller& caller,
                                  const RankPlan& plan, uint64_t generation, const Job& job,
                                  const Registrar::Deps& d) {
  RankSessionOptions options;
  options.job_dir = plan.job_dir;
  options.num_slots = plan.g.num_slots;
  options.save_every = req.save_every();
  options.persist_on_failure = req.persist_on_failure();
  // The kernel's word for the pid (in zccd's pid namespace), not the request's.
  options.pid = caller.pid;
  options.generation = generation;
  options.client_instance = req.client_instance();
  options.metrics = d.metrics;
  options.ema_interval = req.ema_interval();
  options.segment_owner = plan.segment_owner;
  options.fs_owner = job.options().owner;
  options.io.storage = d.shard_storage;
  options.write_pool = d.write_pool;
  options.timeline = req.timeline();  // (the client's: it registers again)
  if (d.replicate) {
    // Every replicate_every-th step, or each step the job checkpoints.
    const uint32_t every = d.config->peer.replicate_every;
    options.replicate_every = every > 0 ? every : req.save_every();
    options.on_replicate = [replicate = d.replicate, job_id = req.job_id(),
                            uid = static_cast<uint32_t>(job.options().owner.uid)](
                               checkpoint::RankStepBytes step) {
      replicate(job_id, uid, std::move(step));
    };
  }
  return options;
}

}  // namespace

absl::StatusOr<v1::RegisterResponse> Registrar::Register(
    const v1::RegisterRequest& req, const Caller& caller,
    const CallerWait& wait) {
  ZCC_ASSIGN_OR_RETURN(RankPlan plan,
                       PlanRank(req, caller, d_, [this] { return EmaWorkers(); }));
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<RankSession> replacing,
                       FindReplaced(req, plan.registered, caller, *d_.jobs));
  ZCC_RETURN_IF_ERROR(RetirePredecessors(req, plan.job_dir, caller, wait));
  if (wait.Gone()) {
    return absl::CancelledError("the client stopped waiting for its registration");
  }
  ZCC_ASSIGN_OR_RETURN(Admission admission, d_.jobs->Admit(MakeAdmitRequest(req, caller, plan, d_)));
  if (replacing != nullptr) {
    // (Claimed first: no retirement stops it beside this.)
    if (!replacing->BeginRetirement()) {
      return absl::UnavailableError(absl::StrCat(
          "the registration of job ", req.job_id(), " rank ", req.rank(), " this one replaces is "
          "being retired (zccd took its trainer for gone)"));
    }
    // Its published snapshots drained (written when due) before its EMA
    // moves over; its trainer waits in this request meanwhile.
    replacing->Stop();
  }
  // Should the registration fail from here on, the stopped session leaves
  // the job, so that its trainer's next registration is not refused for it.
  absl::Cleanup drop_replaced = [&replacing, &admission, &req] {
    if (replacing != nullptr) {
      admission.job()->RemoveRank(req.rank(), replacing->options().generation);
    }
  };
  WritePreviousLayout(admission);
  if (replacing == nullptr) ForgetEarlierRunParts(req, *admission.job());
  const uint64_t generation = admission.generation();
  const Geometry& g = plan.g;

  // Outside every daemon-wide lock from here: the reservation of a large
  // segment takes a while.
  ZCC_ASSIGN_OR_RETURN(
      Staging staging,
      PrepareStaging(absl::StrCat(d_.config->shm_prefix, ".", req.job_id(), ".r", req.rank(), ".g",
                                  generation),
                     g, plan.segment_owner, generation, plan.shards.manifest_hash,
                     std::move(admission.inherited()), std::move(admission.pooled()),
                     d_.before_reserve));
  v1::RegisterResponse resp;
  FillResponse(staging, g, generation, plan.job_dir, plan.shards, plan.registered,
               plan.pull_unavailable, &resp);
  resp.set_daemon_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(d_.config->heartbeat_interval)));
  // (Before a read ahead begins its own attempt, below.)
  resp.set_restore_attempts_before(
      staging.segment.control()->restore_attempt.load(std::memory_order_acquire));
  std::unique_ptr<RankPuller> puller;
  if (g.daemon_pull) {
    ZCC_ASSIGN_OR_RETURN(puller, AttachPuller(*d_.pull, req, caller, staging.segment, g));
  }
  if (!staging.inheritance.held.empty()) {
    ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank()
                  << ": adopted the previous trainer's staging segment with "
                  << staging.inheritance.held.size()
                  << " snapshot(s) for a restore from memory, newest step "
                  << staging.inheritance.held.front().step;
  }

  const std::shared_ptr<Job>& job = admission.job();
  Job* job_ptr = job.get();  // outlives the session's thread: see Job::~Job
  RankSessionOptions options = SessionOptions(req, caller, plan, generation, *job, d_);
  // Else the timeline of the previous trainer of the rank and run whose
  // snapshots this one adopts (it was restarted alone).
  const std::shared_ptr<RankSession>& previous = staging.inheritance.predecessor;
  if (options.timeline.empty() && previous != nullptr &&
      previous->shards().run_id == plan.shards.run_id) {
    options.timeline = previous->Timeline(std::numeric_limits<int64_t>::max());
  }
  resp.set_timeline(options.timeline);
  resp.set_timelines(true);
  options.on_trained_on = [job_ptr, rank = req.rank()](int64_t restored, int64_t step,
                                                        bool from_disk) {
    job_ptr->OnTrainedOn(rank, restored, step, from_disk);
  };
  auto session = std::make_shared<RankSession>(
      plan.shards, plan.registered, std::move(staging.segment), std::move(options),
      [job_ptr](const PersistEvent& event) { job_ptr->OnPersisted(event); },
      std::move(plan.ema.updater), std::move(plan.ema.index), std::move(staging.inheritance));
  if (puller != nullptr) session->AttachPuller(std::move(puller));
  session->ReserveInBackground(std::move(staging.to_reserve));
  // Before the reserver starts, so that it waits for the read.
  // (Not while the previous layout's newest step is being written: the
  // restore will want that one.)
  if (req.prefetch_restore() && !job->relayout_pending()) {
    d_.restores->StartPrefetch(*job, *session, req.rank());
  }
  if (replacing != nullptr) {
    const int64_t ema_step = replacing->ema_step().value_or(-1);
    if (ema_step >= 0) session->AdoptEmaOf(*replacing, ema_step);
    ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank()
                  << ": registration replaced in place (a state blob grew)"
                  << (ema_step >= 0 ? absl::StrCat("; its EMA, at step ", ema_step,
                                                   ", carried over")
                                    : std::string())
                  << "; the old registration's snapshots are dropped";
  }
  session->Start();
  std::shared_ptr<RankSession> replaced = job->PutRank(session);
  d_.housekeeper->PublishSessions();
  if (replaced != nullptr && replaced == replacing) {
    replacing.reset();  // stopped above; its segment goes with it
  } else if (replaced != nullptr) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": replacing the registration of pid " << replaced->options().pid
                     << ", whose trainer is gone";
    replaced->Stop();
  }
  ZCC_LOG(INFO) << "registered job " << req.job_id() << " rank " << req.rank() << "/"
                << req.world_size() << " uid " << caller.uid << " pid " << caller.pid << ": "
                << req.tensors_size() << " tensors, " << g.num_slots << " slots of "
                << g.slot_bytes << " bytes"
                << (g.daemon_pull
                        ? absl::StrCat(", daemon-pull on CUDA device ", req.cuda_device())
                        : std::string());
  return resp;
}

void Registrar::WritePreviousLayout(Admission& admission) {
  if (!admission.previous_layout().has_value()) return;
  auto previous = std::make_shared<PreviousLayout>(std::move(*admission.previous_layout()));
  admission.previous_layout().reset();
  // On a writer thread: a large state takes longer to write than a
  // registration may; the job's restores wait for it (Job::AwaitRelayout).
  d_.write_pool->Post([previous = std::move(previous), job = admission.job(), jobs = d_.jobs,
                       fs = d_.shard_storage]() mutable {
    const absl::Time began = absl::Now();
    // The snapshots are the only copy of their step: a failed write (a
    // disk's or a store's passing error; PersistRetainedStep leaves nothing
    // of it behind) is tried again twice, 1 s and then 2 s later, before
    // they go.
    auto written = PersistRetainedStep(*previous, fs);
    for (int retry = 1; !written.ok() && retry <= kRelayoutRetries; ++retry) {
      const absl::Duration wait = absl::Seconds(retry);
      ZCC_LOG(WARNING) << "job " << job->options().job_id
                       << ": writing the snapshots of its previous layout for the new one failed ("
                       << written.status() << "); trying again in " << wait;
      absl::SleepFor(wait);
      written = PersistRetainedStep(*previous, fs);
    }
    if (written.ok() && written->has_value()) job->OnCommittedOutside(**written, began);
    if (!written.ok()) {
      ZCC_LOG(WARNING) << "job " << job->options().job_id
                       << ": the snapshots of its previous layout could not be written for the "
                          "new one (it restores what its directory has): "
                       << written.status();
    }
    const uint64_t counted = previous->counted_bytes;
    previous.reset();  // the snapshots' segments go
    jobs->RelayoutWritten(job->options().job_id, counted);
    job->RelayoutDone();
  });
}

absl::StatusOr<std::shared_ptr<ema::WorkerGroup>> Registrar::EmaWorkers() {
  zcc::MutexLock lock(&ema_mu_);
  if (ema_workers_ == nullptr) {
    ZCC_ASSIGN_OR_RETURN(std::unique_ptr<ema::WorkerGroup> group,
                         ema::WorkerGroup::Create(static_cast<int>(d_.config->ema_threads)));
    ema_workers_ = std::move(group);
  }
  return ema_workers_;
}

void Registrar::ForgetEarlierRunParts(const v1::RegisterRequest& req, const Job& job) {
  // A step written straight to an object store commits in place once every
  // rank's manifest is there. A trainer that names its run is safe: the
  // commit refuses manifests of mixed runs. One that names none cannot be
  // told from an earlier run, whose parts of a step left uncommitted (its
  // other ranks died first) would complete that step when this run writes
  // it again, with their old bytes. So this rank's parts there go now,
  // before its trainer can write anything; every rank of a run registers
  // before the run writes a step (a trainer reconnecting to a restarted
  // zccd loses its part of a step in flight; the next due step is whole).
  // The tiered modes have their own (JobUploader); a POSIX root writes into
  // step-N.partial/, which retention removes once the commit timeout passed.
  // (Not removed here: this rank's part there may be the checkpoint-on-
  // failure its predecessor persisted a moment ago, or a previous layout's
  // step written for this one; only a run id tells the runs apart before
  // the timeout.)
  if (!req.run_id().empty() || !job.options().upload_dir.empty()) return;
  storage::Storage& fs = storage::StorageOrDefault(job.options().storage);
  const std::string& dir = job.options().job_dir;
  if (!checkpoint::CommitsInPlace(fs, dir)) return;
  auto forgot = checkpoint::ForgetRankParts(fs, dir, {req.rank()});
  if (!forgot.ok()) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": the parts an earlier run left in " << dir
                     << " could not be checked: " << forgot.status()
                     << " (give the trainer a run id: the commit then tells runs apart)";
  } else if (*forgot > 0) {
    ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": removed " << *forgot
                  << " manifest(s) an earlier run left in uncommitted steps of " << dir
                  << " (no run id: they would complete a step this run writes again)";
  }
}

absl::Status Registrar::RetirePredecessors(const v1::RegisterRequest& req,
                                           const std::string& job_dir, const Caller& caller,
                                           const CallerWait& wait) {
  // A trainer restarted faster than the housekeeping round noticed its
  // predecessor's death: retire the old registration first (its
  // checkpoint-on-failure, so a restore right after sees that step; its
  // snapshots kept for a restore from memory). A job resumed in another
  // layout (world size) retires every dead rank of the old one, so that the
  // old job, then idle, is replaced by the admission instead of refusing it.
  std::shared_ptr<Job> found = d_.jobs->Find(req.job_id());
  if (found == nullptr || !found->Authorize(caller.uid).ok()) return absl::OkStatus();
  std::vector<std::shared_ptr<RankSession>> predecessors;
  if (found->options().world_size != req.world_size() || found->options().job_dir != job_dir) {
    predecessors = found->Ranks();
  } else if (std::shared_ptr<RankSession> p = found->FindRank(req.rank())) {
    predecessors.push_back(p);
  }
  const absl::Duration timeout = d_.config->client_timeout;
  // A registration of the rank by the client registering now (the same
  // process and client instance), which holds none when it registers (not a
  // replacement): the client gave that one up (its answer never arrived, or
  // it took zccd for gone).
  auto given_up = [&req, &caller](const RankSession& s) {
    return req.client_instance() != 0 && req.replaces_generation() == 0 &&
           s.options().client_instance == req.client_instance() &&
           s.options().pid == caller.pid;
  };
  // A caller that can go away waits on the reaper's retirement until its
  // answer is due (or it went away), at most kMaxRetireWait from the
  // retirement's start; one that cannot (a test's direct call) has the
  // retirement run here, at most client_timeout for one already under way.
  std::optional<Housekeeper::RetireCaller> retire_caller;
  if (wait.gone != nullptr || wait.answer_by != absl::InfiniteFuture()) {
    retire_caller = Housekeeper::RetireCaller{wait.answer_by, wait.gone};
  }
  bool retired = false;
  for (const std::shared_ptr<RankSession>& p : predecessors) {
    const bool abandoned = given_up(*p);
    if (!abandoned && !p->ClientProcessGone() && p->ClientAlive(timeout)) continue;
    if (abandoned) {
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << p->shards().rank << ": pid "
                       << caller.pid << " registers again from the same client; its earlier "
                       << "registration (generation " << p->options().generation
                       << "), whose answer it did not take, is retired";
    }
    retired = true;
    if (!d_.housekeeper->RetireNow(found, p, timeout,
                                     retire_caller ? &*retire_caller : nullptr)) {
      return absl::UnavailableError(absl::StrCat(
          v1::kRegisterAgain, ": the rank's previous trainer is still retiring (zccd has been "
          "writing and committing the last checkpoint of job ", req.job_id(), " rank ",
          p->shards().rank, "'s previous trainer for ",
          absl::FormatDuration(absl::Trunc(absl::Now() - p->RetiringSince(), absl::Seconds(1))),
          "); the registration adopts its snapshots once that is done"));
    }
  }
  if (retired && wait.PastHalfway()) {
    // What is left of the deadline may not hold the admission and the
    // staging memory's reservation.
    return absl::UnavailableError(absl::StrCat(
        v1::kRegisterAgain, ": the previous trainer of job ", req.job_id(), " rank ", req.rank(),
        " retired late in this registration's time"));
  }
  return absl::OkStatus();
}

}  // namespace zcc::daemon
