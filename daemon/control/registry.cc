#include "daemon/control/registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "common/file_util.h"
#include "common/fs_identity.h"
#include "common/instance_lock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "common/validate.h"
#include "daemon/jobs/job_directory.h"
#include "daemon/memory/system_room.h"
#include "format/manifest.h"
#include "proto/checkpoint_info.h"
#include "shm/segment.h"
#include "storage/posix_storage.h"
#include "storage/whole_file.h"

namespace zcc::daemon {
namespace {

constexpr char kVersion[] = "zccd 0.1.0";

}  // namespace

Registry::Registry(DaemonConfig config, storage::Storage* shard_storage,
                   PullEngineFactory pull_engine, std::function<void(const std::string&, uint64_t)> before_reserve)
    : config_(std::move(config)),
      stores_(config_.object_store_roots, shard_storage),
      shard_storage_(stores_.storage()),
      started_(absl::Now()),
      write_pool_(static_cast<int>(config_.writer_threads)),
      jobs_(started_),
      replicas_(config_.peer.replica_budget_bytes,
                [this](const peer::ReplicaStore::Held& held) {
                  metrics_.peer_replica_bytes().Set(static_cast<double>(held.bytes - held.own_bytes));
                  metrics_.peer_own_copy_bytes().Set(static_cast<double>(held.own_bytes));
                },
                [this](const peer::ReplicaKey& manifest) {
                  // The job's newest whole step may have moved on (PinMemoryTier).
                  const auto pinned = replicas_.pinned(manifest.job_id, manifest.uid);
                  if (pinned.has_value() && *pinned >= manifest.step) return;
                  if (auto replicator = CurrentReplicator()) {
                    replicator->PinSoon(manifest.job_id, manifest.uid);
                  }
                },
                // Replicas count in the staging budget, after the trainers'
                // staging and the pool made ready for them.
                [this]() -> uint64_t {
                  const uint64_t budget = config_.staging_budget_bytes;
                  if (budget == 0) return std::numeric_limits<uint64_t>::max();
                  const uint64_t used = jobs_.StagingBytes() + staging_pool_.bytes();
                  return budget > used ? budget - used : 0;
                },
                jobs_.admissions()),
      recovered_(shard_storage_),
      staging_pool_(StagingPool::Options{
          config_.shm_prefix + ".pool", config_.staging_pool_bytes,
          config_.staging_pool_entry_bytes,
          [this](uint64_t pooled) {
            uint64_t room = PoolRoom(ReadSystemMemory(), pooled);
            if (const uint64_t budget = config_.staging_budget_bytes; budget > 0) {
              const uint64_t used = jobs_.StagingBytes() + replicas_.bytes_held();
              room = std::min(room, budget > used ? budget - used : 0);
            }
            return room;
          },
          [this](uint64_t pooled) {
            metrics_.staging_pool_bytes().Set(static_cast<double>(pooled));
          }}),
      restores_(config_.shm_prefix, config_.max_slot_bytes, &metrics_, &recovered_,
                &staging_pool_),
      pull_(config_.daemon_pull, std::move(pull_engine)),
      housekeeper_(config_, &metrics_,
                   Housekeeper::Registry{[this] { return jobs_.All(); },
                                         [this] { return jobs_.StagingBytes(); },
                                         [this] {
                                           restores_.ExpireSharedReads();
                                           return jobs_.DropIdle();
                                         },
                                         [this] { staging_pool_.Recheck(); },
                                         [this] { ExportPeerMetrics(); }}),
      registrar_(Registrar::Deps{
          &config_, &metrics_, shard_storage_, &write_pool_, &jobs_, &pull_, &restores_,
          &housekeeper_, &staging_pool_,
          [this](const std::string& root, const std::string& job_id, const Caller& caller,
                 bool job_credentials) {
            return ResolveJobDir(root, job_id, caller, true, job_credentials);
          },
          [this](const std::string& root, const std::string& job_id,
                 const v1::StoreCredentials& c) -> absl::StatusOr<std::shared_ptr<void>> {
            storage::s3::Credentials credentials;
            credentials.access_key_id = c.access_key_id();
            credentials.secret_access_key = c.secret_access_key();
            credentials.session_token = c.session_token();
            ZCC_ASSIGN_OR_RETURN(std::shared_ptr<ObjectStoreRoots::JobRoute> route,
                                 stores_.RouteJob(root, job_id, std::move(credentials)));
            return std::shared_ptr<void>(std::move(route));
          },
          std::move(before_reserve),
          config_.peer.listen.empty()
              ? nullptr
              : std::function<void(const std::string&, uint32_t, checkpoint::RankStepBytes)>(
                    [this](const std::string& job_id, uint32_t uid,
                           checkpoint::RankStepBytes step) {
                      ReplicateStep(job_id, uid, std::move(step));
                    }),
          [this] { return replicas_.bytes_held(); },
          [this](uint64_t target, const std::string& job_id, uint32_t uid,
                 std::vector<std::shared_ptr<const void>>* freed) {
            return replicas_.ShrinkTo(target, job_id, uid, freed);
          },
          config_.peer.listen.empty()
              ? nullptr
              : std::function<void(const std::string&, uint32_t, const std::string&, int64_t,
                                   absl::Time)>(
                    [this](const std::string& job_id, uint32_t uid, const std::string& job_dir,
                           int64_t restored, absl::Time at) {
                      JobWentOn(job_id, uid, job_dir, restored, at);
                    })}) {}

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
  staging_pool_.Start();
  return absl::OkStatus();
}

void Registry::BeginShutdown() {
  shutting_down_.store(true);
  for (const std::shared_ptr<Job>& job : jobs_.All()) {
    for (const auto& session : job->Ranks()) session->InterruptWaits();
  }
}

void Registry::Shutdown() {
  if (stopped_.exchange(true)) return;
  housekeeper_.StopWork();
  // Steps of the peer tier being written to disk: their pulls end now (a
  // later restore recovers them again).
  recovered_.CancelAll();
  std::vector<RecoveredStepWriter> writing;
  {
    zcc::MutexLock lock(&peer_mu_);
    writing.swap(writing_recovered_);
  }
  for (RecoveredStepWriter& w : writing) {
    w.step->Cancel();  // shown or not any more (a newer one took its place)
    LeaveIdlePriority(w.thread.native_handle());
    w.thread.join();
  }
  std::map<std::string, std::shared_ptr<Job>> jobs = jobs_.Close();
  for (auto& [id, job] : jobs) {
    for (auto& session : job->Ranks()) session->Stop();
  }
  // The commits the last writes made possible, and a previous layout's
  // step being written for its job (a writer thread's task that uses the
  // job table).
  for (auto& [id, job] : jobs) {
    job->AwaitCommitter();
    job->AwaitRelayout();
  }
  jobs.clear();
  // The replicator's thread ends here, joined by this thread: nothing hands
  // it steps any more, and what it holds is already in replicas_.
  std::shared_ptr<peer::Replicator> replicator;
  {
    zcc::MutexLock lock(&peer_mu_);
    replicator.swap(replicator_);
  }
  replicator.reset();
  housekeeper_.StopHeartbeats();
}

absl::StatusOr<std::string> Registry::ResolveJobDir(const std::string& requested_root,
                                                    const std::string& job_id,
                                                    const Caller& caller, bool create,
                                                    bool job_credentials) const {
  JobDirRequest request;
  request.root = requested_root;
  request.job_id = job_id;
  request.owner = {caller.uid, caller.gid};
  request.create = create;
  request.is_registered_job_dir = [this](const std::string& dir) { return jobs_.HasJobDir(dir); };
  request.stores = &stores_;
  request.job_credentials = job_credentials;
  request.storage = shard_storage_;
  return daemon::ResolveJobDir(config_, request);
}

absl::StatusOr<v1::RegisterResponse> Registry::Register(const v1::RegisterRequest& req,
                                                        const Caller& caller,
                                                        const CallerWait& wait) {
  if (shutting_down_.load()) return absl::UnavailableError("zccd is shutting down");
  ZCC_ASSIGN_OR_RETURN(v1::RegisterResponse resp, registrar_.Register(req, caller, wait));
  if (wait.Gone()) {
    // Nobody would map or heartbeat it: undone as the trainer's own close
    // keeping its snapshots would be (what it inherited goes on with them).
    v1::UnregisterRequest undo;
    undo.set_job_id(req.job_id());
    undo.set_rank(req.rank());
    undo.set_generation(resp.generation());
    undo.set_keep_snapshots(true);
    const absl::Status undone = Unregister(undo, caller);
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": pid "
                     << caller.pid << " stopped waiting for its registration before it was "
                     << "answered; "
                     << (undone.ok() ? std::string("undone")
                                     : absl::StrCat("undoing it failed: ", undone.message()));
    return absl::CancelledError(
        "the registration was undone: the client stopped waiting for it before it was answered");
  }
  zcc::MutexLock lock(&peer_mu_);
  resp.set_peer_address(peer_address_);
  return resp;
}

absl::StatusOr<std::shared_ptr<Job>> Registry::FindJob(const std::string& job_id,
                                                       const Caller& caller) const {
  ZCC_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::shared_ptr<Job> job = jobs_.Find(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' is not registered here"));
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
  // (Claimed first: no retirement stops it beside this.)
  if (!session->BeginRetirement()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", req.rank(), " of job '", req.job_id(), "' is being retired (zccd took its trainer "
        "for gone, or a registration replaces it)"));
  }
  // Drain first: snapshots already published are persisted and reported to
  // the job while the rank still belongs to it, and what they made
  // committable is committed before the trainer's close returns.
  session->Stop();
  job->AwaitCommitter();
  // A trainer that asks (it expects to be started again: a launcher's
  // restart) leaves its snapshots for a restore from memory, kept before the
  // rank leaves the job, which housekeeping would drop as idle otherwise.
  // A clean close releases the staging memory with the session.
  if (req.keep_snapshots()) {
    housekeeper_.Retain(*job, session);
  } else {
    ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": closed; releasing "
                  << session->segment_bytes() << " bytes of staging memory";
  }
  if (job->RemoveRank(req.rank(), req.generation()) == nullptr) {
    return absl::NotFoundError("registration already removed");
  }
  housekeeper_.PublishSessions();  // drops the list's reference to the session
  housekeeper_.LetGo(jobs_.DropIfIdle(req.job_id(), job.get()));
  housekeeper_.LetGo(std::move(job));  // the trainer's close never joins a committer
  ZCC_LOG(INFO) << "unregistered job " << req.job_id() << " rank " << req.rank();
  return absl::OkStatus();
}

absl::StatusOr<v1::RestoreResponse> Registry::Restore(const v1::RestoreRequest& req,
                                                      const Caller& caller,
                                                      const CallerWait& wait) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  ZCC_RETURN_IF_ERROR(session->restore_buffers().CheckRoom());
  auto stop = [this, &wait] { return shutting_down_.load() || wait.Gone(); };
  if (!job->AwaitRelayout(stop)) {
    return absl::CancelledError("the restore was given up while the job's previous layout was "
                                "being written");
  }
  RecoverFromPeers(job, req.rank());
  absl::StatusOr<v1::RestoreResponse> resp = restores_.Restore(*job, *session, req, stop);
  if (resp.ok() && wait.Gone()) {
    // The caller gave up as the read ended: its buffer goes now, not when
    // the rank goes (a retry would find the buffers it may hold taken).
    const absl::Status removed = session->restore_buffers().Remove(resp->restore_id()).status();
    if (!removed.ok()) ZCC_LOG(WARNING) << "restore buffer of a caller gone: " << removed;
    return absl::CancelledError("the caller of the restore went away");
  }
  // Should the trainer go on from it, the job knows (Job::OnTrainedOn).
  if (resp.ok()) {
    // (A step not yet taken up from disk counts as one from disk: refused
    // here, so that an answer that forgot to say never does.)
    if (!resp->has_source()) {
      // (Its buffer goes now: the client, refused, never releases it.)
      const absl::Status removed = session->restore_buffers().Remove(resp->restore_id()).status();
      return absl::InternalError(absl::StrCat("the restore of step ", resp->step(),
                                              " did not say which tier it came from",
                                              removed.ok() ? "" : "; ", removed.message()));
    }
    // (The step's own timeline where it was read from a directory.)
    session->NoteRestored(resp->step(), resp->source() == v1::RESTORE_SOURCE_DISK,
                          resp->has_timeline() ? std::optional<std::string>(resp->timeline())
                                               : std::nullopt);
    resp->set_timeline(session->Timeline(resp->step() + 1));
  }
  return resp;
}

absl::StatusOr<v1::RestoreCandidatesResponse> Registry::RestoreCandidates(
    const v1::RestoreCandidatesRequest& req, const Caller& caller) {
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  if (!job->AwaitRelayout([this] { return shutting_down_.load(); })) {
    return absl::UnavailableError("zccd is shutting down");
  }
  RecoverFromPeers(job, req.rank());
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
  ZCC_RETURN_IF_ERROR(ValidateRunTag(req.timeline(), "timeline"));
  ZCC_ASSIGN_OR_RETURN(auto found, FindSession(req.job_id(), req.rank(), req.generation(), caller));
  auto& [job, session] = found;
  // Every rank holds the step (the client records the timeline whatever
  // the answer, so the session adopts it whatever becomes of the buffer).
  if (!req.timeline().empty()) session->AdoptTimeline(req.timeline());
  // (The step's pin against retention ended with its read: what the
  // client copies from is in memory. Ending it here again took away the pin
  // of another restore of the same rank and step still reading.)
  return session->restore_buffers().Remove(req.restore_id()).status();
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
  // Through the daemon's storage, beside the checkpoints (the job directory
  // is 0750: what it holds is as private).
  storage::Storage& fs = storage::StorageOrDefault(shard_storage_);
  const std::string dir = JoinPath(job->options().job_dir, kJobMetadataDirName);
  ZCC_RETURN_IF_ERROR(fs.MakeDirs(dir));
  const std::string path = JoinPath(dir, req.name());
  ZCC_RETURN_IF_ERROR(storage::WriteFileAtomic(fs, path, req.content()));
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
  if (job != nullptr && !req.checkpoint_root().empty()) {
    // The root named is the job's own: the job's retention, with its pins
    // (steps being restored, partials being written) and in turn with its
    // commits, not the daemon's defaults over it.
    ZCC_ASSIGN_OR_RETURN(const std::string named,
                         ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, false));
    if (named != job->options().job_dir) job = nullptr;
  }
  if (job != nullptr) {
    job_dir = job->options().job_dir;
    ZCC_ASSIGN_OR_RETURN(result, job->CollectGarbage());
  } else {
    ZCC_ASSIGN_OR_RETURN(job_dir, ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, false));
    ScopedFsIdentity as_owner(DirOwner(job_dir));
    checkpoint::RetentionPolicy policy;
    policy.keep_last = config_.keep_last;
    policy.keep_every = config_.keep_every;
    ZCC_ASSIGN_OR_RETURN(result,
                         checkpoint::ApplyRetention(job_dir, policy, checkpoint::RetentionGuard(),
                                                   config_.commit_timeout, shard_storage_));
  }
  v1::CollectGarbageResponse resp;
  for (int64_t step : result.removed_steps) resp.add_removed_steps(step);
  for (const std::string& p : result.removed_partials) resp.add_removed_partials(p);
  auto kept = checkpoint::ListCommittedSteps(job_dir, shard_storage_);
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
  for (const std::shared_ptr<Job>& job : jobs_.All()) {
    // Other users' jobs are private: not even their ids are shown.
    if ((req.job_id().empty() || req.job_id() == job->options().job_id) &&
        job->Authorize(caller.uid).ok()) {
      jobs.push_back(job);
    }
  }
  pull_.FillStatus(&resp);
  resp.set_staging_pool_bytes(staging_pool_.bytes());
  resp.set_staging_pool_target_bytes(config_.staging_pool_bytes);
  resp.set_staging_pool_taken(staging_pool_.taken());
  resp.set_staging_budget_bytes(config_.staging_budget_bytes);
  resp.set_staging_bytes(jobs_.StagingBytes());
  {
    zcc::MutexLock lock(&peer_mu_);
    if (peer_endpoint_.has_value()) {
      v1::PeerStatus* peer = resp.mutable_peer();
      *peer = *peer_endpoint_;
      const peer::ReplicaStore::Held held = replicas_.held();
      peer->set_replica_bytes_held(held.bytes);
      peer->set_replica_budget_bytes(replicas_.budget_bytes());
      peer->set_replicas_held(static_cast<uint32_t>(held.pieces));
      peer->set_own_copy_bytes(held.own_bytes);
      peer->set_own_copy_pieces(static_cast<uint32_t>(held.own_pieces));
      peer->set_replica_bytes_incoming(held.incoming_bytes);
      peer->set_replicas_dropped(replicas_.pieces_dropped());
    }
  }
  for (const auto& job : jobs) {
    v1::JobStatus* js = resp.add_jobs();
    job->FillStatus(js);
    FillPeerStatus(*job, js);
  }
  return resp;
}

absl::StatusOr<v1::ListCheckpointsResponse> Registry::ListCheckpoints(
    const v1::ListCheckpointsRequest& req, const Caller& caller) const {
  ZCC_ASSIGN_OR_RETURN(std::string job_dir,
                       ResolveJobDir(req.checkpoint_root(), req.job_id(), caller, false));
  ScopedFsIdentity as_owner(DirOwner(job_dir));
  std::string upload_dir;  // a registered tiered job's store
  bool node_local = false;
  if (std::shared_ptr<Job> job = jobs_.Find(req.job_id());
      job != nullptr && job->options().job_dir == job_dir) {
    ZCC_RETURN_IF_ERROR(job->Authorize(caller.uid));
    upload_dir = job->options().upload_dir;
    node_local = job->options().node_local_root;
  }
  // A step of the peer tier read in place is listed as restores see it,
  // under the job directory, until it is written there (marked so only
  // when it was shown all through the listing).
  std::shared_ptr<peer::RecoveredStep> in_place = recovered_.Find(job_dir);
  ZCC_ASSIGN_OR_RETURN(std::vector<checkpoint::CommittedStep> steps,
                       checkpoint::ListCheckpoints(job_dir, &recovered_));
  if (recovered_.Find(job_dir) != in_place) in_place = nullptr;
  constexpr char kInPlace[] = "peer tier, in memory";
  v1::ListCheckpointsResponse resp;
  if (upload_dir.empty()) {
    for (const checkpoint::CommittedStep& s : steps) {
      v1::CheckpointInfo* info = resp.add_checkpoints();
      proto::FillCheckpointInfo(s, s.dir, info);
      if (in_place != nullptr && in_place->step() == s.step) {
        info->set_tier(kInPlace);
      }
    }
    return resp;
  }
  // Which step is where: here, in the store, or both.
  std::map<int64_t, std::pair<checkpoint::CommittedStep, std::string>> by_step;
  for (checkpoint::CommittedStep& s : steps) {
    const bool shown = in_place != nullptr && in_place->step() == s.step;
    by_step[s.step] = {std::move(s), shown ? kInPlace : "local"};
  }
  auto stored = checkpoint::ListCheckpoints(upload_dir, shard_storage_);
  if (!stored.ok() && !absl::IsNotFound(stored.status())) return stored.status();
  if (stored.ok()) {
    for (checkpoint::CommittedStep& s : *stored) {
      auto it = by_step.find(s.step);
      if (it != by_step.end()) {
        if (it->second.second != kInPlace) it->second.second = "local+store";
      } else {
        s.is_latest = false;  // `latest` is the local root's
        // The node-local mode keeps this node's part of the newest step it
        // sent (daemon/restore/kept_copies.h).
        const bool kept =
            node_local &&
            storage::Exists(storage::StorageOrDefault(shard_storage_),
                            JoinPath(job_dir, format::SentStepDirName(s.step)));
        const int64_t step = s.step;
        by_step[step] = {std::move(s), kept ? "store, this node's part kept" : "store"};
      }
    }
  }
  for (const auto& [step, entry] : by_step) {
    v1::CheckpointInfo* info = resp.add_checkpoints();
    proto::FillCheckpointInfo(entry.first, entry.first.dir, info);
    info->set_tier(entry.second);
  }
  return resp;
}

bool Registry::Healthy() const { return housekeeper_.Healthy(); }

}  // namespace zcc::daemon
