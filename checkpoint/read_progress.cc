#include "checkpoint/read_progress.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace zcc::checkpoint {
namespace {

std::string Describe(uint64_t read, uint64_t planned, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const double gbps = seconds > 0 ? read / seconds / 1e9 : 0;
  if (planned == 0) {
    return absl::StrFormat("%.2f GB read in %.1f s, %.2f GB/s", read / 1e9, seconds, gbps);
  }
  return absl::StrFormat("%.2f of %.2f GB read in %.1f s, %.2f GB/s", read / 1e9, planned / 1e9,
                         seconds, gbps);
}

}  // namespace

ReadProgress::ReadProgress(std::string what, absl::Duration period)
    : what_(std::move(what)), period_(period), start_(absl::Now()), next_line_(start_ + period) {}

void ReadProgress::AddPlanned(uint64_t bytes) {
  zcc::MutexLock lock(&mu_);
  planned_ += bytes;
}

void ReadProgress::AddRead(uint64_t bytes) {
  const absl::Time now = absl::Now();
  std::string line;
  {
    zcc::MutexLock lock(&mu_);
    read_ += bytes;
    if (now < next_line_) return;
    next_line_ = now + period_;
    line = Describe(read_, planned_, now - start_);
  }
  // Outside the lock: a slow stderr must not hold up another reader.
  ZCC_LOG(INFO) << what_ << ": " << line;
}

uint64_t ReadProgress::bytes_planned() const {
  zcc::MutexLock lock(&mu_);
  return planned_;
}

uint64_t ReadProgress::bytes_read() const {
  zcc::MutexLock lock(&mu_);
  return read_;
}

absl::Duration ReadProgress::elapsed() const { return absl::Now() - start_; }

std::string ReadProgress::Summary() const {
  const absl::Duration elapsed = absl::Now() - start_;
  zcc::MutexLock lock(&mu_);
  return Describe(read_, 0, elapsed);
}

}  // namespace zcc::checkpoint
