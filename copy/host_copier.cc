#include "copy/host_copier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/thread_priority.h"

namespace zcc {
namespace {

// Pieces that several threads take in turn: small enough to share a large
// tensor between them.
constexpr uint64_t kMaxPiece = uint64_t{8} << 20;

// `regions` cut into pieces of at most `piece` bytes (empty regions drop out).
std::vector<CopyRegion> CutIntoPieces(absl::Span<const CopyRegion> regions, uint64_t piece) {
  std::vector<CopyRegion> pieces;
  for (const CopyRegion& r : regions) {
    for (uint64_t done = 0; done < r.nbytes; done += piece) {
      pieces.push_back({static_cast<const char*>(r.src) + done, static_cast<char*>(r.dst) + done,
                        std::min<uint64_t>(piece, r.nbytes - done)});
    }
  }
  return pieces;
}

// Threads worth copying `bytes` with: one per 64 MiB (one memcpy stream does
// not reach the memory's bandwidth; small copies are not worth a thread), at
// most 8 and the core count.
unsigned CopyThreads(uint64_t bytes) {
  constexpr uint64_t kPerThread = uint64_t{64} << 20;
  return std::min<unsigned>({std::max(1u, std::thread::hardware_concurrency()), 8u,
                             static_cast<unsigned>(std::max<uint64_t>(1, bytes / kPerThread))});
}

// Runs `work` on this thread and on up to `threads` - 1 helpers; returns when
// all are done. Fewer helpers when threads cannot be started: `work` must
// finish what the others did not take.
void RunOnThreads(unsigned threads, const std::function<void()>& work) {
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace

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
  const uint64_t piece = std::min<uint64_t>(options_.chunk_bytes, kMaxPiece);
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
      job = queue_.front();
      queue_.pop_front();
    }
    // Cut outside mu_, which the trainer's Enqueue takes.
    auto work = std::make_shared<Work>();
    work->pieces = CutIntoPieces(job.regions, piece);
    {
      zcc::MutexLock lock(&mu_);
      current_ = work;
    }
    RunPieces(*work);
    zcc::MutexLock lock(&mu_);
    // A fence's helpers may still be copying the pieces they took.
    auto all_copied = [&work] { return work->finished.load() == work->pieces.size(); };
    mu_.Await(absl::Condition(&all_copied));
    current_.reset();
    last_completed_ = job.ticket;  // Jobs run in ticket order.
  }
}

void HostCopier::RunPieces(Work& work) {
  const size_t n = work.pieces.size();
  for (size_t i = work.next.fetch_add(1); i < n; i = work.next.fetch_add(1)) {
    if (options_.per_chunk_delay > absl::ZeroDuration()) {
      absl::SleepFor(options_.per_chunk_delay);
    }
    const CopyRegion& p = work.pieces[i];
    std::memcpy(p.dst, p.src, p.nbytes);
    if (work.finished.fetch_add(1) + 1 == n) {
      // The last piece: wake the copy thread (mu_'s waiters re-check their
      // conditions when it is released).
      zcc::MutexLock lock(&mu_);
    }
  }
}

void HostCopier::Help(const std::shared_ptr<Work>& work) {
  const size_t next = std::min(work->next.load(), work->pieces.size());
  uint64_t left = 0;
  for (size_t i = next; i < work->pieces.size(); ++i) left += work->pieces[i].nbytes;
  RunOnThreads(CopyThreads(left), [this, work] { RunPieces(*work); });
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
  std::shared_ptr<Work> work;
  CopyTicket target;
  {
    zcc::MutexLock lock(&mu_);
    target = last_issued_;
    // Until the copy thread has cut its next job into pieces, there is
    // nothing to help with.
    auto done_or_current = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return last_completed_ >= target || current_ != nullptr;
    };
    mu_.Await(absl::Condition(&done_or_current));
    if (last_completed_ >= target) return absl::OkStatus();
    work = current_;
  }
  // The copy in progress: this thread (and helpers) take its pieces too.
  // Jobs queued behind it are left to the copy thread.
  Help(work);
  zcc::MutexLock lock(&mu_);
  AwaitCompleted(target);
  return absl::OkStatus();
}

void HostCopier::AwaitCompleted(CopyTicket ticket) {
  auto completed = [this, ticket]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return last_completed_ >= ticket; };
  mu_.Await(absl::Condition(&completed));
}

absl::Status HostCopier::CopyToDevice(absl::Span<const CopyRegion> regions, void* /*stream*/) {
  if (absl::Status st = ValidateRegions(regions); !st.ok()) return st;
  ParallelCopy(regions);
  return absl::OkStatus();
}

void PopulateForRead(const void* begin, uint64_t bytes) {
#ifdef MADV_POPULATE_READ
  // Maps the source's pages in one call (a fresh process's mapping of a
  // segment another process filled) instead of a fault per few pages as the
  // copy reaches them. Best effort: older kernels lack it.
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(begin) + bytes;
  if (end > start) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_READ);
#else
  (void)begin;
  (void)bytes;
#endif
}

void ParallelCopy(absl::Span<const CopyRegion> regions) {
  // A restore is on the restarted trainer's critical path and its cores are
  // otherwise idle: large copies go in pieces that a few threads take in turn.
  uint64_t total = 0;
  for (const CopyRegion& r : regions) total += r.nbytes;
  const std::vector<CopyRegion> pieces = CutIntoPieces(regions, kMaxPiece);
  std::atomic<size_t> next{0};
  RunOnThreads(CopyThreads(total), [&pieces, &next] {
    for (size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) {
      PopulateForRead(pieces[i].src, pieces[i].nbytes);
      std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].nbytes);
    }
  });
}

}  // namespace zcc
