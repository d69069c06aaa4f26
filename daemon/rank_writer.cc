#include "daemon/rank_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zcc::daemon {

RankWriter::RankWriter(RankWriteTarget target) : target_(std::move(target)) {}

RankWriter::~RankWriter() { Stop(); }

void RankWriter::Start() { thread_ = std::thread([this] { Loop(); }); }

void RankWriter::Submit(absl::FunctionRef<WriteJob()> make) {
  zcc::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &RankWriter::Idle));
  job_ = make();
}

void RankWriter::AwaitIdle() {
  zcc::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &RankWriter::Idle));
}

void RankWriter::Stop() {
  {
    zcc::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void RankWriter::Loop() {
  while (true) {
    WriteJob job;
    {
      zcc::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &RankWriter::QueuedOrStopping));
      if (!job_.has_value()) return;  // stopping, and nothing queued
      job = std::move(*job_);
      job_.reset();
      writing_ = true;
    }
    Write(std::move(job));
    zcc::MutexLock lock(&mu_);
    writing_ = false;
  }
}

void RankWriter::Write(WriteJob job) {
  const int64_t step = job.slot.step;
  PersistEvent event;
  event.rank = target_.shards->rank;
  event.step = step;
  {
    ScopedFsIdentity as_owner(target_.fs_owner);
    auto stats = checkpoint::WriteRankShards(target_.job_dir, step, *target_.shards,
                                             target_.slots->data(job.slot.index), target_.io,
                                             job.ema_shards);
    if (stats.ok()) {
      event.stats = *stats;
      last_persisted_step_.store(step);
    } else {
      event.status = stats.status();
      persist_failures_.fetch_add(1);
      // The trainer's client reports the failure itself (step first: it
      // reads the count, then the step).
      shm::ControlBlock* cb = target_.slots->control();
      cb->last_failed_step.store(step, std::memory_order_relaxed);
      cb->persist_failures.fetch_add(1, std::memory_order_release);
      target_.on_error(absl::StrCat(job.on_failure ? "persist-on-failure" : "persist", " of step ",
                                    step, " failed: ", stats.status().message()));
    }
  }
  // The EMA copy lives only while a write needs it.
  job.ema_copy = storage::AlignedBuffer();
  job.ema_shards.clear();
  target_.slots->Free(job.slot.index);
  // Commit and retention do not need the slot: reported once it is free.
  target_.on_persisted(event);
}

}  // namespace zcc::daemon
