#include "daemon/rank/rank_writer.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "format/manifest.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

struct RankWriter::State {
  explicit State(RankWriteTarget t) : target(std::move(t)) {}

  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !job.has_value() && !writing; }
  // The pool's task: the queued job, written.
  void RunQueued() ABSL_LOCKS_EXCLUDED(mu);
  void Write(WriteJob job);

  const RankWriteTarget target;
  std::atomic<int64_t> last_persisted_step{-1};
  std::atomic<uint64_t> persist_failures{0};
  zcc::Mutex mu;
  std::optional<WriteJob> job ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;
  zcc::Mutex own_replicate_order;  // where the target names none
};

RankWriter::RankWriter(RankWriteTarget target, TaskPool* pool)
    : state_(std::make_shared<State>(std::move(target))),
      own_pool_(pool == nullptr ? std::make_unique<TaskPool>(1) : nullptr),
      pool_(pool != nullptr ? pool : own_pool_.get()) {}

RankWriter::~RankWriter() { Stop(); }

void RankWriter::Submit(absl::FunctionRef<WriteJob()> make) {
  {
    zcc::MutexLock lock(&state_->mu);
    state_->mu.Await(absl::Condition(state_.get(), &State::Idle));
    state_->job = make();
  }
  pool_->Post([state = state_] { state->RunQueued(); });
}

bool RankWriter::TrySubmit(absl::FunctionRef<WriteJob()> make) {
  {
    zcc::MutexLock lock(&state_->mu);
    if (!state_->Idle()) return false;
    state_->job = make();
  }
  pool_->Post([state = state_] { state->RunQueued(); });
  return true;
}

void RankWriter::AwaitIdle() {
  zcc::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(state_.get(), &State::Idle));
}

void RankWriter::LowerLastPersisted(int64_t step) {
  int64_t persisted = state_->last_persisted_step.load();
  while (persisted > step && !state_->last_persisted_step.compare_exchange_weak(persisted, step)) {
  }
}

bool RankWriter::idle() const {
  zcc::MutexLock lock(&state_->mu);
  return state_->Idle();
}

int64_t RankWriter::last_persisted_step() const { return state_->last_persisted_step.load(); }
uint64_t RankWriter::persist_failures() const { return state_->persist_failures.load(); }

void RankWriter::State::RunQueued() {
  WriteJob queued;
  {
    zcc::MutexLock lock(&mu);
    if (!job.has_value()) return;
    queued = std::move(*job);
    job.reset();
    writing = true;
  }
  Write(std::move(queued));
  zcc::MutexLock lock(&mu);
  writing = false;
  if (target.on_idle) target.on_idle();
}

void RankWriter::State::Write(WriteJob job) {
  const int64_t step = job.slot.step;
  PersistEvent event;
  event.rank = target.shards->rank;
  event.step = step;
  event.write_began = std::chrono::steady_clock::now();
  const std::function<bool()> left_behind = [this, &job, step] {
    return target.left_behind && target.left_behind(step, job.restores);
  };
  // A segment cut short under zccd reads zeros (shm/truncation_guard.h):
  // nothing read from it is written or sent from the moment that is known.
  const auto cut = [this] { return target.slots->cut(); };
  if (job.persist && cut()) {
    event.status = absl::DataLossError("the trainer cut its staging segment short (ftruncate)");
    persist_failures.fetch_add(1);
    target.on_error(absl::StrCat("persist of step ", step, " failed: ", event.status.message()));
  } else if (job.persist) {
    ScopedFsIdentity as_owner(target.fs_owner);
    checkpoint::IoOptions io = target.io;
    const std::function<bool()> give_up = [&left_behind, &cut] { return left_behind() || cut(); };
    io.cancelled = &give_up;
    auto stats = checkpoint::WriteRankShards(target.job_dir, step, *target.shards,
                                             target.slots->data(job.slot.index), io,
                                             job.ema_shards, job.timeline);
    if (stats.ok() && give_up()) {
      // Gone back, or the segment found cut, while the manifest was
      // written: it goes again.
      storage::Storage& fs = storage::StorageOrDefault(target.io.storage);
      const std::string dir = checkpoint::WritingStepDir(fs, target.job_dir, step);
      const absl::Status removed =
          fs.Remove(JoinPath(dir, format::ManifestFileName(target.shards->rank)));
      if (!removed.ok() && !absl::IsNotFound(removed)) {
        // Said, not swallowed: that manifest could still complete the step.
        target.on_error(absl::StrCat("the manifest of step ", step, ", of the state the trainer ",
                                     "went back from, could not be removed: ", removed.message()));
      }
      stats = cut() ? absl::DataLossError("the trainer cut its staging segment short "
                                          "(ftruncate) as it was written")
                    : absl::CancelledError("the write was given up after its manifest");
    }
    // (Given up, or failed as the job dropped the step's directory.)
    if (!stats.ok() && left_behind()) {
      event.left_behind = true;
      event.status = stats.status();
      ZCC_LOG(INFO) << "rank " << event.rank << ": the write of step " << step
                    << " is given up: its trainer went back to an older step meanwhile";
    } else if (stats.ok()) {
      event.stats = *stats;
      last_persisted_step.store(step);
    } else {
      event.status = stats.status();
      persist_failures.fetch_add(1);
      // The trainer's client reports the failure itself (step first: it
      // reads the count, then the step).
      shm::ControlBlock* cb = target.slots->control();
      cb->last_failed_step.store(step, std::memory_order_relaxed);
      cb->persist_failures.fetch_add(1, std::memory_order_release);
      target.on_error(absl::StrCat(job.on_failure ? "persist-on-failure" : "persist", " of step ",
                                    step, " failed: ", stats.status().message()));
    }
  }
  if (job.replicate && target.on_replicate && !left_behind() && !cut()) {
    // The files a disk write makes, made in memory, for other nodes: at idle
    // priority unless a checkpoint waits behind it (the trainer's copies and
    // zccd's ingest come first; measured in e2e_bench: 0.96 of the step time
    // without replication, against 0.83 at normal priority).
    std::optional<IdlePriority> idle;
    if (!job.persist) idle.emplace();
    auto bytes = checkpoint::SerializeRankStep(step, *target.shards,
                                               target.slots->data(job.slot.index), job.ema_shards,
                                               job.timeline);
    // (Held through the hand-in, which keeps the owner's copy: seconds for
    // a large step, during which the rank's other writer may wait here.)
    zcc::MutexLock in_order(target.replicate_order != nullptr ? target.replicate_order
                                                              : &own_replicate_order);
    if (bytes.ok() && left_behind()) {
      // Gone back while it was serialized: of the run left behind.
      ZCC_LOG(INFO) << "rank " << event.rank << ": step " << step << " is not replicated: its "
                    << "trainer went back to an older step meanwhile";
    } else if (bytes.ok() && cut()) {
      ZCC_LOG(WARNING) << "rank " << event.rank << ": step " << step << " is not replicated: "
                       << "the trainer cut its staging segment short as it was read";
    } else if (bytes.ok()) {
      bytes->went_on_from = job.went_on_from;
      target.on_replicate(*std::move(bytes));
    } else {
      target.on_error(absl::StrCat("replication of step ", step, " failed: ",
                                    bytes.status().message()));
    }
  }
  // The EMA copy lives only while a write needs it.
  job.ema_copy = storage::AlignedBuffer();
  job.ema_shards.clear();
  target.slots->Free(job.slot.index);
  // Commit and retention do not need the slot: reported once it is free.
  if (job.persist) target.on_persisted(event);
}

}  // namespace zcc::daemon
