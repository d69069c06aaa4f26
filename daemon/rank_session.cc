#include "daemon/rank_session.h"

#include <signal.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"

namespace zcc::daemon {

using shm::ControlBlock;


RankSession::RankSession(checkpoint::RankShards shards, std::vector<RegisteredTensor> registered,
                         shm::Segment segment, RankSessionOptions options,
                         PersistCallback on_persisted, std::unique_ptr<ema::EmaUpdater> ema,
                         std::vector<size_t> ema_index)
    : shards_(std::move(shards)),
      registered_(std::move(registered)),
      segment_(std::move(segment)),
      options_(std::move(options)),
      ring_(segment_.control(), options_.num_slots),
      on_persisted_(std::move(on_persisted)),
      registered_ns_(shm::MonotonicNanos()),
      pid_visible_(options_.pid > 0 && (::kill(options_.pid, 0) == 0 || errno == EPERM)),
      ema_(std::move(ema)),
      ema_index_(std::move(ema_index)) {
  for (size_t i : ema_index_) ema_offsets_.push_back(registered_[i].slot_offset);
}

RankSession::~RankSession() { Stop(); }

void RankSession::Start() {
  writer_ = std::thread([this] { WriterLoop(); });
  thread_ = std::thread([this] { IngestLoop(); });
}

void RankSession::Stop() {
  {
    zcc::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true);
  ControlBlock* cb = segment_.control();
  cb->doorbell.fetch_add(1);
  FutexWakeAll(&cb->doorbell);
  if (thread_.joinable()) thread_.join();
  // Ingest has handed over its last write; the writer finishes it and leaves.
  {
    zcc::MutexLock lock(&write_mu_);
    writer_stop_ = true;
  }
  if (writer_.joinable()) writer_.join();
  cb->closed.store(1);
  FutexWakeAll(&cb->closed);
  restore_buffers_.Clear();
  cb->free_bell.fetch_add(1);
  FutexWakeAll(&cb->free_bell);
}

void RankSession::Heartbeat() {
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
    if (!Process(*slot)) FreeSlot(slot->index);  // else the writer frees it
    worked = true;
  }
  return worked;
}

void RankSession::FreeSlot(uint32_t index) { ring_.Free(index); }

bool RankSession::Process(const shm::ReadySlot& slot) {
  snapshots_ingested_.fetch_add(1);
  last_snapshot_step_.store(slot.step);
  if (options_.metrics != nullptr) options_.metrics->snapshots().Increment();
  {
    zcc::MutexLock lock(&ema_mu_);
    if (ema_ != nullptr) UpdateEma(slot);
  }
  if (slot.kind != shm::SnapshotKind::kFull) return false;
  last_full_slot_.store(slot.index);
  last_full_step_.store(slot.step);
  const bool due = options_.save_every > 0 && slot.step % options_.save_every == 0;
  if (!due && !save_requested_.exchange(false)) return false;
  if (due) save_requested_.store(false);
  SubmitWrite(WriteJob{slot, /*on_failure=*/false});
  return true;
}

void RankSession::SubmitWrite(const WriteJob& job) {
  zcc::MutexLock lock(&write_mu_);
  write_mu_.Await(absl::Condition(this, &RankSession::WriterIdle));
  {
    zcc::MutexLock ema_lock(&ema_mu_);
    CopyEmaForWrite();
  }
  write_job_ = job;
}

void RankSession::AwaitWriterIdle() {
  zcc::MutexLock lock(&write_mu_);
  write_mu_.Await(absl::Condition(this, &RankSession::WriterIdle));
}

void RankSession::CopyEmaForWrite() {
  ema_extra_.clear();
  if (ema_ == nullptr || !ema_->initialized()) return;
  uint64_t total = 0;
  for (size_t i = 0; i < ema_->num_tensors(); ++i) total += ema_->ema(i).size() * sizeof(float);
  ema_copy_ = storage::AlignedBuffer::Uninitialized(total);
  checkpoint::ExtraShard shard{"ema", format::ShardFileName("ema", shards_.rank), {}};
  uint64_t offset = 0;
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    const absl::Span<const float> data = ema_->ema(i);
    const uint64_t bytes = data.size() * sizeof(float);
    uint8_t* dst = ema_copy_.data() + offset;
    if (bytes > 0) std::memcpy(dst, data.data(), bytes);
    shard.tensors.push_back({ema_->tensor(i).name, format::DType::kF32,
                             registered_[ema_index_[i]].shape, dst, bytes});
    offset += bytes;
  }
  ema_extra_.push_back(std::move(shard));
}

void RankSession::WriterLoop() {
  while (true) {
    WriteJob job;
    {
      zcc::MutexLock lock(&write_mu_);
      write_mu_.Await(absl::Condition(this, &RankSession::WriteQueuedOrStopping));
      if (!write_job_.has_value()) return;  // stopping, and nothing queued
      job = *write_job_;
      write_job_.reset();
      writing_ = true;
    }
    const PersistEvent event = Write(job);
    // The EMA copy lives only while a write needs it (zccd's steady-state
    // memory is the EMA, not twice the EMA).
    ema_copy_ = storage::AlignedBuffer();
    ema_extra_.clear();
    FreeSlot(job.slot.index);
    // Commit and retention do not need the slot: reported once it is free.
    on_persisted_(event);
    zcc::MutexLock lock(&write_mu_);
    writing_ = false;
  }
}

PersistEvent RankSession::Write(const WriteJob& job) {
  ScopedFsIdentity as_owner(options_.fs_owner);
  PersistEvent event;
  event.rank = shards_.rank;
  event.step = job.slot.step;
  auto stats = checkpoint::WriteRankShards(options_.job_dir, job.slot.step, shards_,
                                           slot_data(job.slot.index), options_.io, ema_extra_);
  if (stats.ok()) {
    event.stats = *stats;
    last_persisted_step_.store(job.slot.step);
  } else {
    event.status = stats.status();
    persist_failures_.fetch_add(1);
    // The trainer's client reports the failure itself (step first: it reads
    // the count, then the step).
    segment_.control()->last_failed_step.store(job.slot.step, std::memory_order_relaxed);
    segment_.control()->persist_failures.fetch_add(1, std::memory_order_release);
    SetError(absl::StrCat(job.on_failure ? "persist-on-failure" : "persist", " of step ",
                          job.slot.step, " failed: ", stats.status().message()));
  }
  return event;
}

void RankSession::UpdateEma(const shm::ReadySlot& slot) {
  const uint32_t interval = std::max<uint32_t>(1, options_.ema_interval);
  if (slot.step % interval != 0 || slot.step <= ema_->last_step()) return;
  const absl::Time start = absl::Now();
  auto result = ema_->Update(slot_data(slot.index), shards_.layout.slot_bytes, ema_offsets_, slot.step);
  PublishEmaCounters();
  metrics::ZccMetrics* m = options_.metrics;
  if (!result.ok()) {
    if (m != nullptr) m->errors(metrics::ErrorKind::kEma).Increment();
    SetError(absl::StrCat("EMA update at step ", slot.step, " failed: ", result.status().message()));
    return;
  }
  if (!result->applied) {
    // Reported in status every time, logged for the first and then every
    // 100th, so a diverged run does not flood the log.
    const uint64_t skipped = ema_->counters().skipped_nonfinite;
    const std::string error = absl::StrCat("EMA update at step ", slot.step, " skipped: tensor '",
                                           result->nonfinite_tensor, "' holds NaN or Inf (",
                                           skipped, " skipped so far)");
    if (skipped == 1 || skipped % 100 == 0) {
      SetError(error);
    } else {
      zcc::MutexLock lock(&mu_);
      last_error_ = error;
    }
    return;
  }
  if (m != nullptr) {
    m->ema_seconds().ObserveDuration(absl::Now() - start);
    uint64_t source_bytes = 0;
    for (size_t i : ema_index_) source_bytes += registered_[i].nbytes;
    m->ema_bytes().Increment(source_bytes + 2 * ema_->state_bytes());
  }
}

absl::StatusOr<v1::ReadEmaResponse> RankSession::CopyEma(const std::string& shm_name) {
  ZCC_RETURN_IF_ERROR(restore_buffers_.CheckRoom());
  zcc::ReleasableMutexLock lock(&ema_mu_);
  if (ema_ == nullptr) {
    return absl::FailedPreconditionError("this rank keeps no EMA (register with an ema_decay)");
  }
  std::vector<shm::LayoutInput> inputs;
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    inputs.push_back({ema_->tensor(i).name, ema_->tensor(i).elements * sizeof(float),
                      format::TensorKind::kParam});
  }
  ZCC_ASSIGN_OR_RETURN(shm::SlotLayout layout, shm::ComputeSlotLayout(inputs, ~uint64_t{0} >> 1));
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       shm::Segment::Create(shm_name, shm::SegmentBytes(1, layout.slot_bytes),
                                            options_.segment_owner));
  v1::ReadEmaResponse resp;
  resp.set_step(ema_->initialized() ? ema_->last_step() : -1);
  resp.set_shm_name(shm_name);
  resp.set_segment_bytes(segment.size());
  resp.set_data_offset(shm::ControlBlockBytes());
  uint8_t* base = segment.base() + shm::ControlBlockBytes();
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    const absl::Span<const float> data = ema_->ema(i);
    if (!data.empty()) std::memcpy(base + layout.placements[i].offset, data.data(), data.size() * 4);
    v1::TensorPlacement* p = resp.add_placements();
    p->set_name(ema_->tensor(i).name);
    p->set_offset(layout.placements[i].offset);
    p->set_nbytes(ema_->tensor(i).elements * sizeof(float));
    p->set_staged(!data.empty());
  }
  const int64_t step = resp.step();
  lock.Release();
  resp.set_restore_id(restore_buffers_.Add(std::move(segment), step));
  return resp;
}

absl::Status RankSession::RestoreEma(const std::string& step_dir, uint32_t world_size,
                                     int64_t step) {
  // The EMA's tensors are fixed at registration; the disk is read without
  // ema_mu_ (status, ingest and EMA reads go on), and the result installed
  // under it.
  std::vector<uint64_t> elements;
  {
    zcc::MutexLock lock(&ema_mu_);
    if (ema_ == nullptr) return absl::OkStatus();
    for (size_t i = 0; i < ema_->num_tensors(); ++i) elements.push_back(ema_->tensor(i).elements);
  }
  // Which rank's shards hold each EMA tensor.
  std::map<std::string, uint32_t> source;
  for (uint32_t r = 0; r < world_size; ++r) {
    const std::string path = JoinPath(step_dir, format::ManifestFileName(r));
    ZCC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, format::kMaxManifestBytes));
    ZCC_ASSIGN_OR_RETURN(format::RankManifest manifest, format::DecodeRankManifest(text));
    for (const format::ManifestTensor& t : manifest.tensors) {
      if (t.kind == "ema") source.emplace(t.name, r);
    }
  }
  std::vector<std::vector<float>> data(elements.size());
  std::map<uint32_t, std::vector<checkpoint::ReadTarget>> by_rank;
  for (size_t i = 0; i < elements.size(); ++i) {
    const RegisteredTensor& t = registered_[ema_index_[i]];
    auto it = source.find(t.name);
    if (it == source.end()) {
      ZCC_LOG(WARNING) << "job " << shards_.job_id << " rank " << shards_.rank << ": "
                       << step_dir << " holds no EMA of '" << t.name
                       << "'; the EMA starts afresh from the next snapshot";
      return absl::OkStatus();
    }
    data[i].resize(elements[i]);
    by_rank[it->second].push_back({t.name, "ema", format::DType::kF32, t.shape,
                                   reinterpret_cast<uint8_t*>(data[i].data()),
                                   data[i].size() * sizeof(float)});
  }
  for (const auto& [rank, targets] : by_rank) {
    ZCC_RETURN_IF_ERROR(checkpoint::ReadRankTensors(step_dir, rank, targets));
  }
  std::vector<absl::Span<const float>> spans(data.begin(), data.end());
  zcc::MutexLock lock(&ema_mu_);
  ZCC_RETURN_IF_ERROR(ema_->Load(spans, step));
  PublishEmaCounters();
  return absl::OkStatus();
}

void RankSession::PublishEmaCounters() {
  ema_last_step_.store(ema_->last_step(), std::memory_order_relaxed);
  ema_skipped_nonfinite_.store(ema_->counters().skipped_nonfinite, std::memory_order_relaxed);
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
  AwaitWriterIdle();
  const int64_t step = last_full_step_.load();
  if (step < 0 || step <= last_persisted_step_.load()) return std::nullopt;
  const uint32_t index = last_full_slot_.load();
  // Claim the slot so nothing can change it while it is written; a slot the
  // trainer had taken again holds a torn copy and is left alone.
  if (!ring_.ClaimForWrite(index, step)) return std::nullopt;
  const shm::ReadySlot slot{index, step, shm::SnapshotKind::kFull, 0};
  SubmitWrite(WriteJob{slot, /*on_failure=*/true});
  AwaitWriterIdle();
  return last_persisted_step_.load() == step ? std::optional<int64_t>(step) : std::nullopt;
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
  c.last_ema_step = ema_last_step_.load(std::memory_order_relaxed);
  c.ema_skipped_nonfinite = ema_skipped_nonfinite_.load(std::memory_order_relaxed);
  c.ema_tensors = ema_index_.size();
  c.slots_in_use = ring_.InUse();
  zcc::MutexLock lock(&mu_);
  c.last_error = last_error_;
  return c;
}

}  // namespace zcc::daemon
