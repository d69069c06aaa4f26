#include "daemon/jobs/job_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace zcc::daemon {

Admission::Admission(Admission&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      job_id_(std::move(other.job_id_)),
      rank_(other.rank_),
      job_(std::move(other.job_)),
      generation_(other.generation_),
      inherited_(std::move(other.inherited_)),
      pooled_(std::move(other.pooled_)),
      // (A moved-from optional still holds a value: emptied, so that only
      // this admission answers for it.)
      previous_layout_(std::exchange(other.previous_layout_, std::nullopt)) {}

Admission::~Admission() {
  // A previous layout nobody wrote (the registration failed first): the
  // job's other registrations wait no longer.
  if (table_ != nullptr && previous_layout_.has_value()) {
    const uint64_t counted = previous_layout_->counted_bytes;
    previous_layout_.reset();
    table_->RelayoutWritten(job_id_, counted);
    job_->RelayoutDone();
  }
  if (table_ != nullptr) table_->Finish(job_id_, rank_);
}

uint64_t PreviousLayout::bytes() const {
  uint64_t n = 0;
  for (const auto& [rank, entry] : retained) n += entry.session->budget_bytes();
  return n;
}

JobTable::JobTable(absl::Time started) {
  zcc::MutexLock lock(&mu_);
  next_generation_ = (static_cast<uint64_t>(absl::ToUnixMicros(started)) << 8) | 1;
}

std::shared_ptr<Job> JobTable::Find(const std::string& job_id) const {
  zcc::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Job>> JobTable::All() const {
  zcc::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

bool JobTable::HasJobDir(const std::string& dir) const {
  zcc::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (job->options().job_dir == dir) return true;
  }
  return false;
}

uint64_t JobTable::StagingBytes() const {
  zcc::MutexLock lock(&mu_);
  return StagingBytesLocked();
}

uint64_t JobTable::StagingBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& session : job->Ranks()) total += session->budget_bytes();
    total += job->retained().bytes();
  }
  for (const auto& [key, bytes] : in_flight_) total += bytes;
  for (const auto& [id, bytes] : relayout_bytes_) total += bytes;
  return total;
}

uint64_t JobTable::RetainedBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [id, job] : jobs_) total += job->retained().bytes();
  return total;
}

void JobTable::RelayoutWritten(const std::string& job_id, uint64_t counted_bytes) {
  zcc::MutexLock lock(&mu_);
  auto it = relayout_bytes_.find(job_id);
  if (it == relayout_bytes_.end()) return;
  it->second -= std::min(it->second, counted_bytes);
  if (it->second == 0) relayout_bytes_.erase(it);
}

bool JobTable::InFlightLocked(const std::string& job_id) const {
  auto it = in_flight_.lower_bound({job_id, 0});
  return it != in_flight_.end() && it->first.first == job_id;
}

std::vector<std::shared_ptr<Job>> JobTable::DropIdle() {
  std::vector<std::shared_ptr<Job>> dropped;
  zcc::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->droppable() && !InFlightLocked(it->first)) {
      LogForgotten(it->first);
      dropped.push_back(std::move(it->second));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

std::shared_ptr<Job> JobTable::DropIfIdle(const std::string& job_id, const Job* job) {
  zcc::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.get() != job || !job->droppable() ||
      InFlightLocked(job_id)) {
    return nullptr;
  }
  LogForgotten(job_id);
  std::shared_ptr<Job> dropped = std::move(it->second);
  jobs_.erase(it);
  return dropped;
}

void JobTable::LogForgotten(const std::string& job_id) {
  ZCC_LOG(INFO) << "job " << job_id
                << ": forgotten (no rank registered, no commit pending, no snapshot retained)";
}

std::map<std::string, std::shared_ptr<Job>> JobTable::Close() {
  zcc::MutexLock lock(&mu_);
  closed_ = true;
  return std::exchange(jobs_, {});
}

bool JobTable::DropOneRetainedLocked(std::vector<RetainedSnapshots::Entry>* dropped) {
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

void JobTable::Finish(const std::string& job_id, uint32_t rank) {
  zcc::MutexLock lock(&mu_);
  in_flight_.erase({job_id, rank});
}

namespace {

// Whether `r` registers into `job` as it is: its world size and places.
bool SamePlace(const Job& job, const AdmitRequest& r) {
  return job.options().world_size == r.world_size && job.options().job_dir == r.job_dir &&
         job.options().upload_dir == r.upload_dir &&
         job.options().node_local_root == r.node_local_root;
}

// "<dir>" or "<dir> (uploaded to <store>)", for messages.
std::string PlaceName(const std::string& dir, const std::string& upload, bool node_local) {
  if (upload.empty()) return dir;
  return absl::StrCat(dir, " (uploaded to ", upload, node_local ? " from each node" : "", ")");
}

}  // namespace

absl::StatusOr<Admission> JobTable::Admit(AdmitRequest r) {
  // Destroyed after the lock is released (they unmap and remove segments):
  // a replaced idle job with what it retained, retained snapshots dropped for
  // room or not adopted.
  std::shared_ptr<Job> dropped_job;
  std::vector<RetainedSnapshots::Entry> dropped;
  std::vector<shm::Segment> released_pool;  // the staging pool's, for the budget
  // The pool's piece this registration takes (below); one a refused
  // registration took is unmapped and removed after the lock too.
  std::optional<shm::Segment> pooled;
  std::vector<std::shared_ptr<const void>> freed_replicas;  // the peer tier's, for the budget
  // The snapshots a previous layout of the job left, for the registration
  // to have written (below), or dropped with the rest when they do not fit.
  std::optional<PreviousLayout> previous;
  zcc::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("zccd is shutting down");
  admissions_.fetch_add(1, std::memory_order_acq_rel);
  std::shared_ptr<Job>& job = jobs_[r.job_id];
  auto elsewhere = [&r](const Job& j) { return !SamePlace(j, r); };
  // A job whose ranks have all left and whose steps are all committed or
  // dropped is replaced by a registration with another world size or
  // directory: the job resumed with another layout (its checkpoints restore
  // into any layout).
  if (job != nullptr && job->Authorize(r.uid).ok() && job->replaceable() &&
      !InFlightLocked(r.job_id) && elsewhere(*job)) {
    ZCC_LOG(INFO) << "job " << r.job_id << " re-registered with world_size " << r.world_size
                  << " (was " << job->options().world_size << ")";
    dropped_job = std::move(job);
    if (dropped_job->options().job_dir == r.job_dir &&
        dropped_job->options().upload_dir == r.upload_dir && !dropped_job->retained().empty()) {
      previous = PreviousLayout{dropped_job->options(), dropped_job->retained().TakeAll(),
                                dropped_job};
    }
  }
  if (job == nullptr) {
    job = r.make_job();
  } else if (absl::Status st = job->Authorize(r.uid); !st.ok()) {
    return st;
  } else if (elsewhere(*job)) {
    if (job->options().node_local_root && job->Ranks().empty() && job->sending_to_store()) {
      // (Unavailable: the client registers again with backoff.)
      return absl::UnavailableError(absl::StrCat(
          "job '", r.job_id, "' in its previous layout (world_size ", job->options().world_size,
          ") still has steps to send from this node to ", job->options().upload_dir,
          "; its registration with world_size ", r.world_size,
          " waits until they are sent (`zccctl status ", r.job_id, "` shows the upload)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", r.job_id, "' is already registered with world_size ", job->options().world_size,
        " at ",
        PlaceName(job->options().job_dir, job->options().upload_dir,
                  job->options().node_local_root),
        "; this request has ", r.world_size, " at ",
        PlaceName(r.job_dir, r.upload_dir, r.node_local_root),
        " (two jobs cannot share an id)"));
  }
  if (in_flight_.count({r.job_id, r.rank}) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", r.rank, " of job '", r.job_id,
                                                 "' is being registered by another request"));
  }
  std::shared_ptr<RankSession> existing = job->FindRank(r.rank);
  if (existing != nullptr && r.alive(*existing)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", r.rank, " of job '", r.job_id, "' is already registered by pid ",
        existing->options().pid, ", which is still alive"));
  }
  // What the rank's previous trainer left in memory: adopted when it was
  // registered with the same tensors and slots, so its snapshots can be
  // restored from memory (and no new segment is made). When it was not, and
  // this zccd holds every rank's (the job resumed in another layout on the
  // same number of ranks), all of them go to the registration as a previous
  // layout; otherwise the rank's are dropped.
  std::optional<RetainedSnapshots::Entry> inherited = job->retained().Take(r.rank);
  if (inherited.has_value() && inherited->session->SegmentCut()) {
    // Zeros under zccd's mapping, and no longer the memory the trainer maps.
    ZCC_LOG(WARNING) << "job " << r.job_id << " rank " << r.rank
                     << ": the previous trainer's staging segment was cut short (ftruncate); "
                        "its snapshots are dropped";
    dropped.push_back(std::move(*inherited));
    inherited.reset();
  }
  if (inherited.has_value()) {
    const RankSession& old = *inherited->session;
    if (old.shards().manifest_hash != r.manifest_hash || old.options().num_slots != r.num_slots ||
        old.shards().layout.slot_bytes != r.slot_bytes ||
        old.options().segment_owner != r.segment_owner || old.segment_bytes() != r.segment_bytes) {
      // (The rank's own entry is out already: every other rank's must be here.)
      const bool whole = !previous.has_value() &&
                         job->retained().size() + 1 == job->options().world_size;
      ZCC_LOG(INFO) << "job " << r.job_id << " rank " << r.rank
                    << ": the snapshots kept from the previous trainer do not match this "
                       "registration (other tensors or slots)"
                    << (whole ? "; every rank's are here: their newest step is written for the "
                                "new layout"
                              : "; dropping them");
      if (whole) {
        std::map<uint32_t, RetainedSnapshots::Entry> all = job->retained().TakeAll();
        all.emplace(r.rank, std::move(*inherited));
        previous = PreviousLayout{job->options(), std::move(all), nullptr};
      } else {
        dropped.push_back(std::move(*inherited));
      }
      inherited.reset();
    }
  }
  // (The new session's EMA is its own, beside an adopted segment too.)
  const uint64_t needed = (inherited.has_value() ? 0 : r.segment_bytes) + r.ema_bytes;
  const uint64_t replacing = existing ? existing->budget_bytes() : 0;
  // A new segment starts from the pool's memory: that entry becomes part of
  // `needed` (and leaves the pool).
  if (!inherited.has_value() && r.pool != nullptr) {
    pooled = r.pool->Take(r.reserve_now_bytes, r.segment_bytes);
  }
  auto pool_bytes = [&r] { return r.pool != nullptr ? r.pool->bytes() : 0; };
  auto replica_bytes = [&r] { return r.replica_bytes ? r.replica_bytes() : 0; };
  auto besides_replicas = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // (The session replaced may leave the job meanwhile: its rank's
    // unregistration does not take this table's lock.)
    const uint64_t staging = StagingBytesLocked();
    return (staging > replacing ? staging - replacing : 0) + pool_bytes();
  };
  auto in_use = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return besides_replicas() + replica_bytes();
  };
  auto over_budget = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return r.staging_budget_bytes > 0 && in_use() + needed > r.staging_budget_bytes;
  };
  // What gives way to a registration over the budget, in turn: the pool
  // (it holds no data), retained snapshots (the oldest first), then the
  // peer tier's replicas (ShrinkTo's order: the least needed first, this
  // job's own last; other nodes' insurance, and this node's own copies: a
  // trainer that would otherwise be refused comes first). Nothing gives way
  // when all of it together would not make room.
  const uint64_t budget = r.staging_budget_bytes;
  const uint32_t owner = static_cast<uint32_t>(job->options().owner.uid);
  const uint64_t fixed = besides_replicas() - pool_bytes() - RetainedBytesLocked();
  if (over_budget() && fixed + needed <= budget) {
    if (pool_bytes() > 0) {
      const uint64_t excess = in_use() + needed - budget;
      released_pool = r.pool->ReleaseDownTo(pool_bytes() > excess ? pool_bytes() - excess : 0);
    }
    while (over_budget() && DropOneRetainedLocked(&dropped)) continue;
    // Again when a piece pushed meanwhile took the room (Put reads the room
    // outside this lock).
    uint64_t freed = 0;
    for (int i = 0; i < 3 && over_budget() && r.shrink_replicas; ++i) {
      const uint64_t others = besides_replicas();
      if (others + needed > budget) break;
      freed += r.shrink_replicas(budget - others - needed, owner, &freed_replicas);
    }
    if (freed > 0) {
      ZCC_LOG(WARNING) << "job " << r.job_id << " rank " << r.rank << ": dropped " << freed
                       << " bytes of the peer tier's replicas to admit the registration within "
                          "the staging budget of "
                       << budget << " bytes";
    }
  }
  if (over_budget()) {
    if (inherited.has_value()) dropped.push_back(std::move(*inherited));
    // A previous layout of the same job (the same ranks) stays retained
    // for a registration that fits (a job replaced drops it with the job).
    if (previous.has_value() && previous->replaced == nullptr) {
      for (auto& [rank, entry] : previous->retained) {
        const absl::Time expires = entry.expires;
        job->retained().Keep(rank, std::move(entry.session), expires);
      }
      previous.reset();
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "registration needs ", needed, " bytes of staging memory",
        r.ema_bytes > 0 ? absl::StrCat(" (", r.ema_bytes, " of them its EMA)") : std::string(),
        "; ", in_use(), " of the ",
        r.staging_budget_bytes, "-byte budget are in use",
        replica_bytes() > 0
            ? absl::StrCat(" (", replica_bytes(), " by the peer tier's replicas, which give way "
                           "only when that makes room)")
            : std::string()));
  }
  // A previous layout's snapshots go to the registration when the budget
  // holds them beside it until they are written; they are dropped otherwise.
  if (previous.has_value()) {
    const uint64_t held = previous->bytes();
    // The job's own unwritten step comes before other nodes' insurance.
    if (budget > 0 && in_use() + needed + held > budget && r.shrink_replicas &&
        besides_replicas() + needed + held <= budget) {
      const uint64_t freed =
          r.shrink_replicas(budget - besides_replicas() - needed - held, owner, &freed_replicas);
      ZCC_LOG(WARNING) << "job " << r.job_id << ": dropped " << freed
                       << " bytes of the peer tier's replicas to keep the snapshots its previous "
                          "layout left within the staging budget";
    }
    if (r.staging_budget_bytes == 0 || in_use() + needed + held <= r.staging_budget_bytes) {
      relayout_bytes_[r.job_id] += held;
      previous->counted_bytes = held;
      job->ExpectRelayout();
    } else {
      ZCC_LOG(WARNING) << "job " << r.job_id << ": the " << held
                       << " bytes of snapshots its previous layout left in memory do not fit "
                          "the staging budget beside the new layout; dropped";
      for (auto& [rank, entry] : previous->retained) dropped.push_back(std::move(entry));
      previous.reset();
    }
  }
  // (An adopted segment is counted too: it left the retained snapshots.)
  in_flight_[{r.job_id, r.rank}] =
      needed + (inherited.has_value() ? inherited->session->budget_bytes() : 0);
  // Released by its destructor, which takes the lock: never destroyed here.
  Admission admission(this, r.job_id, r.rank);
  admission.job_ = job;
  admission.previous_layout_ = std::move(previous);
  admission.generation_ = next_generation_++;
  admission.inherited_ = std::move(inherited);
  admission.pooled_ = std::move(pooled);
  return admission;
}

}  // namespace zcc::daemon
