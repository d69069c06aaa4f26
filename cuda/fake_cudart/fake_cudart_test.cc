// The fake CUDA runtime's semantics, checked through the CUDA runtime API
// itself: the copier tests rely on these being those of the real runtime.
#include "cuda/fake_cudart/fake_cudart.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/fake_cudart/fake_ipc_peer.h"

extern char** environ;

namespace zcc::fake_cudart {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

cudaStream_t MakeStream(unsigned flags) {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  return s;
}

cudaEvent_t MakeEvent(unsigned flags) {
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, flags) == cudaSuccess);
  return e;
}

// Work on `stream` that notes whether `flag` was already set when it ran.
std::shared_ptr<std::atomic<int>> Observe(cudaStream_t stream, const std::atomic<bool>& flag) {
  auto seen = std::make_shared<std::atomic<int>>(-1);
  REQUIRE(LaunchHostWork(stream, [seen, &flag] { *seen = flag.load() ? 1 : 0; }) == 0);
  return seen;
}

TEST_CASE("a stream runs its work in issue order, on its own thread") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  std::vector<int> order;
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> other_thread{true};
  REQUIRE(Stall(s, milliseconds(50)) == 0);
  for (int i = 0; i < 20; ++i) {
    REQUIRE(LaunchHostWork(s, [&order, &other_thread, caller, i] {
              order.push_back(i);
              if (std::this_thread::get_id() == caller) other_thread = false;
            }) == 0);
  }
  CHECK(order.empty());  // Still behind the stall.
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(order.size() == 20);
  for (int i = 0; i < 20; ++i) CHECK(order[i] == i);
  CHECK(other_thread);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("cudaStreamWaitEvent orders work across streams, as recorded at the call") {
  Reset();
  cudaStream_t a = MakeStream(cudaStreamNonBlocking);
  cudaStream_t b = MakeStream(cudaStreamNonBlocking);
  cudaEvent_t e = MakeEvent(cudaEventDisableTiming);
  std::atomic<bool> first{false}, second{false};

  // An event never recorded: waiting on it waits for nothing.
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  REQUIRE(cudaEventQuery(e) == cudaSuccess);

  REQUIRE(Stall(a, milliseconds(100)) == 0);
  REQUIRE(LaunchHostWork(a, [&] { first = true; }) == 0);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaSuccess);  // "Not ready" is no error.
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  // Re-recording later does not change what b already waits for.
  REQUIRE(Stall(a, milliseconds(300)) == 0);
  REQUIRE(LaunchHostWork(a, [&] { second = true; }) == 0);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  auto saw_first = Observe(b, first);
  auto saw_second = Observe(b, second);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(*saw_first == 1);
  CHECK(*saw_second == 0);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  CHECK(second);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("the legacy default stream synchronises with blocking streams only") {
  Reset();
  cudaStream_t blocking = MakeStream(cudaStreamDefault);
  cudaStream_t non_blocking = MakeStream(cudaStreamNonBlocking);
  std::atomic<bool> blocking_done{false}, non_blocking_done{false}, legacy_done{false};
  REQUIRE(Stall(blocking, milliseconds(100)) == 0);
  REQUIRE(LaunchHostWork(blocking, [&] { blocking_done = true; }) == 0);
  REQUIRE(Stall(non_blocking, milliseconds(300)) == 0);
  REQUIRE(LaunchHostWork(non_blocking, [&] { non_blocking_done = true; }) == 0);
  // 0 and cudaStreamLegacy name the same stream.
  auto legacy_saw_blocking = Observe(nullptr, blocking_done);
  auto legacy_saw_non_blocking = Observe(cudaStreamLegacy, non_blocking_done);
  REQUIRE(Stall(nullptr, milliseconds(50)) == 0);
  REQUIRE(LaunchHostWork(nullptr, [&] { legacy_done = true; }) == 0);
  // Work issued on a blocking stream now waits for the legacy stream's work.
  auto blocking_saw_legacy = Observe(blocking, legacy_done);
  auto non_blocking_saw_legacy = Observe(non_blocking, legacy_done);
  REQUIRE(cudaStreamSynchronize(blocking) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(non_blocking) == cudaSuccess);
  CHECK(*legacy_saw_blocking == 1);
  CHECK(*legacy_saw_non_blocking == 0);
  CHECK(*blocking_saw_legacy == 1);
  CHECK(*non_blocking_saw_legacy == 1);  // It ran after its 300 ms stall anyway.
  CHECK(cudaStreamSynchronize(cudaStreamPerThread) == cudaErrorNotSupported);
  REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(non_blocking) == cudaSuccess);
}

TEST_CASE("events: blocking-sync and spinning synchronisations are told apart") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  cudaEvent_t blocking = MakeEvent(cudaEventBlockingSync | cudaEventDisableTiming);
  cudaEvent_t spinning = MakeEvent(cudaEventDisableTiming);
  REQUIRE(Stall(s, milliseconds(50)) == 0);
  REQUIRE(cudaEventRecord(blocking, s) == cudaSuccess);
  REQUIRE(cudaEventRecord(spinning, s) == cudaSuccess);
  const auto start = Clock::now();
  REQUIRE(cudaEventSynchronize(blocking) == cudaSuccess);
  CHECK(MillisSince(start) >= 40);
  REQUIRE(cudaEventSynchronize(spinning) == cudaSuccess);
  const Counters c = GetCounters();
  CHECK(c.blocking_event_syncs == 1);
  CHECK(c.spinning_event_syncs == 1);
  CHECK(c.live_events == 2);
  cudaEvent_t bad = nullptr;
  CHECK(cudaEventCreateWithFlags(&bad, cudaEventInterprocess) == cudaErrorInvalidValue);
  REQUIRE(cudaEventDestroy(blocking) == cudaSuccess);
  REQUIRE(cudaEventDestroy(spinning) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(GetCounters().live_events == 0);
}

TEST_CASE("events belong to the device current at their creation") {
  Config config;
  config.device_count = 2;
  Reset(config);
  cudaEvent_t on0 = MakeEvent(cudaEventDisableTiming);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t s1 = MakeStream(cudaStreamNonBlocking);
  CHECK(cudaEventRecord(on0, s1) == cudaErrorInvalidResourceHandle);
  // Waiting on another device's event is allowed.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaEventRecord(on0, nullptr) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s1, on0, 0) == cudaSuccess);
  CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);
  REQUIRE(cudaStreamDestroy(s1) == cudaSuccess);
  REQUIRE(cudaEventDestroy(on0) == cudaSuccess);
}

TEST_CASE("cudaMemcpyAsync: stream-ordered, synchronous with pageable host memory") {
  Config config;
  config.copy_delay = std::chrono::microseconds(100000);
  Reset(config);
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  constexpr size_t kBytes = 4096;
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  std::memset(device, 0x11, kBytes);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, kBytes) == cudaSuccess);
  std::memset(pinned, 0, kBytes);
  std::vector<unsigned char> registered(kBytes, 0), pageable(kBytes, 0);
  REQUIRE(cudaHostRegister(registered.data(), kBytes, cudaHostRegisterPortable) == cudaSuccess);

  auto start = Clock::now();
  REQUIRE(cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDefault, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(registered.data(), device, kBytes, cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  CHECK(MillisSince(start) < 50);  // Both asynchronous.
  CHECK(static_cast<unsigned char*>(pinned)[0] == 0);
  start = Clock::now();
  REQUIRE(cudaMemcpyAsync(pageable.data(), device, kBytes, cudaMemcpyDefault, s) == cudaSuccess);
  CHECK(MillisSince(start) >= 250);  // Behind the two queued copies, then its own.
  CHECK(pageable[kBytes - 1] == 0x11);
  CHECK(static_cast<unsigned char*>(pinned)[kBytes - 1] == 0x11);
  CHECK(registered[kBytes - 1] == 0x11);
  // Host to host is synchronous too, even between pinned buffers.
  REQUIRE(cudaMemcpyAsync(pinned, registered.data(), 1, cudaMemcpyDefault, s) == cudaSuccess);
  const std::vector<CopyRecord> copies = Copies();
  REQUIRE(copies.size() == 4);
  CHECK_FALSE(copies[0].host_synchronous);
  CHECK_FALSE(copies[1].host_synchronous);
  CHECK(copies[2].host_synchronous);
  CHECK(copies[3].host_synchronous);
  for (int i = 0; i < 4; ++i) CHECK(copies[i].exec_index == i);
  CHECK(copies[0].stream == static_cast<void*>(s));
  CHECK(GetCounters().host_synchronous_copies == 2);
  CHECK(cudaMemcpyAsync(pinned, device, 1, static_cast<cudaMemcpyKind>(7), s) ==
        cudaErrorInvalidMemcpyDirection);
  CHECK(cudaMemcpyAsync(nullptr, device, 1, cudaMemcpyDefault, s) == cudaErrorInvalidValue);

  REQUIRE(cudaHostUnregister(registered.data()) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaFree(device) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(GetCounters().freed_while_in_use == 0);
}

TEST_CASE("unpinning memory a queued copy uses is counted as misuse; freeing waits") {
  Config config;
  config.copy_delay = std::chrono::microseconds(100000);
  Reset(config);
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  std::vector<unsigned char> host(64);
  REQUIRE(cudaHostRegister(host.data(), host.size(), 0) == cudaSuccess);
  void* device = DeviceAlloc(64);
  REQUIRE(cudaMemcpyAsync(host.data(), device, 64, cudaMemcpyDefault, s) == cudaSuccess);
  REQUIRE(cudaHostUnregister(host.data()) == cudaSuccess);
  CHECK(GetCounters().freed_while_in_use == 1);
  std::memset(device, 0x33, 64);
  REQUIRE(cudaMemcpyAsync(host.data(), device, 64, cudaMemcpyDefault, s) == cudaSuccess);
  DeviceFree(device);  // Waits for the copy (host is pageable now: it was synchronous anyway).
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64) == cudaSuccess);
  device = DeviceAlloc(64);
  REQUIRE(cudaMemcpyAsync(pinned, device, 64, cudaMemcpyDefault, s) == cudaSuccess);
  const auto start = Clock::now();
  DeviceFree(device);
  CHECK(MillisSince(start) >= 50);
  CHECK(GetCounters().freed_while_in_use == 1);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cudaHostRegister rejects overlaps and unknown bases like the driver") {
  Reset();
  std::vector<unsigned char> buffer(3 * 4096);
  unsigned char* base = buffer.data();
  REQUIRE(cudaHostRegister(base + 4096, 4096, cudaHostRegisterPortable) == cudaSuccess);
  CHECK(cudaHostRegister(base + 4096, 4096, cudaHostRegisterPortable) ==
        cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaHostRegister(base, 4097, 0) == cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaHostRegister(base + 8191, 10, 0) == cudaErrorHostMemoryAlreadyRegistered);
  REQUIRE(cudaHostRegister(base, 4096, 0) == cudaSuccess);  // Adjacent is fine.
  CHECK(cudaHostRegister(base + 8192, 0, 0) == cudaErrorInvalidValue);
  CHECK(cudaHostRegister(base + 8192, 10, 0x100) == cudaErrorInvalidValue);
  CHECK(cudaHostUnregister(base + 8192) == cudaErrorHostMemoryNotRegistered);
  CHECK(cudaHostUnregister(base + 4097) == cudaErrorHostMemoryNotRegistered);
  CHECK(GetCounters().host_registrations == 2);
  REQUIRE(cudaHostUnregister(base) == cudaSuccess);
  REQUIRE(cudaHostUnregister(base + 4096) == cudaSuccess);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 100) == cudaSuccess);
  CHECK(cudaHostRegister(pinned, 100, 0) == cudaErrorHostMemoryAlreadyRegistered);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(GetCounters().host_registrations == 0);
  CHECK(GetCounters().pinned_allocations == 0);
}

TEST_CASE("last error: set by failures, cleared by cudaGetLastError, kept by Peek") {
  Reset();
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  CHECK(PeekLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
  // Per thread.
  CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
  std::thread([] { CHECK(cudaGetLastError() == cudaSuccess); }).join();
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
}

TEST_CASE("no device, an old driver and injected faults fail like the runtime") {
  Config config;
  config.device_count = 0;
  Reset(config);
  int count = -1;
  CHECK(cudaGetDeviceCount(&count) == cudaErrorNoDevice);
  CHECK(count == 0);
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, 0) == cudaErrorNoDevice);
  CHECK(cudaGetLastError() == cudaErrorNoDevice);

  config = Config();
  config.init_error = cudaErrorInsufficientDriver;
  Reset(config);
  CHECK(cudaGetDeviceCount(&count) == cudaErrorInsufficientDriver);
  CHECK(count == 0);
  CHECK(cudaSetDevice(0) == cudaErrorInsufficientDriver);
  CHECK(std::string(cudaGetErrorName(cudaErrorInsufficientDriver)) ==
        "cudaErrorInsufficientDriver");
  CHECK(std::string(cudaGetErrorString(cudaErrorInsufficientDriver)) ==
        "CUDA driver version is insufficient for CUDA runtime version");
  CHECK(std::string(cudaGetErrorName(static_cast<cudaError_t>(123456))) ==
        "unrecognized error code");

  Reset();
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  FailCall(Api::kStreamCreateWithFlags, cudaErrorMemoryAllocation, /*skip=*/1, /*times=*/2);
  cudaStream_t ok = MakeStream(0);
  CHECK(cudaStreamCreateWithFlags(&s, 0) == cudaErrorMemoryAllocation);
  CHECK(cudaStreamCreateWithFlags(&s, 0) == cudaErrorMemoryAllocation);
  cudaStream_t ok2 = MakeStream(0);
  CHECK(CallCount(Api::kStreamCreateWithFlags) == 4);
  CHECK(std::string(ApiName(Api::kStreamCreateWithFlags)) == "cudaStreamCreateWithFlags");
  FailCall(Api::kEventRecord, cudaErrorLaunchFailure, 0, -1);
  cudaEvent_t e = MakeEvent(0);
  for (int i = 0; i < 3; ++i) CHECK(cudaEventRecord(e, ok) == cudaErrorLaunchFailure);
  ClearFaults();
  CHECK(cudaEventRecord(e, ok) == cudaSuccess);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(ok) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(ok2) == cudaSuccess);
}

TEST_CASE("a copy failing on its stream leaves a sticky error") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  std::vector<unsigned char> host(16, 0);
  REQUIRE(cudaHostRegister(host.data(), host.size(), 0) == cudaSuccess);
  void* device = DeviceAlloc(16);
  std::memset(device, 0x22, 16);
  FailCopyExecution(cudaErrorIllegalAddress, /*skip=*/1);
  REQUIRE(cudaMemcpyAsync(host.data(), device, 8, cudaMemcpyDefault, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(host.data() + 8, device, 8, cudaMemcpyDefault, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  CHECK(host[0] == 0x22);  // The first copy ran.
  CHECK(host[8] == 0);     // The second failed.
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // Sticky.
  cudaEvent_t e = nullptr;
  CHECK(cudaEventCreateWithFlags(&e, 0) == cudaErrorIllegalAddress);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);  // Releasing still works.
  Reset();
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("calls are counted per calling thread too") {
  Reset();
  const ThreadCalls before = CallsOnThisThread();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  cudaEvent_t e = MakeEvent(cudaEventDisableTiming);
  ThreadCalls other_thread;
  int recorded = 0;  // Catch2 assertions are for the test's own thread only.
  std::thread([&] {
    const ThreadCalls start = CallsOnThisThread();
    for (int i = 0; i < 3; ++i) recorded += cudaEventRecord(e, s) == cudaSuccess ? 1 : 0;
    other_thread = CallsOnThisThread().Since(start);
  }).join();
  CHECK(recorded == 3);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  const ThreadCalls mine = CallsOnThisThread().Since(before);
  CHECK(mine.of(Api::kStreamCreateWithFlags) == 1);
  CHECK(mine.of(Api::kEventCreateWithFlags) == 1);
  CHECK(mine.of(Api::kEventSynchronize) == 1);
  CHECK(mine.of(Api::kEventRecord) == 0);
  CHECK(mine.Total() == 3);
  CHECK(other_thread.of(Api::kEventRecord) == 3);
  CHECK(other_thread.Total() == 3);
  CHECK(CallCount(Api::kEventRecord) == 3);  // The process-wide count has both.
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("the issue delay slows the thread calling cudaMemcpyAsync, not the stream") {
  Config config;
  config.issue_delay = std::chrono::microseconds(30000);
  Reset(config);
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  void* device = DeviceAlloc(64);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64) == cudaSuccess);
  auto start = Clock::now();
  REQUIRE(cudaMemcpyAsync(pinned, device, 64, cudaMemcpyDefault, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, device, 64, cudaMemcpyDefault, s) == cudaSuccess);
  CHECK(MillisSince(start) >= 60);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  // Other calls are not slowed down, nor is anything while a call sleeps.
  SetIssueDelay(std::chrono::microseconds(200000));
  cudaError_t issued = cudaErrorUnknown;
  std::thread issuer([&] { issued = cudaMemcpyAsync(pinned, device, 64, cudaMemcpyDefault, s); });
  std::this_thread::sleep_for(milliseconds(20));
  start = Clock::now();
  cudaEvent_t e = MakeEvent(cudaEventDisableTiming);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  CHECK(MillisSince(start) < 100);
  issuer.join();
  CHECK(issued == cudaSuccess);
  SetIssueDelay(std::chrono::microseconds(0));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  DeviceFree(device);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("Reset drains the streams and forgets every handle") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  std::atomic<bool> ran{false};
  REQUIRE(Stall(s, milliseconds(50)) == 0);
  REQUIRE(LaunchHostWork(s, [&] { ran = true; }) == 0);
  Reset();
  CHECK(ran);
  const Counters c = GetCounters();
  CHECK(c.live_streams == 0);
  CHECK(c.calls[static_cast<int>(Api::kStreamCreateWithFlags)] == 0);
  CHECK(c.fatbinaries_registered >= 0);
}

// ---- CUDA IPC across processes: the test and fake_ipc_peer. ----

std::string PeerPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string relative = "cuda/fake_cudart/fake_ipc_peer";
  if (srcdir == nullptr) return "bazel-bin/" + relative;
  return std::string(srcdir) + "/" + (workspace != nullptr ? workspace : "zcc") + "/" + relative;
}

// fake_ipc_peer, another process linked against the fake, driven one command
// at a time (fake_ipc_peer.h). Owns the process: killed and reaped on
// destruction unless already reaped.
class PeerProcess {
 public:
  PeerProcess() {
    signal(SIGPIPE, SIG_IGN);  // Writing to a dead peer must not kill the test.
    int to_child[2], from_child[2];
    REQUIRE(pipe2(to_child, O_CLOEXEC) == 0);
    REQUIRE(pipe2(from_child, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    const std::string path = PeerPath();
    char* argv[] = {const_cast<char*>(path.c_str()), nullptr};
    const int rc = posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    to_ = to_child[1];
    from_ = from_child[0];
    INFO("spawning " << path);
    REQUIRE(rc == 0);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() {
    close(to_);
    close(from_);
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // One command's reply line; "" if none came within 10 s.
  std::string Call(const std::string& command) {
    const std::string line = command + "\n";
    if (write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
    return ReadLine(std::chrono::seconds(10));
  }

  // The results of a command that must succeed.
  std::vector<std::string> Ok(const std::string& command) {
    const std::string reply = Call(command);
    INFO(command << " -> " << reply);
    REQUIRE(reply.rfind("ok", 0) == 0);
    std::istringstream in(reply.substr(2));
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
  }

  // The cudaError_t a command returned (0 for "ok"); -1 for no reply.
  int Code(const std::string& command) {
    const std::string reply = Call(command);
    if (reply.rfind("ok", 0) == 0) return 0;
    if (reply.rfind("err ", 0) == 0) return std::stoi(reply.substr(4));
    return -1;
  }

  // SIGKILL; the peer stays a zombie until Reap().
  void Kill() { kill(pid_, SIGKILL); }
  // Blocks until the peer has exited (a zombie counts), at most 10 s.
  void AwaitExit() {
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    REQUIRE(pidfd >= 0);
    pollfd p{pidfd, POLLIN, 0};
    const int ready = poll(&p, 1, 10000);
    close(pidfd);
    REQUIRE(ready == 1);
  }
  void Reap() {
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  void Exit() {
    const std::string line = "exit\n";
    REQUIRE(write(to_, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    Reap();
  }

 private:
  std::string ReadLine(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      pollfd p{from_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return "";
      char chunk[4096];
      const ssize_t n = read(from_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int to_ = -1;
  int from_ = -1;
  std::string buffer_;
};

template <typename Handle>
std::string Hex(const Handle& handle) {
  return ToHex(&handle, sizeof(handle));
}

template <typename Handle>
Handle HandleFromHex(const std::string& hex) {
  Handle handle;
  REQUIRE(FromHex(hex, &handle, sizeof(handle)));
  return handle;
}

std::vector<unsigned char> BytesFromHex(const std::string& hex) {
  std::vector<unsigned char> bytes(hex.size() / 2);
  REQUIRE(FromHex(hex, bytes.data(), bytes.size()));
  return bytes;
}

cudaIpcMemHandle_t MemHandle(void* device) {
  cudaIpcMemHandle_t handle;
  REQUIRE(cudaIpcGetMemHandle(&handle, device) == cudaSuccess);
  return handle;
}

cudaIpcEventHandle_t EventHandle(cudaEvent_t event) {
  cudaIpcEventHandle_t handle;
  REQUIRE(cudaIpcGetEventHandle(&handle, event) == cudaSuccess);
  return handle;
}

constexpr unsigned kIpcEventFlags = cudaEventInterprocess | cudaEventDisableTiming;

int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  int n = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // The directory's own.
}

TEST_CASE("IPC memory is the same bytes in both processes, refcounted per importer") {
  Reset();
  constexpr size_t kBytes = 4096;
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  auto* bytes = static_cast<unsigned char*>(device);
  std::memset(bytes, 0x11, kBytes);
  const cudaIpcMemHandle_t handle = MemHandle(device);
  const cudaIpcMemHandle_t again = MemHandle(device);
  CHECK(std::memcmp(&handle, &again, sizeof(handle)) == 0);
  cudaIpcMemHandle_t unused;
  CHECK(cudaIpcGetMemHandle(&unused, bytes + 1) == cudaErrorInvalidValue);  // Not a base.
  std::vector<unsigned char> host(16);
  CHECK(cudaIpcGetMemHandle(&unused, host.data()) == cudaErrorInvalidValue);
  void* mapped = nullptr;
  // A process cannot import its own memory (CUDA_ERROR_INVALID_CONTEXT).
  CHECK(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess) ==
        cudaErrorDeviceUninitialized);
  CHECK(Errors().device_uninitialized == cudaErrorDeviceUninitialized);

  PeerProcess peer;
  const std::vector<std::string> opened = peer.Ok("open_mem " + Hex(handle));
  REQUIRE(opened.size() == 2);
  const std::vector<unsigned char> read = BytesFromHex(peer.Ok("read 0 0 4096").at(0));
  CHECK(read == std::vector<unsigned char>(kBytes, 0x11));
  // The peer's host-to-device copy lands in this process's allocation ...
  peer.Ok("write 0 100 deadbeef");
  CHECK(bytes[100] == 0xde);
  CHECK(bytes[103] == 0xef);
  CHECK(bytes[104] == 0x11);
  // ... and what this process writes, the peer's next copy reads.
  bytes[4095] = 0x77;
  CHECK(peer.Ok("read 0 4094 2").at(0) == "1177");

  // Opened again: the same mapping, counted.
  const std::vector<std::string> reopened = peer.Ok("open_mem " + Hex(handle));
  CHECK(reopened.at(1) == opened.at(1));
  CHECK(peer.Ok("counters").at(0) == "1");
  peer.Ok("close_mem 0");
  CHECK(peer.Ok("read 1 100 1").at(0) == "de");  // Still mapped.
  peer.Ok("close_mem 1");
  CHECK(peer.Ok("counters").at(0) == "0");
  CHECK(peer.Code("close_mem 1") == cudaErrorInvalidValue);
  peer.Exit();
  REQUIRE(cudaFree(device) == cudaSuccess);
}

TEST_CASE("IPC handles of exited exporters, of freed allocations and garbage are refused") {
  Reset();
  void* mapped = nullptr;
  cudaIpcMemHandle_t garbage;
  std::memset(&garbage, 0xab, sizeof(garbage));
  CHECK(cudaIpcOpenMemHandle(&mapped, garbage, 0) == cudaErrorInvalidResourceHandle);
  std::memset(&garbage, 0, sizeof(garbage));
  CHECK(cudaIpcOpenMemHandle(&mapped, garbage, 0) == cudaErrorInvalidResourceHandle);
  cudaIpcEventHandle_t garbage_event;
  std::memset(&garbage_event, 0xcd, sizeof(garbage_event));
  cudaEvent_t imported = nullptr;
  CHECK(cudaIpcOpenEventHandle(&imported, garbage_event) == cudaErrorInvalidResourceHandle);

  PeerProcess peer;
  const std::string freed = peer.Ok("alloc 4096 5").at(1);
  peer.Ok("free 0");
  const std::string live = peer.Ok("alloc 4096 6").at(1);  // Likely the same fd number.
  CHECK(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(freed), 0) ==
        cudaErrorInvalidResourceHandle);
  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(live), 0) ==
          cudaSuccess);
  CHECK(static_cast<unsigned char*>(mapped)[4095] == 6);
  CHECK(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(live), 7) ==
        cudaErrorInvalidValue);  // Unknown flags.
  REQUIRE(cudaIpcCloseMemHandle(mapped) == cudaSuccess);
  CHECK(cudaIpcCloseMemHandle(mapped) == cudaErrorInvalidValue);
  const std::string event = peer.Ok("event").at(1);

  // Dead (a zombie, then reaped): its handles name nothing any more.
  peer.Kill();
  peer.AwaitExit();
  CHECK(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(live), 0) ==
        cudaErrorInvalidResourceHandle);
  peer.Reap();
  CHECK(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(live), 0) ==
        cudaErrorInvalidResourceHandle);
  CHECK(cudaIpcOpenEventHandle(&imported, HandleFromHex<cudaIpcEventHandle_t>(event)) ==
        cudaErrorInvalidResourceHandle);
  CHECK(GetCounters().ipc_mem_imports == 0);
}

TEST_CASE("interprocess events order work across processes, in both directions") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  constexpr size_t kBytes = 64;
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, kBytes) == cudaSuccess);
  std::memset(device, 0, kBytes);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, kBytes) == cudaSuccess);
  cudaEvent_t e = MakeEvent(kIpcEventFlags | cudaEventBlockingSync);
  const cudaIpcEventHandle_t handle = EventHandle(e);
  cudaEvent_t local = MakeEvent(cudaEventDisableTiming);
  cudaIpcEventHandle_t unused;
  CHECK(cudaIpcGetEventHandle(&unused, local) == cudaErrorInvalidResourceHandle);
  cudaEvent_t imported = nullptr;
  CHECK(cudaIpcOpenEventHandle(&imported, handle) == cudaErrorDeviceUninitialized);

  PeerProcess peer;
  peer.Ok("open_mem " + Hex(MemHandle(device)));
  peer.Ok("open_event " + Hex(handle));
  CHECK(peer.Ok("counters").at(1) == "1");
  // Never recorded: nothing to wait for, anywhere.
  CHECK(peer.Code("query 0") == cudaSuccess);

  // The peer's stream waits for this process's record, behind a stall.
  auto start = Clock::now();
  REQUIRE(Stall(s, milliseconds(300)) == 0);
  REQUIRE(LaunchHostWork(s, [device] { std::memset(device, 0x5a, kBytes); }) == 0);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  CHECK(peer.Code("query 0") == cudaErrorNotReady);
  peer.Ok("wait 0");
  CHECK(BytesFromHex(peer.Ok("read 0 0 64").at(0)) == std::vector<unsigned char>(kBytes, 0x5a));
  CHECK(MillisSince(start) >= 290);
  CHECK(peer.Code("query 0") == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaSuccess);

  // This process's stream waits for the peer's record of the same event.
  start = Clock::now();
  peer.Ok("stall 300");
  peer.Ok("fill 0 195");  // 0xc3
  peer.Ok("record 0");
  REQUIRE(cudaStreamWaitEvent(s, e, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(MillisSince(start) >= 290);
  CHECK(std::vector<unsigned char>(static_cast<unsigned char*>(pinned),
                                   static_cast<unsigned char*>(pinned) + kBytes) ==
        std::vector<unsigned char>(kBytes, 0xc3));
  CHECK(cudaEventQuery(e) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  CHECK(GetCounters().blocking_event_syncs == 1);

  // cudaEventSynchronize in the importer waits for the exporter's record.
  start = Clock::now();
  REQUIRE(Stall(s, milliseconds(200)) == 0);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  CHECK(peer.Code("event_sync 0") == cudaSuccess);
  CHECK(MillisSince(start) >= 190);

  // Destroying the import leaves the exporter's event alone.
  peer.Ok("destroy_event 0");
  CHECK(peer.Ok("counters").at(1) == "0");
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  peer.Exit();
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaEventDestroy(local) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaFree(device) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("interprocess events within one process keep the stream-order semantics") {
  Reset();
  cudaStream_t a = MakeStream(cudaStreamNonBlocking);
  cudaStream_t b = MakeStream(cudaStreamNonBlocking);
  cudaEvent_t e = MakeEvent(kIpcEventFlags);
  std::atomic<bool> first{false}, second{false};
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);  // Never recorded: no wait.
  REQUIRE(Stall(a, milliseconds(100)) == 0);
  REQUIRE(LaunchHostWork(a, [&] { first = true; }) == 0);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  REQUIRE(Stall(a, milliseconds(300)) == 0);
  REQUIRE(LaunchHostWork(a, [&] { second = true; }) == 0);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  auto saw_first = Observe(b, first);
  auto saw_second = Observe(b, second);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(*saw_first == 1);
  CHECK(*saw_second == 0);  // The wait captured the first record only.
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  CHECK(second);
  CHECK(GetCounters().spinning_event_syncs == 1);
  cudaEvent_t bad = nullptr;
  CHECK(cudaEventCreateWithFlags(&bad, cudaEventInterprocess | cudaEventBlockingSync) ==
        cudaErrorInvalidValue);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("a copy touching memory of an exporter that died fails, sticky, until cudaDeviceReset") {
  Reset();
  PeerProcess peer;
  const std::string handle = peer.Ok("alloc 4096 9").at(1);
  void* mapped = nullptr;
  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(handle),
                               cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  auto* imported = static_cast<unsigned char*>(mapped);
  cudaPointerAttributes attributes;
  REQUIRE(cudaPointerGetAttributes(&attributes, imported + 10) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);
  CHECK(attributes.devicePointer == imported + 10);
  void* entry = nullptr;
  REQUIRE(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000,
                                           cudaEnableDefault) == cudaSuccess);
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)>(entry)(
              &base, &size, reinterpret_cast<CUdeviceptr>(imported + 4095)) == CUDA_SUCCESS);
  CHECK(base == reinterpret_cast<CUdeviceptr>(imported));
  CHECK(size == 4096);

  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 4096) == cudaSuccess);
  auto* host = static_cast<unsigned char*>(pinned);
  REQUIRE(cudaMemcpyAsync(host, imported, 4096, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(host[4095] == 9);
  CHECK(GetCounters().ipc_mem_imports == 1);

  peer.Kill();  // A zombie counts as exited.
  peer.AwaitExit();
  std::memset(host, 0, 4096);
  REQUIRE(cudaMemcpyAsync(host, imported, 4096, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  CHECK(host[4095] == 0);  // Nothing moved.
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // Sticky.
  cudaEvent_t e = nullptr;
  CHECK(cudaEventCreateWithFlags(&e, 0) == cudaErrorIllegalAddress);
  peer.Reap();

  // cudaDeviceReset: everything of the device goes, the sticky error too.
  void* own = nullptr;
  REQUIRE(cudaIpcCloseMemHandle(imported) == cudaSuccess);  // Releasing still works.
  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(handle), 0) ==
          cudaErrorIllegalAddress);
  REQUIRE(cudaDeviceReset() == cudaSuccess);
  CHECK(CallCount(Api::kDeviceReset) == 1);
  Counters c = GetCounters();
  CHECK(c.live_streams == 0);
  CHECK(c.live_events == 0);
  CHECK(c.device_allocations == 0);
  CHECK(c.ipc_mem_imports == 0);
  cudaGetLastError();  // The thread's last error is not the device's state.
  CHECK(cudaGetLastError() == cudaSuccess);
  s = MakeStream(cudaStreamNonBlocking);
  REQUIRE(cudaMalloc(&own, 4096) == cudaSuccess);
  std::memset(own, 0x42, 4096);
  REQUIRE(cudaMemcpyAsync(host, own, 4096, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(host[4095] == 0x42);
  REQUIRE(cudaFree(own) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("a wait on an imported event ends with an error when its exporter dies") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  {
    PeerProcess peer;
    const std::string handle = peer.Ok("event").at(1);
    cudaEvent_t imported = nullptr;
    REQUIRE(cudaIpcOpenEventHandle(&imported, HandleFromHex<cudaIpcEventHandle_t>(handle)) ==
            cudaSuccess);
    CHECK(GetCounters().ipc_event_imports == 1);
    peer.Ok("stall 60000");
    peer.Ok("record 0");
    REQUIRE(cudaStreamWaitEvent(s, imported, 0) == cudaSuccess);
    std::atomic<bool> after{false};
    REQUIRE(LaunchHostWork(s, [&] { after = true; }) == 0);
    std::this_thread::sleep_for(milliseconds(100));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK_FALSE(after);
    peer.Kill();
    const auto start = Clock::now();
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
    CHECK(MillisSince(start) < 2000);
    CHECK(cudaEventQuery(imported) == cudaErrorIllegalAddress);
    REQUIRE(cudaDeviceReset() == cudaSuccess);
    CHECK(GetCounters().ipc_event_imports == 0);
  }
  {
    // The same through cudaEventSynchronize, with the exporter a zombie.
    PeerProcess peer;
    const std::string handle = peer.Ok("event").at(1);
    cudaEvent_t imported = nullptr;
    REQUIRE(cudaIpcOpenEventHandle(&imported, HandleFromHex<cudaIpcEventHandle_t>(handle)) ==
            cudaSuccess);
    peer.Ok("stall 60000");
    peer.Ok("record 0");
    CHECK(cudaEventQuery(imported) == cudaErrorNotReady);
    std::thread killer([&peer] {
      std::this_thread::sleep_for(milliseconds(100));
      peer.Kill();
    });
    const auto start = Clock::now();
    CHECK(cudaEventSynchronize(imported) == cudaErrorIllegalAddress);
    CHECK(MillisSince(start) < 2000);
    killer.join();
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    REQUIRE(cudaDeviceReset() == cudaSuccess);
  }
}

TEST_CASE("a record pending in a process that died counts as completed") {
  Reset();
  cudaStream_t s = MakeStream(cudaStreamNonBlocking);
  cudaEvent_t e = MakeEvent(kIpcEventFlags);
  PeerProcess peer;
  peer.Ok("open_event " + Hex(EventHandle(e)));
  peer.Ok("stall 60000");
  peer.Ok("record 0");
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);  // Pending in a live process.
  REQUIRE(cudaStreamWaitEvent(s, e, 0) == cudaSuccess);
  std::atomic<bool> after{false};
  REQUIRE(LaunchHostWork(s, [&] { after = true; }) == 0);
  std::this_thread::sleep_for(milliseconds(100));
  CHECK_FALSE(after);
  peer.Kill();
  peer.Reap();
  const auto start = Clock::now();
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);  // This process exported it: no error.
  CHECK(MillisSince(start) < 2000);
  CHECK(after);
  CHECK(cudaEventQuery(e) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cudaPointerGetAttributes and cuMemGetAddressRange tell device memory apart") {
  Config config;
  config.device_count = 2;
  Reset(config);
  void* device = DeviceAlloc(1000);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  void* on1 = nullptr;
  REQUIRE(cudaMalloc(&on1, 64) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64) == cudaSuccess);
  std::vector<unsigned char> registered(64), pageable(64);
  REQUIRE(cudaHostRegister(registered.data(), registered.size(), 0) == cudaSuccess);

  cudaPointerAttributes a;
  REQUIRE(cudaPointerGetAttributes(&a, static_cast<char*>(device) + 999) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(a.device == 0);
  CHECK(a.devicePointer == static_cast<char*>(device) + 999);
  REQUIRE(cudaPointerGetAttributes(&a, on1) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(a.device == 1);
  REQUIRE(cudaPointerGetAttributes(&a, pinned) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeHost);
  CHECK(a.hostPointer == pinned);
  REQUIRE(cudaPointerGetAttributes(&a, registered.data() + 63) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeHost);
  REQUIRE(cudaPointerGetAttributes(&a, pageable.data()) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);
  REQUIRE(cudaPointerGetAttributes(&a, static_cast<char*>(device) + 1000) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);  // One past the end.
  CHECK(cudaPointerGetAttributes(nullptr, pinned) == cudaErrorInvalidValue);

  void* entry = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  REQUIRE(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000,
                                           cudaEnableDefault, &status) == cudaSuccess);
  REQUIRE(entry != nullptr);
  CHECK(status == cudaDriverEntryPointSuccess);
  auto get_range = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)>(entry);
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(get_range(&base, &size, reinterpret_cast<CUdeviceptr>(device) + 500) == CUDA_SUCCESS);
  CHECK(base == reinterpret_cast<CUdeviceptr>(device));
  CHECK(size == 1000);
  CHECK(get_range(&base, &size, reinterpret_cast<CUdeviceptr>(pinned)) == CUDA_ERROR_NOT_FOUND);
  CHECK(get_range(&base, &size, reinterpret_cast<CUdeviceptr>(device) + 1000) ==
        CUDA_ERROR_NOT_FOUND);
  CHECK(CUDA_ERROR_NOT_FOUND == 500);
  REQUIRE(cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &entry, 12000, 0, &status) ==
          cudaSuccess);
  CHECK(entry == nullptr);
  CHECK(status == cudaDriverEntryPointSymbolNotFound);
  CHECK(CallCount(Api::kGetDriverEntryPoint) == 2);
  CHECK(std::string(ApiName(Api::kGetDriverEntryPoint)) == "cudaGetDriverEntryPointByVersion");
  CHECK(std::string(ApiName(Api::kIpcOpenMemHandle)) == "cudaIpcOpenMemHandle");

  FailCall(Api::kPointerGetAttributes, cudaErrorUnknown);
  CHECK(cudaPointerGetAttributes(&a, pinned) == cudaErrorUnknown);
  CHECK(cudaPointerGetAttributes(&a, pinned) == cudaSuccess);

  DeviceFree(device);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaFree(on1) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaHostUnregister(registered.data()) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("cudaDeviceReset resets the current device only; Reset closes every IPC resource") {
  Config config;
  config.device_count = 2;
  Reset(config);
  PeerProcess peer;
  const int baseline_fds = OpenFds();
  const std::string memory = peer.Ok("alloc 4096 1").at(1);
  const std::string event = peer.Ok("event").at(1);
  void* mapped = nullptr;
  cudaEvent_t imported = nullptr;
  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(memory), 0) ==
          cudaSuccess);
  REQUIRE(cudaIpcOpenEventHandle(&imported, HandleFromHex<cudaIpcEventHandle_t>(event)) ==
          cudaSuccess);
  cudaEvent_t exported = MakeEvent(kIpcEventFlags);
  void* own = DeviceAlloc(4096);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t on1 = MakeStream(cudaStreamNonBlocking);
  void* own1 = nullptr;
  REQUIRE(cudaMalloc(&own1, 64) == cudaSuccess);
  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(memory), 0) ==
          cudaSuccess);  // Known: counted, still device 0's.
  REQUIRE(cudaIpcCloseMemHandle(mapped) == cudaSuccess);
  CHECK(OpenFds() > baseline_fds);

  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaDeviceReset() == cudaSuccess);
  Counters c = GetCounters();
  CHECK(c.ipc_mem_imports == 0);
  CHECK(c.ipc_event_imports == 0);
  CHECK(c.device_allocations == 1);  // Device 1's.
  CHECK(c.live_streams == 1);
  CHECK(c.live_events == 0);
  (void)own;
  (void)exported;

  REQUIRE(cudaIpcOpenMemHandle(&mapped, HandleFromHex<cudaIpcMemHandle_t>(memory), 0) ==
          cudaSuccess);
  REQUIRE(cudaIpcOpenEventHandle(&imported, HandleFromHex<cudaIpcEventHandle_t>(event)) ==
          cudaSuccess);
  exported = MakeEvent(kIpcEventFlags);
  own = DeviceAlloc(4096);
  Reset();
  c = GetCounters();
  CHECK(c.ipc_mem_imports == 0);
  CHECK(c.ipc_event_imports == 0);
  CHECK(c.device_allocations == 0);
  CHECK(c.live_events == 0);
  CHECK(OpenFds() == baseline_fds);  // Memfds, pidfds: all closed.
  (void)on1;
  (void)own1;
  peer.Exit();
}

}  // namespace
}  // namespace zcc::fake_cudart
