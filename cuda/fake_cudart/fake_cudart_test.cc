// The fake CUDA runtime's semantics, checked through the CUDA runtime API
// itself: the copier tests rely on these being those of the real runtime.
#include "cuda/fake_cudart/fake_cudart.h"

#include <cuda_runtime.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace zcc::fake_cudart
