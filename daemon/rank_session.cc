#include "daemon/rank_session.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/futex.h"
#include "common/tsan.h"
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
      segment_(std::move(segment)),
      options_(std::move(options)),
      ring_(segment_.control(), options_.num_slots),
      on_persisted_(std::move(on_persisted)),
      registered_ns_(shm::MonotonicNanos()),
      pid_visible_(options_.pid > 0 && (::kill(options_.pid, 0) == 0 || errno == EPERM)),
      ema_(std::move(ema), EmaSources(registered_, ema_index), shards_.job_id, shards_.rank,
           options_.ema_interval, options_.metrics),
      writer_([this](WriteJob job) { Write(std::move(job)); }) {
  for (auto& step : ingested_full_step_) step.store(-1);
  zcc::MutexLock lock(&mu_);
  held_ = std::move(inherited.held);
  if (!held_.empty()) predecessor_ = std::move(inherited.predecessor);
  inherits_.store(!held_.empty());
}

RankSession::~RankSession() { Stop(); }

void RankSession::Start() {
  writer_.Start();
  thread_ = std::thread([this] { IngestLoop(); });
  if (!to_reserve_.empty()) {
    reserver_ = std::thread([this] {
      // Background work (SCHED_BATCH, nice 10): with few cores a reservation
      // (~0.1 s of kernel time a GB) must not slow a restore that the trainer
      // is waiting for, which usually follows the registration at once.
      MakeThisThreadBackground();
      const uint64_t slot_bytes = shards_.layout.slot_bytes;
      for (size_t i = 0; i < to_reserve_.size(); ++i) {
        const uint32_t slot = to_reserve_[i];
        // The first at once: a trainer whose restore holds slot 0 (a read
        // ahead) but who snapshots first needs it. The others after the
        // restore's read (RestoreRead), for at most a few seconds of it: a
        // restore of many GB does not hold the trainer's slots back.
        if (i > 0) {
          zcc::MutexLock lock(&reserve_mu_);
          reserve_mu_.AwaitWithTimeout(
              absl::Condition(
                  +[](RankSession* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->reserve_mu_) {
                    return s->restore_reads_ == 0 || s->reserver_stop_;
                  },
                  this),
              absl::Seconds(5));
        }
        if (stopping_.load()) return;
        const absl::Status st = segment_.Reserve(SlotOffset(slot), slot_bytes);
        if (!st.ok()) {
          ZCC_LOG(ERROR) << "staging slot " << slot << " stays unused: " << st;
          SetError(absl::StrCat("staging slot ", slot, " stays unused: ", st.message()));
          continue;
        }
        FreeSlot(slot);
      }
    });
  }
}

void RankSession::ReserveInBackground(std::vector<uint32_t> slots) {
  to_reserve_ = std::move(slots);
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
  {
    zcc::MutexLock lock(&reserve_mu_);
    reserver_stop_ = true;  // wakes a reserver waiting for a restore's read
  }
  InterruptWaits();  // a ReadEma waiting for a step answers now
  TakePrefetch().reset();
  if (reserver_.joinable()) reserver_.join();
  ControlBlock* cb = segment_.control();
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);
  if (thread_.joinable()) thread_.join();
  // Ingest has handed over its last write; the writer finishes it and leaves.
  writer_.Stop();
  cb->closed.store(1);
  FutexWakeAll(&cb->closed);
  restore_buffers_.Clear();
  cb->free_bell.fetch_add(1);
  FutexWakeAll(&cb->free_bell);
}

void RankSession::Heartbeat() {
  if (segment_taken_.load()) return;
  segment_.control()->daemon_heartbeat_ns.store(shm::MonotonicNanos(), std::memory_order_relaxed);
}

bool RankSession::ClientAlive(absl::Duration timeout) const {
  uint64_t last = segment_.control()->client_heartbeat_ns.load(std::memory_order_relaxed);
  const uint64_t now = shm::MonotonicNanos();
  // No heartbeat yet, or one from the future (garbage): count from registration.
  if (last < registered_ns_ || last > now) last = registered_ns_;
  return absl::Nanoseconds(now - last) < timeout;
}

bool RankSession::ClientProcessGone() const {
  return pid_visible_ && ::kill(options_.pid, 0) != 0 && errno == ESRCH;
}

void RankSession::IngestLoop() {
  ControlBlock* cb = segment_.control();
  while (true) {
    const uint32_t bell = cb->doorbell.load(std::memory_order_acquire);
    const bool worked = IngestReadySlots();
    if (stopping_.load()) {
      // Drain what the client published before the stop, then leave.
      while (IngestReadySlots()) {
      }
      return;
    }
    if (!worked) FutexWait(&cb->doorbell, bell, absl::Seconds(1));
  }
}

bool RankSession::IngestReadySlots() {
  std::vector<absl::Status> bad;
  const std::vector<shm::ReadySlot> ready = ring_.Ready(&bad);
  for (const absl::Status& st : bad) {
    SetError(absl::StrCat("bad control block from the trainer: ", st.message()));
  }
  bool worked = false;
  for (const shm::ReadySlot& seen : ready) {
    // What the slot holds is read after the take: the trainer may have
    // handed it to a due step and published it again since `seen`.
    auto slot = ring_.Take(seen.index);
    if (!slot.ok()) {
      if (slot.status().code() == absl::StatusCode::kDataLoss) {
        SetError(absl::StrCat("bad control block from the trainer: ", slot.status().message()));
        FreeSlot(seen.index);
      }
      continue;
    }
    // Daemon-pull: zccd's own copy thread filled the slot (common/tsan.h).
    TsanAcquire(segment_.base());
    if (!Process(*slot)) FreeSlot(slot->index);  // else the writer frees it
    worked = true;
  }
  return worked;
}

void RankSession::FreeSlot(uint32_t index) {
  // Daemon-pull: zccd's copy thread may fill the slot next (common/tsan.h).
  TsanRelease(segment_.base());
  ring_.Free(index);
}

bool RankSession::Process(const shm::ReadySlot& slot) {
  snapshots_ingested_.fetch_add(1);
  last_snapshot_step_.store(slot.step);
  if (options_.metrics != nullptr) options_.metrics->snapshots().Increment();
  if (std::optional<EmaProblem> problem =
          ema_.Update(slot_data(slot.index), shards_.layout.slot_bytes, slot.step)) {
    if (problem->log) {
      SetError(std::move(problem->message));
    } else {
      zcc::MutexLock lock(&mu_);
      last_error_ = std::move(problem->message);
    }
  }
  // The trainer went on without restoring from memory: what it left is of
  // no more use. (One atomic load per snapshot once it is released.)
  if (inherits_.load(std::memory_order_relaxed)) ReleaseHeld();
  // Nor is a read begun for a restore it did not ask for (cancelled within a
  // chunk; its slot goes back to the trainer).
  if (has_prefetch_.load(std::memory_order_relaxed)) {
    if (std::unique_ptr<RestorePrefetch> unused = TakePrefetch()) {
      ZCC_LOG(INFO) << "job " << shards_.job_id << " rank " << shards_.rank
                    << ": the trainer snapshotted without restoring; the read begun at "
                       "registration is dropped";
    }
  }
  ingested_full_step_[slot.index].store(slot.kind == shm::SnapshotKind::kFull ? slot.step : -1);
  if (slot.kind != shm::SnapshotKind::kFull) return false;
  last_full_slot_.store(slot.index);
  last_full_step_.store(slot.step);
  const bool due = options_.save_every > 0 && slot.step % options_.save_every == 0;
  if (!due && !save_requested_.exchange(false)) return false;
  if (due) save_requested_.store(false);
  SubmitWrite(slot, /*on_failure=*/false);
  return true;
}

void RankSession::SubmitWrite(const shm::ReadySlot& slot, bool on_failure) {
  writer_.Submit([&] {
    WriteJob job;
    job.slot = slot;
    job.on_failure = on_failure;
    ema_.CopyForWrite(&job);
    return job;
  });
}

void RankSession::Write(WriteJob job) {
  PersistEvent event;
  event.rank = shards_.rank;
  event.step = job.slot.step;
  {
    ScopedFsIdentity as_owner(options_.fs_owner);
    auto stats = checkpoint::WriteRankShards(options_.job_dir, job.slot.step, shards_,
                                             slot_data(job.slot.index), options_.io,
                                             job.ema_shards);
    if (stats.ok()) {
      event.stats = *stats;
      last_persisted_step_.store(job.slot.step);
    } else {
      event.status = stats.status();
      persist_failures_.fetch_add(1);
      // The trainer's client reports the failure itself (step first: it
      // reads the count, then the step).
      segment_.control()->last_failed_step.store(job.slot.step, std::memory_order_relaxed);
      segment_.control()->persist_failures.fetch_add(1, std::memory_order_release);
      SetError(absl::StrCat(job.on_failure ? "persist-on-failure" : "persist", " of step ",
                            job.slot.step, " failed: ", stats.status().message()));
    }
  }
  // The EMA copy lives only while a write needs it.
  job.ema_copy = storage::AlignedBuffer();
  job.ema_shards.clear();
  FreeSlot(job.slot.index);
  // Commit and retention do not need the slot: reported once it is free.
  on_persisted_(event);
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

absl::Status RankSession::RestoreEma(const std::string& step_dir,
                                     const checkpoint::GroupedIndex& index, int64_t step) {
  // Through the daemon's storage, like the rank's writes.
  checkpoint::IoOptions io;
  io.storage = options_.io.storage;
  return ema_.Restore(step_dir, index, step, io);
}

void RankSession::SetError(std::string error) {
  ZCC_LOG(ERROR) << "job " << shards_.job_id << " rank " << shards_.rank << ": " << error;
  zcc::MutexLock lock(&mu_);
  last_error_ = std::move(error);
}

std::optional<int64_t> RankSession::PersistNewestOnFailure() {
  {
    zcc::MutexLock lock(&mu_);
    if (stopped_) return std::nullopt;
  }
  // The ingest thread may be mid-way through a slot; it is stopped below, and
  // draining here under its own CAS discipline is safe alongside it.
  while (IngestReadySlots()) {
  }
  // A due step ingest handed over is written first.
  writer_.AwaitIdle();
  const int64_t step = last_full_step_.load();
  if (step < 0 || step <= last_persisted_step_.load()) return std::nullopt;
  const uint32_t index = last_full_slot_.load();
  // Claim the slot so nothing can change it while it is written; a slot the
  // trainer had taken again holds a torn copy and is left alone.
  if (!ring_.ClaimForWrite(index, step)) return std::nullopt;
  const shm::ReadySlot slot{index, step, shm::SnapshotKind::kFull, 0};
  SubmitWrite(slot, /*on_failure=*/true);
  writer_.AwaitIdle();
  return last_persisted_step_.load() == step ? std::optional<int64_t>(step) : std::nullopt;
}

std::vector<int64_t> RankSession::MemorySteps() const {
  zcc::MutexLock lock(&mu_);
  std::vector<int64_t> steps;
  for (const SlotSnapshot& s : held_) steps.push_back(s.step);
  return steps;
}

std::optional<uint32_t> RankSession::HeldSlot(int64_t step) const {
  zcc::MutexLock lock(&mu_);
  for (const SlotSnapshot& s : held_) {
    if (s.step == step) return s.slot;
  }
  return std::nullopt;
}

absl::Status RankSession::TakePredecessorEma(int64_t step) {
  std::shared_ptr<RankSession> predecessor;
  {
    zcc::MutexLock lock(&mu_);
    if (predecessor_ema_taken_) return absl::OkStatus();  // a second restore from memory
    predecessor = predecessor_;
    predecessor_ema_taken_ = predecessor != nullptr;
  }
  if (predecessor == nullptr) {
    return absl::FailedPreconditionError("no snapshot of the previous trainer is held any more");
  }
  ema_.AdoptFrom(predecessor->ema_, step);
  return absl::OkStatus();
}

void RankSession::ReleaseHeld(std::optional<int64_t> restored) {
  std::vector<SlotSnapshot> held;
  std::shared_ptr<RankSession> predecessor;  // destroyed here, outside the lock
  {
    zcc::MutexLock lock(&mu_);
    if (held_.empty() && predecessor_ == nullptr) return;
    inherits_.store(false);
    held.swap(held_);
    predecessor.swap(predecessor_);
  }
  for (const SlotSnapshot& s : held) {
    ingested_full_step_[s.slot].store(restored == s.step ? s.step : -1);
    FreeSlot(s.slot);
  }
}

bool RankSession::AllStaged() const {
  for (const RegisteredTensor& t : registered_) {
    if (!t.staged) return false;
  }
  return true;
}

std::vector<SlotSnapshot> RankSession::IntactSnapshots() const {
  std::vector<SlotSnapshot> intact;
  {
    zcc::MutexLock lock(&mu_);
    intact = held_;
  }
  for (uint32_t i = 0; i < options_.num_slots; ++i) {
    const int64_t ingested = ingested_full_step_[i].load();
    if (ingested >= 0 && ring_.FreeSlotStep(i) == ingested) intact.push_back({i, ingested});
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

std::optional<uint32_t> RankSession::TakeSlotForRestore() {
  std::optional<uint32_t> slot = ring_.TakeFree();
  // What it held is overwritten: no longer a snapshot a successor could use.
  if (slot.has_value()) ingested_full_step_[*slot].store(-1);
  return slot;
}

uint64_t RankSession::SlotOffset(uint32_t slot) const {
  return static_cast<uint64_t>(slot_data(slot) - segment_.base());
}

shm::Segment RankSession::TakeSegment() {
  segment_taken_.store(true);
  return std::move(segment_);
}

RankCounters RankSession::counters() const {
  RankCounters c;
  const ControlBlock* cb = segment_.control();
  c.last_snapshot_step = last_snapshot_step_.load();
  c.last_persisted_step = last_persisted_step_.load();
  c.snapshots_ingested = snapshots_ingested_.load();
  c.snapshots_skipped = cb->snapshots_skipped.load(std::memory_order_relaxed);
  c.persist_failures = persist_failures_.load();
  // Published by the EMA's users: a status query never waits for an EMA
  // update, copy or restore.
  c.last_ema_step = ema_.last_step();
  c.ema_skipped_nonfinite = ema_.skipped_nonfinite();
  c.ema_tensors = ema_.num_tensors();
  c.slots_in_use = ring_.InUse();
  if (puller_ != nullptr) {
    c.daemon_pull = true;
    c.pulls = puller_->Stats();
  }
  zcc::MutexLock lock(&mu_);
  c.last_error = last_error_;
  return c;
}

}  // namespace zcc::daemon
