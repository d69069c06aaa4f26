#include "daemon/rank/rank_ema.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/container/flat_hash_set.h"
#include "checkpoint/global_index.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/status.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/slot_layout.h"

namespace zcc::daemon {
namespace {

std::vector<uint64_t> SlotOffsets(const std::vector<RegisteredTensor>& sources) {
  std::vector<uint64_t> offsets;
  offsets.reserve(sources.size());
  for (const RegisteredTensor& t : sources) offsets.push_back(t.slot_offset);
  return offsets;
}

}  // namespace

RankEma::RankEma(std::unique_ptr<ema::EmaUpdater> ema, std::vector<RegisteredTensor> sources,
                 std::string job_id, uint32_t rank, uint32_t interval,
                 metrics::ZccMetrics* metrics)
    : enabled_(ema != nullptr),
      sources_(ema != nullptr ? std::move(sources) : std::vector<RegisteredTensor>{}),
      offsets_(SlotOffsets(sources_)),
      job_id_(std::move(job_id)),
      rank_(rank),
      interval_(std::max<uint32_t>(1, interval)),
      metrics_(metrics),
      allocated_bytes_(ema != nullptr ? ema->allocated_bytes() : 0),
      ema_(std::move(ema)) {}

std::optional<EmaProblem> RankEma::Update(const uint8_t* slot, uint64_t slot_bytes, int64_t step,
                                          uint64_t seq) {
  if (!enabled_) return std::nullopt;
  zcc::MutexLock lock(&mu_);
  if (step % interval_ != 0 || seq < first_seq_) return std::nullopt;
  if (step <= ema_->last_step()) {
    // A step replayed after a restore that kept a newer EMA is not folded
    // in again; one published before the step folded in last was taken in
    // out of order, and is lost to the EMA.
    if (seq < last_seq_) {
      const uint64_t n = out_of_order_.fetch_add(1, std::memory_order_relaxed) + 1;
      if (metrics_ != nullptr) {
        metrics_->ema_left_out(metrics::EmaLeftOut::kOutOfOrder).Increment();
      }
      if (n == 1 || n % 100 == 0) {
        ZCC_LOG(ERROR) << "job " << job_id_ << " rank " << rank_ << ": the snapshot of step "
                       << step << " was taken in after that of step " << ema_->last_step()
                       << ", published later; the EMA has not folded it in (" << n
                       << " so far)";
      }
    }
    return std::nullopt;
  }
  const absl::Time start = absl::Now();
  auto result = ema_->Update(slot, slot_bytes, offsets_, step);
  PublishCounters();
  if (!result.ok()) {
    if (metrics_ != nullptr) metrics_->errors(metrics::ErrorKind::kEma).Increment();
    return EmaProblem{
        absl::StrCat("EMA update at step ", step, " failed: ", result.status().message()), true};
  }
  if (!result->applied) {
    if (metrics_ != nullptr) metrics_->ema_left_out(metrics::EmaLeftOut::kNonFinite).Increment();
    // Reported in status every time, logged for the first and then every
    // 100th, so a diverged run does not flood the log.
    const uint64_t skipped = ema_->counters().skipped_nonfinite;
    return EmaProblem{absl::StrCat("EMA update at step ", step, " skipped: tensor '",
                                   result->nonfinite_tensor, "' holds NaN or Inf (", skipped,
                                   " skipped so far)"),
                      skipped == 1 || skipped % 100 == 0};
  }
  if (metrics_ != nullptr) {
    metrics_->ema_seconds().ObserveDuration(absl::Now() - start);
    uint64_t source_bytes = 0;
    for (const RegisteredTensor& t : sources_) source_bytes += t.nbytes;
    metrics_->ema_bytes().Increment(source_bytes + 2 * ema_->state_bytes());
  }
  last_seq_ = seq;
  return std::nullopt;
}

void RankEma::CopyForWrite(WriteJob* job) {
  job->ema_copy = storage::AlignedBuffer();
  job->ema_shards.clear();
  if (!enabled_) return;
  zcc::MutexLock lock(&mu_);
  if (!ema_->initialized()) return;
  if (ema_->last_step() > job->slot.step) {
    // Folded in later steps already (a write of an older snapshot:
    // persist-on-failure): not this step's EMA, nor one it could say.
    ZCC_LOG(WARNING) << "job " << job_id_ << " rank " << rank_ << ": step " << job->slot.step
                     << " is written without the EMA, which has folded in steps up to "
                     << ema_->last_step();
    return;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < ema_->num_tensors(); ++i) total += ema_->ema(i).size() * sizeof(float);
  job->ema_copy = storage::AlignedBuffer::Uninitialized(total);
  checkpoint::ExtraShard shard{format::kEmaKindName, format::ShardFileName("ema", rank_), {},
                               ema_->last_step()};
  uint64_t offset = 0;
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    const absl::Span<const float> data = ema_->ema(i);
    const uint64_t bytes = data.size() * sizeof(float);
    uint8_t* dst = job->ema_copy.data() + offset;
    if (bytes > 0) std::memcpy(dst, data.data(), bytes);
    shard.tensors.push_back({ema_->tensor(i).name, format::DType::kF32, sources_[i].shape, dst,
                             bytes, sources_[i].global_shape, sources_[i].box_offset});
    offset += bytes;
  }
  job->ema_shards.push_back(std::move(shard));
}

absl::StatusOr<std::pair<shm::Segment, v1::ReadEmaResponse>> RankEma::CopyToSegment(
    const std::string& shm_name, uid_t owner) {
  if (!enabled_) {
    return absl::FailedPreconditionError("this rank keeps no EMA (register with an ema_decay)");
  }
  // The EMA's tensors are fixed at registration (AdoptFrom swaps only
  // updaters of the same tensors): the segment is made and its pages
  // faulted in before the lock, under which only the copy runs (the ingest
  // thread's next update waits for it).
  std::vector<shm::LayoutInput> inputs;
  {
    zcc::MutexLock lock(&mu_);
    for (size_t i = 0; i < ema_->num_tensors(); ++i) {
      inputs.push_back({ema_->tensor(i).name, ema_->tensor(i).elements * sizeof(float),
                        format::TensorKind::kParam});
    }
  }
  ZCC_ASSIGN_OR_RETURN(shm::SlotLayout layout, shm::ComputeSlotLayout(inputs, ~uint64_t{0} >> 1));
  ZCC_ASSIGN_OR_RETURN(
      shm::Segment segment,
      shm::Segment::Create(shm_name, shm::SegmentBytes(1, layout.slot_bytes), owner));
  // (An older kernel faults the pages in during the copy instead.)
  if (absl::Status st = segment.Populate(shm::ControlBlockBytes(), layout.slot_bytes);
      !st.ok() && !absl::IsUnimplemented(st)) {
    return st;
  }
  v1::ReadEmaResponse resp;
  resp.set_shm_name(shm_name);
  resp.set_segment_bytes(segment.size());
  resp.set_data_offset(shm::ControlBlockBytes());
  uint8_t* base = segment.base() + shm::ControlBlockBytes();
  zcc::MutexLock lock(&mu_);
  resp.set_step(ema_->initialized() ? ema_->last_step() : -1);
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    const absl::Span<const float> data = ema_->ema(i);
    if (!data.empty()) std::memcpy(base + layout.placements[i].offset, data.data(), data.size() * 4);
    v1::TensorPlacement* p = resp.add_placements();
    p->set_name(ema_->tensor(i).name);
    p->set_offset(layout.placements[i].offset);
    p->set_nbytes(ema_->tensor(i).elements * sizeof(float));
    p->set_staged(!data.empty());
  }
  return std::make_pair(std::move(segment), std::move(resp));
}

absl::StatusOr<RankEma::Saved> RankEma::ReadSaved(const std::string& step_dir,
                                                  const checkpoint::GroupedIndex& index,
                                                  const checkpoint::IoOptions& io) {
  Saved saved;
  if (!enabled_) return saved;
  // The EMA's tensors are fixed at registration (AdoptFrom swaps only
  // updaters of the same tensors): their sizes are read once under the lock.
  std::vector<uint64_t> elements;
  {
    zcc::MutexLock lock(&mu_);
    for (size_t i = 0; i < ema_->num_tensors(); ++i) elements.push_back(ema_->tensor(i).elements);
  }
  // Each EMA box is filled from the saved EMA pieces that overlap it,
  // whatever layout wrote the step.
  absl::flat_hash_set<std::string> names;
  for (const checkpoint::GlobalTensor& g : index.tensors) {
    if (g.kind == format::kEmaKindName) names.insert(g.name);
  }
  saved.data.resize(elements.size());
  std::vector<checkpoint::BoxTarget> targets;
  for (size_t i = 0; i < elements.size(); ++i) {
    const RegisteredTensor& t = sources_[i];
    if (!names.contains(t.name)) {
      ZCC_LOG(WARNING) << "job " << job_id_ << " rank " << rank_ << ": " << step_dir
                       << " holds no EMA of '" << t.name
                       << "'; the EMA starts afresh from the next snapshot";
      return Saved{};
    }
    saved.data[i].resize(elements[i]);
    targets.push_back({format::kEmaKindName, t.name, format::DType::kF32, t.global(), t.box(),
                       reinterpret_cast<uint8_t*>(saved.data[i].data())});
  }
  ZCC_RETURN_IF_ERROR(
      checkpoint::ReadBoxes(step_dir, index.index, index.tensors, targets, io).status());
  saved.present = true;
  return saved;
}

absl::Status RankEma::Install(Saved saved, int64_t step, uint64_t next_seq) {
  if (!enabled_ || !saved.present) return absl::OkStatus();
  std::vector<absl::Span<const float>> spans(saved.data.begin(), saved.data.end());
  zcc::MutexLock lock(&mu_);
  ZCC_RETURN_IF_ERROR(ema_->Load(spans, step));
  first_seq_ = std::max(first_seq_, next_seq);
  last_seq_ = 0;
  PublishCounters();
  return absl::OkStatus();
}

std::string RankEma::Incompatibility(const RankEma& from) const {
  if (!from.enabled_) return "the previous trainer kept no EMA";
  if (!from.ema_->initialized()) return "the previous trainer's EMA had no update yet";
  if (from.ema_->decay() != ema_->decay()) {
    return absl::StrCat("the previous trainer's EMA decay was ", from.ema_->decay(), ", not ",
                        ema_->decay());
  }
  if (from.ema_->num_tensors() != ema_->num_tensors()) {
    return absl::StrCat("the previous trainer kept the EMA of ", from.ema_->num_tensors(),
                        " tensors, not ", ema_->num_tensors());
  }
  for (size_t i = 0; i < ema_->num_tensors(); ++i) {
    const ema::EmaTensorSpec& mine = ema_->tensor(i);
    const ema::EmaTensorSpec& theirs = from.ema_->tensor(i);
    if (mine.name != theirs.name || mine.elements != theirs.elements || mine.dtype != theirs.dtype) {
      return absl::StrCat("the previous trainer's EMA tensor ", i, " is '", theirs.name,
                          "', not '", mine.name, "'");
    }
  }
  return "";
}

void RankEma::AdoptFrom(RankEma& from, int64_t step, uint64_t next_seq) {
  if (!enabled_) return;
  // `from` is a stopped session's: no other thread takes its lock.
  zcc::MutexLock theirs(&from.mu_);
  zcc::MutexLock mine(&mu_);
  if (std::string why = Incompatibility(from); !why.empty()) {
    ZCC_LOG(WARNING) << "job " << job_id_ << " rank " << rank_ << ": restored step " << step
                     << " from memory without its EMA (" << why
                     << "); the EMA starts afresh from the next snapshot";
    return;
  }
  if (from.ema_->last_step() > step) {
    ZCC_LOG(WARNING) << "job " << job_id_ << " rank " << rank_ << ": restored step " << step
                     << " from memory with an EMA that has folded in steps up to "
                     << from.ema_->last_step() << "; the replay of those steps is not folded again";
  }
  std::swap(ema_, from.ema_);
  if (ema_->interval() != interval_) {
    // The values are the same EMA; the gaps from now on are counted in this
    // trainer's interval (as for an EMA read back from a checkpoint).
    ZCC_LOG(INFO) << "job " << job_id_ << " rank " << rank_ << ": the EMA taken over was kept "
                  << "every " << ema_->interval() << " step(s); it is kept every " << interval_
                  << " from now on";
    ema_->set_interval(interval_);
  }
  first_seq_ = std::max(first_seq_, next_seq);
  last_seq_ = 0;
  PublishCounters();
  from.PublishCounters();
}

bool RankEma::AwaitStep(int64_t step, absl::Time deadline) {
  if (!enabled_) return false;
  zcc::MutexLock lock(&mu_);
  auto reached = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return interrupted_ || ema_->last_step() >= step;
  };
  mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  return ema_->last_step() >= step;
}

void RankEma::Interrupt() {
  zcc::MutexLock lock(&mu_);
  interrupted_ = true;
}

void RankEma::PublishCounters() {
  last_step_.store(ema_->last_step(), std::memory_order_relaxed);
  skipped_nonfinite_.store(ema_->counters().skipped_nonfinite, std::memory_order_relaxed);
}

}  // namespace zcc::daemon
