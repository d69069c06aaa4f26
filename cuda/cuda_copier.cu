// The CUDA DeviceCopier (see cuda_copier.h). Host code only: no kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/log.h"
#include "common/status.h"
#include "copy/device_copier.h"
#include "cuda/cuda_copier.h"
#include "cuda/cuda_status.h"

namespace zcc {
namespace {

absl::Status Check(cudaError_t err, absl::string_view context) {
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

absl::Status ValidateRegions(absl::Span<const CopyRegion> regions) {
  for (size_t i = 0; i < regions.size(); ++i) {
    const CopyRegion& r = regions[i];
    if (r.nbytes != 0 && (r.src == nullptr || r.dst == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("copy region ", i, " has a null ",
                                                     r.src == nullptr ? "source" : "destination",
                                                     " for ", r.nbytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// nullptr names the legacy default stream, whatever this file was compiled with.
cudaStream_t CallerStream(void* stream) {
  return stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
}

// Thread-safety: all methods may be called concurrently. issue_mu_ serialises
// the work issued on the copy stream, so tickets complete in ticket order;
// mu_ guards the ticket bookkeeping and is never held while the host blocks.
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

  CudaCopier(const CudaCopierOptions& options, CudaStream copy_stream, CudaEvent caller_ready)
      : device_(options.device),
        chunk_bytes_(options.chunk_bytes),
        copy_stream_(std::move(copy_stream)),
        caller_ready_(std::move(caller_ready)) {}

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
  CudaStream copy_stream_;  // Declared first: destroyed after the events recorded on it.

  absl::Mutex issue_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Re-recorded on the caller's stream by each Enqueue() and CopyToDevice().
  CudaEvent caller_ready_ ABSL_GUARDED_BY(issue_mu_);

  absl::Mutex mu_;
  CopyTicket last_issued_ ABSL_GUARDED_BY(mu_) = 0;
  // Done events of the tickets not yet waited for, in ticket order.
  std::map<CopyTicket, DoneEvent> in_flight_ ABSL_GUARDED_BY(mu_);
  // After everything issued on the copy stream so far; what a fence waits for.
  DoneEvent latest_done_ ABSL_GUARDED_BY(mu_);

  absl::Mutex registry_mu_;
  absl::flat_hash_map<void*, HostRegistration> registrations_ ABSL_GUARDED_BY(registry_mu_);
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
  ZCC_LOG(DEBUG) << "CUDA copier on device " << options.device << ", stream priority " << priority
                 << ", chunks of " << options.chunk_bytes << " bytes";
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
  absl::MutexLock lock(&registry_mu_);
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
  absl::MutexLock lock(&registry_mu_);
  if (registrations_.contains(base)) {
    return absl::AlreadyExistsError("RegisterHostMemory: base is already registered");
  }
  // Portable: pinned for every device context, not just this copier's.
  ZCC_RETURN_IF_ERROR(Check(cudaHostRegister(base, bytes, cudaHostRegisterPortable),
                            absl::StrCat("cudaHostRegister of ", bytes, " bytes")));
  registrations_.emplace(base, HostRegistration(base));
  return absl::OkStatus();
}

absl::Status CudaCopier::UnregisterHostMemory(void* base) {
  if (base == nullptr) return absl::InvalidArgumentError("UnregisterHostMemory: null base");
  ScopedDevice scoped(device_);
  ZCC_RETURN_IF_ERROR(scoped.status());
  absl::MutexLock lock(&registry_mu_);
  auto it = registrations_.find(base);
  if (it == registrations_.end()) {
    return absl::NotFoundError("UnregisterHostMemory: base was not registered");
  }
  // Copies into the mapping may still be in flight; unpin only after them.
  DoneEvent latest;
  {
    absl::MutexLock state_lock(&mu_);
    latest = latest_done_;
  }
  if (latest != nullptr) {
    ZCC_RETURN_IF_ERROR(Synchronize(latest, "waiting for copies before cudaHostUnregister"));
  }
  absl::Status st = it->second.Reset();
  registrations_.erase(it);
  return st;
}

absl::Status CudaCopier::IssueCopies(absl::Span<const CopyRegion> regions, cudaStream_t caller,
                                     const CudaEvent& done) {
  ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(caller_ready_.get(), caller),
                            "cudaEventRecord on the trainer's stream"));
  ZCC_RETURN_IF_ERROR(Check(cudaStreamWaitEvent(copy_stream_.get(), caller_ready_.get(), 0),
                            "cudaStreamWaitEvent for the trainer's stream"));
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto* src = static_cast<const char*>(regions[i].src);
    auto* dst = static_cast<char*>(regions[i].dst);
    const size_t nbytes = regions[i].nbytes;
    for (size_t offset = 0; offset < nbytes; offset += chunk_bytes_) {
      const size_t n = std::min(chunk_bytes_, nbytes - offset);
      // cudaMemcpyDefault: the runtime tells device from host pointers (UVA).
      const cudaError_t err =
          cudaMemcpyAsync(dst + offset, src + offset, n, cudaMemcpyDefault, copy_stream_.get());
      if (err != cudaSuccess) {
        return Check(err, absl::StrCat("cudaMemcpyAsync of region ", i, " (", nbytes,
                                       " bytes) at offset ", offset));
      }
    }
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
  absl::MutexLock issue_lock(&issue_mu_);
  const absl::Status issued = IssueCopies(regions, CallerStream(stream), *done);
  absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  // One copy stream runs the tickets in order, so the earlier ones are done too.
  in_flight_.erase(in_flight_.begin(), in_flight_.upper_bound(ticket));
  return absl::OkStatus();
}

absl::Status CudaCopier::FenceBeforeUpdate(void* stream) {
  DoneEvent latest;
  {
    absl::MutexLock lock(&mu_);
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
    absl::MutexLock issue_lock(&issue_mu_);
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
