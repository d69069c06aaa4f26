// The CUDA DeviceCopier (see cuda_copier.h). Host code only: no kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

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
#include "cuda/cuda_status.h"

namespace zcc {
namespace {

// Every runtime call's result becomes a Status here. A failed call also
// leaves its error as the thread's "last error", where the trainer's own
// checks (PyTorch calls cudaGetLastError after its kernel launches) would
// find it and blame themselves; it is consumed here. Sticky errors (a
// corrupted context) stay: the runtime reports them to every later call.
absl::Status Check(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaToStatus(static_cast<int>(err), context);
}

// Owns one CUDA runtime handle and releases it with `Release` on destruction.
// Move-only. Used for streams, events and registered host memory.
template <typename T, cudaError_t (*Release)(T)>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(T handle) : handle_(handle) {}
  CudaHandle(CudaHandle&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    if (this != &other) {
      LogIfError(Reset());
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { LogIfError(Reset()); }

  T get() const { return handle_; }

  // Releases the handle now and reports the runtime's error, if any.
  absl::Status Reset() {
    if (handle_ == T{}) return absl::OkStatus();
    return Check(Release(std::exchange(handle_, T{})),
                 "releasing a CUDA stream, event or host registration");
  }

 private:
  static void LogIfError(const absl::Status& status) {
    if (!status.ok()) ZCC_LOG(WARNING) << status;
  }

  T handle_{};
};

using CudaStream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using CudaEvent = CudaHandle<cudaEvent_t, cudaEventDestroy>;
// Host memory pinned by cudaHostRegister; the handle is the registered base.
using HostRegistration = CudaHandle<void*, cudaHostUnregister>;
// Host memory from cudaMallocHost.
using PinnedAllocation = CudaHandle<void*, cudaFreeHost>;

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

absl::StatusOr<CudaEvent> NewEvent(unsigned flags) {
  cudaEvent_t event = nullptr;
  ZCC_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags"));
  return CudaEvent(event);
}

// Makes `device` current on the calling thread for the guard's lifetime: the
// runtime's current device is per thread, and the caller may use another one.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : status_(Enter(device)) {}
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  absl::Status Enter(int device) {
    ZCC_RETURN_IF_ERROR(Check(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (previous_ == device) return absl::OkStatus();
    ZCC_RETURN_IF_ERROR(Check(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
    restore_ = true;
    return absl::OkStatus();
  }

  // Initialised before status_, which Enter() computes.
  int previous_ = 0;
  bool restore_ = false;
  absl::Status status_;
};

// nullptr names the legacy default stream, whatever this file was compiled with.
cudaStream_t CallerStream(void* stream) {
  return stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
}

// Thread-safety: all methods may be called concurrently. issue_mu_ serialises
// the work issued on the copy stream, so tickets complete in ticket order;
// mu_ guards the ticket bookkeeping and registry_mu_ the registrations;
// neither is held while the host blocks. Lock order: issue_mu_ before
// registry_mu_ and before mu_.
//
// Registrations that cudaHostRegister refuses (a range another library
// pinned already, a container's pinned-memory limit, a platform without
// registration) do not fail: copies into such a mapping go through a small
// pinned bounce buffer, a device-to-host copy into it followed by a host
// function on the copy stream that memcpys the piece into place. Enqueue
// still returns at once and the fence stays on the device; only the
// bandwidth drops. If even the bounce buffer cannot be allocated, the copies
// use the pageable memory directly, which the runtime performs synchronously:
// Enqueue then returns only after the bytes moved. The first fallback is
// logged as one warning line per copier.
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
  // Shared: Wait() synchronises on an event outside mu_ while Enqueue() may
  // replace latest_done_ or a later Wait() may drop it from in_flight_.
  using DoneEvent = std::shared_ptr<CudaEvent>;

  // A mapping handed to RegisterHostMemory.
  struct Registration {
    size_t bytes = 0;
    bool pending = true;   // cudaHostRegister is running, registry_mu_ released.
    HostRegistration pin;  // Empty if cudaHostRegister refused the mapping.
  };

  CudaCopier(const CudaCopierOptions& options, CudaStream copy_stream, CudaEvent caller_ready)
      : device_(options.device),
        chunk_bytes_(options.chunk_bytes),
        bounce_bytes_(std::min(options.chunk_bytes, kMaxBounceBytes)),
        copy_stream_(std::move(copy_stream)),
        caller_ready_(std::move(caller_ready)) {}

  // Called when cudaHostRegister refused [base, base + bytes): sets up the
  // bounce buffer if there is none and logs the first fallback.
  void FallBackToUnpinned(void* base, size_t bytes, const absl::Status& why);

  // Whether `p` lies in a registered mapping that could not be pinned.
  bool InUnpinnedMapping(const void* p);

  // Queues the copy of one region on the copy stream, in chunks.
  absl::Status IssueRegion(size_t index, const CopyRegion& region, bool through_bounce)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);

  // An event the host can sleep on (no spinning) and that records no time.
  static absl::StatusOr<DoneEvent> NewDoneEvent();

  // Issues on the copy stream, after the work already issued on `caller`, the
  // copies of `regions` in chunks, then records `done` after them.
  absl::Status IssueCopies(absl::Span<const CopyRegion> regions, cudaStream_t caller,
                           const CudaEvent& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);

  // Blocks until the work recorded by `done` has finished.
  static absl::Status Synchronize(const DoneEvent& done, absl::string_view what);

  const int device_;
  const size_t chunk_bytes_;
  const size_t bounce_bytes_;
  CudaStream copy_stream_;  // Declared first: destroyed after the events recorded on it.

  zcc::Mutex issue_mu_ ABSL_ACQUIRED_BEFORE(mu_, registry_mu_);
  // Re-recorded on the caller's stream by each Enqueue() and CopyToDevice().
  CudaEvent caller_ready_ ABSL_GUARDED_BY(issue_mu_);
  // bounce_bytes_ of pinned memory, allocated at the first refused
  // registration; empty while none was refused or if allocating it failed.
  PinnedAllocation bounce_ ABSL_GUARDED_BY(issue_mu_);

  zcc::Mutex mu_;
  CopyTicket last_issued_ ABSL_GUARDED_BY(mu_) = 0;
  // Done events of the tickets not yet waited for, in ticket order.
  std::map<CopyTicket, DoneEvent> in_flight_ ABSL_GUARDED_BY(mu_);
  // After everything issued on the copy stream so far; what a fence waits for.
  DoneEvent latest_done_ ABSL_GUARDED_BY(mu_);

  zcc::Mutex registry_mu_;
  // By base address, so that the mapping holding a pointer can be found.
  std::map<uintptr_t, Registration> registrations_ ABSL_GUARDED_BY(registry_mu_);
  // Registrations without a pin; lets Enqueue skip the lookup when zero.
  std::atomic<int> unpinned_mappings_{0};
  bool fallback_logged_ ABSL_GUARDED_BY(registry_mu_) = false;
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
  ZCC_ASSIGN_OR_RETURN(CudaEvent caller_ready, NewEvent(cudaEventDisableTiming));
  ZCC_LOG(DEBUG) << "CUDA copier on device " << options.device << " (" << prop.name
                 << "), stream priority " << priority << ", chunks of " << options.chunk_bytes
                 << " bytes";
  return std::unique_ptr<DeviceCopier>(
      new CudaCopier(options, std::move(copy_stream), std::move(caller_ready)));
}

CudaCopier::~CudaCopier() {
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

absl::StatusOr<CudaCopier::DoneEvent> CudaCopier::NewDoneEvent() {
  ZCC_ASSIGN_OR_RETURN(CudaEvent event, NewEvent(cudaEventDisableTiming | cudaEventBlockingSync));
  return std::make_shared<CudaEvent>(std::move(event));
}

absl::Status CudaCopier::Synchronize(const DoneEvent& done, absl::string_view what) {
  return Check(cudaEventSynchronize(done->get()), what);
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
  // that Enqueue (which looks mappings up) never waits for it.
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
    zcc::MutexLock issue_lock(&issue_mu_);
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
                         "still returns at once)")
          : absl::StrCat("and no pinned bounce buffer either (", bounce_status.message(),
                         "): copies into this memory are synchronous, Snapshot blocks "
                         "until they finish");
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
  // Copies into the mapping may still be in flight; unpin only after them.
  DoneEvent latest;
  {
    zcc::MutexLock state_lock(&mu_);
    latest = latest_done_;
  }
  const absl::Status drained =
      latest == nullptr ? absl::OkStatus()
                        : Synchronize(latest, "waiting for copies before cudaHostUnregister");
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

absl::Status CudaCopier::IssueRegion(size_t index, const CopyRegion& region, bool through_bounce) {
  const auto* src = static_cast<const char*>(region.src);
  auto* dst = static_cast<char*>(region.dst);
  const size_t piece = through_bounce ? bounce_bytes_ : chunk_bytes_;
  for (size_t offset = 0; offset < region.nbytes; offset += piece) {
    const size_t n = std::min(piece, region.nbytes - offset);
    auto where = [&] {
      return absl::StrCat(" of region ", index, " (", region.nbytes, " bytes) at offset ", offset);
    };
    // cudaMemcpyDefault: the runtime tells device from host pointers (UVA).
    void* to = through_bounce ? bounce_.get() : dst + offset;
    ZCC_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(to, src + offset, n, cudaMemcpyDefault, copy_stream_.get()),
              absl::StrCat("cudaMemcpyAsync", where())));
    if (through_bounce) {
      // The next piece's copy into the buffer is queued behind this host
      // function on the same stream, so the buffer is free again by then.
      auto job = std::make_unique<BounceCopy>(BounceCopy{bounce_.get(), dst + offset, n});
      ZCC_RETURN_IF_ERROR(Check(cudaLaunchHostFunc(copy_stream_.get(), &BounceCopy::Run, job.get()),
                                absl::StrCat("cudaLaunchHostFunc (bounce copy)", where())));
      job.release();  // BounceCopy::Run owns it now.
    }
  }
  return absl::OkStatus();
}

absl::Status CudaCopier::IssueCopies(absl::Span<const CopyRegion> regions, cudaStream_t caller,
                                     const CudaEvent& done) {
  ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(caller_ready_.get(), caller),
                            "cudaEventRecord on the trainer's stream"));
  ZCC_RETURN_IF_ERROR(Check(cudaStreamWaitEvent(copy_stream_.get(), caller_ready_.get(), 0),
                            "cudaStreamWaitEvent for the trainer's stream"));
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].nbytes == 0) continue;
    // Only the destination can need the bounce buffer: restores read from
    // unpinned memory directly (the runtime stages pageable sources itself,
    // and CopyToDevice waits for the copies anyway).
    const bool through_bounce = bounce_.get() != nullptr && InUnpinnedMapping(regions[i].dst);
    ZCC_RETURN_IF_ERROR(IssueRegion(i, regions[i], through_bounce));
  }
  return Check(cudaEventRecord(done.get(), copy_stream_.get()),
               "cudaEventRecord on the copy stream");
}

absl::StatusOr<CopyTicket> CudaCopier::Enqueue(absl::Span<const CopyRegion> regions, void* stream) {
  ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  // Created before anything is issued, so that failing to create it leaves
  // no copies behind that no event covers.
  ZCC_ASSIGN_OR_RETURN(DoneEvent done, NewDoneEvent());
  zcc::MutexLock issue_lock(&issue_mu_);
  const absl::Status issued = IssueCopies(regions, CallerStream(stream), *done);
  zcc::MutexLock lock(&mu_);
  if (!issued.ok()) {
    // Some chunks may be queued already; a later fence must still cover them.
    if (cudaEventRecord(done->get(), copy_stream_.get()) == cudaSuccess) latest_done_ = done;
    return issued;
  }
  const CopyTicket ticket = ++last_issued_;
  in_flight_.emplace(ticket, done);
  latest_done_ = std::move(done);
  return ticket;
}

absl::Status CudaCopier::Wait(CopyTicket ticket) {
  DoneEvent done;
  {
    zcc::MutexLock lock(&mu_);
    if (ticket == 0 || ticket > last_issued_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Wait: ticket ", ticket, " was never issued (last issued ", last_issued_, ")"));
    }
    auto it = in_flight_.find(ticket);
    // Gone once it, or a later ticket, was waited for: then it has finished.
    if (it == in_flight_.end()) return absl::OkStatus();
    done = it->second;
  }
  ZCC_RETURN_IF_ERROR(Synchronize(done, absl::StrCat("waiting for copy ticket ", ticket)));
  zcc::MutexLock lock(&mu_);
  // One copy stream runs the tickets in order, so the earlier ones are done too.
  in_flight_.erase(in_flight_.begin(), in_flight_.upper_bound(ticket));
  return absl::OkStatus();
}

absl::Status CudaCopier::FenceBeforeUpdate(void* stream) {
  DoneEvent latest;
  {
    zcc::MutexLock lock(&mu_);
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
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  // Waiting on a blocking-sync event rather than cudaStreamSynchronize: the
  // host sleeps whatever the device's scheduling flags, and only until these
  // copies (and those queued before them) are done.
  ZCC_ASSIGN_OR_RETURN(DoneEvent done, NewDoneEvent());
  {
    zcc::MutexLock issue_lock(&issue_mu_);
    const absl::Status issued = IssueCopies(regions, CallerStream(stream), *done);
    if (!issued.ok()) {
      // Do not return while chunks already queued may still write the tensors.
      (void)cudaStreamSynchronize(copy_stream_.get());
      return issued;
    }
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
