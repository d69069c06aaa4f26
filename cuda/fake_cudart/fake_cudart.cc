// The fake CUDA runtime (see fake_cudart.h). Host C++, but compiled through
// nvcc (nvcc.bzl) so that it sees the real CUDA headers: every function below
// then has exactly the signature the copier was compiled against. Not a .cu
// file: in a CUDA translation unit the device-side declarations of the
// runtime functions (cuda_device_runtime_api.h) would clash with these
// definitions. Linked instead of libcudart.
//
// CUDA runtime functions defined here (and nothing else of the runtime):
//   cudaGetDeviceCount cudaGetDevice cudaSetDevice cudaGetDeviceProperties
//   cudaDeviceGetStreamPriorityRange cudaDeviceSynchronize
//   cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy
//   cudaStreamSynchronize cudaStreamQuery cudaStreamWaitEvent
//   cudaEventCreateWithFlags cudaEventDestroy cudaEventRecord cudaEventQuery
//   cudaEventSynchronize cudaMemcpyAsync cudaMalloc cudaFree cudaMallocHost
//   cudaFreeHost cudaHostRegister cudaHostUnregister cudaLaunchHostFunc
//   cudaGetLastError cudaPeekAtLastError cudaGetErrorName cudaGetErrorString
//   __cudaRegisterFatBinary __cudaRegisterFatBinaryEnd __cudaUnregisterFatBinary
// The per-thread default stream (cudaStreamPerThread) is not modelled: it is
// refused with cudaErrorNotSupported.
//
// Design: one mutex and one condition variable guard the whole runtime. A
// stream is a queue of operations and a worker thread; an operation runs once
// every dependency (a stream and a sequence number on it) has completed.
// Dependencies come from cudaStreamWaitEvent and from the legacy default
// stream's implicit synchronisation with blocking streams.
#include "cuda/fake_cudart/fake_cudart.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace zcc::fake_cudart {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kApiCount = static_cast<int>(Api::kCount);

struct StreamState;

// Satisfied once `stream` has completed the operation numbered `seq`.
struct Dep {
  std::shared_ptr<StreamState> stream;
  uint64_t seq = 0;
};

struct Op {
  uint64_t seq = 0;
  std::vector<Dep> deps;
  std::function<void()> run;  // Empty for markers (event records, waits).
};

struct StreamState {
  int device = 0;
  bool legacy = false;
  bool blocking = true;  // Synchronises implicitly with the legacy stream.
  int priority = 0;
  std::deque<Op> queue;
  uint64_t issued = 0;     // Sequence number of the last operation issued.
  uint64_t completed = 0;  // ... and of the last one finished.
  bool stopping = false;   // Destroyed: drain the queue, then exit.
  std::thread worker;
};

}  // namespace
}  // namespace zcc::fake_cudart

// The runtime's opaque handle types, which the CUDA headers only declare.
struct CUstream_st {
  std::shared_ptr<zcc::fake_cudart::StreamState> state;
};
struct CUevent_st {
  unsigned flags = 0;
  int device = 0;
  bool recorded = false;
  std::shared_ptr<zcc::fake_cudart::StreamState> stream;  // Where it was last recorded.
  uint64_t seq = 0;
};

namespace zcc::fake_cudart {
namespace {

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
// The calling thread's counts (CallsOnThisThread).
thread_local ThreadCalls t_calls;

// Config::issue_delay in microseconds. Read by cudaMemcpyAsync before it
// takes the runtime's lock, so that the sleep holds nothing up but its caller.
std::atomic<int64_t> g_issue_delay_us{0};

// Counted outside the runtime's lock: nvcc-generated static initialisers call
// the registration functions, possibly before anything else exists.
std::atomic<int64_t> g_fatbinaries{0};

bool InRange(const std::map<uintptr_t, size_t>& ranges, const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return false;
  --it;
  return addr < it->first + it->second;
}

bool Overlaps(const std::map<uintptr_t, size_t>& ranges, uintptr_t begin, size_t bytes) {
  const uintptr_t end = begin + bytes;
  auto it = ranges.lower_bound(end);  // First range starting at or after `end`.
  if (it == ranges.begin()) return false;
  --it;  // Last range starting before `end`.
  return it->first + it->second > begin;
}

bool RangesOverlap(uintptr_t a, size_t an, uintptr_t b, size_t bn) {
  return a < b + bn && b < a + an;
}

struct Fault {
  cudaError_t error = cudaSuccess;
  int skip = 0;
  int times = 0;  // < 0: forever.
};

class Runtime {
 public:
  std::mutex mu;
  std::condition_variable cv;
  Config config;
  Fault faults[kApiCount];
  int64_t calls[kApiCount] = {};
  std::vector<std::shared_ptr<StreamState>> legacy;  // Per device, made on first use.
  std::map<CUstream_st*, std::shared_ptr<StreamState>> streams;
  std::vector<std::shared_ptr<StreamState>> retired;  // Destroyed; joined by Reset().
  std::set<CUevent_st*> events;
  std::map<uintptr_t, size_t> registered;     // cudaHostRegister: base -> bytes.
  std::map<uintptr_t, size_t> pinned_allocs;  // cudaMallocHost.
  std::map<uintptr_t, size_t> device_allocs;  // cudaMalloc, DeviceAlloc.
  std::vector<cudaError_t> sticky;            // Per device.
  cudaError_t fail_copy_error = cudaSuccess;
  int64_t fail_copy_at = -1;  // The exec_index of the copy to fail.
  std::vector<CopyRecord> copies;
  uint64_t copies_base = 0;  // Copy ids below this were cleared.
  int64_t next_exec = 0;
  int64_t blocking_event_syncs = 0;
  int64_t spinning_event_syncs = 0;
  int64_t host_synchronous_copies = 0;
  int64_t freed_while_in_use = 0;

  // Counts the call and returns the error it must fail with, if any.
  cudaError_t Enter(Api api, bool sticky_applies = true) {
    const int i = static_cast<int>(api);
    ++calls[i];
    ++t_calls.calls[i];
    if (config.init_error != 0) return static_cast<cudaError_t>(config.init_error);
    if (config.device_count <= 0) return cudaErrorNoDevice;
    Fault& f = faults[i];
    if (f.error != cudaSuccess && f.times != 0) {
      if (f.skip > 0) {
        --f.skip;
      } else {
        if (f.times > 0) --f.times;
        return f.error;
      }
    }
    if (sticky_applies && t_device < static_cast<int>(sticky.size()) &&
        sticky[t_device] != cudaSuccess) {
      return sticky[t_device];
    }
    return cudaSuccess;
  }

  cudaError_t Sticky(int device) const {
    return device < static_cast<int>(sticky.size()) ? sticky[device] : cudaSuccess;
  }

  std::shared_ptr<StreamState> NewState(int device, bool is_legacy, bool blocking, int priority) {
    auto s = std::make_shared<StreamState>();
    s->device = device;
    s->legacy = is_legacy;
    s->blocking = blocking;
    s->priority = priority;
    s->worker = std::thread([this, s] { Work(s); });
    return s;
  }

  const std::shared_ptr<StreamState>& Legacy(int device) {
    if (legacy.size() <= static_cast<size_t>(device)) legacy.resize(device + 1);
    if (legacy[device] == nullptr) legacy[device] = NewState(device, true, true, 0);
    return legacy[device];
  }

  // The stream a handle names; nullptr (and *err set) for a bad handle.
  std::shared_ptr<StreamState> Resolve(cudaStream_t handle, cudaError_t* err) {
    if (handle == nullptr || handle == cudaStreamLegacy) return Legacy(t_device);
    if (handle == cudaStreamPerThread) {
      *err = cudaErrorNotSupported;
      return nullptr;
    }
    auto it = streams.find(handle);
    if (it == streams.end()) {
      *err = cudaErrorInvalidResourceHandle;
      return nullptr;
    }
    return it->second;
  }

  // Queues an operation on `s` after `deps` and the implicit synchronisation
  // of the legacy default stream; returns its sequence number.
  uint64_t Submit(const std::shared_ptr<StreamState>& s, std::vector<Dep> deps,
                  std::function<void()> run) {
    if (s->legacy) {
      // Legacy-stream work waits for all work issued so far on the device's
      // blocking streams.
      for (const auto& entry : streams) {
        const std::shared_ptr<StreamState>& other = entry.second;
        if (other->device == s->device && other->blocking && other->issued > other->completed) {
          deps.push_back({other, other->issued});
        }
      }
    } else if (s->blocking) {
      // Work on a blocking stream waits for the legacy stream's work so far.
      const std::shared_ptr<StreamState>& l = Legacy(s->device);
      if (l->issued > l->completed) deps.push_back({l, l->issued});
    }
    Op op;
    op.seq = ++s->issued;
    op.deps = std::move(deps);
    op.run = std::move(run);
    s->queue.push_back(std::move(op));
    cv.notify_all();
    return s->issued;
  }

  void WaitFor(std::unique_lock<std::mutex>& lock, const std::shared_ptr<StreamState>& s,
               uint64_t seq) {
    cv.wait(lock, [&] { return s->completed >= seq; });
  }

  // The target of cudaStreamSynchronize: on the legacy stream a marker, which
  // picks up its implicit dependencies; elsewhere the last operation issued.
  uint64_t SyncPoint(const std::shared_ptr<StreamState>& s) {
    return s->legacy ? Submit(s, {}, nullptr) : s->issued;
  }

  static bool DepsDone(const Op& op) {
    for (const Dep& d : op.deps) {
      if (d.stream->completed < d.seq) return false;
    }
    return true;
  }

  void Work(const std::shared_ptr<StreamState>& s) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] {
        return (!s->queue.empty() && DepsDone(s->queue.front())) ||
               (s->stopping && s->queue.empty());
      });
      if (s->queue.empty()) return;  // Stopping, drained.
      Op op = std::move(s->queue.front());
      s->queue.pop_front();
      if (op.run) {
        lock.unlock();
        op.run();
        lock.lock();
      }
      s->completed = op.seq;
      cv.notify_all();
    }
  }

  // Whether a copy not yet finished reads or writes [begin, begin + bytes).
  bool CopyPending(uintptr_t begin, size_t bytes) const {
    for (const CopyRecord& c : copies) {
      if (c.finished != Clock::time_point()) continue;
      if (RangesOverlap(begin, bytes, reinterpret_cast<uintptr_t>(c.dst), c.bytes) ||
          RangesOverlap(begin, bytes, reinterpret_cast<uintptr_t>(c.src), c.bytes)) {
        return true;
      }
    }
    return false;
  }

  // Blocks until every stream of `device` has finished what it was given.
  void DrainDevice(std::unique_lock<std::mutex>& lock, int device) {
    std::vector<std::pair<std::shared_ptr<StreamState>, uint64_t>> targets;
    for (const auto& entry : streams) {
      if (entry.second->device == device) targets.emplace_back(entry.second, entry.second->issued);
    }
    for (const auto& s : retired) {
      if (s->device == device) targets.emplace_back(s, s->issued);
    }
    if (static_cast<size_t>(device) < legacy.size() && legacy[device] != nullptr) {
      targets.emplace_back(legacy[device], legacy[device]->issued);
    }
    for (const auto& [s, seq] : targets) WaitFor(lock, s, seq);
  }

  enum class Memory { kDevice, kPinned, kPageable };
  Memory Classify(const void* p) const {
    if (InRange(device_allocs, p)) return Memory::kDevice;
    if (InRange(registered, p) || InRange(pinned_allocs, p)) return Memory::kPinned;
    return Memory::kPageable;
  }

  // Issues one copy on `s`; returns its record's id. Caller holds mu.
  uint64_t IssueCopy(const std::shared_ptr<StreamState>& s, void* dst, const void* src,
                     size_t bytes, cudaStream_t handle, bool host_synchronous) {
    const uint64_t id = copies_base + copies.size();
    CopyRecord record;
    record.src = src;
    record.dst = dst;
    record.bytes = bytes;
    record.stream = handle == nullptr ? static_cast<void*>(cudaStreamLegacy) : handle;
    record.device = s->device;
    record.host_synchronous = host_synchronous;
    record.issued = Clock::now();
    copies.push_back(record);
    if (host_synchronous) ++host_synchronous_copies;
    const auto delay = config.copy_delay;
    const int device = s->device;
    Submit(s, {}, [this, id, dst, src, bytes, delay, device] {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      bool fail = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        CopyRecord* rec = id >= copies_base ? &copies[id - copies_base] : nullptr;
        const int64_t exec = next_exec++;
        if (rec != nullptr) {
          rec->exec_index = exec;
          rec->started = Clock::now();
        }
        if (Sticky(device) != cudaSuccess) {
          fail = true;
        } else if (exec == fail_copy_at) {
          fail = true;
          sticky[device] = fail_copy_error;
          fail_copy_at = -1;
        }
      }
      if (!fail) std::memcpy(dst, src, bytes);
      std::lock_guard<std::mutex> lock(mu);
      if (id >= copies_base) copies[id - copies_base].finished = Clock::now();
      cv.notify_all();
    });
    return id;
  }

  // Lets every stream's worker drain its queue and exit, and joins it.
  void StopWorkers() {
    std::vector<std::shared_ptr<StreamState>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& entry : streams) all.push_back(entry.second);
      all.insert(all.end(), retired.begin(), retired.end());
      for (const auto& s : legacy) {
        if (s != nullptr) all.push_back(s);
      }
      for (const auto& s : all) s->stopping = true;
      cv.notify_all();
    }
    for (const auto& s : all) {
      if (s->worker.joinable()) s->worker.join();
    }
  }

  // Stops and joins every worker, then forgets everything.
  void Reset(const Config& c) {
    StopWorkers();
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& entry : streams) delete entry.first;
    streams.clear();
    retired.clear();
    legacy.clear();
    for (CUevent_st* e : events) delete e;
    events.clear();
    registered.clear();
    for (const auto& [p, n] : pinned_allocs) std::free(reinterpret_cast<void*>(p));
    pinned_allocs.clear();
    for (const auto& [p, n] : device_allocs) std::free(reinterpret_cast<void*>(p));
    device_allocs.clear();
    config = c;
    g_issue_delay_us.store(c.issue_delay.count());
    for (Fault& f : faults) f = Fault();
    for (int64_t& n : calls) n = 0;
    sticky.assign(std::max(1, c.device_count), cudaSuccess);
    fail_copy_error = cudaSuccess;
    fail_copy_at = -1;
    copies.clear();
    copies_base = 0;
    next_exec = 0;
    blocking_event_syncs = spinning_event_syncs = host_synchronous_copies = 0;
    freed_while_in_use = 0;
    t_device = 0;
    t_last_error = cudaSuccess;
  }

  // cudaStreamCreateWithPriority without counting or faults. Caller holds mu.
  cudaError_t CreateStream(cudaStream_t* out, unsigned flags, int priority) {
    if (out == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) {
      return cudaErrorInvalidValue;
    }
    // The runtime clamps priorities into the device's range.
    priority = std::min(config.least_priority, std::max(config.greatest_priority, priority));
    auto state = NewState(t_device, false, (flags & cudaStreamNonBlocking) == 0, priority);
    auto* handle = new CUstream_st{state};
    streams.emplace(handle, std::move(state));
    *out = handle;
    return cudaSuccess;
  }

  cudaError_t DestroyStream(cudaStream_t handle) {
    auto it = streams.find(handle);
    if (it == streams.end()) return cudaErrorInvalidResourceHandle;
    // As in CUDA, work already queued still runs; the call does not wait.
    it->second->stopping = true;
    retired.push_back(it->second);
    streams.erase(it);
    delete handle;
    cv.notify_all();
    return cudaSuccess;
  }

  void* AllocDevice(size_t bytes) {
    void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    if (p != nullptr) device_allocs.emplace(reinterpret_cast<uintptr_t>(p), bytes);
    return p;
  }
};

Runtime& Rt() {
  // Never destroyed: worker threads may outlive static destruction.
  static Runtime* runtime = new Runtime;
  return *runtime;
}

// Joins the stream workers when the process exits normally, so that no thread
// is left unjoined (streams destroyed without a Reset keep theirs until then;
// ThreadSanitizer reports such threads as leaks). The runtime stays.
struct JoinWorkersAtExit {
  ~JoinWorkersAtExit() { Rt().StopWorkers(); }
} join_workers_at_exit;

// Records a failure as the thread's last error and returns it.
cudaError_t Fail(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) t_last_error = err;
  return err;
}

struct ErrorInfo {
  cudaError_t code;
  const char* name;
  const char* text;
};

#define ZCC_FAKE_ERROR(code, text) \
  { code, #code, text }
constexpr ErrorInfo kErrors[] = {
    ZCC_FAKE_ERROR(cudaSuccess, "no error"),
    ZCC_FAKE_ERROR(cudaErrorInvalidValue, "invalid argument"),
    ZCC_FAKE_ERROR(cudaErrorMemoryAllocation, "out of memory"),
    ZCC_FAKE_ERROR(cudaErrorInitializationError, "initialization error"),
    ZCC_FAKE_ERROR(cudaErrorCudartUnloading, "driver shutting down"),
    ZCC_FAKE_ERROR(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    ZCC_FAKE_ERROR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    ZCC_FAKE_ERROR(cudaErrorInsufficientDriver,
                   "CUDA driver version is insufficient for CUDA runtime version"),
    ZCC_FAKE_ERROR(cudaErrorCallRequiresNewerDriver,
                   "API call is not supported in the installed CUDA driver"),
    ZCC_FAKE_ERROR(cudaErrorStubLibrary, "CUDA driver is a stub library"),
    ZCC_FAKE_ERROR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    ZCC_FAKE_ERROR(cudaErrorInvalidDevice, "invalid device ordinal"),
    ZCC_FAKE_ERROR(cudaErrorDeviceNotLicensed, "device doesn't have valid Grid license"),
    ZCC_FAKE_ERROR(cudaErrorSystemDriverMismatch,
                   "system has unsupported display driver / cuda driver combination"),
    ZCC_FAKE_ERROR(cudaErrorCompatNotSupportedOnDevice,
                   "forward compatibility was attempted on non supported HW"),
    ZCC_FAKE_ERROR(cudaErrorDevicesUnavailable,
                   "CUDA-capable device(s) is/are busy or unavailable"),
    ZCC_FAKE_ERROR(cudaErrorNoKernelImageForDevice,
                   "no kernel image is available for execution on the device"),
    ZCC_FAKE_ERROR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    ZCC_FAKE_ERROR(cudaErrorNotReady, "device not ready"),
    ZCC_FAKE_ERROR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    ZCC_FAKE_ERROR(cudaErrorLaunchFailure, "unspecified launch failure"),
    ZCC_FAKE_ERROR(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    ZCC_FAKE_ERROR(cudaErrorHostMemoryAlreadyRegistered,
                   "part or all of the requested memory range is already mapped"),
    ZCC_FAKE_ERROR(cudaErrorHostMemoryNotRegistered,
                   "pointer does not correspond to a registered memory region"),
    ZCC_FAKE_ERROR(cudaErrorNotSupported, "operation not supported"),
    ZCC_FAKE_ERROR(cudaErrorNotPermitted, "operation not permitted"),
    ZCC_FAKE_ERROR(cudaErrorSystemNotReady, "system not yet initialized"),
    ZCC_FAKE_ERROR(cudaErrorTimeout, "timeout reached"),
    ZCC_FAKE_ERROR(cudaErrorUnknown, "unknown error"),
};
#undef ZCC_FAKE_ERROR

const ErrorInfo* FindError(cudaError_t err) {
  for (const ErrorInfo& e : kErrors) {
    if (e.code == err) return &e;
  }
  return nullptr;
}

constexpr const char* kApiNames[kApiCount] = {
    "cudaGetDeviceCount",
    "cudaGetDevice",
    "cudaSetDevice",
    "cudaGetDeviceProperties",
    "cudaDeviceGetStreamPriorityRange",
    "cudaDeviceSynchronize",
    "cudaStreamCreateWithFlags",
    "cudaStreamCreateWithPriority",
    "cudaStreamDestroy",
    "cudaStreamSynchronize",
    "cudaStreamQuery",
    "cudaStreamWaitEvent",
    "cudaEventCreateWithFlags",
    "cudaEventDestroy",
    "cudaEventRecord",
    "cudaEventQuery",
    "cudaEventSynchronize",
    "cudaMemcpyAsync",
    "cudaMalloc",
    "cudaFree",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaHostRegister",
    "cudaHostUnregister",
    "cudaLaunchHostFunc",
};

}  // namespace

// ---- Test-facing functions (fake_cudart.h). ----

const char* ApiName(Api api) {
  const int i = static_cast<int>(api);
  return i >= 0 && i < kApiCount ? kApiNames[i] : "(not an API)";
}

std::vector<UnusableDevice> UnusableDevices() {
  auto with = [](int device_count, int init_error) {
    Config c;
    c.device_count = device_count;
    c.init_error = init_error;
    return c;
  };
  return {
      {"no GPU", with(0, 0), "cudaErrorNoDevice", false},
      {"driver older than the runtime", with(1, cudaErrorInsufficientDriver),
       "cudaErrorInsufficientDriver", false},
      {"stub libcuda", with(1, cudaErrorStubLibrary), "cudaErrorStubLibrary", false},
      {"devices busy", with(1, cudaErrorDevicesUnavailable), "cudaErrorDevicesUnavailable",
       true},
  };
}

ErrorCodes Errors() {
  ErrorCodes e;
  e.success = cudaSuccess;
  e.invalid_value = cudaErrorInvalidValue;
  e.memory_allocation = cudaErrorMemoryAllocation;
  e.initialization_error = cudaErrorInitializationError;
  e.insufficient_driver = cudaErrorInsufficientDriver;
  e.no_device = cudaErrorNoDevice;
  e.stub_library = cudaErrorStubLibrary;
  e.invalid_device = cudaErrorInvalidDevice;
  e.invalid_resource_handle = cudaErrorInvalidResourceHandle;
  e.devices_unavailable = cudaErrorDevicesUnavailable;
  e.host_memory_already_registered = cudaErrorHostMemoryAlreadyRegistered;
  e.host_memory_not_registered = cudaErrorHostMemoryNotRegistered;
  e.illegal_address = cudaErrorIllegalAddress;
  e.launch_failure = cudaErrorLaunchFailure;
  e.not_supported = cudaErrorNotSupported;
  e.not_ready = cudaErrorNotReady;
  e.unknown = cudaErrorUnknown;
  return e;
}

void Reset(const Config& config) { Rt().Reset(config); }

void FailCall(Api api, int cuda_error, int skip, int times) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.faults[static_cast<int>(api)] = Fault{static_cast<cudaError_t>(cuda_error), skip, times};
}

void ClearFaults() {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  for (Fault& f : r.faults) f = Fault();
}

void FailCopyExecution(int cuda_error, int skip) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.fail_copy_error = static_cast<cudaError_t>(cuda_error);
  r.fail_copy_at = r.next_exec + skip;
}

void SetCopyDelay(std::chrono::microseconds delay) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.config.copy_delay = delay;
}

void SetIssueDelay(std::chrono::microseconds delay) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.config.issue_delay = delay;
  g_issue_delay_us.store(delay.count());
}

int NewStream(void** stream, bool non_blocking) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  cudaStream_t s = nullptr;
  const cudaError_t err =
      r.CreateStream(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, 0);
  if (err == cudaSuccess) *stream = s;
  return err;
}

int DestroyStream(void* stream) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.DestroyStream(static_cast<cudaStream_t>(stream));
}

int LaunchHostWork(void* stream, std::function<void()> work) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(static_cast<cudaStream_t>(stream), &err);
  if (s == nullptr) return err;
  r.Submit(s, {}, std::move(work));
  return cudaSuccess;
}

int Stall(void* stream, std::chrono::milliseconds duration) {
  return LaunchHostWork(stream, [duration] { std::this_thread::sleep_for(duration); });
}

int SynchronizeStream(void* stream) {
  Runtime& r = Rt();
  std::unique_lock<std::mutex> lock(r.mu);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(static_cast<cudaStream_t>(stream), &err);
  if (s == nullptr) return err;
  r.WaitFor(lock, s, r.SyncPoint(s));
  return r.Sticky(s->device);
}

void* DeviceAlloc(size_t bytes) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.AllocDevice(bytes);
}

void DeviceFree(void* ptr) {
  if (ptr == nullptr) return;
  Runtime& r = Rt();
  std::unique_lock<std::mutex> lock(r.mu);
  auto it = r.device_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.device_allocs.end()) {
    std::fprintf(stderr, "fake_cudart: DeviceFree of %p, which DeviceAlloc did not return\n", ptr);
    std::abort();
  }
  // Like cudaFree: the device's queued work finishes first.
  for (int device = 0; device < r.config.device_count; ++device) r.DrainDevice(lock, device);
  r.device_allocs.erase(reinterpret_cast<uintptr_t>(ptr));
  std::free(ptr);
}

std::vector<CopyRecord> Copies() {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.copies;
}

void ClearCopies() {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  r.copies_base += r.copies.size();
  r.copies.clear();
}

Counters GetCounters() {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  Counters c;
  std::copy(std::begin(r.calls), std::end(r.calls), std::begin(c.calls));
  c.live_streams = static_cast<int>(r.streams.size());
  c.live_events = static_cast<int>(r.events.size());
  c.host_registrations = static_cast<int>(r.registered.size());
  c.pinned_allocations = static_cast<int>(r.pinned_allocs.size());
  c.device_allocations = static_cast<int>(r.device_allocs.size());
  c.blocking_event_syncs = r.blocking_event_syncs;
  c.spinning_event_syncs = r.spinning_event_syncs;
  c.host_synchronous_copies = r.host_synchronous_copies;
  c.fatbinaries_registered = g_fatbinaries.load();
  c.freed_while_in_use = r.freed_while_in_use;
  return c;
}

int64_t CallCount(Api api) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.calls[static_cast<int>(api)];
}

ThreadCalls CallsOnThisThread() { return t_calls; }

int PeekLastError() { return t_last_error; }

int CurrentDevice() { return t_device; }

}  // namespace zcc::fake_cudart

// ---- The CUDA runtime API. ----

using zcc::fake_cudart::Api;
using zcc::fake_cudart::Clock;
using zcc::fake_cudart::Fail;
using zcc::fake_cudart::g_issue_delay_us;
using zcc::fake_cudart::Overlaps;
using zcc::fake_cudart::Rt;
using zcc::fake_cudart::Runtime;
using zcc::fake_cudart::t_device;
using zcc::fake_cudart::t_last_error;

namespace {
using Lock = std::unique_lock<std::mutex>;
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = 0;
  if (cudaError_t e = r.Enter(Api::kGetDeviceCount, false)) return Fail(e);
  *count = r.config.device_count;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kGetDevice, false)) return Fail(e);
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kSetDevice, false)) return Fail(e);
  if (device < 0 || device >= r.config.device_count) return Fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kGetDeviceProperties, false)) return Fail(e);
  if (prop == nullptr) return Fail(cudaErrorInvalidValue);
  if (device < 0 || device >= r.config.device_count) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "zcc fake CUDA device %d", device);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{80} << 30;
  prop->multiProcessorCount = 132;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->pciBusID = device + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kDeviceGetStreamPriorityRange)) return Fail(e);
  if (least != nullptr) *least = r.config.least_priority;
  if (greatest != nullptr) *greatest = r.config.greatest_priority;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kDeviceSynchronize)) return Fail(e);
  r.DrainDevice(lock, t_device);
  return Fail(r.Sticky(t_device));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamCreateWithFlags)) return Fail(e);
  return Fail(r.CreateStream(stream, flags, 0));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamCreateWithPriority)) return Fail(e);
  return Fail(r.CreateStream(stream, flags, priority));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamDestroy, false)) return Fail(e);
  return Fail(r.DestroyStream(stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamSynchronize)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  r.WaitFor(lock, s, r.SyncPoint(s));
  return Fail(r.Sticky(s->device));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamQuery)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  return s->completed >= s->issued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kStreamWaitEvent)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  if (r.events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return Fail(cudaErrorInvalidValue);
  // Waits for the event's most recent record at the time of this call; an
  // event never recorded makes the stream wait for nothing.
  if (event->recorded) r.Submit(s, {{event->stream, event->seq}}, nullptr);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventCreateWithFlags)) return Fail(e);
  constexpr unsigned kKnown =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0 ||
      ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0)) {
    return Fail(cudaErrorInvalidValue);
  }
  auto* e = new CUevent_st;
  e->flags = flags;
  e->device = t_device;
  r.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventDestroy, false)) return Fail(e);
  // As in CUDA, destroying an event whose record is pending is allowed: the
  // streams waiting on it captured what they wait for.
  if (r.events.erase(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventRecord)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  if (r.events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  // An event belongs to the device current when it was created.
  if (event->device != s->device) return Fail(cudaErrorInvalidResourceHandle);
  event->seq = r.Submit(s, {}, nullptr);
  event->stream = s;
  event->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventQuery)) return Fail(e);
  if (r.events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (!event->recorded) return cudaSuccess;
  if (event->stream->completed < event->seq) return cudaErrorNotReady;
  return Fail(r.Sticky(event->device));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventSynchronize)) return Fail(e);
  if (r.events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  // The real runtime spins (or yields) on events without this flag.
  if ((event->flags & cudaEventBlockingSync) != 0) {
    ++r.blocking_event_syncs;
  } else {
    ++r.spinning_event_syncs;
  }
  if (!event->recorded) return cudaSuccess;
  // Hold our own references: the event may be destroyed or re-recorded meanwhile.
  const std::shared_ptr<zcc::fake_cudart::StreamState> s = event->stream;
  const uint64_t seq = event->seq;
  const int device = event->device;
  r.WaitFor(lock, s, seq);
  return Fail(r.Sticky(device));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (const int64_t delay_us = g_issue_delay_us.load(); delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  }
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kMemcpyAsync)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  if (static_cast<int>(kind) < cudaMemcpyHostToHost || static_cast<int>(kind) > cudaMemcpyDefault) {
    return Fail(cudaErrorInvalidMemcpyDirection);
  }
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  using Memory = Runtime::Memory;
  const Memory from = r.Classify(src);
  const Memory to = r.Classify(dst);
  // The runtime's documented synchronisation: pageable memory on either side,
  // or host memory on both, makes the call return only after the copy.
  const bool host_synchronous = from == Memory::kPageable || to == Memory::kPageable ||
                                (from != Memory::kDevice && to != Memory::kDevice);
  const uint64_t id = r.IssueCopy(s, dst, src, count, stream, host_synchronous);
  if (host_synchronous) {
    r.cv.wait(lock, [&] {
      return id < r.copies_base || r.copies[id - r.copies_base].finished != Clock::time_point();
    });
    return Fail(r.Sticky(s->device));
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kMalloc)) return Fail(e);
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  *ptr = r.AllocDevice(size);
  return *ptr == nullptr ? Fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kFree)) return Fail(e);
  if (ptr == nullptr) return cudaSuccess;
  auto it = r.device_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.device_allocs.end()) return Fail(cudaErrorInvalidValue);
  // cudaFree synchronises the device first, as the real one does.
  r.DrainDevice(lock, t_device);
  r.device_allocs.erase(reinterpret_cast<uintptr_t>(ptr));
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kMallocHost)) return Fail(e);
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (p == nullptr) return Fail(cudaErrorMemoryAllocation);
  r.pinned_allocs.emplace(reinterpret_cast<uintptr_t>(p), size);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kFreeHost)) return Fail(e);
  if (ptr == nullptr) return cudaSuccess;
  auto it = r.pinned_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.pinned_allocs.end()) return Fail(cudaErrorInvalidValue);
  if (r.CopyPending(it->first, it->second)) ++r.freed_while_in_use;
  r.pinned_allocs.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kHostRegister)) return Fail(e);
  constexpr unsigned kKnown = cudaHostRegisterPortable | cudaHostRegisterMapped |
                              cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
  if (ptr == nullptr || size == 0 || (flags & ~kKnown) != 0) return Fail(cudaErrorInvalidValue);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  if (Overlaps(r.registered, base, size) || Overlaps(r.pinned_allocs, base, size)) {
    return Fail(cudaErrorHostMemoryAlreadyRegistered);
  }
  r.registered.emplace(base, size);
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kHostUnregister)) return Fail(e);
  auto it = r.registered.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.registered.end()) return Fail(cudaErrorHostMemoryNotRegistered);
  if (r.CopyPending(it->first, it->second)) ++r.freed_while_in_use;
  r.registered.erase(it);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kLaunchHostFunc)) return Fail(e);
  cudaError_t err = cudaSuccess;
  auto s = r.Resolve(stream, &err);
  if (s == nullptr) return Fail(err);
  if (fn == nullptr) return Fail(cudaErrorInvalidValue);
  r.Submit(s, {}, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  // A sticky error is reported every time and never cleared.
  if (cudaError_t sticky = r.Sticky(t_device)) return sticky;
  return std::exchange(t_last_error, cudaSuccess);
}

cudaError_t cudaPeekAtLastError(void) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t sticky = r.Sticky(t_device)) return sticky;
  return t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  const auto* info = zcc::fake_cudart::FindError(error);
  return info != nullptr ? info->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const auto* info = zcc::fake_cudart::FindError(error);
  return info != nullptr ? info->text : "unrecognized error code";
}

// nvcc's generated static initialisers register each object's device code.
// The fake has no device: it hands out a handle and forgets the image.
void** __cudaRegisterFatBinary(void* /*fat_cubin*/) {
  static void* handle = nullptr;
  zcc::fake_cudart::g_fatbinaries.fetch_add(1);
  return &handle;
}

void __cudaRegisterFatBinaryEnd(void** /*handle*/) {}

void __cudaUnregisterFatBinary(void** /*handle*/) {}

}  // extern "C"
