#include "daemon/registry.h"

#include "daemon/restorer.h"

#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "format/checksum.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/segment.h"

namespace zcc::daemon {
namespace {

constexpr uint32_t kMaxWorldSize = 1 << 20;
constexpr int kMaxDims = 16;
constexpr char kVersion[] = "zccd 0.1.0";

absl::StatusOr<format::DType> FromProtoDType(v1::DType dtype) {
  switch (dtype) {
    case v1::F32: return format::DType::kF32;
    case v1::F16: return format::DType::kF16;
    case v1::BF16: return format::DType::kBF16;
    case v1::F64: return format::DType::kF64;
    case v1::I64: return format::DType::kI64;
    case v1::I32: return format::DType::kI32;
    case v1::I16: return format::DType::kI16;
    case v1::I8: return format::DType::kI8;
    case v1::U8: return format::DType::kU8;
    case v1::BOOL: return format::DType::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
}

absl::StatusOr<shm::FileGroup> FromProtoKind(v1::TensorKind kind) {
  switch (kind) {
    case v1::PARAM: return shm::FileGroup::kModel;
    case v1::OPTIM: return shm::FileGroup::kOptim;
    case v1::EXTRA: return shm::FileGroup::kExtra;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor kind ", static_cast<int>(kind), " is not PARAM, OPTIM or EXTRA"));
  }
}

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
    auto dtype = FromProtoDType(spec.dtype());
    if (!dtype.ok()) return fail(dtype.status());
    t.dtype = *dtype;
    auto group = FromProtoKind(spec.kind());
    if (!group.ok()) return fail(group.status());
    t.group = *group;
    if (spec.shape_size() > kMaxDims) {
      return fail(absl::InvalidArgumentError(absl::StrCat(spec.shape_size(), " dimensions; at most ",
                                                          kMaxDims)));
    }
    t.shape.assign(spec.shape().begin(), spec.shape().end());
    auto nbytes = format::TensorBytes(t.dtype, t.shape, config.max_slot_bytes);
    if (!nbytes.ok()) return fail(nbytes.status());
    t.nbytes = *nbytes;
    t.ema_eligible = spec.ema_eligible();
    hash.Update(t.name.data(), t.name.size() + 1);
    const int64_t header[3] = {static_cast<int64_t>(t.dtype), static_cast<int64_t>(t.group),
                               static_cast<int64_t>(t.shape.size())};
    hash.Update(header, sizeof(header));
    hash.Update(t.shape.data(), t.shape.size() * sizeof(int64_t));
    out.push_back(std::move(t));
  }
  *manifest_hash = hash.Digest();
  return out;
}

// Decides which tensors this rank writes (and therefore stages): its own, and
// the replicated ones the shard assigner gives it.
absl::Status AssignStaged(const v1::RegisterRequest& req, std::vector<RegisteredTensor>* tensors) {
  for (RegisteredTensor& t : *tensors) t.staged = true;
  return absl::OkStatus();
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
  std::vector<shm::LayoutInput> inputs;
  for (const RegisteredTensor& t : *registered) {
    if (!t.staged) continue;
    inputs.push_back({t.name, t.nbytes, t.group});
    checkpoint::RankTensor rt;
    rt.name = t.name;
    rt.dtype = t.dtype;
    rt.shape = t.shape;
    rt.group = t.group;
    rt.nbytes = t.nbytes;
    shards.tensors.push_back(std::move(rt));
  }
  ZCC_ASSIGN_OR_RETURN(shards.layout, shm::ComputeSlotLayout(inputs, config.max_slot_bytes));
  size_t k = 0;
  for (RegisteredTensor& t : *registered) {
    if (!t.staged) continue;
    t.slot_offset = shards.layout.placements[k].offset;
    shards.tensors[k].slot_offset = t.slot_offset;
    ++k;
  }
  return shards;
}

}  // namespace

Registry::Registry(DaemonConfig config)
    : config_(std::move(config)), started_(absl::Now()) {
  absl::MutexLock lock(&mu_);
  // Generations are unique across daemon restarts, so a client holding an old
  // one can never address a new registration by accident.
  next_generation_ = (static_cast<uint64_t>(absl::ToUnixMicros(started_)) << 8) | 1;
}

Registry::~Registry() { Shutdown(); }

absl::Status Registry::Start() {
  const std::vector<std::string> stale = shm::Segment::ListWithPrefix(config_.shm_prefix + ".");
  for (const std::string& name : stale) ZCC_RETURN_IF_ERROR(shm::Segment::Remove(name));
  if (!stale.empty()) {
    ZCC_LOG(WARNING) << "removed " << stale.size()
                     << " stale staging segment(s) left by a previous zccd instance";
  }
  ZCC_RETURN_IF_ERROR(Annotate(MakeDirs(config_.default_root), "default checkpoint root"));
  housekeeper_ = std::thread([this] { HousekeepingLoop(); });
  return absl::OkStatus();
}

void Registry::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  std::map<std::string, std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs.swap(jobs_);
  }
  for (auto& [id, job] : jobs) {
    for (auto& session : job->Ranks()) session->Stop();
  }
  jobs.clear();
}

absl::StatusOr<std::string> Registry::ResolveJobDir(const std::string& requested_root,
                                                    const std::string& job_id,
                                                    bool create) const {
  ZCC_RETURN_IF_ERROR(ValidateJobId(job_id));
  const std::string root = requested_root.empty() ? config_.default_root : requested_root;
  if (root[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint root '", root,
                                                   "' must be an absolute path"));
  }
  auto canonical_root = CanonicalPath(root);
  if (!canonical_root.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint root ", root, " is not usable: ", canonical_root.status().message()));
  }
  bool allowed = false;
  for (const std::string& allowed_root : config_.allowed_roots) {
    auto under = IsUnderRoot(*canonical_root, allowed_root);
    if (under.ok() && *under) allowed = true;
  }
  if (!allowed) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint root ", root, " is not under an allowed root (",
        absl::StrJoin(config_.allowed_roots, ", "), "); start zccd with --allowed_roots"));
  }
  const std::string job_dir = JoinPath(*canonical_root, job_id);
  if (create) {
    ZCC_RETURN_IF_ERROR(MakeDirs(job_dir));
  } else if (!PathExists(job_dir)) {
    return absl::NotFoundError(absl::StrCat("no checkpoints for job '", job_id, "' under ", root));
  }
  // A job directory planted as a symlink out of the root is refused.
  auto inside = IsUnderRoot(job_dir, *canonical_root);
  if (!inside.ok() || !*inside) {
    return absl::PermissionDeniedError(absl::StrCat(job_dir, " resolves outside ", root));
  }
  return job_dir;
}

uint64_t Registry::StagingBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& session : job->Ranks()) total += session->segment_bytes();
  }
  return total;
}

absl::StatusOr<v1::RegisterResponse> Registry::Register(const v1::RegisterRequest& req) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  if (req.world_size() == 0 || req.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", req.world_size(), " is outside [1, ", kMaxWorldSize, "]"));
  }
  if (req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", req.rank(), " is not below world_size ", req.world_size()));
  }
  const uint32_t num_slots = req.num_slots() == 0 ? config_.default_num_slots : req.num_slots();
  if (num_slots < shm::kMinSlots || num_slots > shm::kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("num_slots ", num_slots, " is outside [",
                                                   shm::kMinSlots, ", ", shm::kMaxSlots, "]"));
  }
  uint64_t manifest_hash = 0;
  ZCC_ASSIGN_OR_RETURN(std::vector<RegisteredTensor> registered,
                       ParseTensors(req, config_, &manifest_hash));
  ZCC_RETURN_IF_ERROR(AssignStaged(req, &registered));
  ZCC_ASSIGN_OR_RETURN(checkpoint::RankShards shards,
                       ShardsFor(req, &registered, manifest_hash, config_));
  ZCC_ASSIGN_OR_RETURN(std::string job_dir, ResolveJobDir(req.checkpoint_root(), req.job_id(), true));
  const uint64_t slot_bytes = shards.layout.slot_bytes;
  const uint64_t segment_bytes = shm::SegmentBytes(num_slots, slot_bytes);
  if (slot_bytes > (~uint64_t{0}) / shm::kMaxSlots) {
    return absl::InvalidArgumentError("registration is too large");
  }

  std::shared_ptr<RankSession> replaced;
  v1::RegisterResponse resp;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("zccd is shutting down");
    std::shared_ptr<Job>& job = jobs_[req.job_id()];
    if (job == nullptr) {
      JobOptions options;
      options.job_id = req.job_id();
      options.world_size = req.world_size();
      options.job_dir = job_dir;
      options.retention.keep_last = req.keep_last() > 0 ? req.keep_last() : config_.keep_last;
      options.retention.keep_every = config_.keep_every;
      options.commit_timeout = config_.commit_timeout;
      job = std::make_shared<Job>(std::move(options));
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
    const uint64_t in_use = StagingBytesLocked() - (existing ? existing->segment_bytes() : 0);
    if (config_.staging_budget_bytes > 0 && in_use + segment_bytes > config_.staging_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "registration needs ", segment_bytes, " bytes of staging memory; ", in_use, " of the ",
          config_.staging_budget_bytes, "-byte budget are in use"));
    }
    const uint64_t generation = next_generation_++;
    const std::string shm_name = absl::StrCat(config_.shm_prefix, ".", req.job_id(), ".r",
                                              req.rank(), ".g", generation);
    ZCC_ASSIGN_OR_RETURN(shm::Segment segment, shm::Segment::Create(shm_name, segment_bytes));
    shm::InitControlBlock(segment.control(), num_slots, slot_bytes, generation,
                          shards.manifest_hash);

    RankSessionOptions options;
    options.job_dir = job_dir;
    options.num_slots = num_slots;
    options.save_every = req.save_every();
    options.pid = req.pid();
    options.generation = generation;
    Job* job_ptr = job.get();  // outlives the session's thread: see Job::~Job
    auto session = std::make_shared<RankSession>(
        shards, registered, std::move(segment), options,
        [job_ptr](const PersistEvent& event) { job_ptr->OnPersisted(event); });
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
    for (const RegisteredTensor& t : registered) {
      v1::TensorPlacement* p = resp.add_placements();
      p->set_name(t.name);
      p->set_offset(t.staged ? t.slot_offset : 0);
      p->set_nbytes(t.nbytes);
      p->set_staged(t.staged);
    }
  }
  if (replaced != nullptr) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": replacing the registration of pid " << replaced->options().pid
                     << ", whose trainer is gone";
    replaced->Stop();
  }
  ZCC_LOG(INFO) << "registered job " << req.job_id() << " rank " << req.rank() << "/"
                << req.world_size() << " pid " << req.pid() << ": " << req.tensors_size()
                << " tensors, " << num_slots << " slots of " << slot_bytes << " bytes";
  return resp;
}

absl::StatusOr<std::pair<std::shared_ptr<Job>, std::shared_ptr<RankSession>>> Registry::FindSession(
    const std::string& job_id, uint32_t rank, uint64_t generation) const {
  ZCC_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' is not registered"));
    }
    job = it->second;
  }
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

absl::Status Registry::Unregister(const v1::UnregisterRequest& req) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation()));
  auto& [job, session] = found;
  // Drain first: snapshots already published are persisted and reported to
  // the job while the rank still belongs to it.
  session->Stop();
  if (job->RemoveRank(req.rank(), req.generation()) == nullptr) {
    return absl::NotFoundError("registration already removed");
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(req.job_id());
  if (it != jobs_.end() && it->second == job && job->idle()) jobs_.erase(it);
  ZCC_LOG(INFO) << "unregistered job " << req.job_id() << " rank " << req.rank();
  return absl::OkStatus();
}

absl::Status Registry::VerifyCached(const std::string& step_dir) {
  auto record = checkpoint::ReadCommitRecord(step_dir);
  if (!record.ok()) return record.status();
  absl::MutexLock lock(&verify_mu_);
  const auto key = std::make_pair(step_dir, record->manifest_hash);
  auto it = verified_.find(key);
  if (it != verified_.end()) return it->second;
  const absl::Time start = absl::Now();
  const absl::Status status = checkpoint::VerifyStep(step_dir).status();
  if (status.ok()) {
    ZCC_LOG(INFO) << "verified " << step_dir << " in "
                  << absl::FormatDuration(absl::Now() - start);
  } else {
    ZCC_LOG(ERROR) << "checkpoint " << step_dir << " failed verification: " << status.message();
  }
  if (verified_.size() > 256) verified_.clear();
  verified_[key] = status;
  return status;
}

absl::StatusOr<v1::RestoreResponse> Registry::Restore(const v1::RestoreRequest& req) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation()));
  auto& [job, session] = found;
  const std::string& job_dir = job->options().job_dir;
  ZCC_ASSIGN_OR_RETURN(
      checkpoint::RestoreChoice choice,
      checkpoint::ChooseRestoreStep(job_dir, req.step() < 0 ? -1 : req.step(),
                                    [this](const std::string& dir) { return VerifyCached(dir); }));
  for (const std::string& why : choice.rejected) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": restore skipped " << why;
  }
  const std::string step_dir = JoinPath(job_dir, format::StepDirName(choice.step));
  ZCC_ASSIGN_OR_RETURN(format::CommitRecord record, checkpoint::ReadCommitRecord(step_dir));
  if (record.world_size != job->options().world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        format::StepDirName(choice.step), " was written by ", record.world_size,
        " ranks; this job has ", job->options().world_size, " (resharding is not supported)"));
  }
  const std::string shm_name =
      absl::StrCat(config_.shm_prefix, ".", req.job_id(), ".r", req.rank(), ".restore.g",
                   req.generation(), ".", next_restore_seq_.fetch_add(1));
  job->BeginRestore(req.rank(), choice.step);
  auto buffer = ReadRestoreBuffer(step_dir, record.world_size, session->registered(), shm_name,
                                  config_.max_slot_bytes);
  if (!buffer.ok()) {
    job->EndRestore(req.rank(), choice.step);
    return Annotate(buffer.status(), absl::StrCat("restore of ", format::StepDirName(choice.step)));
  }
  v1::RestoreResponse resp;
  resp.set_step(choice.step);
  for (const std::string& why : choice.rejected) resp.add_skipped_steps(why);
  resp.set_shm_name(shm_name);
  resp.set_segment_bytes(buffer->segment.size());
  resp.set_data_offset(buffer->data_offset);
  const auto& registered = session->registered();
  for (size_t i = 0; i < registered.size(); ++i) {
    v1::TensorPlacement* p = resp.add_placements();
    p->set_name(registered[i].name);
    p->set_offset(buffer->offsets[i]);
    p->set_nbytes(registered[i].nbytes);
    p->set_staged(true);
  }
  resp.set_restore_id(session->AddRestoreBuffer(std::move(buffer->segment), choice.step));
  ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": restored "
                << format::StepDirName(choice.step) << " into " << shm_name;
  return resp;
}

absl::Status Registry::RestoreDone(const v1::RestoreDoneRequest& req) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation()));
  auto& [job, session] = found;
  ZCC_ASSIGN_OR_RETURN(int64_t step, session->RemoveRestoreBuffer(req.restore_id()));
  job->EndRestore(req.rank(), step);
  return absl::OkStatus();
}

absl::StatusOr<v1::SaveNowResponse> Registry::SaveNow(const v1::SaveNowRequest& req) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req.job_id());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job '", req.job_id(), "' is not registered here"));
    }
    job = it->second;
  }
  v1::SaveNowResponse resp;
  for (auto& session : job->Ranks()) {
    session->RequestSave();
    resp.set_ranks_flagged(resp.ranks_flagged() + 1);
  }
  return resp;
}

absl::StatusOr<v1::CollectGarbageResponse> Registry::CollectGarbage(
    const v1::CollectGarbageRequest& req) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(req.job_id()));
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req.job_id());
    if (it != jobs_.end()) job = it->second;
  }
  std::string job_dir;
  checkpoint::RetentionResult result;
  if (job != nullptr && req.checkpoint_root().empty()) {
    job_dir = job->options().job_dir;
    ZCC_ASSIGN_OR_RETURN(result, job->CollectGarbage());
  } else {
    ZCC_ASSIGN_OR_RETURN(job_dir, ResolveJobDir(req.checkpoint_root(), req.job_id(), false));
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

v1::StatusResponse Registry::GetStatus(const v1::StatusRequest& req) const {
  v1::StatusResponse resp;
  resp.set_version(kVersion);
  resp.set_pid(::getpid());
  resp.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (req.job_id().empty() || req.job_id() == id) jobs.push_back(job);
    }
  }
  for (const auto& job : jobs) job->FillStatus(resp.add_jobs());
  return resp;
}

absl::StatusOr<v1::ListCheckpointsResponse> Registry::ListCheckpoints(
    const v1::ListCheckpointsRequest& req) const {
  ZCC_ASSIGN_OR_RETURN(std::string job_dir, ResolveJobDir(req.checkpoint_root(), req.job_id(), false));
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

void Registry::HousekeepingLoop() {
  mu_.Lock();
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), config_.heartbeat_interval);
    if (stopping_) break;
    std::vector<std::shared_ptr<Job>> jobs;
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
    mu_.Unlock();

    for (const auto& job : jobs) {
      for (const auto& session : job->Ranks()) {
        session->Heartbeat();
        const bool gone = session->ClientProcessGone();
        if (gone || !session->ClientAlive(config_.client_timeout)) {
          const uint32_t rank = session->shards().rank;
          ZCC_LOG(WARNING) << "job " << job->options().job_id << " rank " << rank << ": trainer pid "
                           << session->options().pid
                           << (gone ? " exited" : " stopped sending heartbeats")
                           << "; dropping its registration";
          session->Stop();
          job->RemoveRank(rank, session->options().generation);
        }
      }
      job->Tick();
    }

    mu_.Lock();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      it = it->second->idle() ? jobs_.erase(it) : std::next(it);
    }
  }
  mu_.Unlock();
}

}  // namespace zcc::daemon
