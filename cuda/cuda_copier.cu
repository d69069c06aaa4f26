// The CUDA DeviceCopier (see cuda_copier.h). Host code only: no kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "copy/device_copier.h"
#include "cuda/cuda_copier.h"
#include "cuda/cuda_handle.h"
#include "cuda/cuda_status.h"

namespace zcc {
namespace {

using cuda_internal::CallerStream;
using cuda_internal::Check;
using cuda_internal::CudaEvent;
using cuda_internal::CudaStream;
using cuda_internal::HostRegistration;
using cuda_internal::NewEvent;
using cuda_internal::PinnedAllocation;
using cuda_internal::ScopedDevice;

// The most pinned memory a copier allocates for copies into mappings that
// cudaHostRegister refused (see RegisterHostMemory).
constexpr size_t kMaxBounceBytes = size_t{16} << 20;

// One piece of a copy through the bounce buffer: the device-to-host copy into
// the buffer is queued on the copy stream, followed by this host function,
// which moves the bytes on into the (unpinned) destination.
struct BounceCopy {
  const void* from;
  void* to;
  size_t bytes;

  static void CUDART_CB Run(void* job) {
    std::unique_ptr<BounceCopy> copy(static_cast<BounceCopy*>(job));
    std::memcpy(copy->to, copy->from, copy->bytes);
  }
};


class EventPool;

// An event on loan from an EventPool; destroying the handle gives the event
// back to the pool (no runtime call). Move-only.
class PooledEvent {
 public:
  PooledEvent() = default;
  PooledEvent(EventPool* pool, CudaEvent event) : pool_(pool), event_(std::move(event)) {}
  PooledEvent(PooledEvent&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), event_(std::move(other.event_)) {}
  PooledEvent& operator=(PooledEvent&& other) noexcept {
    if (this != &other) {
      GiveBack();
      pool_ = std::exchange(other.pool_, nullptr);
      event_ = std::move(other.event_);
    }
    return *this;
  }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;
  ~PooledEvent() { GiveBack(); }

  cudaEvent_t get() const { return event_.get(); }

 private:
  void GiveBack();

  EventPool* pool_ = nullptr;
  CudaEvent event_;
};

// The copier's events, reused from snapshot to snapshot instead of created
// and destroyed for each. All of one kind, which serves every use: no timing
// (cheaper to record) and blocking sync (a host thread waiting on one sleeps).
// Events are created only while the pool is empty, so it grows to the most
// events ever on loan at once (about two per ticket in flight) and no further.
//
// Thread-safety: Take() may be called from any thread, with the copier's
// device current (a new event belongs to it); mu_ is a leaf lock, never held
// across a runtime call. Ownership: the pool owns the events it holds and
// destroys them with itself; it must outlive every PooledEvent it lent.
class EventPool {
 public:
  absl::StatusOr<PooledEvent> Take() {
    {
      zcc::MutexLock lock(&mu_);
      if (!free_.empty()) {
        CudaEvent event = std::move(free_.back());
        free_.pop_back();
        return PooledEvent(this, std::move(event));
      }
    }
    ZCC_ASSIGN_OR_RETURN(CudaEvent event, NewEvent(cudaEventDisableTiming | cudaEventBlockingSync));
    return PooledEvent(this, std::move(event));
  }

 private:
  friend class PooledEvent;

  // An event may come back with its last record still pending: recording it
  // again later is allowed, and whoever waits on it captured that record.
  void Return(CudaEvent event) {
    zcc::MutexLock lock(&mu_);
    free_.push_back(std::move(event));
  }

  zcc::Mutex mu_;
  std::vector<CudaEvent> free_ ABSL_GUARDED_BY(mu_);
};

void PooledEvent::GiveBack() {
  if (pool_ != nullptr && event_.get() != nullptr) pool_->Return(std::move(event_));
  pool_ = nullptr;
}

// Thread-safety: all methods may be called concurrently.
//
// Snapshot copies are issued by a copy thread the copier owns, so that the
// trainer thread's cost of Enqueue() does not grow with the number of
// tensors: Enqueue() validates and copies the region list, records one
// pooled event on the trainer's stream and queues the list; the copy thread
// makes the copy stream wait on that event, issues the chunked copies and
// records the ticket's done event. Tickets are issued one at a time in
// ticket order (FIFO), on one copy stream, so they also complete in order.
//
// Locks: mu_ guards the queue and the ticket bookkeeping and is never held
// across a runtime call; issue_mu_ serialises the work issued on the copy
// stream (the copy thread's tickets and CopyToDevice) and is held while a
// ticket is issued, which no trainer-path call (Enqueue, Wait,
// FenceBeforeUpdate) takes; registry_mu_ guards the registrations and
// bounce_mu_ the bounce buffer. Lock order: issue_mu_ before registry_mu_
// and bounce_mu_; the event pool's lock is a leaf.
//
// Registrations that cudaHostRegister refuses (a range another library
// pinned already, a container's pinned-memory limit, a platform without
// registration) do not fail: copies into such a mapping go through a small
// pinned bounce buffer, a device-to-host copy into it followed by a host
// function on the copy stream that memcpys the piece into place. Enqueue()
// still returns at once, but issuing work behind a host function waits for
// the stream to get there (on an H100 the copy thread's issuing, and with it
// FenceBeforeUpdate(), returned 3 ms after a 1 s stall of the trainer's
// stream ahead of the copy had ended): the fence then waits for the trainer's
// stream to reach the snapshot and for the copy. If even the bounce buffer
// cannot be allocated, the copies use the pageable memory directly, which
// the runtime performs synchronously: the copy thread then issues a ticket
// only as fast as its bytes move, and FenceBeforeUpdate(), which waits for
// the copies to be issued, returns only after they have landed. The first
// fallback is logged as one warning line per copier.
class CudaCopier final : public DeviceCopier {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> Create(const CudaCopierOptions& options);
  ~CudaCopier() override;

  std::string name() const override { return "cuda"; }
  absl::Status RegisterHostMemory(void* base, size_t bytes) override;
  absl::Status UnregisterHostMemory(void* base) override;
  absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion> regions, void* stream) override;
  absl::Status Wait(CopyTicket ticket) override;
  absl::Status FenceBeforeUpdate(void* stream) override;
  absl::Status CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) override;

 private:
  // Shared: Wait(), FenceBeforeUpdate() and UnregisterHostMemory() synchronise
  // on one outside mu_ while the copy thread may replace latest_done_ or a
  // Wait() may drop it from tickets_. The last reference returns it to the pool.
  using DoneEvent = std::shared_ptr<const PooledEvent>;

  // A mapping handed to RegisterHostMemory.
  struct Registration {
    size_t bytes = 0;
    bool pending = true;   // cudaHostRegister is running, registry_mu_ released.
    HostRegistration pin;  // Empty if cudaHostRegister refused the mapping.
  };

  // A snapshot copy on its way from Enqueue() to the copy thread.
  struct Job {
    CopyTicket ticket = 0;
    std::vector<CopyRegion> regions;  // Enqueue's own copy of the caller's list.
    PooledEvent ready;                // Recorded on the trainer's stream.
  };

  // What issuing a ticket left for Wait().
  struct TicketState {
    // Recorded on the copy stream after the ticket's copies; null once nothing
    // of the ticket can still be in flight.
    DoneEvent done;
    // The first error issuing the copies: then only those queued before it
    // run (done still covers them).
    absl::Status status;
  };

  CudaCopier(const CudaCopierOptions& options, CudaStream copy_stream)
      : device_(options.device),
        chunk_bytes_(options.chunk_bytes),
        bounce_bytes_(std::min(options.chunk_bytes, kMaxBounceBytes)),
        copy_stream_(std::move(copy_stream)) {}

  // The copy thread: issues the queued tickets in order until the destructor
  // stops it, after the queue has drained.
  void CopyLoop();
  // Issues one ticket's copies on the copy stream (on the copy thread).
  TicketState IssueTicket(Job& job);
  // Blocks, sleeping on mu_, until the copy thread has issued `ticket` (and
  // so every earlier one).
  void AwaitIssued(CopyTicket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Called when cudaHostRegister refused [base, base + bytes): sets up the
  // bounce buffer if there is none and logs the first fallback.
  void FallBackToUnpinned(void* base, size_t bytes, const absl::Status& why);

  // Whether `p` lies in a registered mapping that could not be pinned.
  bool InUnpinnedMapping(const void* p);

  // The bounce buffer, or nullptr while there is none. Once set it stays
  // until the copier is destroyed.
  void* BounceBuffer();

  // Queues the copy of one region on the copy stream, in chunks; through
  // `bounce` (a bounce_bytes_ pinned buffer) unless that is null.
  absl::Status IssueRegion(size_t index, const CopyRegion& region, void* bounce)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);

  // Makes the copy stream wait for `ready` (recorded on the trainer's stream)
  // and queues the copies of `regions` in chunks. Stops at the first error;
  // the chunks queued before it stay queued.
  absl::Status IssueCopies(absl::Span<const CopyRegion> regions, const PooledEvent& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);

  // Records `done` on the copy stream after what was issued on it. If that
  // fails, no event covers the copies just queued: waits for the copy stream
  // to drain instead, so that none is left in flight.
  absl::Status RecordDone(const PooledEvent& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);

  // Blocks until the work recorded by `done` has finished.
  static absl::Status Synchronize(const PooledEvent& done, absl::string_view what);

  const int device_;
  const size_t chunk_bytes_;
  const size_t bounce_bytes_;
  CudaStream copy_stream_;  // Declared first: destroyed after the events recorded on it.
  // Declared before everything that borrows its events.
  EventPool events_;

  zcc::Mutex issue_mu_ ABSL_ACQUIRED_BEFORE(registry_mu_, bounce_mu_);

  zcc::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);       // Enqueued, not yet taken by the copy thread.
  CopyTicket last_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // The last ticket Enqueue() handed out.
  CopyTicket issued_through_ ABSL_GUARDED_BY(mu_) = 0;  // The copy thread has issued up to here.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The issued tickets not yet waited for, in ticket order. A ticket that
  // failed stays (its done event released once it is known complete), so
  // that every Wait() for it reports the same error.
  std::map<CopyTicket, TicketState> tickets_ ABSL_GUARDED_BY(mu_);
  // After everything issued on the copy stream so far; what a fence waits for.
  DoneEvent latest_done_ ABSL_GUARDED_BY(mu_);

  zcc::Mutex bounce_mu_;
  // bounce_bytes_ of pinned memory, allocated at the first refused
  // registration; empty while none was refused or if allocating it failed.
  PinnedAllocation bounce_ ABSL_GUARDED_BY(bounce_mu_);

  zcc::Mutex registry_mu_;
  // By base address, so that the mapping holding a pointer can be found.
  std::map<uintptr_t, Registration> registrations_ ABSL_GUARDED_BY(registry_mu_);
  // Registrations without a pin; lets the copy thread skip the lookup when zero.
  std::atomic<int> unpinned_mappings_{0};
  bool fallback_logged_ ABSL_GUARDED_BY(registry_mu_) = false;

  // Started by Create() once everything above exists; joined by the destructor.
  std::thread copy_thread_;
};

absl::StatusOr<std::unique_ptr<DeviceCopier>> CudaCopier::Create(const CudaCopierOptions& options) {
  if (options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("CUDA copier: chunk_bytes must be positive");
  }
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();  // Not sticky: leave no error behind for other runtime users.
    return Annotate(Check(err, "cudaGetDeviceCount"),
                    "no usable CUDA device (is an NVIDIA driver as new as the CUDA runtime "
                    "installed, and a GPU visible?)");
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device found");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " devices)"));
  }
  cudaDeviceProp prop;
  ZCC_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, options.device),
                            absl::StrCat("cudaGetDeviceProperties(", options.device, ")")));
  if (!prop.unifiedAddressing) {
    // cudaMemcpyDefault tells device from host pointers only with UVA.
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", options.device, " (",
                                                      prop.name, ") lacks unified addressing"));
  }
  ScopedDevice scoped(options.device);
  ZCC_RETURN_IF_ERROR(scoped.status());

  int priority = 0;  // The default priority.
  if (options.low_priority_stream) {
    int greatest = 0;  // Numerically lower values are higher priorities.
    ZCC_RETURN_IF_ERROR(Check(cudaDeviceGetStreamPriorityRange(&priority, &greatest),
                              "cudaDeviceGetStreamPriorityRange"));
  }
  cudaStream_t stream = nullptr;
  // Non-blocking: the copy stream does not synchronise implicitly with the
  // legacy default stream; ordering comes from events alone.
  ZCC_RETURN_IF_ERROR(Check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority),
                            "cudaStreamCreateWithPriority"));
  CudaStream copy_stream(stream);
  std::unique_ptr<CudaCopier> copier(new CudaCopier(options, std::move(copy_stream)));
  try {
    copier->copy_thread_ = std::thread([c = copier.get()] { c->CopyLoop(); });
  } catch (const std::system_error& e) {
    return ErrnoToStatus(e.code().value(), "CUDA copier: starting the copy thread");
  }
  ZCC_LOG(DEBUG) << "CUDA copier on device " << options.device << " (" << prop.name
                 << "), stream priority " << priority << ", chunks of " << options.chunk_bytes
                 << " bytes";
  return std::unique_ptr<DeviceCopier>(std::move(copier));
}

CudaCopier::~CudaCopier() {
  {
    zcc::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // The copy thread issues every ticket still queued before it exits.
  if (copy_thread_.joinable()) copy_thread_.join();
  ScopedDevice scoped(device_);
  // Copies still in flight read or write memory that may go away next.
  if (absl::Status st =
          Check(cudaStreamSynchronize(copy_stream_.get()), "cudaStreamSynchronize in ~CudaCopier");
      !st.ok()) {
    ZCC_LOG(WARNING) << st;
  }
  zcc::MutexLock lock(&registry_mu_);
  registrations_.clear();  // Unregisters; errors are logged by the handles.
}

void CudaCopier::CopyLoop() {
  for (;;) {
    Job job;
    {
      zcc::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      if (queue_.empty()) return;  // Stopping, and every ticket is issued.
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    TicketState state = IssueTicket(job);
    zcc::MutexLock lock(&mu_);
    if (state.done != nullptr) latest_done_ = state.done;
    tickets_.emplace(job.ticket, std::move(state));
    issued_through_ = job.ticket;
  }
}

CudaCopier::TicketState CudaCopier::IssueTicket(Job& job) {
  DoneEvent done;
  const absl::Status status = [&]() -> absl::Status {
    // The runtime's current device is per thread; this one is the copier's.
    ScopedDevice scoped(device_);
    ZCC_RETURN_IF_ERROR(scoped.status());
    // Taken before anything is issued, so that failing to create it leaves
    // no copies behind that no event covers.
    ZCC_ASSIGN_OR_RETURN(PooledEvent event, events_.Take());
    zcc::MutexLock issue_lock(&issue_mu_);
    const absl::Status issued = IssueCopies(job.regions, job.ready);
    // The copy stream's wait captured the trainer's point: the event is free again.
    job.ready = PooledEvent();
    // Even after a failure: the chunks queued before it must stay covered
    // by the fence and by Wait.
    const absl::Status recorded = RecordDone(event);
    if (recorded.ok()) done = std::make_shared<const PooledEvent>(std::move(event));
    return issued.ok() ? recorded : issued;
  }();
  job.ready = PooledEvent();  // If not given back above.
  if (status.ok()) return TicketState{std::move(done), status};
  return TicketState{std::move(done),
                     Annotate(status, absl::StrCat("issuing copy ticket ", job.ticket))};
}

void CudaCopier::AwaitIssued(CopyTicket ticket) {
  auto issued = [this, ticket]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return issued_through_ >= ticket; };
  mu_.Await(absl::Condition(&issued));
}

absl::Status CudaCopier::Synchronize(const PooledEvent& done, absl::string_view what) {
  return Check(cudaEventSynchronize(done.get()), what);
}

absl::Status CudaCopier::RegisterHostMemory(void* base, size_t bytes) {
  if (base == nullptr) return absl::InvalidArgumentError("RegisterHostMemory: null base");
  if (bytes == 0) return absl::InvalidArgumentError("RegisterHostMemory: zero bytes");
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  const auto key = reinterpret_cast<uintptr_t>(base);
  {
    zcc::MutexLock lock(&registry_mu_);
    Registration pending;
    pending.bytes = bytes;
    if (!registrations_.emplace(key, std::move(pending)).second) {
      return absl::AlreadyExistsError("RegisterHostMemory: base is already registered");
    }
  }
  // Pinning gigabytes takes a while: registry_mu_ is not held meanwhile, so
  // that the copy thread (which looks mappings up) never waits for it.
  // Portable: pinned for every device context, not just this copier's.
  const absl::Status pinned = Check(cudaHostRegister(base, bytes, cudaHostRegisterPortable),
                                    absl::StrCat("cudaHostRegister of ", bytes, " bytes"));
  if (!pinned.ok()) FallBackToUnpinned(base, bytes, pinned);
  zcc::MutexLock lock(&registry_mu_);
  Registration& registration = registrations_.at(key);
  registration.pending = false;
  if (pinned.ok()) registration.pin = HostRegistration(base);
  return absl::OkStatus();
}

void CudaCopier::FallBackToUnpinned(void* base, size_t bytes, const absl::Status& why) {
  const absl::Status bounce_status = [&]() -> absl::Status {
    // Only other refused registrations and the copy thread, once per ticket,
    // wait for this lock while the buffer is allocated.
    zcc::MutexLock bounce_lock(&bounce_mu_);
    if (bounce_.get() != nullptr) return absl::OkStatus();
    void* buffer = nullptr;
    ZCC_RETURN_IF_ERROR(Check(cudaMallocHost(&buffer, bounce_bytes_),
                              absl::StrCat("cudaMallocHost of ", bounce_bytes_, " bytes")));
    bounce_ = PinnedAllocation(buffer);
    return absl::OkStatus();
  }();
  unpinned_mappings_.fetch_add(1);
  zcc::MutexLock lock(&registry_mu_);
  const bool first = !std::exchange(fallback_logged_, true);
  const std::string what =
      bounce_status.ok()
          ? absl::StrCat("copying through a ", bounce_bytes_ >> 10,
                         " KiB pinned bounce buffer instead (lower bandwidth; Snapshot "
                         "still returns at once, but FenceBeforeUpdate waits for the "
                         "device to reach the copy and finish it)")
          : absl::StrCat("and no pinned bounce buffer either (", bounce_status.message(),
                         "): copies into this memory are synchronous, FenceBeforeUpdate "
                         "blocks until they finish");
  if (first) {
    ZCC_LOG(WARNING) << "zcc: cannot pin " << bytes << " bytes of staging memory at " << base
                     << " (" << why.message() << "); " << what;
  } else {
    ZCC_LOG(DEBUG) << "zcc: cannot pin " << bytes << " bytes at " << base << " (" << why.message()
                   << "); " << what;
  }
}

bool CudaCopier::InUnpinnedMapping(const void* p) {
  if (unpinned_mappings_.load(std::memory_order_relaxed) == 0) return false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  zcc::MutexLock lock(&registry_mu_);
  auto it = registrations_.upper_bound(addr);
  if (it == registrations_.begin()) return false;
  --it;
  const Registration& r = it->second;
  return addr < it->first + r.bytes && !r.pending && r.pin.get() == nullptr;
}

void* CudaCopier::BounceBuffer() {
  zcc::MutexLock lock(&bounce_mu_);
  return bounce_.get();
}

absl::Status CudaCopier::UnregisterHostMemory(void* base) {
  if (base == nullptr) return absl::InvalidArgumentError("UnregisterHostMemory: null base");
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  const auto key = reinterpret_cast<uintptr_t>(base);
  {
    zcc::MutexLock lock(&registry_mu_);
    auto it = registrations_.find(key);
    if (it == registrations_.end() || it->second.pending) {
      return absl::NotFoundError("UnregisterHostMemory: base was not registered");
    }
    it->second.pending = true;  // Being unregistered: no second Unregister meanwhile.
  }
  // Copies into the mapping may still be queued for the copy thread or in
  // flight on the copy stream; unpin only after them.
  DoneEvent latest;
  {
    zcc::MutexLock state_lock(&mu_);
    AwaitIssued(last_ticket_);
    latest = latest_done_;
  }
  const absl::Status drained =
      latest == nullptr ? absl::OkStatus()
                        : Synchronize(*latest, "waiting for copies before cudaHostUnregister");
  Registration registration;
  {
    zcc::MutexLock lock(&registry_mu_);
    auto it = registrations_.find(key);
    if (!drained.ok()) {
      // Still registered (and pinned): unpinning now could pull the pages
      // from under a copy. The caller may retry; the destructor drains first.
      it->second.pending = false;
      return drained;
    }
    registration = std::move(it->second);
    registrations_.erase(it);
  }
  if (registration.pin.get() == nullptr) unpinned_mappings_.fetch_sub(1);
  return registration.pin.Reset();
}

absl::Status CudaCopier::IssueRegion(size_t index, const CopyRegion& region, void* bounce) {
  const auto* src = static_cast<const char*>(region.src);
  auto* dst = static_cast<char*>(region.dst);
  const size_t piece = bounce != nullptr ? bounce_bytes_ : chunk_bytes_;
  for (size_t offset = 0; offset < region.nbytes; offset += piece) {
    const size_t n = std::min(piece, region.nbytes - offset);
    auto where = [&] {
      return absl::StrCat(" of region ", index, " (", region.nbytes, " bytes) at offset ", offset);
    };
    // cudaMemcpyDefault: the runtime tells device from host pointers (UVA).
    void* to = bounce != nullptr ? bounce : dst + offset;
    ZCC_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(to, src + offset, n, cudaMemcpyDefault, copy_stream_.get()),
              absl::StrCat("cudaMemcpyAsync", where())));
    if (bounce != nullptr) {
      // The next piece's copy into the buffer is queued behind this host
      // function on the same stream, so the buffer is free again by then.
      auto job = std::make_unique<BounceCopy>(BounceCopy{bounce, dst + offset, n});
      ZCC_RETURN_IF_ERROR(Check(cudaLaunchHostFunc(copy_stream_.get(), &BounceCopy::Run, job.get()),
                                absl::StrCat("cudaLaunchHostFunc (bounce copy)", where())));
      job.release();  // BounceCopy::Run owns it now.
    }
  }
  return absl::OkStatus();
}

absl::Status CudaCopier::IssueCopies(absl::Span<const CopyRegion> regions,
                                     const PooledEvent& ready) {
  ZCC_RETURN_IF_ERROR(Check(cudaStreamWaitEvent(copy_stream_.get(), ready.get(), 0),
                            "cudaStreamWaitEvent for the trainer's stream"));
  void* const bounce = BounceBuffer();
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].nbytes == 0) continue;
    // Only the destination can need the bounce buffer: restores read from
    // unpinned memory directly (the runtime stages pageable sources itself,
    // and CopyToDevice waits for the copies anyway).
    const bool through_bounce = bounce != nullptr && InUnpinnedMapping(regions[i].dst);
    ZCC_RETURN_IF_ERROR(IssueRegion(i, regions[i], through_bounce ? bounce : nullptr));
  }
  return absl::OkStatus();
}

absl::Status CudaCopier::RecordDone(const PooledEvent& done) {
  const absl::Status recorded =
      Check(cudaEventRecord(done.get(), copy_stream_.get()), "cudaEventRecord on the copy stream");
  if (!recorded.ok()) {
    (void)Check(cudaStreamSynchronize(copy_stream_.get()),
                "cudaStreamSynchronize after a failed cudaEventRecord");
  }
  return recorded;
}

absl::StatusOr<CopyTicket> CudaCopier::Enqueue(absl::Span<const CopyRegion> regions, void* stream) {
  ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
  // The copy thread works from its own copy of the list: the caller may
  // reuse or free its list once Enqueue has returned.
  Job job;
  job.regions.assign(regions.begin(), regions.end());
  // A fixed number of runtime calls whatever the number of regions: the
  // copy thread issues the copies.
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  ZCC_ASSIGN_OR_RETURN(job.ready, events_.Take());
  ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(job.ready.get(), CallerStream(stream)),
                            "cudaEventRecord on the trainer's stream"));
  zcc::MutexLock lock(&mu_);
  job.ticket = ++last_ticket_;
  const CopyTicket ticket = job.ticket;
  queue_.push_back(std::move(job));
  return ticket;
}

absl::Status CudaCopier::Wait(CopyTicket ticket) {
  TicketState state;
  {
    zcc::MutexLock lock(&mu_);
    if (ticket == 0 || ticket > last_ticket_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Wait: ticket ", ticket, " was never issued (last issued ", last_ticket_, ")"));
    }
    AwaitIssued(ticket);
    auto it = tickets_.find(ticket);
    // Gone once it, or a later ticket, was waited for: then it has finished.
    if (it == tickets_.end()) return absl::OkStatus();
    state = it->second;
  }
  if (state.done != nullptr) {
    const absl::Status synced =
        Synchronize(*state.done, absl::StrCat("waiting for copy ticket ", ticket));
    // The first error: one issuing the copies, else this one.
    if (!synced.ok()) return state.status.ok() ? synced : state.status;
    state.done.reset();
  }
  zcc::MutexLock lock(&mu_);
  // One copy stream runs the tickets in order, so the earlier ones are done too.
  for (auto it = tickets_.begin(); it != tickets_.end() && it->first <= ticket;) {
    if (it->second.status.ok()) {
      it = tickets_.erase(it);
    } else {
      it->second.done.reset();  // Keeps the error for Wait(), frees the event.
      ++it;
    }
  }
  return state.status;
}

absl::Status CudaCopier::FenceBeforeUpdate(void* stream) {
  DoneEvent latest;
  {
    zcc::MutexLock lock(&mu_);
    // A copy the copy thread has not issued yet has no event to wait on:
    // first wait on the host until every ticket enqueued so far is issued.
    AwaitIssued(last_ticket_);
    latest = latest_done_;
  }
  if (latest == nullptr) return absl::OkStatus();
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  return Check(cudaStreamWaitEvent(CallerStream(stream), latest->get(), 0),
               "cudaStreamWaitEvent fencing the trainer's stream behind the copies");
}

absl::Status CudaCopier::CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) {
  ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
  {
    // Snapshots enqueued before the restore read the tensors before it
    // overwrites them: their copies go on the copy stream first.
    zcc::MutexLock lock(&mu_);
    AwaitIssued(last_ticket_);
  }
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  // Waiting on a blocking-sync event rather than cudaStreamSynchronize: the
  // host sleeps whatever the device's scheduling flags, and only until these
  // copies (and those queued before them) are done.
  ZCC_ASSIGN_OR_RETURN(PooledEvent ready, events_.Take());
  ZCC_ASSIGN_OR_RETURN(PooledEvent done, events_.Take());
  {
    zcc::MutexLock issue_lock(&issue_mu_);
    ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(ready.get(), CallerStream(stream)),
                              "cudaEventRecord on the trainer's stream"));
    if (const absl::Status issued = IssueCopies(regions, ready); !issued.ok()) {
      // Do not return while chunks already queued may still write the tensors.
      (void)Check(cudaStreamSynchronize(copy_stream_.get()),
                  "cudaStreamSynchronize after a failed restore");
      return issued;
    }
    // On failure RecordDone has drained the copy stream itself.
    ZCC_RETURN_IF_ERROR(RecordDone(done));
  }
  return Synchronize(done, "waiting for the restore copies");
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(const CudaCopierOptions& options) {
  return CudaCopier::Create(options);
}

bool CudaDeviceAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace zcc
