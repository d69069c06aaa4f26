#include "daemon/rank_writer.h"

#include <utility>

namespace zcc::daemon {

RankWriter::RankWriter(WriteFn write) : write_(std::move(write)) {}

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
    write_(std::move(job));
    zcc::MutexLock lock(&mu_);
    writing_ = false;
  }
}

}  // namespace zcc::daemon
