#include "daemon/rank/rank_session.h"

#include <signal.h>

#include <algorithm>
#include <limits>
#include <cerrno>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/status.h"

namespace zcc::daemon {

using shm::ControlBlock;

namespace {

std::vector<RegisteredTensor> EmaSources(const std::vector<RegisteredTensor>& registered,
                                         const std::vector<size_t>& ema_index) {
  std::vector<RegisteredTensor> sources;
  sources.reserve(ema_index.size());
  for (size_t i : ema_index) sources.push_back(registered[i]);
  return sources;
}

}  // namespace

RankSession::RankSession(checkpoint::RankShards shards, std::vector<RegisteredTensor> registered,
                         shm::Segment segment, RankSessionOptions options,
                         PersistCallback on_persisted, std::unique_ptr<ema::EmaUpdater> ema,
                         std::vector<size_t> ema_index, Inheritance inherited)
    : shards_(std::move(shards)),
      registered_(std::move(registered)),
      options_(std::move(options)),
      slots_(std::move(segment), options_.num_slots, shards_.layout.slot_bytes),
      registered_ns_(shm::MonotonicNanos()),
      pid_visible_(options_.pid > 0 && (::kill(options_.pid, 0) == 0 || errno == EPERM)),
      ema_(std::move(ema), EmaSources(registered_, ema_index), shards_.job_id, shards_.rank,
           options_.ema_interval, options_.metrics),
      held_(SkipEmptyPredecessors(std::move(inherited))),
      writer_(WriteTarget(std::move(on_persisted), nullptr), options_.write_pool),
      replicate_writer_(WriteTarget([](const PersistEvent&) {},
                                    [this] {
                                      if (replication_owed_.load() >= 0) slots_.RingDoorbell();
                                    }),
                        options_.write_pool) {
  zcc::MutexLock lock(&timeline_mu_);
  timeline_before_ = timeline_after_ = options_.timeline;
}

RankWriteTarget RankSession::WriteTarget(PersistCallback on_persisted,
                                         std::function<void()> on_idle) {
  RankWriteTarget target;
  target.shards = &shards_;
  target.slots = &slots_;
  target.job_dir = options_.job_dir;
  target.fs_owner = options_.fs_owner;
  target.io = options_.io;
  target.on_persisted = std::move(on_persisted);
  target.on_error = [this](const std::string& error) { SetError(error); };
  target.on_replicate = options_.on_replicate;
  target.replicate_order = &replicate_order_;
  // A snapshot taken before the trainer's last restore, of a step after
  // the one restored: the state it went back from.
  target.left_behind = [this](int64_t step, uint64_t restores) {
    return restores < restores_.load(std::memory_order_acquire) &&
           step > last_restored_.load(std::memory_order_relaxed);
  };
  target.on_idle = std::move(on_idle);
  return target;
}

RankSession::~RankSession() { Stop(); }

void RankSession::Start() {
  thread_ = std::thread([this] { IngestLoop(); });
  slots_.StartReserving();
}

void RankSession::ReserveInBackground(std::vector<uint32_t> slots) {
  slots_.ReserveInBackground(std::move(slots),
                             [this](const std::string& error) { SetError(error); });
}

void RankSession::AttachPuller(std::unique_ptr<RankPuller> puller) {
  puller_ = std::move(puller);
}

void RankSession::Stop() {
  {
    zcc::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // No more copies out of the trainer's memory, and its handles closed,
  // before anything else happens to the segment; no more reads into it.
  if (puller_ != nullptr) puller_->Stop();
  stopping_.store(true);
  InterruptWaits();  // a ReadEma waiting for a step answers now
  TakePrefetch().reset();
  slots_.StopReserving();
  slots_.RingDoorbell();
  if (thread_.joinable()) thread_.join();
  {
    // Nor does a retirement's drain (IngestWhatIsLeft) take anything in once
    // the writers stop, below.
    zcc::MutexLock ingesting(&ingest_mu_);
    ingest_closed_ = true;
  }
  // Ingest has handed over its last write; the writers finish it and leave.
  writer_.Stop();
  replicate_writer_.Stop();
  slots_.Close();
  restore_buffers_.Clear();
}

void RankSession::Heartbeat() { slots_.Heartbeat(); }

bool RankSession::ClientAlive(absl::Duration timeout) const {
  uint64_t last = slots_.ClientHeartbeatNs();
  const uint64_t now = shm::MonotonicNanos();
  // No heartbeat yet, or one from the future (garbage): count from registration.
  if (last < registered_ns_ || last > now) last = registered_ns_;
  return absl::Nanoseconds(now - last) < timeout;
}

bool RankSession::ClientProcessGone() const {
  return pid_visible_ && ::kill(options_.pid, 0) != 0 && errno == ESRCH;
}

void RankSession::IngestLoop() {
  ControlBlock* cb = slots_.control();
  while (true) {
    const uint32_t bell = cb->doorbell.load(std::memory_order_acquire);
    const bool worked = IngestReadySlots();
    if (stopping_.load()) {
      // Drain what the client published before the stop, then leave.
      while (IngestReadySlots()) {
      }
      return;
    }
    PayOwedReplication();
    if (!worked) FutexWait(&cb->doorbell, bell, absl::Seconds(1));
  }
}

bool RankSession::IngestReadySlots() {
  zcc::MutexLock ingesting(&ingest_mu_);
  if (ingest_closed_) return false;
  std::vector<absl::Status> bad;
  std::vector<shm::ReadySlot> ready = slots_.Ready(&bad, options_.after_slot_read);
  for (const absl::Status& st : bad) {
    SetError(absl::StrCat("bad control block from the trainer: ", st.message()));
  }
  if (ready.empty() && deferred_.empty()) return false;
  // The EMA folds steps in the order they were published, so ingest takes
  // them in that order. The scan reads the slots one after another: a
  // snapshot published into a slot already read, and the next one into a
  // slot read later, show the newer alone. The trainer publishes in order,
  // so all it published up to the newest seen (or taken, deferred_) is
  // ready by a second scan; what is newer waits for the next round.
  uint64_t newest = ready.empty() ? 0 : ready.back().seq;
  for (const shm::ReadySlot& d : deferred_) newest = std::max(newest, d.seq);
  ready = slots_.Ready(nullptr, options_.after_slot_read);
  ready.erase(std::remove_if(ready.begin(), ready.end(),
                             [newest](const shm::ReadySlot& s) { return s.seq > newest; }),
              ready.end());
  struct Next {
    shm::ReadySlot slot;
    bool taken;  // deferred from the last round
  };
  std::vector<Next> next;
  for (const shm::ReadySlot& d : deferred_) next.push_back({d, true});
  deferred_.clear();
  for (const shm::ReadySlot& r : ready) next.push_back({r, false});
  std::sort(next.begin(), next.end(),
            [](const Next& a, const Next& b) { return a.slot.seq < b.slot.seq; });
  bool worked = false;
  for (const Next& n : next) {
    shm::ReadySlot slot = n.slot;
    if (!n.taken) {
      // What the slot holds is read after the take: the trainer may have
      // handed it to a due step and published it again since the scan.
      auto taken = slots_.Take(n.slot.index);
      if (!taken.ok()) {
        if (taken.status().code() == absl::StatusCode::kDataLoss) {
          SetError(
              absl::StrCat("bad control block from the trainer: ", taken.status().message()));
          slots_.Free(n.slot.index);
        }
        continue;
      }
      worked = true;
      if (taken->seq > newest) {
        // Published again since: after what this round takes (held, the
        // trainer cannot touch it), first in the next.
        deferred_.push_back(*taken);
        continue;
      }
      slot = *taken;
    }
    if (!Process(slot)) slots_.Free(slot.index);  // else the writer frees it
    worked = true;
  }
  return worked;
}

bool RankSession::Process(const shm::ReadySlot& slot) {
  snapshots_ingested_.fetch_add(1);
  last_snapshot_step_.store(slot.step);
  if (options_.metrics != nullptr) options_.metrics->snapshots().Increment();
  // (Not a snapshot published before the trainer's last restore: of the
  // state it left, which the restored EMA must not fold in. The EMA itself
  // knows the boundary from the moment a restore set it; NoteRestored's
  // comes later.)
  const bool before_restore_noted = slot.seq < restored_seq_.load(std::memory_order_acquire);
  if (std::optional<EmaProblem> problem =
          before_restore_noted ? std::nullopt
                               : ema_.Update(slots_.data(slot.index), shards_.layout.slot_bytes,
                                             slot.step, slot.seq)) {
    if (problem->log) {
      SetError(std::move(problem->message));
    } else {
      zcc::MutexLock lock(&mu_);
      last_error_ = std::move(problem->message);
    }
  }
  // The trainer went on without restoring from memory: what it left is of
  // no more use. (One atomic load per snapshot once it is released.)
  if (held_.any()) ReleaseHeld();
  // Nor is a read begun for a restore it did not ask for (cancelled within a
  // chunk; its slot goes back to the trainer).
  if (has_prefetch_.load(std::memory_order_relaxed)) {
    if (std::unique_ptr<RestorePrefetch> unused = TakePrefetch()) {
      ZCC_LOG(INFO) << "job " << shards_.job_id << " rank " << shards_.rank
                    << ": the trainer snapshotted without restoring; the read begun at "
                       "registration is dropped";
    }
  }
  slots_.NoteIngested(slot);
  // Published before the trainer's last restore (ingested only now): not the
  // trainer going on, and, of a later step, no longer its state.
  int64_t restored = restored_step_.load(std::memory_order_acquire);
  const bool before_restore = slot.seq < restored_seq_.load(std::memory_order_acquire);
  if (before_restore && slot.step > last_restored_.load(std::memory_order_relaxed)) {
    slots_.ForgetFullNewerThan(last_restored_.load(std::memory_order_relaxed));
  }
  if (!before_restore && restored >= 0 && slot.step > restored &&
      restored_step_.compare_exchange_strong(restored, -1, std::memory_order_relaxed)) {
    if (options_.on_trained_on) {
      options_.on_trained_on(restored, slot.step, restored_from_disk_.load() == restored);
    }
    // Replicated as soon as the writer is free: where the rank went back,
    // the buddies drop the steps it left behind when this one arrives
    // (peer::ReplicaStore::Put), not only at the next due step.
    if (options_.on_replicate != nullptr) {
      supersede_next_.store(restored);
      // (What was owed before the restore was of the state it replaced.)
      replication_owed_.store(slot.step, std::memory_order_relaxed);
    }
  }
  if (slot.kind != shm::SnapshotKind::kFull) return false;
  const bool due = options_.save_every > 0 && slot.step % options_.save_every == 0;
  const bool persist = due || save_requested_.exchange(false);
  if (due) save_requested_.store(false);
  const bool due_replica = options_.on_replicate != nullptr && options_.replicate_every > 0 &&
                           slot.step % options_.replicate_every == 0;
  // A due step left out (below) is owed: the next full snapshot goes in its
  // place, as soon as the replication writer is free.
  const int64_t owed = replication_owed_.load(std::memory_order_relaxed);
  const bool replicate = due_replica || owed >= 0;
  if (persist) {
    SubmitWrite(slot, /*on_failure=*/false, replicate);
    if (replicate) PaidReplication(slot.step);
    return true;
  }
  if (!replicate) return false;
  // Replication alone has a writer of its own and never waits for it (still
  // serializing an earlier step): the step is left out, and the lag shows.
  const bool submitted =
      replicate_writer_.TrySubmit([&] { return MakeWriteJob(slot, false, false, true); });
  if (submitted) {
    PaidReplication(slot.step);
  } else if (due_replica) {
    replications_skipped_.fetch_add(1);
    if (owed < 0) {
      ZCC_LOG(INFO) << "job " << shards_.job_id << " rank " << shards_.rank << ": step "
                    << slot.step << " not replicated: the previous one is still being "
                    << "serialized; the newest snapshot goes in its place once it is through";
    }
    replication_owed_.store(slot.step, std::memory_order_relaxed);
  }
  return submitted;
}

void RankSession::PaidReplication(int64_t step) {
  int64_t owed = replication_owed_.load(std::memory_order_relaxed);
  // (A step owed since, newer than this one, stays owed.)
  while (owed >= 0 && owed <= step &&
         !replication_owed_.compare_exchange_weak(owed, -1, std::memory_order_relaxed)) {
  }
  if (owed >= 0 && owed < step) {
    ZCC_LOG(INFO) << "job " << shards_.job_id << " rank " << shards_.rank << ": step " << step
                  << " replicated in place of step " << owed << ", left out";
  }
}

WriteJob RankSession::MakeWriteJob(const shm::ReadySlot& slot, bool on_failure, bool persist,
                                   bool replicate) {
  WriteJob job;
  job.slot = slot;
  job.on_failure = on_failure;
  job.persist = persist;
  job.replicate = replicate;
  // The restores before the snapshot was taken (RankWriteTarget::left_behind).
  job.restores = restores_.load(std::memory_order_acquire);
  if (job.restores > 0 && slot.seq < restored_seq_.load(std::memory_order_acquire)) --job.restores;
  if (replicate) job.went_on_from = supersede_next_.exchange(-1);
  job.timeline = TimelineOf(slot);
  ema_.CopyForWrite(&job);
  return job;
}

std::string RankSession::TimelineOf(const shm::ReadySlot& slot) const {
  // (As for the restores above: published after the last restore, of a
  // later step than it; read with the timelines, which NoteRestored sets
  // with them.)
  zcc::MutexLock lock(&timeline_mu_);
  const bool after = slot.seq >= restored_seq_.load(std::memory_order_acquire) &&
                     slot.step > last_restored_.load(std::memory_order_relaxed);
  return after ? timeline_after_ : timeline_before_;
}

void RankSession::AdoptTimeline(const std::string& timeline) {
  zcc::MutexLock lock(&timeline_mu_);
  timeline_after_ = timeline;
}

std::string RankSession::Timeline(int64_t step) const {
  zcc::MutexLock lock(&timeline_mu_);
  return step > last_restored_.load(std::memory_order_relaxed) ? timeline_after_
                                                               : timeline_before_;
}

void RankSession::SubmitWrite(const shm::ReadySlot& slot, bool on_failure, bool replicate) {
  writer_.Submit([&] { return MakeWriteJob(slot, on_failure, true, replicate); });
}

absl::StatusOr<v1::ReadEmaResponse> RankSession::CopyEma(const std::string& shm_name,
                                                        int64_t min_step, absl::Time deadline) {
  ZCC_RETURN_IF_ERROR(restore_buffers_.CheckRoom());
  if (min_step >= 0) ema_.AwaitStep(min_step, deadline);
  ZCC_ASSIGN_OR_RETURN(auto copied, ema_.CopyToSegment(shm_name, options_.segment_owner));
  auto& [segment, resp] = copied;
  resp.set_restore_id(restore_buffers_.Add(std::move(segment), resp.step()));
  return std::move(resp);
}

absl::StatusOr<RankEma::Saved> RankSession::ReadEma(const std::string& step_dir,
                                                    const checkpoint::GroupedIndex& index,
                                                    storage::Storage* storage,
                                                    const std::function<bool()>* cancelled) {
  checkpoint::IoOptions io;
  io.storage = storage;
  io.cancelled = cancelled;
  return ema_.ReadSaved(step_dir, index, io);
}

absl::Status RankSession::InstallEma(RankEma::Saved saved, int64_t step) {
  // Snapshots the trainer published before this restore are of the state it
  // replaces: never folded into the EMA restored with it.
  return ema_.Install(std::move(saved), step,
                      slots_.control()->next_seq.load(std::memory_order_acquire));
}

void RankSession::SetError(std::string error) {
  ZCC_LOG(ERROR) << "job " << shards_.job_id << " rank " << shards_.rank << ": " << error;
  zcc::MutexLock lock(&mu_);
  last_error_ = std::move(error);
}

bool RankSession::IngestWhatIsLeft() {
  {
    zcc::MutexLock lock(&mu_);
    if (stopped_) return false;
  }
  // The ingest thread may be mid-way through a slot; it is stopped later,
  // and draining here under its own CAS discipline is safe alongside it.
  while (IngestReadySlots()) {
  }
  return true;
}

std::optional<shm::ReadySlot> RankSession::ClaimNewestFull(int64_t min_step) {
  const std::optional<SlotSnapshot> newest = slots_.NewestFull();
  if (!newest.has_value() || newest->step < min_step) return std::nullopt;
  // Claimed so that nothing can change it while it is written; a slot the
  // trainer had taken again holds a torn copy and is left alone.
  if (!slots_.ClaimForWrite(newest->slot, newest->step)) return std::nullopt;
  // (Ingested after the trainer's last restore, or of a step no newer than
  // the restored one: NoteRestored forgot a newer one published before.)
  return shm::ReadySlot{newest->slot, newest->step, shm::SnapshotKind::kFull,
                        std::numeric_limits<uint64_t>::max()};
}

std::optional<int64_t> RankSession::PersistNewestOnFailure() {
  if (!IngestWhatIsLeft()) return std::nullopt;
  // A due step ingest handed over is written first.
  writer_.AwaitIdle();
  const std::optional<shm::ReadySlot> slot = ClaimNewestFull(writer_.last_persisted_step() + 1);
  if (!slot.has_value()) return std::nullopt;
  SubmitWrite(*slot, /*on_failure=*/true);
  writer_.AwaitIdle();
  return writer_.last_persisted_step() == slot->step ? slot->step : std::optional<int64_t>();
}

void RankSession::NoteRestored(int64_t step, bool from_disk,
                               const std::optional<std::string>& step_timeline) {
  {
    zcc::MutexLock lock(&timeline_mu_);
    // The trainer went on from the last restore (or none came before): the
    // snapshots published before this one are of the timeline it went on
    // in; else of the one before it.
    if (restored_step_.load(std::memory_order_acquire) < 0) timeline_before_ = timeline_after_;
    if (step_timeline.has_value()) timeline_after_ = *step_timeline;
    last_restored_.store(step, std::memory_order_relaxed);
    // What the trainer publishes from now on is of the restored state; what
    // it published before (numbered below this; the client publishes what it
    // took before it asks for a restore) is not.
    restored_seq_.store(slots_.control()->next_seq.load(std::memory_order_acquire),
                        std::memory_order_release);
  }
  restored_from_disk_.store(from_disk ? step : -1);
  restores_.fetch_add(1, std::memory_order_release);
  // A snapshot ingested before, of a later step, is no longer the trainer's
  // state (one of the restored step still is; one ingested from now on sees
  // the above and is forgotten by ingest).
  slots_.ForgetFullNewerThan(step);
  // Nor is a step persisted after it: persist-on-failure writes this run's
  // newest.
  writer_.LowerLastPersisted(step);
  restored_step_.store(step, std::memory_order_release);
}

void RankSession::PayOwedReplication() {
  if (replication_owed_.load(std::memory_order_relaxed) < 0) return;
  // (Not claimed while the writer is busy: the trainer may want the slot.)
  if (!replicate_writer_.idle()) return;
  const std::optional<shm::ReadySlot> slot = ClaimOwedReplication();
  if (!slot.has_value()) return;
  const bool submitted =
      replicate_writer_.TrySubmit([&] { return MakeWriteJob(*slot, false, false, true); });
  if (!submitted) {
    // Still serializing: the writer rings again when it is free.
    slots_.Free(slot->index);
    return;
  }
  PaidReplication(slot->step);
}

std::optional<shm::ReadySlot> RankSession::ClaimOwedReplication() {
  const int64_t owed = replication_owed_.load(std::memory_order_relaxed);
  if (owed < 0) return std::nullopt;
  const std::optional<SlotSnapshot> newest = slots_.NewestFull();
  if (!newest.has_value() || ema_.last_step() > newest->step) return std::nullopt;
  return ClaimNewestFull(owed);
}

std::optional<int64_t> RankSession::ReplicateOwed() {
  if (options_.on_replicate == nullptr) return std::nullopt;
  // What the trainer published last may pay what is owed on its own.
  if (!IngestWhatIsLeft()) return std::nullopt;
  writer_.AwaitIdle();
  replicate_writer_.AwaitIdle();
  const std::optional<shm::ReadySlot> slot = ClaimOwedReplication();
  if (!slot.has_value()) {
    // (Ingest may have just sent it: then its write is done here.)
    replicate_writer_.AwaitIdle();
    if (const int64_t owed = replication_owed_.load(); owed >= 0) {
      ZCC_LOG(WARNING) << "job " << shards_.job_id << " rank " << shards_.rank << ": step "
                       << owed << " is left out of the peer tier: no FULL snapshot of it or "
                       << "later whose EMA is its own is left to send";
    }
    return std::nullopt;
  }
  replicate_writer_.Submit([&] { return MakeWriteJob(*slot, false, false, true); });
  PaidReplication(slot->step);
  replicate_writer_.AwaitIdle();
  return slot->step;
}

absl::StatusOr<checkpoint::WriteStats> RankSession::WriteRetained(const SlotSnapshot& held,
                                                                  const std::string& job_dir,
                                                                  bool with_ema) {
  const auto cut = [this] {
    return absl::DataLossError(absl::StrCat("rank ", shards_.rank, "'s staging segment was cut "
                                            "short (ftruncate): its snapshots read as zeros"));
  };
  if (SegmentCut()) return cut();
  WriteJob ema;  // only its EMA copy is used
  ema.slot.step = held.step;
  // (Of this step or an earlier one, recorded as such; one ahead of it is
  // left out by CopyForWrite.)
  if (with_ema && ema_.enabled()) ema_.CopyForWrite(&ema);
  auto written = checkpoint::WriteRankShards(job_dir, held.step, shards_, slots_.data(held.slot),
                                             options_.io, ema.ema_shards, Timeline(held.step));
  // Found cut as it was read: what was written may be zeros.
  if (written.ok() && SegmentCut()) return cut();
  return written;
}

std::vector<int64_t> RankSession::MemorySteps() const {
  if (SegmentCut()) return {};
  return held_.Steps();
}

std::optional<SlotSnapshot> RankSession::Held(int64_t step) const {
  if (SegmentCut()) return std::nullopt;
  return held_.Find(step);
}

Inheritance RankSession::SkipEmptyPredecessors(Inheritance inherited) {
  // A predecessor that ended before it snapshotted or restored (a trainer
  // that died again at start-up, a registration whose client gave up on
  // it) passes on the snapshots it still held of its own predecessor, and
  // an EMA with nothing in it: the EMA of those snapshots is that earlier
  // session's, inherited here directly, so that no chain of such sessions
  // (each with its EMA's memory) builds up however many restarts lie between.
  while (inherited.predecessor != nullptr && inherited.predecessor->held_.any()) {
    absl::StatusOr<std::shared_ptr<RankSession>> earlier =
        inherited.predecessor->held_.TakePredecessorForEma();
    if (!earlier.ok() || *earlier == nullptr) break;  // its own EMA, or none
    inherited.predecessor = *std::move(earlier);
  }
  return inherited;
}

absl::Status RankSession::TakePredecessorEma(int64_t step) {
  ZCC_ASSIGN_OR_RETURN(std::shared_ptr<RankSession> predecessor, held_.TakePredecessorForEma());
  if (predecessor != nullptr) {
    ema_.AdoptFrom(predecessor->ema_, step,
                   slots_.control()->next_seq.load(std::memory_order_acquire));
  }
  return absl::OkStatus();
}

void RankSession::ReleaseHeld(std::optional<int64_t> restored) {
  for (const SlotSnapshot& s : held_.Release()) {
    slots_.SetIntact(s.slot, restored == s.step ? s.step : -1);
    slots_.Free(s.slot);
  }
}

bool RankSession::AllStaged() const {
  for (const RegisteredTensor& t : registered_) {
    if (!t.staged) return false;
  }
  return true;
}

std::vector<SlotSnapshot> RankSession::IntactSnapshots() const {
  // A segment cut short holds zeros (its control block too: read as free
  // slots of step 0): nothing in it is a snapshot.
  if (SegmentCut()) return {};
  std::vector<SlotSnapshot> intact = held_.List();  // (their timelines with them)
  for (SlotSnapshot s : slots_.IntactFree()) {
    s.timeline = Timeline(s.step);
    intact.push_back(std::move(s));
  }
  std::sort(intact.begin(), intact.end(),
            [](const SlotSnapshot& a, const SlotSnapshot& b) { return a.step > b.step; });
  // One snapshot per step, or none: two of one step would be two timelines,
  // and which one the trainer last followed cannot be told.
  std::vector<SlotSnapshot> unique;
  for (size_t i = 0; i < intact.size(); ++i) {
    const bool twin = (i > 0 && intact[i - 1].step == intact[i].step) ||
                      (i + 1 < intact.size() && intact[i + 1].step == intact[i].step);
    if (twin) {
      ZCC_LOG(ERROR) << "job " << shards_.job_id << " rank " << shards_.rank
                     << ": two snapshots of step " << intact[i].step
                     << " in memory; neither is kept";
      continue;
    }
    unique.push_back(intact[i]);
  }
  return unique;
}

void RankSession::SetPrefetch(std::unique_ptr<RestorePrefetch> prefetch) {
  std::unique_ptr<RestorePrefetch> unused;  // cancelled outside the lock
  zcc::MutexLock lock(&mu_);
  if (stopped_) {
    unused = std::move(prefetch);
    return;
  }
  unused = std::move(prefetch_);
  prefetch_ = std::move(prefetch);
  has_prefetch_.store(prefetch_ != nullptr);
}

std::unique_ptr<RestorePrefetch> RankSession::TakePrefetch() {
  zcc::MutexLock lock(&mu_);
  has_prefetch_.store(false);
  return std::move(prefetch_);
}

shm::Segment RankSession::TakeSegment() { return slots_.TakeSegment(); }

RankCounters RankSession::counters() const {
  RankCounters c;
  const ControlBlock* cb = slots_.control();
  c.last_snapshot_step = last_snapshot_step_.load();
  c.last_persisted_step = writer_.last_persisted_step();
  c.snapshots_ingested = snapshots_ingested_.load();
  c.snapshots_skipped = cb->snapshots_skipped.load(std::memory_order_relaxed);
  c.persist_failures = writer_.persist_failures();
  // Published by the EMA's users: a status query never waits for an EMA
  // update, copy or restore.
  c.last_ema_step = ema_.last_step();
  c.ema_skipped_nonfinite = ema_.skipped_nonfinite();
  c.ema_out_of_order = ema_.out_of_order();
  c.ema_tensors = ema_.num_tensors();
  c.slots_in_use = slots_.InUse();
  c.replications_skipped = replications_skipped_.load(std::memory_order_relaxed);
  if (puller_ != nullptr) {
    c.daemon_pull = true;
    c.pulls = puller_->Stats();
  }
  zcc::MutexLock lock(&mu_);
  c.last_error = last_error_;
  return c;
}

}  // namespace zcc::daemon
