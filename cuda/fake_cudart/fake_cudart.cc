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
//   cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaIpcCloseMemHandle
//   cudaIpcGetEventHandle cudaIpcOpenEventHandle cudaDeviceReset
//   cudaPointerGetAttributes cudaGetDriverEntryPointByVersion
//   __cudaRegisterFatBinary __cudaRegisterFatBinaryEnd __cudaUnregisterFatBinary
// and, through cudaGetDriverEntryPointByVersion only, cuMemGetAddressRange_v2.
// The per-thread default stream (cudaStreamPerThread) is not modelled: it is
// refused with cudaErrorNotSupported.
//
// Design: one mutex and one condition variable guard the whole runtime. A
// stream is a queue of operations and a worker thread; an operation runs once
// every dependency (a stream and a sequence number on it) has completed.
// Dependencies come from cudaStreamWaitEvent and from the legacy default
// stream's implicit synchronisation with blocking streams.
//
// Interprocess state cannot live behind that mutex: another process changes
// it. Device memory is a memfd mapped MAP_SHARED, which an importer reopens
// through /proc/<exporter pid>/fd/<fd> (the handle also carries the memfd's
// inode, so that a reused fd number is refused). An interprocess event is a
// memfd page of atomic counters (SharedEventPage); a stream waiting on one
// blocks its worker thread on a shared futex, and every 10 ms looks at the
// exporter's pidfd and at the recorders' pids, so that a dead peer ends the
// wait (fake_cudart.h states the rules). Process liveness comes from pidfds,
// which report a zombie as exited.
#include "cuda/fake_cudart/fake_cudart.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
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
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace zcc::fake_cudart {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kApiCount = static_cast<int>(Api::kCount);

// How often a wait on another process's event looks whether that process has
// exited (it sleeps on a futex in between).
constexpr std::chrono::milliseconds kPeerPoll{10};

// An owned file descriptor. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Close(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

// An owned mapping. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      Unmap();
      base_ = std::exchange(other.base_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { Unmap(); }

  void* base() const { return base_; }

 private:
  void Unmap() {
    if (base_ != nullptr) munmap(base_, bytes_);
    base_ = nullptr;
  }
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// A new memfd of `bytes` (at least one: a mapping cannot be empty); invalid on
// failure. Close-on-exec: a process the test starts must not keep it alive.
UniqueFd NewMemfd(const char* name, size_t bytes) {
  UniqueFd fd(memfd_create(name, MFD_CLOEXEC));
  if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(std::max<size_t>(bytes, 1))) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Maps `bytes` (at least one) of `fd` shared and writable; empty on failure.
Mapping MapShared(int fd, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? Mapping() : Mapping(p, bytes);
}

uint64_t InodeOf(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

UniqueFd PidfdOpen(pid_t pid) { return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))); }

// Whether the process a pidfd refers to has exited; a zombie has.
bool PidfdExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Whether process `pid` has exited: it is a zombie or no longer exists.
// Assumes the pid has not been reused meanwhile (pids wrap after millions).
bool ProcessExited(pid_t pid) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno == ESRCH;
  const bool exited = PidfdExited(pidfd);
  close(pidfd);
  return exited;
}

// A shared (not FUTEX_PRIVATE) futex: the word lies in a MAP_SHARED page that
// other processes wait on too.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Magics, as little-endian ASCII: "zccfkmem", "zccfkevt", "zccfkpag".
constexpr uint64_t kMemHandleMagic = 0x6d656d6b6663637a;
constexpr uint64_t kEventHandleMagic = 0x7476656b6663637a;
constexpr uint64_t kEventPageMagic = 0x6761706b6663637a;
constexpr uint32_t kEventPageVersion = 1;

// The bytes of the cudaIpcMemHandle_t and cudaIpcEventHandle_t this fake hands
// out: where the exporter's memfd is and what the importer must find there.
// Validated when opened: the other process may have written anything.
struct IpcHandle {
  uint64_t magic = 0;
  int32_t pid = 0;      // The exporter: the memfd is /proc/<pid>/fd/<fd> ...
  uint32_t uid = 0;     // ... which another uid cannot open (except root).
  int32_t fd = -1;
  int32_t device = 0;   // The exporter's.
  uint64_t bytes = 0;   // The allocation's size; for an event, its page's.
  uint64_t serial = 0;  // Tells the exporter's allocations and events apart.
  uint64_t inode = 0;   // The memfd's: a reused fd number names another file.
};
static_assert(sizeof(IpcHandle) <= CUDA_IPC_HANDLE_SIZE);
static_assert(std::is_trivially_copyable_v<IpcHandle>);

template <typename Handle>
Handle EncodeHandle(const IpcHandle& h) {
  Handle out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(out.reserved, &h, sizeof(h));
  return out;
}

template <typename Handle>
IpcHandle DecodeHandle(const Handle& handle) {
  IpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  return h;
}

constexpr int kRecorderSlots = 32;
constexpr size_t kEventPageBytes = 4096;

// An interprocess event's state, in a memfd page that every process using the
// event maps: fixed layout, no pointers, lock-free atomics only (a process may
// die at any instruction). The exporter writes magic and version; importers
// check them.
struct SharedEventPage {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  std::atomic<uint64_t> recorded;   // Values handed out to records: the last one.
  std::atomic<uint64_t> completed;  // The highest value whose record has run.
  std::atomic<uint32_t> wake;       // Futex word, bumped whenever `completed` may move.
  uint32_t reserved2;
  // Each recording process's latest record (pending while above `completed`),
  // so that the records of a process that died can count as completed.
  struct Recorder {
    std::atomic<int32_t> pid;  // 0: free.
    uint32_t reserved;
    std::atomic<uint64_t> latest;
  } recorders[kRecorderSlots];
};
static_assert(sizeof(SharedEventPage) <= kEventPageBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<int32_t>::is_always_lock_free);

// One interprocess event's shared page as this process maps it. The exporter
// owns the memfd its handle names; an importer holds a pidfd of the exporter
// instead. Shared by the event and by the stream operations still using the
// page, so that destroying the event never unmaps it under them. Its methods
// touch only the shared page (and the kernel): callable without the runtime's
// lock, from any thread.
struct IpcEvent {
  enum class Wait { kReached, kExporterExited, kAbandoned };

  Mapping mapping;
  SharedEventPage* page = nullptr;
  IpcHandle handle;         // What cudaIpcGetEventHandle returns.
  UniqueFd memfd;           // Exporter only.
  UniqueFd exporter_pidfd;  // Importer only.

  bool imported() const { return exporter_pidfd.valid(); }
  bool ExporterExited() const { return imported() && PidfdExited(exporter_pidfd.get()); }
  bool Reached(uint64_t target) const { return page->completed.load() >= target; }

  // Takes the next record value (`++recorded`), noting it as this process's
  // latest; 0 when every recorder slot belongs to another live process.
  uint64_t BeginRecord() const {
    SharedEventPage::Recorder* slot = RecorderSlot();
    if (slot == nullptr) return 0;
    // The slot holds the value before `recorded` hands it out, so that a
    // process dying in between leaves no record that no slot accounts for.
    uint64_t last = page->recorded.load();
    do {
      slot->latest.store(last + 1);
    } while (!page->recorded.compare_exchange_weak(last, last + 1));
    return last + 1;
  }

  // completed = max(completed, value); wakes every waiter, in any process.
  void Complete(uint64_t value) const {
    uint64_t current = page->completed.load();
    while (current < value && !page->completed.compare_exchange_weak(current, value)) {
    }
    page->wake.fetch_add(1);
    FutexWakeAll(&page->wake);
  }

  // Counts the pending records of processes that have exited as completed;
  // whether `completed` moved.
  bool CompleteDeadRecorders() const {
    bool moved = false;
    for (SharedEventPage::Recorder& r : page->recorders) {
      const int32_t pid = r.pid.load();
      const uint64_t latest = r.latest.load();
      if (pid == 0 || latest <= page->completed.load() || !ProcessExited(pid)) continue;
      Complete(latest);
      moved = true;
    }
    return moved;
  }

  // Blocks until `completed` reaches `target`, the exporter of an imported
  // event has exited first, or `abandon` (asked every kPeerPoll) says so.
  Wait WaitUntil(uint64_t target, const std::function<bool()>& abandon) const {
    for (;;) {
      const uint32_t word = page->wake.load();
      if (Reached(target)) return Wait::kReached;
      // Looked at before the second check: an exporter that ran the record
      // and then exited leaves a completed event, not a failure.
      const bool exporter_exited = ExporterExited();
      if (Reached(target)) return Wait::kReached;
      if (exporter_exited) return Wait::kExporterExited;
      if (CompleteDeadRecorders()) continue;
      if (abandon()) return Wait::kAbandoned;
      FutexWait(&page->wake, word, kPeerPoll);
    }
  }

 private:
  // This process's recorder slot, claimed if need be. Records are issued
  // under the runtime's lock: one thread per process claims at a time.
  SharedEventPage::Recorder* RecorderSlot() const {
    const int32_t me = getpid();
    for (SharedEventPage::Recorder& r : page->recorders) {
      if (r.pid.load() == me) return &r;
    }
    for (SharedEventPage::Recorder& r : page->recorders) {
      int32_t free_slot = 0;
      if (r.pid.compare_exchange_strong(free_slot, me)) return &r;
    }
    // All taken: reuse the slot of a process that exited with nothing pending.
    for (SharedEventPage::Recorder& r : page->recorders) {
      int32_t owner = r.pid.load();
      if (r.latest.load() <= page->completed.load() && ProcessExited(owner) &&
          r.pid.compare_exchange_strong(owner, me)) {
        return &r;
      }
    }
    return nullptr;
  }
};

// Another process's device allocation mapped into this one, with a pidfd of
// its exporter. Shared by the import and by the copies queued on it, so that
// closing the import never unmaps memory under a queued copy.
struct ImportMapping {
  Mapping mapping;
  UniqueFd exporter_pidfd;

  bool ExporterExited() const { return PidfdExited(exporter_pidfd.get()); }
};

// Identifies an exported allocation across its importers: exporter pid,
// serial, memfd inode.
using ImportKey = std::tuple<int32_t, uint64_t, uint64_t>;

// A device allocation of this process (cudaMalloc, DeviceAlloc): a memfd,
// which cudaIpcGetMemHandle names, mapped shared. Move-only; erasing it from
// the runtime's map unmaps and closes.
struct DeviceAllocation {
  size_t bytes = 0;
  int device = 0;
  uint64_t serial = 0;
  uint64_t inode = 0;
  UniqueFd memfd;
  Mapping mapping;
};

// An open cudaIpcOpenMemHandle mapping, counted per cudaIpcOpenMemHandle.
struct ImportedMemory {
  size_t bytes = 0;
  int device = 0;  // The importing device (current at the first open).
  int refs = 0;
  ImportKey key;
  std::shared_ptr<ImportMapping> mapping;
};

// The size of a range in the runtime's maps of base -> size or base -> record.
size_t RangeBytes(size_t bytes) { return bytes; }
template <typename Range>
size_t RangeBytes(const Range& range) {
  return range.bytes;
}

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
  // Set by cudaDeviceReset, Reset and at exit: waits on interprocess events
  // give up, so that draining never waits on another process.
  std::atomic<bool> abandon{false};
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
  // Interprocess events (created with cudaEventInterprocess, or imported)
  // only; their state is in the shared page, not in the fields above.
  std::shared_ptr<zcc::fake_cudart::IpcEvent> ipc;
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

// The range of `ranges` containing `p`, or end().
template <typename Range>
typename std::map<uintptr_t, Range>::const_iterator FindRange(
    const std::map<uintptr_t, Range>& ranges, const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return addr < it->first + RangeBytes(it->second) ? it : ranges.end();
}

template <typename Range>
bool InRange(const std::map<uintptr_t, Range>& ranges, const void* p) {
  return FindRange(ranges, p) != ranges.end();
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
  std::map<uintptr_t, DeviceAllocation> device_allocs;  // cudaMalloc, DeviceAlloc.
  std::map<uintptr_t, ImportedMemory> ipc_imports;      // cudaIpcOpenMemHandle, by base.
  std::map<ImportKey, uintptr_t> ipc_import_bases;      // ... by exported allocation.
  uint64_t next_serial = 0;  // Of exported allocations and events; never reset.
  // Sized for the default Config before any Reset(): a process that never
  // calls Reset() (zccd or a trainer over the fake) must get sticky errors too.
  std::vector<cudaError_t> sticky = std::vector<cudaError_t>(1, cudaSuccess);  // Per device.
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

  // The device's first sticky error stays.
  void SetSticky(int device, cudaError_t err) {
    if (device < static_cast<int>(sticky.size()) && sticky[device] == cudaSuccess) {
      sticky[device] = err;
    }
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
    if (InRange(device_allocs, p) || InRange(ipc_imports, p)) return Memory::kDevice;
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
    // Held until the copy ran: closing an import must not unmap it first.
    std::vector<std::shared_ptr<ImportMapping>> imports;
    for (const void* p : {src, static_cast<const void*>(dst)}) {
      if (auto it = FindRange(ipc_imports, p); it != ipc_imports.end()) {
        imports.push_back(it->second.mapping);
      }
    }
    Submit(s, {}, [this, id, dst, src, bytes, delay, device, imports = std::move(imports)] {
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
        } else {
          // The exporter's memory is gone with it, as far as the device
          // knows: a fault rather than bytes (fake_cudart.h).
          for (const auto& import : imports) {
            if (import->ExporterExited()) {
              fail = true;
              SetSticky(device, cudaErrorIllegalAddress);
              break;
            }
          }
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
      for (const auto& s : all) {
        s->stopping = true;
        s->abandon = true;
      }
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
    device_allocs.clear();  // Unmaps and closes the memfds.
    ipc_imports.clear();    // Unmaps (no copy is queued any more).
    ipc_import_bases.clear();
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

  // A memfd mapped shared, so that cudaIpcGetMemHandle can name it to
  // another process. Caller holds mu.
  void* AllocDevice(size_t bytes) {
    DeviceAllocation a;
    a.memfd = NewMemfd("zcc-fake-device", bytes);
    if (!a.memfd.valid()) return nullptr;
    a.mapping = MapShared(a.memfd.get(), bytes);
    void* p = a.mapping.base();
    if (p == nullptr) return nullptr;
    a.bytes = bytes;
    a.device = t_device;
    a.serial = ++next_serial;
    a.inode = InodeOf(a.memfd.get());
    device_allocs.emplace(reinterpret_cast<uintptr_t>(p), std::move(a));
    return p;
  }

  // An interprocess event's page, exported (its memfd stays open for
  // importers); nullptr on failure. Caller holds mu.
  std::shared_ptr<IpcEvent> NewIpcEvent() {
    auto e = std::make_shared<IpcEvent>();
    e->memfd = NewMemfd("zcc-fake-event", kEventPageBytes);
    if (!e->memfd.valid()) return nullptr;
    e->mapping = MapShared(e->memfd.get(), kEventPageBytes);
    if (e->mapping.base() == nullptr) return nullptr;
    e->page = new (e->mapping.base()) SharedEventPage();
    e->page->magic = kEventPageMagic;
    e->page->version = kEventPageVersion;
    e->handle.magic = kEventHandleMagic;
    e->handle.pid = getpid();
    e->handle.uid = getuid();
    e->handle.fd = e->memfd.get();
    e->handle.device = t_device;
    e->handle.bytes = kEventPageBytes;
    e->handle.serial = ++next_serial;
    e->handle.inode = InodeOf(e->memfd.get());
    return e;
  }

  // Queues on `s` a wait until `event` reaches `target`. The stream's worker
  // blocks on the shared futex; the exporter of an imported event exiting
  // first leaves the stream's device a sticky cudaErrorIllegalAddress.
  void SubmitSharedWait(const std::shared_ptr<StreamState>& s, std::shared_ptr<IpcEvent> event,
                        uint64_t target) {
    StreamState* stream = s.get();  // Alive while its own worker runs this.
    Submit(s, {}, [this, event = std::move(event), target, stream] {
      const IpcEvent::Wait result = event->WaitUntil(target, [this, stream] {
        if (stream->abandon.load()) return true;
        // After a fault nothing on the device waits any longer.
        std::lock_guard<std::mutex> lock(mu);
        return Sticky(stream->device) != cudaSuccess;
      });
      if (result == IpcEvent::Wait::kExporterExited) {
        std::lock_guard<std::mutex> lock(mu);
        SetSticky(stream->device, cudaErrorIllegalAddress);
      }
    });
  }

  // Opens the memfd an IPC handle names in its exporter, `file_bytes` long,
  // and a pidfd of the exporter. Any mismatch is the exporter gone or the fd
  // reused: cudaErrorInvalidResourceHandle.
  static cudaError_t OpenExported(const IpcHandle& h, uint64_t file_bytes, UniqueFd* memfd,
                                  UniqueFd* pidfd) {
    if (h.pid <= 0 || h.fd < 0) return cudaErrorInvalidResourceHandle;
    // The pidfd first: were the pid reused before it, the fd below would not
    // be the memfd (the inode check refuses it), so a pidfd that passes the
    // check is the exporter's.
    UniqueFd exporter = PidfdOpen(h.pid);
    if (!exporter.valid() || PidfdExited(exporter.get())) return cudaErrorInvalidResourceHandle;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    UniqueFd fd(open(path, O_RDWR | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EACCES || errno == EPERM) {
        // Not a peer's death but a setup the fake cannot serve: say so.
        std::fprintf(stderr, "fake_cudart: cannot open %s (exporter uid %u, ours %u): %s\n", path,
                     h.uid, getuid(), std::strerror(errno));
      }
      return cudaErrorInvalidResourceHandle;
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_ino) != h.inode ||
        static_cast<uint64_t>(st.st_size) != file_bytes) {
      return cudaErrorInvalidResourceHandle;
    }
    *memfd = std::move(fd);
    *pidfd = std::move(exporter);
    return cudaSuccess;
  }

  // cudaDeviceReset of `device`: its queued work runs out (no stream waits
  // for another process any longer), then its streams, events, imports and
  // allocations go and its sticky error is cleared.
  void ResetDevice(std::unique_lock<std::mutex>& lock, int device) {
    std::vector<cudaStream_t> doomed;
    for (const auto& [handle, s] : streams) {
      if (s->device == device) {
        s->abandon = true;
        doomed.push_back(handle);
      }
    }
    for (const auto& s : retired) {
      if (s->device == device) s->abandon = true;
    }
    const bool has_legacy = static_cast<size_t>(device) < legacy.size() && legacy[device] != nullptr;
    if (has_legacy) legacy[device]->abandon = true;
    for (cudaStream_t handle : doomed) DestroyStream(handle);
    DrainDevice(lock, device);
    if (has_legacy) legacy[device]->abandon = false;  // It outlives the reset.
    for (auto it = events.begin(); it != events.end();) {
      if ((*it)->device == device) {
        delete *it;
        it = events.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = ipc_imports.begin(); it != ipc_imports.end();) {
      if (it->second.device == device) {
        ipc_import_bases.erase(it->second.key);
        it = ipc_imports.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = device_allocs.begin(); it != device_allocs.end();) {
      if (it->second.device == device) {
        it = device_allocs.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<size_t>(device) < sticky.size()) sticky[device] = cudaSuccess;
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
    ZCC_FAKE_ERROR(cudaErrorDeviceUninitialized, "invalid device context"),
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
    "cudaIpcGetMemHandle",
    "cudaIpcOpenMemHandle",
    "cudaIpcCloseMemHandle",
    "cudaIpcGetEventHandle",
    "cudaIpcOpenEventHandle",
    "cudaDeviceReset",
    "cudaPointerGetAttributes",
    "cudaGetDriverEntryPointByVersion",
};
// A name short would leave the array's tail null without a compile error.
static_assert(kApiNames[kApiCount - 1] != nullptr, "kApiNames must follow enum Api");

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
  e.device_uninitialized = cudaErrorDeviceUninitialized;
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
  r.device_allocs.erase(reinterpret_cast<uintptr_t>(ptr));  // Unmaps, closes the memfd.
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
  c.ipc_mem_imports = static_cast<int>(r.ipc_imports.size());
  for (const CUevent_st* e : r.events) {
    if (e->ipc != nullptr && e->ipc->imported()) ++c.ipc_event_imports;
  }
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
using zcc::fake_cudart::DecodeHandle;
using zcc::fake_cudart::EncodeHandle;
using zcc::fake_cudart::Fail;
using zcc::fake_cudart::FindRange;
using zcc::fake_cudart::g_issue_delay_us;
using zcc::fake_cudart::ImportedMemory;
using zcc::fake_cudart::ImportKey;
using zcc::fake_cudart::ImportMapping;
using zcc::fake_cudart::InRange;
using zcc::fake_cudart::IpcEvent;
using zcc::fake_cudart::IpcHandle;
using zcc::fake_cudart::kEventHandleMagic;
using zcc::fake_cudart::kEventPageBytes;
using zcc::fake_cudart::kEventPageMagic;
using zcc::fake_cudart::kEventPageVersion;
using zcc::fake_cudart::kMemHandleMagic;
using zcc::fake_cudart::MapShared;
using zcc::fake_cudart::Overlaps;
using zcc::fake_cudart::Rt;
using zcc::fake_cudart::Runtime;
using zcc::fake_cudart::SharedEventPage;
using zcc::fake_cudart::t_device;
using zcc::fake_cudart::t_last_error;
using zcc::fake_cudart::UniqueFd;

namespace {
using Lock = std::unique_lock<std::mutex>;

// cuMemGetAddressRange_v2, the one driver function the fake hands out
// (cudaGetDriverEntryPointByVersion): the device allocation or IPC import
// containing `dptr`. Either out-pointer may be null, as in the driver.
CUresult CUDAAPI FakeCuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  Runtime& r = Rt();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto* p = reinterpret_cast<const void*>(static_cast<uintptr_t>(dptr));
  uintptr_t found_base = 0;
  size_t found_bytes = 0;
  if (auto it = FindRange(r.device_allocs, p); it != r.device_allocs.end()) {
    found_base = it->first;
    found_bytes = it->second.bytes;
  } else if (auto imp = FindRange(r.ipc_imports, p); imp != r.ipc_imports.end()) {
    found_base = imp->first;
    found_bytes = imp->second.bytes;
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  if (base != nullptr) *base = static_cast<CUdeviceptr>(found_base);
  if (size != nullptr) *size = found_bytes;
  return CUDA_SUCCESS;
}
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
  if (event->ipc != nullptr) {
    // The same capture, on the shared counters: whatever any process has
    // recorded so far.
    const uint64_t target = event->ipc->page->recorded.load();
    if (!event->ipc->Reached(target)) r.SubmitSharedWait(s, event->ipc, target);
    return cudaSuccess;
  }
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
  if ((flags & cudaEventInterprocess) != 0) {
    e->ipc = r.NewIpcEvent();
    if (e->ipc == nullptr) {
      delete e;
      return Fail(cudaErrorMemoryAllocation);
    }
  }
  r.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kEventDestroy, false)) return Fail(e);
  // As in CUDA, destroying an event whose record is pending is allowed: the
  // streams waiting on it captured what they wait for. An interprocess
  // event's page stays mapped while queued operations use it, and in every
  // other process that mapped it.
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
  if (event->ipc != nullptr) {
    const uint64_t value = event->ipc->BeginRecord();
    // Every recorder slot held by a live process: more than the fake models.
    if (value == 0) return Fail(cudaErrorUnknown);
    r.Submit(s, {}, [ipc = event->ipc, value] { ipc->Complete(value); });
    return cudaSuccess;
  }
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
  if (event->ipc != nullptr) {
    const IpcEvent& ipc = *event->ipc;
    const uint64_t target = ipc.page->recorded.load();
    const bool exporter_exited = ipc.ExporterExited();  // Before: see WaitUntil.
    if (!ipc.Reached(target)) {
      if (exporter_exited) {
        r.SetSticky(event->device, cudaErrorIllegalAddress);
        return Fail(r.Sticky(event->device));
      }
      ipc.CompleteDeadRecorders();
      if (!ipc.Reached(target)) return cudaErrorNotReady;
    }
    return Fail(r.Sticky(event->device));
  }
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
  if (event->ipc != nullptr) {
    // Our own reference: the event may be destroyed meanwhile.
    const std::shared_ptr<IpcEvent> ipc = event->ipc;
    const uint64_t target = ipc->page->recorded.load();
    const int device = event->device;
    lock.unlock();
    const IpcEvent::Wait result = ipc->WaitUntil(target, [&r, device] {
      std::lock_guard<std::mutex> relock(r.mu);
      return r.Sticky(device) != cudaSuccess;
    });
    lock.lock();
    if (result == IpcEvent::Wait::kExporterExited) r.SetSticky(device, cudaErrorIllegalAddress);
    return Fail(r.Sticky(device));
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
  r.device_allocs.erase(reinterpret_cast<uintptr_t>(ptr));  // Unmaps, closes the memfd.
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

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kIpcGetMemHandle)) return Fail(e);
  if (handle == nullptr) return Fail(cudaErrorInvalidValue);
  // The base of an allocation of this process only (not an interior
  // pointer, not an import).
  auto it = r.device_allocs.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == r.device_allocs.end()) return Fail(cudaErrorInvalidValue);
  IpcHandle h;
  h.magic = kMemHandleMagic;
  h.pid = getpid();
  h.uid = getuid();
  h.fd = it->second.memfd.get();
  h.device = it->second.device;
  h.bytes = it->second.bytes;
  h.serial = it->second.serial;
  h.inode = it->second.inode;
  *handle = EncodeHandle<cudaIpcMemHandle_t>(h);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kIpcOpenMemHandle)) return Fail(e);
  if (devPtr == nullptr || (flags & ~static_cast<unsigned>(cudaIpcMemLazyEnablePeerAccess)) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  *devPtr = nullptr;
  const IpcHandle h = DecodeHandle(handle);
  if (h.magic != kMemHandleMagic) return Fail(cudaErrorInvalidResourceHandle);
  // As the driver: a context cannot import its own process's memory
  // (CUDA_ERROR_INVALID_CONTEXT, which the runtime has called
  // cudaErrorDeviceUninitialized since CUDA 10.1).
  if (h.pid == getpid()) return Fail(cudaErrorDeviceUninitialized);
  const ImportKey key{h.pid, h.serial, h.inode};
  if (auto known = r.ipc_import_bases.find(key); known != r.ipc_import_bases.end()) {
    ++r.ipc_imports.at(known->second).refs;
    *devPtr = reinterpret_cast<void*>(known->second);
    return cudaSuccess;
  }
  UniqueFd memfd, pidfd;
  const uint64_t file_bytes = std::max<uint64_t>(h.bytes, 1);
  if (cudaError_t e = Runtime::OpenExported(h, file_bytes, &memfd, &pidfd)) return Fail(e);
  auto mapping = std::make_shared<ImportMapping>();
  mapping->mapping = MapShared(memfd.get(), h.bytes);  // Keeps the memfd alive on its own.
  if (mapping->mapping.base() == nullptr) return Fail(cudaErrorMemoryAllocation);
  mapping->exporter_pidfd = std::move(pidfd);
  const auto base = reinterpret_cast<uintptr_t>(mapping->mapping.base());
  ImportedMemory import;
  import.bytes = h.bytes;
  import.device = t_device;
  import.refs = 1;
  import.key = key;
  import.mapping = std::move(mapping);
  r.ipc_imports.emplace(base, std::move(import));
  r.ipc_import_bases.emplace(key, base);
  *devPtr = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  // Releasing works on a device with a sticky error, as cudaStreamDestroy.
  if (cudaError_t e = r.Enter(Api::kIpcCloseMemHandle, false)) return Fail(e);
  auto it = r.ipc_imports.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == r.ipc_imports.end()) return Fail(cudaErrorInvalidValue);
  if (--it->second.refs == 0) {
    // Unmapped now, or once the copies queued on it ran (they share it).
    r.ipc_import_bases.erase(it->second.key);
    r.ipc_imports.erase(it);
  }
  return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kIpcGetEventHandle)) return Fail(e);
  if (handle == nullptr) return Fail(cudaErrorInvalidValue);
  if (r.events.count(event) == 0 || event->ipc == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  // An imported event's handle is its exporter's.
  *handle = EncodeHandle<cudaIpcEventHandle_t>(event->ipc->handle);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kIpcOpenEventHandle)) return Fail(e);
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  const IpcHandle h = DecodeHandle(handle);
  if (h.magic != kEventHandleMagic) return Fail(cudaErrorInvalidResourceHandle);
  // As for memory (the fake's choice: the driver documents the error only).
  if (h.pid == getpid()) return Fail(cudaErrorDeviceUninitialized);
  UniqueFd memfd, pidfd;
  if (cudaError_t e = Runtime::OpenExported(h, kEventPageBytes, &memfd, &pidfd)) return Fail(e);
  auto ipc = std::make_shared<IpcEvent>();
  ipc->mapping = MapShared(memfd.get(), kEventPageBytes);
  if (ipc->mapping.base() == nullptr) return Fail(cudaErrorMemoryAllocation);
  ipc->page = static_cast<SharedEventPage*>(ipc->mapping.base());
  if (ipc->page->magic != kEventPageMagic || ipc->page->version != kEventPageVersion) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  ipc->handle = h;
  ipc->exporter_pidfd = std::move(pidfd);
  // "Behaves like a locally created event with cudaEventDisableTiming".
  auto* e = new CUevent_st;
  e->flags = cudaEventDisableTiming | cudaEventInterprocess;
  e->device = t_device;
  e->ipc = std::move(ipc);
  r.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  // The way out of a sticky error: not refused because of one.
  if (cudaError_t e = r.Enter(Api::kDeviceReset, false)) return Fail(e);
  r.ResetDevice(lock, t_device);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kPointerGetAttributes)) return Fail(e);
  if (attributes == nullptr) return Fail(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof(*attributes));
  void* p = const_cast<void*>(ptr);
  if (auto it = FindRange(r.device_allocs, ptr); it != r.device_allocs.end()) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = it->second.device;
    attributes->devicePointer = p;
  } else if (auto imp = FindRange(r.ipc_imports, ptr); imp != r.ipc_imports.end()) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = imp->second.device;
    attributes->devicePointer = p;
  } else if (InRange(r.pinned_allocs, ptr) || InRange(r.registered, ptr)) {
    // Mapped into the device's address space too (unified addressing). The
    // fake does not note the device current at the allocation: this one.
    attributes->type = cudaMemoryTypeHost;
    attributes->device = t_device;
    attributes->devicePointer = p;
    attributes->hostPointer = p;
  } else {
    // CUDA >= 11: unknown host memory is no error.
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = cudaInvalidDeviceId;
  }
  return cudaSuccess;
}

// The header's declaration gives driverStatus a default (C++ only).
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int /*cudaVersion*/,
                                             unsigned long long /*flags*/,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  Runtime& r = Rt();
  Lock lock(r.mu);
  if (cudaError_t e = r.Enter(Api::kGetDriverEntryPoint, false)) return Fail(e);
  if (symbol == nullptr || funcPtr == nullptr) return Fail(cudaErrorInvalidValue);
  // Every version asked for gets the _v2 variant (CUDA >= 3.2).
  const bool found = std::strcmp(symbol, "cuMemGetAddressRange") == 0;
  *funcPtr = found ? reinterpret_cast<void*>(&FakeCuMemGetAddressRange) : nullptr;
  if (driverStatus != nullptr) {
    *driverStatus = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  // The runtime reports an unknown symbol through driverStatus only.
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
