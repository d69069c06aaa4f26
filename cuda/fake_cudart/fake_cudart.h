// A fake CUDA runtime for tests: a CPU implementation of the CUDA runtime API
// functions the CUDA copier calls (cuda/cuda_copier.cu, cuda/cuda_status.cu),
// linked into a test instead of libcudart, so that the real copier code runs
// its stream, event, fence and chunk logic on machines without a GPU.
//
// What it models (fake_cudart.cc lists every function it defines):
//   * devices: a configured count, per-thread current device, properties,
//     a stream-priority range; "no device" and "driver too old" as configured
//     errors that every call then returns, as the real runtime does;
//   * streams: each one a worker thread running its operations in issue
//     order; the legacy default stream (0 / cudaStreamLegacy) of each device
//     with its implicit synchronisation against blocking streams;
//     non-blocking streams (cudaStreamNonBlocking) without it;
//   * events: record, query, synchronize (counted as blocking or spinning by
//     the event's cudaEventBlockingSync flag), cudaStreamWaitEvent creating a
//     cross-stream dependency captured at call time, as CUDA does;
//   * memory: "device" memory is host memory the fake tracks (cudaMalloc,
//     DeviceAlloc below); pinned memory is what cudaHostRegister or
//     cudaMallocHost covers; anything else is pageable. cudaMemcpyAsync runs
//     in stream order and, like the real runtime, is synchronous with respect
//     to the host when either side is pageable host memory or both sides are
//     host memory (the call returns only once the bytes moved);
//   * cudaHostRegister bookkeeping: an overlap with a registered range or a
//     cudaMallocHost block fails with cudaErrorHostMemoryAlreadyRegistered,
//     unregistering an unknown base with cudaErrorHostMemoryNotRegistered;
//   * errors: a per-thread last error (cudaGetLastError clears it, Peek does
//     not), sticky per-device errors from failed asynchronous work, names and
//     descriptions for cudaGetErrorName / cudaGetErrorString;
//   * CUDA IPC across real processes (both linked against this fake):
//     every device allocation is a memfd mapped MAP_SHARED (one open fd per
//     allocation), and cudaIpcGetMemHandle names it by the exporter's pid and
//     fd number; cudaIpcOpenMemHandle maps /proc/<pid>/fd/<fd> (same uid or
//     root, one pid namespace), refcounted per process, and the mapping is
//     device memory of the importer (its current device). Opening a handle in
//     the process that exported it fails with cudaErrorDeviceUninitialized
//     (the driver's CUDA_ERROR_INVALID_CONTEXT, cudaErrorInvalidContext
//     before CUDA 10.1), for memory and events alike. Interprocess events
//     (cudaEventInterprocess) keep their state in a memfd page of shared
//     counters: a record takes `v = ++recorded` when called and its stream
//     sets `completed = max(completed, v)`; a wait, query or synchronize
//     captures `recorded` when called and is satisfied once `completed`
//     reaches it (so a later record that completes first also completes an
//     earlier one still queued elsewhere, unlike a real event). Waiters sleep
//     on a shared futex and look every 10 ms at the peers that matter;
//   * peer death, which the real runtime leaves undefined, as zcc's
//     daemon-pull copies need it bounded (no hang, no crash):
//       - a copy reading or writing an imported mapping whose exporter has
//         exited (zombie included) fails on its stream with a sticky
//         cudaErrorIllegalAddress on the stream's device, moving nothing;
//       - a stream wait, synchronize or query on an IMPORTED event that is not
//         complete while its exporter has exited fails the same way;
//       - a record whose recording process exited before its stream ran it
//         counts as completed (each process's latest record is kept with its
//         pid in the shared page), so that the other side's waits end. The
//         real hardware would most likely never signal it; the modelling
//         choice stands for "the daemon noticed its peer died" and keeps the
//         survivor moving. An imported event whose exporter died fails
//         rather than completing: that rule is checked first;
//       - records still complete on a device with a sticky error, and waits
//         on interprocess events give up (without an error of their own) on
//         a device with a sticky error, in cudaDeviceReset and in Reset();
//   * cudaDeviceReset: drains and destroys the calling thread's current
//     device's streams and events, closes its IPC imports, frees its device
//     allocations and clears its sticky error (how zccd recovers);
//   * cudaPointerGetAttributes, and cudaGetDriverEntryPointByVersion for
//     "cuMemGetAddressRange" only (the allocation or import containing a
//     pointer; CUDA_ERROR_NOT_FOUND otherwise).
// Fault injection: FailCall() makes chosen calls of one API function fail
// with a given cudaError_t, FailCopyExecution() makes a queued copy fail on
// its stream (a sticky error later synchronisations report), the copy delay
// slows every copy down on its stream and the issue delay slows every
// cudaMemcpyAsync call down on the thread that makes it.
// Calls are counted both in all and per calling thread (CallsOnThisThread),
// so that a test can tell which thread paid for what.
//
// This header is plain C++ (no CUDA headers): tests compiled by the host
// compiler use it. cudaError_t values are passed as int; Errors() names them.
//
// Thread-safety: every function here and every fake CUDA function may be
// called from any thread. Ownership: the fake owns its worker threads; Reset()
// drains and joins them. The runtime state lives for the whole process.
#ifndef ZCC_CUDA_FAKE_CUDART_FAKE_CUDART_H_
#define ZCC_CUDA_FAKE_CUDART_FAKE_CUDART_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zcc::fake_cudart {

// The fake CUDA functions whose calls are counted and can be made to fail.
enum class Api : int {
  kGetDeviceCount,
  kGetDevice,
  kSetDevice,
  kGetDeviceProperties,
  kDeviceGetStreamPriorityRange,
  kDeviceSynchronize,
  kStreamCreateWithFlags,
  kStreamCreateWithPriority,
  kStreamDestroy,
  kStreamSynchronize,
  kStreamQuery,
  kStreamWaitEvent,
  kEventCreateWithFlags,
  kEventDestroy,
  kEventRecord,
  kEventQuery,
  kEventSynchronize,
  kMemcpyAsync,
  kMalloc,
  kFree,
  kMallocHost,
  kFreeHost,
  kHostRegister,
  kHostUnregister,
  kLaunchHostFunc,
  kIpcGetMemHandle,
  kIpcOpenMemHandle,
  kIpcCloseMemHandle,
  kIpcGetEventHandle,
  kIpcOpenEventHandle,
  kDeviceReset,
  kPointerGetAttributes,
  kGetDriverEntryPoint,  // cudaGetDriverEntryPointByVersion.
  kCount,                // Not a function.
};

// "cudaMemcpyAsync" for Api::kMemcpyAsync, and so on.
const char* ApiName(Api api);

// cudaError_t values by name, for tests compiled without the CUDA headers.
struct ErrorCodes {
  int success, invalid_value, memory_allocation, initialization_error, insufficient_driver,
      no_device, stub_library, invalid_device, invalid_resource_handle, devices_unavailable,
      host_memory_already_registered, host_memory_not_registered, illegal_address, launch_failure,
      not_supported, not_ready, unknown,
      // CUDA_ERROR_INVALID_CONTEXT: cudaErrorInvalidContext before CUDA 10.1.
      device_uninitialized;
};
ErrorCodes Errors();

struct Config {
  // Devices the fake reports. 0: cudaGetDeviceCount (and every other call)
  // fails with cudaErrorNoDevice, as the runtime does on a machine without GPU.
  int device_count = 1;
  // Non-zero: every call fails with this cudaError_t, as the runtime does
  // when the driver is missing, a stub, or older than the runtime
  // (cudaErrorInsufficientDriver, cudaErrorStubLibrary, ...).
  int init_error = 0;
  // cudaDeviceGetStreamPriorityRange (an H100's values).
  int least_priority = 0;
  int greatest_priority = -5;
  // Each copy sleeps this long on its stream before moving bytes.
  std::chrono::microseconds copy_delay{0};
  // Each cudaMemcpyAsync call sleeps this long on the calling thread before
  // queuing its copy: the host-side cost of issuing a copy, which on a real
  // GPU adds up to milliseconds over thousands of tensors.
  std::chrono::microseconds issue_delay{0};
};

// The machines without a usable CUDA device that tests reproduce: each a
// Config for Reset and the cudaError_t name the runtime reports there.
// `transient`: the devices exist but are busy, which may pass (zcc reports
// it as Unavailable rather than FailedPrecondition).
struct UnusableDevice {
  const char* what;
  Config config;
  const char* error_name;
  bool transient;
};
std::vector<UnusableDevice> UnusableDevices();

// Drains and joins every stream (destroyed or not), then forgets all state:
// streams, events, registrations, allocations, IPC imports (unmapped) and
// exports (memfds closed), faults, counters and the copy log, and applies
// `config`. Streams waiting on another process's event stop waiting. The calling thread's current device becomes 0
// and its last error cudaSuccess. Call it when no code still uses the fake's
// handles (at the start of each test).
void Reset(const Config& config = Config());

// The next `skip` calls of `api` succeed; the `times` calls after them fail
// with `cuda_error` (times < 0: every later call). Replaces any earlier
// fault for `api`.
void FailCall(Api api, int cuda_error, int skip = 0, int times = 1);
void ClearFaults();

// Makes the copy that executes `skip` copies from now (counting every stream)
// fail on its stream instead of moving bytes: the device gets the sticky
// `cuda_error`, which every later synchronisation, cudaGetLastError and most
// calls on that device return, as after an illegal address.
void FailCopyExecution(int cuda_error, int skip = 0);

// Every copy issued from now on sleeps `delay` on its stream first.
void SetCopyDelay(std::chrono::microseconds delay);

// Every cudaMemcpyAsync call from now on sleeps `delay` on the calling thread
// (holding none of the fake's locks) before it queues its copy.
void SetIssueDelay(std::chrono::microseconds delay);

// ---- Trainer-side work for tests (what kernels and cudaMalloc would do). ----
// Streams are passed as void* (a cudaStream_t); nullptr is the legacy default
// stream of the calling thread's current device. These return a cudaError_t.

// A stream on the current device, as cudaStreamCreateWithFlags makes it.
int NewStream(void** stream, bool non_blocking = true);
int DestroyStream(void* stream);
// Runs `work` on the stream's worker in stream order, like a kernel launch.
int LaunchHostWork(void* stream, std::function<void()> work);
// Occupies the stream for `duration`, like a long kernel.
int Stall(void* stream, std::chrono::milliseconds duration);
// Blocks until the work issued on the stream so far has finished.
int SynchronizeStream(void* stream);
// "Device" memory (cudaMalloc / cudaFree without counting calls or injecting
// faults). DeviceFree, like cudaFree, first waits for all queued work.
void* DeviceAlloc(size_t bytes);
void DeviceFree(void* ptr);

// ---- Observations. ----

// One cudaMemcpyAsync, in issue order.
struct CopyRecord {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
  void* stream = nullptr;         // The handle as passed (0x1 for cudaStreamLegacy).
  int device = 0;                 // The device of the stream that ran it.
  bool host_synchronous = false;  // A pageable or host-to-host copy: returned once done.
  int64_t exec_index = -1;        // Order of execution among all copies; -1: not yet run.
  std::chrono::steady_clock::time_point issued, started, finished;
};
std::vector<CopyRecord> Copies();
void ClearCopies();

struct Counters {
  int64_t calls[static_cast<int>(Api::kCount)] = {};
  int live_streams = 0;  // Created and not destroyed, the legacy streams excluded.
  int live_events = 0;
  int host_registrations = 0;
  int pinned_allocations = 0;  // cudaMallocHost blocks not freed.
  int device_allocations = 0;
  int64_t blocking_event_syncs = 0;  // cudaEventSynchronize on a cudaEventBlockingSync event.
  int64_t spinning_event_syncs = 0;  // ... on an event the real runtime would spin on.
  int64_t host_synchronous_copies = 0;
  int64_t fatbinaries_registered = 0;
  // Misuse the real runtime would not report but that corrupts memory there:
  // unregistering or freeing memory that a queued copy still reads or writes.
  int64_t freed_while_in_use = 0;
  int ipc_mem_imports = 0;    // cudaIpcOpenMemHandle mappings not yet unmapped.
  int ipc_event_imports = 0;  // cudaIpcOpenEventHandle events not destroyed (also live_events).
};
Counters GetCounters();
int64_t CallCount(Api api);

// The calls of each counted function made by the calling thread since the
// thread started. Reset() does not clear them (it cannot reach other
// threads' counts): take two readings and compare.
struct ThreadCalls {
  int64_t calls[static_cast<int>(Api::kCount)] = {};

  int64_t of(Api api) const { return calls[static_cast<int>(api)]; }
  int64_t Total() const {
    int64_t total = 0;
    for (int64_t n : calls) total += n;
    return total;
  }
  // The calls made between `earlier` and this reading.
  ThreadCalls Since(const ThreadCalls& earlier) const {
    ThreadCalls delta;
    for (int i = 0; i < static_cast<int>(Api::kCount); ++i) {
      delta.calls[i] = calls[i] - earlier.calls[i];
    }
    return delta;
  }
};
ThreadCalls CallsOnThisThread();

// The calling thread's last error, without clearing it.
int PeekLastError();

// The calling thread's current device (as cudaGetDevice, uncounted).
int CurrentDevice();

}  // namespace zcc::fake_cudart

#endif  // ZCC_CUDA_FAKE_CUDART_FAKE_CUDART_H_
