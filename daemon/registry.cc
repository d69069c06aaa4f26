#include "daemon/registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "common/file_util.h"
#include "common/fs_identity.h"
#include "common/instance_lock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "daemon/job_directory.h"
#include "daemon/registration.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/pull_channel.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"

namespace zcc::daemon {
namespace {

constexpr uint32_t kMaxWorldSize = 1 << 20;
constexpr char kVersion[] = "zccd 0.1.0";

}  // namespace

Registry::Registry(DaemonConfig config, storage::Storage* shard_storage,
                   PullEngineFactory pull_engine)
    : config_(std::move(config)),
      shard_storage_(shard_storage),
      started_(absl::Now()),
      restores_(config_.shm_prefix, config_.max_slot_bytes, &metrics_),
      pull_(config_.daemon_pull, std::move(pull_engine)),
      housekeeper_(config_, &metrics_,
                   Housekeeper::Registry{[this] { return Jobs(); },
                                         [this] {
                                           zcc::MutexLock lock(&mu_);
                                           return StagingBytesLocked();
                                         },
                                         [this] {
                                           DropIdleJobs();
                                           restores_.ExpireSharedReads();
                                         }}) {
  zcc::MutexLock lock(&mu_);
  // Generations are unique across daemon restarts, so a client holding an old
  // one can never address a new registration by accident.
  next_generation_ = (static_cast<uint64_t>(absl::ToUnixMicros(started_)) << 8) | 1;
}

Registry::~Registry() { Shutdown(); }

absl::Status Registry::Start() {
  // One zccd per prefix: the segments under it are this zccd's alone, so
  // those found now were left by a previous instance, which is gone (the
  // kernel released its lock). A zccd beside a live one refuses to start
  // instead of removing the live one's memory tier and its trainers' slots.
  ZCC_ASSIGN_OR_RETURN(
      InstanceLock lock,
      InstanceLock::Acquire(ShmPrefixLockPath(config_.shm_prefix),
                            absl::StrCat("shared-memory prefix '", config_.shm_prefix, "'")));
  prefix_lock_.emplace(std::move(lock));
  const std::vector<std::string> stale = shm::Segment::ListWithPrefix(config_.shm_prefix + ".");
  size_t removed = 0;
  for (const std::string& name : stale) {
    const absl::Status st = shm::Segment::Remove(name);
    if (st.ok()) {
      ++removed;
    } else if (!absl::IsNotFound(st)) {
      // Not fatal: the name stays taken (a registration that draws it fails
      // and the trainer registers again with the next generation).
      ZCC_LOG(WARNING) << "could not remove stale staging segment: " << st;
    }
  }
  if (removed > 0) {
    ZCC_LOG(WARNING) << "removed " << removed << " of " << stale.size()
                     << " stale staging segment(s) left by a previous zccd instance";
  }
  ZCC_RETURN_IF_ERROR(Annotate(MakeDirs(config_.default_root), "default checkpoint root"));
  ZCC_RETURN_IF_ERROR(ScopedFsIdentity::Probe());
  RecoverJobDirectories(config_);
  housekeeper_.Start();
  return absl::OkStatus();
}

void Registry::BeginShutdown() {
  shutting_down_.store(true);
  for (const std::shared_ptr<Job>& job : Jobs()) {
    for (const auto& session : job->Ranks()) session->InterruptWaits();
  }
}

void Registry::Shutdown() {
  {
    zcc::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  housekeeper_.StopWork();
  std::map<std::string, std::shared_ptr<Job>> jobs;
  {
    zcc::MutexLock lock(&mu_);
    jobs.swap(jobs_);
  }
  for (auto& [id, job] : jobs) {
    for (auto& session : job->Ranks()) session->Stop();
  }
  jobs.clear();
  housekeeper_.StopHeartbeats();
}

absl::StatusOr<std::string> Registry::ResolveJobDir(const std::string& requested_root,
                                                    const std::string& job_id,
                                                    const Caller& caller, bool create) const {
  JobDirRequest request;
  request.root = requested_root;
  request.job_id = job_id;
  request.owner = {caller.uid, caller.gid};
  request.create = create;
  request.is_registered_job_dir = [this](const std::string& dir) {
    zcc::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (job->options().job_dir == dir) return true;
    }
    return false;
  };
  return daemon::ResolveJobDir(config_, request);
}

uint64_t Registry::StagingBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& session : job->Ranks()) total += session->segment_bytes();
    total += job->retained().bytes();
  }
  return total;
}

bool Registry::DropOneRetainedLocked(std::vector<RetainedSnapshots::Entry>* dropped) {
  for (const auto& [id, job] : jobs_) {
    if (std::optional<RetainedSnapshots::Entry> entry = job->retained().TakeFirstToExpire()) {
      dropped->push_back(std::move(*entry));
      ZCC_LOG(WARNING) << "job " << id
                       << ": dropped a rank's retained snapshots to make room in the staging "
                          "budget for a registration";
      return true;
    }
  }
  return false;
}

absl::StatusOr<v1::RegisterResponse> Registry::Register(const v1::RegisterRequest& req,
                                                        const Caller& caller) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  if (shutting_down_.load()) return absl::UnavailableError("zccd is shutting down");
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
  const uint32_t num_slots = req.num_slots() == 0 ? config_.default_num_slots : req.num_slots();
  ZCC_RETURN_IF_ERROR(shm::ValidateNumSlots(num_slots));
  uint64_t manifest_hash = 0;
  ZCC_ASSIGN_OR_RETURN(std::vector<RegisteredTensor> registered,
                       ParseTensors(req, config_, &manifest_hash));
  ZCC_RETURN_IF_ERROR(AssignStaged(req, &registered));
  ZCC_ASSIGN_OR_RETURN(checkpoint::RankShards shards,
                       ShardsFor(req, &registered, manifest_hash, config_));
  // The job's directory, made for the caller if new; checkpoints of this job
  // id under this root belong to whoever made them.
  ZCC_ASSIGN_OR_RETURN(std::string job_dir,
                       ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, true));
  // The EMA of the staged parameters the trainer marked eligible.
  std::unique_ptr<ema::EmaUpdater> ema;
  std::vector<size_t> ema_index;
  if (req.ema_decay() != 0) {
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
      ema_index.push_back(i);
    }
    ema::EmaOptions ema_options;
    ema_options.decay = req.ema_decay();
    ema_options.interval = std::max<uint32_t>(1, req.ema_interval());
    ema_options.threads = static_cast<int>(config_.ema_threads);
    ZCC_ASSIGN_OR_RETURN(ema, ema::EmaUpdater::Create(std::move(specs), ema_options));
  }
  const uint64_t slot_bytes = shards.layout.slot_bytes;
  if (slot_bytes > (~uint64_t{0}) / shm::kMaxSlots) {
    return absl::InvalidArgumentError("registration is too large");
  }
  // Daemon-pull: the channel follows the slots in the segment.
  std::string pull_unavailable;
  ZCC_ASSIGN_OR_RETURN(const bool daemon_pull, pull_.Decide(req, &pull_unavailable));
  const shm::PullGeometry pull_geometry =
      shm::PullGeometryFor(static_cast<uint32_t>(req.tensors_size()));
  const uint64_t pull_offset = shm::SegmentBytes(num_slots, slot_bytes);
  const uint64_t segment_bytes = pull_offset + (daemon_pull ? pull_geometry.bytes : 0);
  // Reserving this much takes tens of milliseconds: more, and the slots after
  // the first are reserved in the background.
  constexpr uint64_t kReserveAtOnceBytes = uint64_t{256} << 20;
  const bool reserve_later = segment_bytes > kReserveAtOnceBytes;

  // A trainer restarted faster than the housekeeping round noticed its
  // predecessor's death: retire the old registration first (its
  // checkpoint-on-failure, so a restore right after sees that step; its
  // snapshots kept for a restore from memory). A job resumed in another
  // layout (world size) retires every dead rank of the old one, so that the
  // old job, then idle, is replaced below instead of refusing the new one.
  {
    std::shared_ptr<Job> found;
    {
      zcc::MutexLock lock(&mu_);
      auto it = jobs_.find(req.job_id());
      if (it != jobs_.end() && it->second->Authorize(caller.uid).ok()) found = it->second;
    }
    std::vector<std::shared_ptr<RankSession>> predecessors;
    if (found != nullptr && (found->options().world_size != req.world_size() ||
                             found->options().job_dir != job_dir)) {
      predecessors = found->Ranks();
    } else if (found != nullptr) {
      if (std::shared_ptr<RankSession> p = found->FindRank(req.rank())) predecessors.push_back(p);
    }
    for (const std::shared_ptr<RankSession>& p : predecessors) {
      if (p->ClientProcessGone() || !p->ClientAlive(config_.client_timeout)) {
        housekeeper_.RetireNow(found, p, config_.client_timeout);
      }
    }
  }

  std::shared_ptr<RankSession> replaced;
  // Destroyed after the lock is released: a replaced idle job (with what it
  // retained), retained snapshots dropped for room or not adopted.
  std::shared_ptr<Job> dropped_job;
  std::vector<RetainedSnapshots::Entry> dropped;
  v1::RegisterResponse resp;
  {
    zcc::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("zccd is shutting down");
    std::shared_ptr<Job>& job = jobs_[req.job_id()];
    // A job whose ranks have all left and whose steps are all committed or
    // dropped is replaced by a registration with another world size or
    // directory: the job resumed with another layout (its checkpoints
    // restore into any layout).
    if (job != nullptr && job->Authorize(caller.uid).ok() && job->idle() &&
        (job->options().world_size != req.world_size() || job->options().job_dir != job_dir)) {
      ZCC_LOG(INFO) << "job " << req.job_id() << " re-registered with world_size "
                    << req.world_size() << " (was " << job->options().world_size << ")";
      dropped_job = std::move(job);
    }
    if (job == nullptr) {
      JobOptions options;
      options.job_id = req.job_id();
      options.world_size = req.world_size();
      options.job_dir = job_dir;
      options.retention.keep_last = req.keep_last() > 0 ? req.keep_last() : config_.keep_last;
      options.retention.keep_every = config_.keep_every;
      options.commit_timeout = config_.commit_timeout;
      options.owner = {caller.uid, caller.gid};
      options.metrics = &metrics_;
      job = std::make_shared<Job>(std::move(options));
    } else if (absl::Status st = job->Authorize(caller.uid); !st.ok()) {
      return st;
    } else if (job->options().world_size != req.world_size() ||
               job->options().job_dir != job_dir) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", req.job_id(), "' is already registered with world_size ",
          job->options().world_size, " at ", job->options().job_dir, "; this request has ",
          req.world_size(), " at ", job_dir, " (two jobs cannot share an id)"));
    }
    std::shared_ptr<RankSession> existing = job->FindRank(req.rank());
    if (existing != nullptr && !existing->ClientProcessGone() &&
        existing->ClientAlive(config_.client_timeout)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", req.rank(), " of job '", req.job_id(), "' is already registered by pid ",
          existing->options().pid, ", which is still alive"));
    }
    // Owned by the trainer's uid, mode 0600: no other user can map it (nor
    // its restore and EMA buffers, made for the same owner).
    const uid_t segment_owner = self == 0 ? caller.uid : static_cast<uid_t>(-1);
    // What the rank's previous trainer left in memory: adopted when it was
    // registered with the same tensors and slots, so its snapshots can be
    // restored from memory (and no new segment is made); dropped otherwise.
    std::optional<RetainedSnapshots::Entry> inherited = job->retained().Take(req.rank());
    if (inherited.has_value()) {
      const RankSession& old = *inherited->session;
      if (old.shards().manifest_hash != shards.manifest_hash ||
          old.options().num_slots != num_slots || old.shards().layout.slot_bytes != slot_bytes ||
          old.options().segment_owner != segment_owner || old.segment_bytes() != segment_bytes) {
        ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank()
                      << ": the snapshots kept from the previous trainer do not match this "
                         "registration (other tensors or slots); dropping them";
        dropped.push_back(std::move(*inherited));
        inherited.reset();
      }
    }
    const uint64_t needed = inherited.has_value() ? 0 : segment_bytes;
    uint64_t in_use = StagingBytesLocked() - (existing ? existing->segment_bytes() : 0);
    // Retained snapshots give way to a registration: the oldest go first.
    while (config_.staging_budget_bytes > 0 && in_use + needed > config_.staging_budget_bytes &&
           DropOneRetainedLocked(&dropped)) {
      in_use = StagingBytesLocked() - (existing ? existing->segment_bytes() : 0);
    }
    if (config_.staging_budget_bytes > 0 && in_use + needed > config_.staging_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "registration needs ", segment_bytes, " bytes of staging memory; ", in_use, " of the ",
          config_.staging_budget_bytes, "-byte budget are in use"));
    }
    const uint64_t generation = next_generation_++;
    Inheritance inheritance;
    std::optional<shm::Segment> adopted;
    if (inherited.has_value()) {
      adopted.emplace(inherited->session->TakeSegment());
      inheritance.predecessor = std::move(inherited->session);
    } else {
      // A large segment: the control block and slot 0 now, the other slots
      // in the background (RankSession::ReserveInBackground), so that
      // registering 1 GB of state does not wait for 3 GB of staging to be
      // zeroed. A small one whole, at once: every slot is free on return.
      ZCC_ASSIGN_OR_RETURN(
          shm::Segment created,
          shm::Segment::Create(absl::StrCat(config_.shm_prefix, ".", req.job_id(), ".r",
                                            req.rank(), ".g", generation),
                               segment_bytes, segment_owner,
                               reserve_later ? shm::ControlBlockBytes() + slot_bytes
                                             : segment_bytes));
      if (daemon_pull && reserve_later) {
        ZCC_RETURN_IF_ERROR(created.Reserve(pull_offset, pull_geometry.bytes));
      }
      adopted.emplace(std::move(created));
    }
    shm::Segment segment = std::move(*adopted);
    const std::string shm_name = segment.name();
    shm::InitControlBlock(segment.control(), num_slots, slot_bytes, generation,
                          shards.manifest_hash);
    // Every slot but the first (and those adopted with a snapshot) waits for
    // its memory; an adopted segment's is reserved already, which is quick.
    std::vector<uint32_t> to_reserve;
    if (reserve_later) {
      shm::SlotRing ring(segment.control(), num_slots);
      for (uint32_t slot = 1; slot < num_slots; ++slot) {
        bool held = false;
        if (inherited.has_value()) {
          for (const SlotSnapshot& s : inherited->snapshots) held = held || s.slot == slot;
        }
        if (held) continue;
        ring.HoldBack(slot);
        to_reserve.push_back(slot);
      }
    }
    std::unique_ptr<RankPuller> puller;
    if (daemon_pull) {
      auto* channel = reinterpret_cast<shm::PullChannel*>(segment.base() + pull_offset);
      shm::InitPullChannel(channel, pull_geometry, req.cuda_device());
      PullAttachment a;
      a.owner = absl::StrCat("job ", req.job_id(), " rank ", req.rank());
      a.uid = caller.uid;
      a.device = req.cuda_device();
      a.mapping.segment_base = segment.base();
      a.mapping.staging_begin = shm::ControlBlockBytes();
      a.mapping.staging_end = pull_offset;
      a.mapping.channel = channel;
      a.mapping.geometry = pull_geometry;
      a.on_failure = [owner = a.owner](uint64_t ticket, const absl::Status& why) {
        ZCC_LOG(WARNING) << owner << ": snapshot copy (ticket " << ticket
                         << ") failed and was dropped: " << why;
      };
      ZCC_ASSIGN_OR_RETURN(puller, pull_.Attach(std::move(a)));
    }
    if (inherited.has_value()) {
      // One slot stays free at least, so the trainer can snapshot before it
      // restores (which lets the held ones go).
      shm::SlotRing ring(segment.control(), num_slots);
      for (const SlotSnapshot& s : inherited->snapshots) {
        if (inheritance.held.size() + 1 >= num_slots) break;
        ring.Hold(s.slot, s.step);
        inheritance.held.push_back(s);
      }
      ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank()
                    << ": adopted the previous trainer's staging segment with "
                    << inheritance.held.size() << " snapshot(s) for a restore from memory, newest step "
                    << inheritance.held.front().step;
    }

    RankSessionOptions options;
    options.job_dir = job_dir;
    options.num_slots = num_slots;
    options.save_every = req.save_every();
    options.persist_on_failure = req.persist_on_failure();
    // The kernel's word for the pid (in zccd's pid namespace), not the request's.
    options.pid = caller.pid;
    options.generation = generation;
    options.metrics = &metrics_;
    options.ema_interval = req.ema_interval();
    options.segment_owner = segment_owner;
    options.fs_owner = job->options().owner;
    options.io.storage = shard_storage_;
    Job* job_ptr = job.get();  // outlives the session's thread: see Job::~Job
    auto session = std::make_shared<RankSession>(
        shards, registered, std::move(segment), options,
        [job_ptr](const PersistEvent& event) { job_ptr->OnPersisted(event); }, std::move(ema),
        std::move(ema_index), std::move(inheritance));
    if (puller != nullptr) session->AttachPuller(std::move(puller));
    session->ReserveInBackground(std::move(to_reserve));
    // Before the reserver starts, so that it waits for the read.
    if (req.prefetch_restore()) restores_.StartPrefetch(*job, *session, req.rank());
    session->Start();
    replaced = job->PutRank(session);

    resp.set_shm_name(shm_name);
    resp.set_segment_bytes(segment_bytes);
    resp.set_num_slots(num_slots);
    resp.set_slot_bytes(slot_bytes);
    resp.set_slots_offset(shm::ControlBlockBytes());
    resp.set_generation(generation);
    resp.set_checkpoint_dir(job_dir);
    resp.set_manifest_hash(shards.manifest_hash);
    if (daemon_pull) {
      resp.set_daemon_pull(true);
      resp.set_pull_channel_offset(pull_offset);
      resp.set_pull_channel_bytes(pull_geometry.bytes);
      resp.set_pull_max_sources(pull_geometry.max_sources);
      resp.set_pull_regions_per_request(pull_geometry.regions_per_request);
    } else {
      resp.set_daemon_pull_unavailable(pull_unavailable);
    }
    for (const RegisteredTensor& t : registered) {
      v1::TensorPlacement* p = resp.add_placements();
      p->set_name(t.name);
      p->set_offset(t.staged ? t.slot_offset : 0);
      p->set_nbytes(t.nbytes);
      p->set_staged(t.staged);
    }
  }
  housekeeper_.PublishSessions();
  if (replaced != nullptr) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": replacing the registration of pid " << replaced->options().pid
                     << ", whose trainer is gone";
    replaced->Stop();
  }
  ZCC_LOG(INFO) << "registered job " << req.job_id() << " rank " << req.rank() << "/"
                << req.world_size() << " uid " << caller.uid << " pid " << caller.pid << ": "
                << req.tensors_size()
                << " tensors, " << num_slots << " slots of " << slot_bytes << " bytes"
                << (daemon_pull ? absl::StrCat(", daemon-pull on CUDA device ", req.cuda_device())
                                : std::string());
  return resp;
}

absl::StatusOr<std::shared_ptr<Job>> Registry::FindJob(const std::string& job_id,
                                                       const Caller& caller) const {
  ZCC_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::shared_ptr<Job> job;
  {
    zcc::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' is not registered here"));
    }
    job = it->second;
  }
  ZCC_RETURN_IF_ERROR(job->Authorize(caller.uid));
  return job;
}

absl::StatusOr<std::pair<std::shared_ptr<Job>, std::shared_ptr<RankSession>>> Registry::FindSession(
    const std::string& job_id, uint32_t rank, uint64_t generation, const Caller& caller) const {
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id, caller));
  std::shared_ptr<RankSession> session = job->FindRank(rank);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " of job '", job_id,
                                            "' is not registered"));
  }
  if (session->options().generation != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of job '", job_id, "' was registered again since (stale generation)"));
  }
  return std::make_pair(job, session);
}

absl::Status Registry::Unregister(const v1::UnregisterRequest& req, const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  // Drain first: snapshots already published are persisted and reported to
  // the job while the rank still belongs to it.
  session->Stop();
  // A trainer that exits may be started again (a job restarted by its
  // launcher): its snapshots stay for a restore from memory. Kept before the
  // rank leaves the job, which housekeeping would drop as idle otherwise.
  housekeeper_.Retain(*job, session);
  if (job->RemoveRank(req.rank(), req.generation()) == nullptr) {
    return absl::NotFoundError("registration already removed");
  }
  housekeeper_.PublishSessions();  // drops the list's reference to the session
  {
    zcc::MutexLock lock(&mu_);
    auto it = jobs_.find(req.job_id());
    if (it != jobs_.end() && it->second == job && job->droppable()) jobs_.erase(it);
  }
  ZCC_LOG(INFO) << "unregistered job " << req.job_id() << " rank " << req.rank();
  return absl::OkStatus();
}

absl::StatusOr<v1::RestoreResponse> Registry::Restore(const v1::RestoreRequest& req,
                                                      const Caller& caller,
                                                      std::function<bool()> client_gone) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  ZCC_RETURN_IF_ERROR(session->restore_buffers().CheckRoom());
  return restores_.Restore(*job, *session, req, [this, &client_gone] {
    return shutting_down_.load() || (client_gone && client_gone());
  });
}

absl::StatusOr<v1::RestoreCandidatesResponse> Registry::RestoreCandidates(
    const v1::RestoreCandidatesRequest& req, const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  return restores_.Candidates(*job, *session, req.owned_only());
}

absl::StatusOr<v1::ReadEmaResponse> Registry::ReadEma(const v1::ReadEmaRequest& req,
                                                      const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  // A trainer waiting for the EMA to include its last snapshot asks once
  // and is answered when it does (or when its wait is up).
  constexpr double kMaxEmaWaitS = 300;
  const double wait_s = std::isfinite(req.wait_s()) ? std::clamp(req.wait_s(), 0.0, kMaxEmaWaitS) : 0;
  return session->CopyEma(restores_.BufferName("ema", req.job_id(), req.rank(), req.generation()),
                          req.has_min_step() ? req.min_step() : -1,
                          absl::Now() + absl::Seconds(wait_s));
}

absl::Status Registry::RestoreDone(const v1::RestoreDoneRequest& req, const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  ZCC_ASSIGN_OR_RETURN(int64_t step, session->restore_buffers().Remove(req.restore_id()));
  job->EndRestore(req.rank(), step);
  return absl::OkStatus();
}

absl::StatusOr<v1::SaveNowResponse> Registry::SaveNow(const v1::SaveNowRequest& req,
                                                      const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(req.job_id(), caller));
  v1::SaveNowResponse resp;
  for (auto& session : job->Ranks()) {
    session->RequestSave();
    resp.set_ranks_flagged(resp.ranks_flagged() + 1);
  }
  return resp;
}

absl::StatusOr<v1::PutJobFileResponse> Registry::PutJobFile(const v1::PutJobFileRequest& req,
                                                            const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(req.job_id(), caller));
  ZCC_RETURN_IF_ERROR(ValidateJobFileName(req.name()));
  if (req.content().size() > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job file '", req.name(), "' is ",
                                                   req.content().size(), " bytes; the limit is ",
                                                   kMaxJobFileBytes));
  }
  // With the job owner's identity, like every write into the job directory.
  ScopedFsIdentity as_owner(job->options().owner);
  const std::string dir = JoinPath(job->options().job_dir, kJobMetadataDirName);
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
  }
  const std::string path = JoinPath(dir, req.name());
  ZCC_RETURN_IF_ERROR(WriteFileAtomic(path, req.content()));
  ZCC_LOG(INFO) << "job " << req.job_id() << ": stored " << path << " (" << req.content().size()
                << " bytes)";
  v1::PutJobFileResponse resp;
  resp.set_path(path);
  return resp;
}

absl::StatusOr<v1::CollectGarbageResponse> Registry::CollectGarbage(
    const v1::CollectGarbageRequest& req, const Caller& caller) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  auto registered = FindJob(req.job_id(), caller);
  if (!registered.ok() && registered.status().code() != absl::StatusCode::kNotFound) {
    return registered.status();
  }
  std::shared_ptr<Job> job = registered.ok() ? *registered : nullptr;
  std::string job_dir;
  checkpoint::RetentionResult result;
  if (job != nullptr && req.checkpoint_root().empty()) {
    job_dir = job->options().job_dir;
    ZCC_ASSIGN_OR_RETURN(result, job->CollectGarbage());
  } else {
    ZCC_ASSIGN_OR_RETURN(job_dir, ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, false));
    ScopedFsIdentity as_owner(DirOwner(job_dir));
    checkpoint::RetentionPolicy policy;
    policy.keep_last = config_.keep_last;
    policy.keep_every = config_.keep_every;
    ZCC_ASSIGN_OR_RETURN(result,
                         checkpoint::ApplyRetention(job_dir, policy, {}, config_.commit_timeout));
  }
  v1::CollectGarbageResponse resp;
  for (int64_t step : result.removed_steps) resp.add_removed_steps(step);
  for (const std::string& p : result.removed_partials) resp.add_removed_partials(p);
  auto kept = checkpoint::ListCommittedSteps(job_dir);
  if (kept.ok()) {
    for (int64_t step : *kept) resp.add_kept_steps(step);
  }
  return resp;
}

v1::StatusResponse Registry::GetStatus(const v1::StatusRequest& req, const Caller& caller) const {
  v1::StatusResponse resp;
  resp.set_version(kVersion);
  resp.set_pid(::getpid());
  resp.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  std::vector<std::shared_ptr<Job>> jobs;
  {
    zcc::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      // Other users' jobs are private: not even their ids are shown.
      if ((req.job_id().empty() || req.job_id() == id) && job->Authorize(caller.uid).ok()) {
        jobs.push_back(job);
      }
    }
  }
  pull_.FillStatus(&resp);
  for (const auto& job : jobs) job->FillStatus(resp.add_jobs());
  return resp;
}

absl::StatusOr<v1::ListCheckpointsResponse> Registry::ListCheckpoints(
    const v1::ListCheckpointsRequest& req, const Caller& caller) const {
  ZCC_ASSIGN_OR_RETURN(std::string job_dir,
                       ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, false));
  ScopedFsIdentity as_owner(DirOwner(job_dir));
  {
    zcc::MutexLock lock(&mu_);
    auto it = jobs_.find(req.job_id());
    if (it != jobs_.end() && it->second->options().job_dir == job_dir) {
      ZCC_RETURN_IF_ERROR(it->second->Authorize(caller.uid));
    }
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<int64_t> steps, checkpoint::ListCommittedSteps(job_dir));
  auto latest = checkpoint::ReadLatest(job_dir);
  v1::ListCheckpointsResponse resp;
  for (int64_t step : steps) {
    const std::string dir = JoinPath(job_dir, format::StepDirName(step));
    auto record = checkpoint::ReadCommitRecord(dir);
    v1::CheckpointInfo* info = resp.add_checkpoints();
    info->set_step(step);
    info->set_path(dir);
    info->set_is_latest(latest.ok() && *latest == step);
    if (record.ok()) {
      info->set_world_size(record->world_size);
      info->set_total_bytes(record->total_bytes);
      info->set_committed_at(record->committed_at);
    }
  }
  return resp;
}

bool Registry::Healthy() const { return housekeeper_.Healthy(); }

std::vector<std::shared_ptr<Job>> Registry::Jobs() const {
  zcc::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

void Registry::DropIdleJobs() {
  zcc::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    it = it->second->droppable() ? jobs_.erase(it) : std::next(it);
  }
}

}  // namespace zcc::daemon
