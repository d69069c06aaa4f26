#include "copy/host_copier.h"

#include "common/thread_priority.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc {
absl::StatusOr<std::unique_ptr<HostCopier>> HostCopier::Create(const HostCopierOptions& options) {
  if (options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("HostCopier: chunk_bytes must be positive");
  }
  if (options.per_chunk_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("HostCopier: per_chunk_delay must not be negative");
  }
  std::unique_ptr<HostCopier> copier(new HostCopier(options));
  try {
    copier->copy_thread_ = std::thread([c = copier.get()] { c->CopyLoop(); });
  } catch (const std::system_error& e) {
    return ErrnoToStatus(e.code().value(), "HostCopier: starting the copy thread");
  }
  return copier;
}

HostCopier::HostCopier(const HostCopierOptions& options) : options_(options) {}

HostCopier::~HostCopier() {
  {
    zcc::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (copy_thread_.joinable()) copy_thread_.join();
}

void HostCopier::CopyLoop() {
  MakeThisThreadBackground();
  for (;;) {
    Job job;
    {
      zcc::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      // Stopping drains the queue first: the destructor promises queued copies finish.
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    for (const CopyRegion& region : job.regions) CopyRegionInChunks(region);
    zcc::MutexLock lock(&mu_);
    last_completed_ = job.ticket;  // Jobs run in ticket order.
  }
}

void HostCopier::CopyRegionInChunks(const CopyRegion& region) const {
  const auto* src = static_cast<const char*>(region.src);
  auto* dst = static_cast<char*>(region.dst);
  for (size_t done = 0; done < region.nbytes;) {
    const size_t n = std::min(options_.chunk_bytes, region.nbytes - done);
    if (options_.per_chunk_delay > absl::ZeroDuration()) {
      absl::SleepFor(options_.per_chunk_delay);
    }
    std::memcpy(dst + done, src + done, n);
    done += n;
  }
}

absl::Status HostCopier::RegisterHostMemory(void* base, size_t bytes) {
  if (base == nullptr) return absl::InvalidArgumentError("RegisterHostMemory: null base");
  if (bytes == 0) return absl::InvalidArgumentError("RegisterHostMemory: zero bytes");
  zcc::MutexLock lock(&mu_);
  if (!registered_.emplace(base, bytes).second) {
    return absl::AlreadyExistsError("RegisterHostMemory: base is already registered");
  }
  return absl::OkStatus();
}

absl::Status HostCopier::UnregisterHostMemory(void* base) {
  if (base == nullptr) return absl::InvalidArgumentError("UnregisterHostMemory: null base");
  zcc::MutexLock lock(&mu_);
  if (registered_.erase(base) == 0) {
    return absl::NotFoundError("UnregisterHostMemory: base was not registered");
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyTicket> HostCopier::Enqueue(absl::Span<const CopyRegion> regions,
                                               void* /*stream*/) {
  if (absl::Status st = ValidateRegions(regions); !st.ok()) return st;
  Job job{0, regions};
  zcc::MutexLock lock(&mu_);
  job.ticket = ++last_issued_;
  const CopyTicket ticket = job.ticket;
  queue_.push_back(std::move(job));
  return ticket;
}

absl::Status HostCopier::Wait(CopyTicket ticket) {
  zcc::MutexLock lock(&mu_);
  if (ticket == 0 || ticket > last_issued_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Wait: ticket ", ticket, " was never issued (last issued ", last_issued_, ")"));
  }
  AwaitCompleted(ticket);
  return absl::OkStatus();
}

absl::Status HostCopier::FenceBeforeUpdate(void* /*stream*/) {
  zcc::MutexLock lock(&mu_);
  AwaitCompleted(last_issued_);
  return absl::OkStatus();
}

void HostCopier::AwaitCompleted(CopyTicket ticket) {
  auto completed = [this, ticket]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return last_completed_ >= ticket; };
  mu_.Await(absl::Condition(&completed));
}

absl::Status HostCopier::CopyToDevice(absl::Span<const CopyRegion> regions, void* /*stream*/) {
  if (absl::Status st = ValidateRegions(regions); !st.ok()) return st;
  for (const CopyRegion& r : regions) {
    if (r.nbytes != 0) std::memcpy(r.dst, r.src, r.nbytes);
  }
  return absl::OkStatus();
}

}  // namespace zcc
