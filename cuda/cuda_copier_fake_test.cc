// The real CUDA copier (the object nvcc compiled from cuda_copier.cu) over the
// fake CUDA runtime (cuda/fake_cudart): the DeviceCopier conformance suite,
// then the stream, event, fence and chunk logic and every error path, on
// machines without a GPU.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "common/testing/stderr_capture.h"
#include "copy/copier_conformance.h"
#include "cuda/cuda_copier.h"
#include "cuda/cuda_status.h"
#include "cuda/fake_cudart/fake_cudart.h"

namespace zcc {
namespace {

namespace fake = fake_cudart;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<unsigned char>;

constexpr size_t kChunk = 4096;  // Small, so that most regions span chunks.

template <typename T>
bool StatusCodeIs(const T& status_or, absl::StatusCode code) {
  return ::zcc::testing::ToStatus(status_or).code() == code;
}

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double ThreadCpuMillis() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

Bytes Pattern(size_t n, unsigned seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) % 251);
  return b;
}

fake::Config WithDelay(milliseconds delay) {
  fake::Config config;
  config.copy_delay = std::chrono::duration_cast<std::chrono::microseconds>(delay);
  return config;
}

// The copier must release every stream, event, pin and pinned block it made,
// and never unpin or free memory a queued copy still uses.
void CheckReleasedEverything() {
  const fake::Counters c = fake::GetCounters();
  CHECK(c.live_streams == 0);
  CHECK(c.live_events == 0);
  CHECK(c.host_registrations == 0);
  CHECK(c.pinned_allocations == 0);
  CHECK(c.freed_while_in_use == 0);
}

std::unique_ptr<DeviceCopier> MakeCopier(size_t chunk = kChunk, int device = 0) {
  CudaCopierOptions options;
  options.chunk_bytes = chunk;
  options.device = device;
  auto copier = NewCudaCopier(options);
  REQUIRE_OK(copier);
  return *std::move(copier);
}

// A trainer stream of the fake runtime for the length of a test.
class TestStream {
 public:
  TestStream() { REQUIRE(fake::NewStream(&stream_) == 0); }
  ~TestStream() { CHECK(fake::DestroyStream(stream_) == 0); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  void* get() const { return stream_; }

 private:
  void* stream_ = nullptr;
};

// "Device" memory of the fake runtime.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n), p_(static_cast<unsigned char*>(fake::DeviceAlloc(n))) {}
  ~DeviceBuffer() { fake::DeviceFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  unsigned char* p_;
};

// A shared anonymous mapping, as the staging segment is.
class Mapping {
 public:
  explicit Mapping(size_t n) : n_(n) {
    void* p = mmap(nullptr, n_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    p_ = static_cast<unsigned char*>(p);
  }
  ~Mapping() { munmap(p_, n_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  unsigned char* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  unsigned char* p_ = nullptr;
};

// Trainer work on `stream`: writes `bytes` into `dst` in stream order.
void WriteOnStream(void* stream, void* dst, Bytes bytes) {
  auto shared = std::make_shared<Bytes>(std::move(bytes));
  REQUIRE(fake::LaunchHostWork(
              stream, [dst, shared] { std::memcpy(dst, shared->data(), shared->size()); }) == 0);
}

// ---- The DeviceCopier contract. ----

testing::CopierConformanceEnv DeviceTensorEnv(void* stream, size_t chunk) {
  testing::CopierConformanceEnv env;
  env.make_copier = [chunk] { return MakeCopier(chunk); };
  env.chunk_bytes = chunk;
  env.stream = stream;
  env.alloc_source = [](size_t n) { return fake::DeviceAlloc(n); };
  env.free_source = [](void* p) { fake::DeviceFree(p); };
  env.write_source = [](void* source, const void* host, size_t n, void* s) {
    const auto* b = static_cast<const unsigned char*>(host);
    WriteOnStream(s, source, Bytes(b, b + n));
  };
  env.read_source = [](void* host, const void* source, size_t n, void* s) {
    REQUIRE(fake::SynchronizeStream(s) == 0);
    std::memcpy(host, source, n);
  };
  env.stall_stream = [](void* s) { REQUIRE(fake::Stall(s, milliseconds(100)) == 0); };
  return env;
}

// Tensors in pageable host memory; the trainer drains its stream before
// touching them from the host, since the fence is device-side.
testing::CopierConformanceEnv HostTensorEnv(void* stream, size_t chunk) {
  testing::CopierConformanceEnv env =
      testing::HostMemoryConformanceEnv([chunk] { return MakeCopier(chunk); }, chunk);
  env.stream = stream;
  env.write_source = [](void* source, const void* host, size_t n, void* s) {
    REQUIRE(fake::SynchronizeStream(s) == 0);
    std::memcpy(source, host, n);
  };
  env.read_source = [](void* host, const void* source, size_t n, void* s) {
    REQUIRE(fake::SynchronizeStream(s) == 0);
    std::memcpy(host, source, n);
  };
  return env;
}

TEST_CASE("fake runtime: CUDA copier meets the contract, device tensors, default stream") {
  fake::Reset();
  testing::RunCopierConformance(DeviceTensorEnv(nullptr, kChunk));
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CUDA copier meets the contract, device tensors, trainer stream") {
  // Slow copies widen every window in which a missing dependency would show.
  fake::Reset(WithDelay(milliseconds(0)));
  fake::SetCopyDelay(std::chrono::microseconds(200));
  {
    TestStream stream;
    testing::RunCopierConformance(DeviceTensorEnv(stream.get(), kChunk));
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CUDA copier meets the contract, 64 KiB chunks, trainer stream") {
  fake::Reset();
  {
    TestStream stream;
    testing::RunCopierConformance(DeviceTensorEnv(stream.get(), size_t{64} << 10));
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CUDA copier meets the contract, host tensors") {
  fake::Reset();
  {
    TestStream stream;
    testing::RunCopierConformance(HostTensorEnv(stream.get(), kChunk));
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CUDA copier meets the contract when pinning is refused") {
  fake::Reset();
  fake::FailCall(fake::Api::kHostRegister, fake::Errors().not_supported, 0, -1);
  {
    TestStream stream;
    testing::RunCopierConformance(DeviceTensorEnv(stream.get(), kChunk));
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CUDA copier meets the contract when nothing can be pinned") {
  fake::Reset();
  fake::FailCall(fake::Api::kHostRegister, fake::Errors().memory_allocation, 0, -1);
  fake::FailCall(fake::Api::kMallocHost, fake::Errors().memory_allocation, 0, -1);
  {
    TestStream stream;
    testing::RunCopierConformance(DeviceTensorEnv(stream.get(), kChunk));
  }
  CheckReleasedEverything();
}

// ---- Streams, events, chunks and the fence. ----

TEST_CASE("fake runtime: Enqueue returns at once; the copy thread issues the chunks in order") {
  fake::Reset(WithDelay(milliseconds(20)));
  TestStream trainer;
  auto copier = MakeCopier();
  const size_t n0 = 2 * kChunk + kChunk / 2;
  const size_t n1 = kChunk;
  DeviceBuffer src0(n0), src1(n1);
  const Bytes want0 = Pattern(n0, 1), want1 = Pattern(n1, 2);
  std::memcpy(src0.data(), want0.data(), n0);
  std::memcpy(src1.data(), want1.data(), n1);
  Mapping staging(4 * kChunk + 4096);
  std::memset(staging.data(), 0, staging.size());
  unsigned char* dst1 = staging.data() + 3 * kChunk + 100;
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));

  // Trainer work still running: the copies must start only after it.
  auto stall_end = std::make_shared<Clock::time_point>();
  REQUIRE(fake::Stall(trainer.get(), milliseconds(150)) == 0);
  REQUIRE(fake::LaunchHostWork(trainer.get(), [stall_end] { *stall_end = Clock::now(); }) == 0);
  fake::ClearCopies();
  const CopyRegion regions[] = {
      {src0.data(), staging.data(), n0}, {nullptr, nullptr, 0}, {src1.data(), dst1, n1}};
  const fake::ThreadCalls calls_before = fake::CallsOnThisThread();
  const auto start = Clock::now();
  auto ticket = copier->Enqueue(regions, trainer.get());
  REQUIRE_OK(ticket);
  CHECK(MillisSince(start) < 100);
  // The copy thread issues the chunks; the fence returns once they are
  // issued, long before the stall lets any of them run.
  REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
  CHECK(MillisSince(start) < 100);
  CHECK(fake::CallsOnThisThread().Since(calls_before).of(fake::Api::kMemcpyAsync) == 0);

  std::vector<fake::CopyRecord> copies = fake::Copies();
  REQUIRE(copies.size() == 4);
  const struct {
    const void* src;
    void* dst;
    size_t bytes;
  } want[] = {{src0.data(), staging.data(), kChunk},
              {src0.data() + kChunk, staging.data() + kChunk, kChunk},
              {src0.data() + 2 * kChunk, staging.data() + 2 * kChunk, kChunk / 2},
              {src1.data(), dst1, n1}};
  for (size_t i = 0; i < 4; ++i) {
    INFO("copy " << i);
    CHECK(copies[i].src == want[i].src);
    CHECK(copies[i].dst == want[i].dst);
    CHECK(copies[i].bytes == want[i].bytes);
    CHECK(copies[i].stream == copies[0].stream);  // One copy stream ...
    CHECK(copies[i].stream != trainer.get());     // ... not the trainer's.
    CHECK_FALSE(copies[i].host_synchronous);
    CHECK(copies[i].exec_index == -1);  // Nothing has moved yet.
  }
  CHECK(staging.data()[0] == 0);

  REQUIRE_OK(copier->Wait(*ticket));
  copies = fake::Copies();
  for (size_t i = 0; i < 4; ++i) {
    INFO("copy " << i);
    CHECK(copies[i].exec_index == static_cast<int64_t>(i));
    CHECK(copies[i].started >= *stall_end);
  }
  CHECK(std::memcmp(staging.data(), want0.data(), n0) == 0);
  CHECK(std::memcmp(dst1, want1.data(), n1) == 0);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  copier.reset();
  CHECK(fake::GetCounters().live_streams == 1);  // The trainer's.
}

TEST_CASE("fake runtime: Enqueue's runtime calls on the trainer thread do not grow with tensors") {
  fake::Reset();
  TestStream trainer;
  auto copier = MakeCopier();
  // Sizes from 1 byte to three chunks, so that many tensors span chunks.
  constexpr size_t kTensors = 2000;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (size_t i = 0; i < kTensors; ++i) {
    offsets.push_back(total);
    total += 1 + (i * 997) % (3 * kChunk);
  }
  offsets.push_back(total);
  DeviceBuffer source(total);
  const Bytes want = Pattern(total, 11);
  std::memcpy(source.data(), want.data(), total);
  Mapping staging(total);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), total));
  auto regions_for = [&](size_t count) {
    std::vector<CopyRegion> regions;
    for (size_t i = 0; i < count; ++i) {
      regions.push_back(
          {source.data() + offsets[i], staging.data() + offsets[i], offsets[i + 1] - offsets[i]});
    }
    return regions;
  };
  // One snapshot of the first `count` tensors; returns the calls the
  // trainer thread made inside Enqueue. The region list is gone before the
  // copies are waited for: the copier keeps its own.
  auto snapshot = [&](size_t count) {
    std::memset(staging.data(), 0, total);
    auto regions = std::make_unique<std::vector<CopyRegion>>(regions_for(count));
    const fake::ThreadCalls before = fake::CallsOnThisThread();
    auto ticket = copier->Enqueue(*regions, trainer.get());
    const fake::ThreadCalls calls = fake::CallsOnThisThread().Since(before);
    REQUIRE_OK(ticket);
    std::fill(regions->begin(), regions->end(), CopyRegion{});
    regions.reset();
    REQUIRE_OK(copier->Wait(*ticket));
    const size_t copied = offsets[count];
    CHECK(std::memcmp(staging.data(), want.data(), copied) == 0);
    CHECK(std::all_of(staging.data() + copied, staging.data() + total,
                      [](unsigned char b) { return b == 0; }));
    return calls;
  };
  snapshot(kTensors);  // Warm-up: the copier creates the events it reuses later.
  snapshot(1);
  // Steady state, on every thread: no event is created or destroyed per snapshot.
  const int64_t events_created = fake::CallCount(fake::Api::kEventCreateWithFlags);
  const fake::ThreadCalls one = snapshot(1);
  const fake::ThreadCalls many = snapshot(kTensors);
  CHECK(fake::CallCount(fake::Api::kEventCreateWithFlags) == events_created);
  CHECK(fake::CallCount(fake::Api::kEventDestroy) == 0);
  for (int api = 0; api < static_cast<int>(fake::Api::kCount); ++api) {
    INFO(fake::ApiName(static_cast<fake::Api>(api))
         << ": " << one.calls[api] << " calls for 1 tensor, " << many.calls[api] << " for "
         << kTensors);
    CHECK(one.calls[api] == many.calls[api]);
  }
  INFO("trainer-thread calls per Enqueue: " << one.Total() << " for 1 tensor, " << many.Total()
                                            << " for " << kTensors);
  CHECK(one.Total() == many.Total());
  CHECK(many.of(fake::Api::kMemcpyAsync) == 0);
  CHECK(many.of(fake::Api::kEventCreateWithFlags) == 0);
  CHECK(many.of(fake::Api::kEventRecord) == 1);
  CHECK(many.of(fake::Api::kStreamWaitEvent) == 0);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  copier.reset();
  CHECK(fake::GetCounters().live_events == 0);
}

TEST_CASE("fake runtime: events are pooled, not created per snapshot, and all released") {
  fake::Reset(WithDelay(milliseconds(1)));  // So that tickets overlap.
  {
    TestStream trainer;
    auto copier = MakeCopier();
    const size_t n = 2 * kChunk;
    DeviceBuffer source(n);
    Mapping staging(2 * n);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    // As the client runs: two staging slots, the ticket before the last one
    // waited for while the next is enqueued.
    std::vector<CopyTicket> tickets;
    for (int i = 0; i < 60; ++i) {
      const CopyRegion region{source.data(), staging.data() + (i % 2) * n, n};
      auto ticket = copier->Enqueue({&region, 1}, trainer.get());
      REQUIRE_OK(ticket);
      tickets.push_back(*ticket);
      REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
      if (tickets.size() >= 2) REQUIRE_OK(copier->Wait(tickets[tickets.size() - 2]));
    }
    REQUIRE_OK(copier->Wait(tickets.back()));
    // At most a few events are ever on loan at once (two per ticket in
    // flight and the fence's), so the pool stops growing at once.
    const fake::Counters c = fake::GetCounters();
    INFO(fake::CallCount(fake::Api::kEventCreateWithFlags) << " events created");
    CHECK(fake::CallCount(fake::Api::kEventCreateWithFlags) <= 8);
    CHECK(c.live_events == fake::CallCount(fake::Api::kEventCreateWithFlags));
    CHECK(fake::CallCount(fake::Api::kEventDestroy) == 0);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: FenceBeforeUpdate waits for the copies to be issued, not to land") {
  // Issuing each copy takes the copy thread 15 ms, running it 30 ms.
  fake::Config config = WithDelay(milliseconds(30));
  config.issue_delay = std::chrono::microseconds(15000);
  fake::Reset(config);
  const bool fenced = GENERATE(true, false);
  INFO((fenced ? "fenced" : "not fenced (control: the check must be able to fail)"));
  TestStream trainer;
  auto copier = MakeCopier();
  constexpr size_t kTensors = 6;
  const size_t n = kTensors * kChunk;
  DeviceBuffer source(n);
  const Bytes want = Pattern(n, 12);
  std::memcpy(source.data(), want.data(), n);
  Mapping staging(n);
  std::memset(staging.data(), 0, n);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
  std::vector<CopyRegion> regions;
  for (size_t i = 0; i < kTensors; ++i) {
    regions.push_back({source.data() + i * kChunk, staging.data() + i * kChunk, kChunk});
  }

  const fake::ThreadCalls calls_before = fake::CallsOnThisThread();
  const auto start = Clock::now();
  auto ticket = copier->Enqueue(regions, trainer.get());
  REQUIRE_OK(ticket);
  // The trainer does not pay for issuing the copies (6 x 15 ms).
  CHECK(MillisSince(start) < 60);
  if (fenced) {
    REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
    const double fence_ms = MillisSince(start);
    INFO("the fence returned after " << fence_ms << " ms");
    // It waited on the host until the copy thread had issued every copy ...
    const std::vector<fake::CopyRecord> copies = fake::Copies();
    CHECK(copies.size() == kTensors);
    CHECK(fence_ms >= 80);
    // ... but not for them to land: the last one cannot even have started
    // (the copies ahead of it take 150 ms on the copy stream).
    CHECK(copies.back().exec_index == -1);
    const fake::ThreadCalls calls = fake::CallsOnThisThread().Since(calls_before);
    CHECK(calls.of(fake::Api::kMemcpyAsync) == 0);
    CHECK(calls.of(fake::Api::kStreamWaitEvent) == 1);  // The fence's, on the trainer's stream.
    CHECK(calls.of(fake::Api::kEventSynchronize) == 0);
  }
  // The "optimizer step": trainer work issued after the fence. Fenced, it
  // runs only once every copy has finished, and sees all the bytes staged.
  auto step_start = std::make_shared<Clock::time_point>();
  auto staged = std::make_shared<std::atomic<bool>>(false);
  unsigned char* staging_data = staging.data();
  const Bytes* expected = &want;
  REQUIRE(fake::LaunchHostWork(trainer.get(), [=] {
            *step_start = Clock::now();
            *staged = std::memcmp(staging_data, expected->data(), n) == 0;
          }) == 0);
  REQUIRE(fake::SynchronizeStream(trainer.get()) == 0);
  REQUIRE_OK(copier->Wait(*ticket));
  const std::vector<fake::CopyRecord> copies = fake::Copies();
  REQUIRE(copies.size() == kTensors);
  if (fenced) {
    CHECK(*staged);
    for (const fake::CopyRecord& c : copies) CHECK(c.finished <= *step_start);
  } else {
    CHECK_FALSE(*staged);
    CHECK(copies.back().finished > *step_start);
  }
  CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
}

TEST_CASE("fake runtime: FenceBeforeUpdate orders the trainer's stream after the copies") {
  fake::Reset(WithDelay(milliseconds(40)));
  TestStream trainer_stream;
  void* const stream = GENERATE(as<bool>{}, true, false) ? nullptr : trainer_stream.get();
  INFO((stream == nullptr ? "legacy default stream" : "trainer stream"));
  const bool fenced = GENERATE(true, false);
  INFO((fenced ? "fenced" : "not fenced (control: the check must be able to fail)"));
  auto copier = MakeCopier();
  const size_t n = 4 * kChunk;
  DeviceBuffer source(n);
  const Bytes before = Pattern(n, 3), after = Pattern(n, 4);
  std::memcpy(source.data(), before.data(), n);
  Mapping staging(n);
  std::memset(staging.data(), 0, n);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));

  const CopyRegion region{source.data(), staging.data(), n};
  auto ticket = copier->Enqueue({&region, 1}, stream);
  REQUIRE_OK(ticket);
  const auto start = Clock::now();
  if (fenced) REQUIRE_OK(copier->FenceBeforeUpdate(stream));
  CHECK(MillisSince(start) < 100);  // The host does not wait for ~160 ms of copies.
  // The "optimizer step": first looks at the staging copy, then updates the tensor.
  auto complete = std::make_shared<std::atomic<bool>>(false);
  unsigned char* staged = staging.data();
  const Bytes* expected = &before;
  REQUIRE(fake::LaunchHostWork(stream, [complete, staged, expected] {
            *complete = std::memcmp(staged, expected->data(), n) == 0;
          }) == 0);
  WriteOnStream(stream, source.data(), after);
  REQUIRE(fake::SynchronizeStream(stream) == 0);
  REQUIRE_OK(copier->Wait(*ticket));
  if (fenced) {
    CHECK(*complete);
    CHECK(std::memcmp(staging.data(), before.data(), n) == 0);
  } else {
    // Without the fence the step ran while the copies were still queued.
    CHECK_FALSE(*complete);
  }
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
}

TEST_CASE("fake runtime: Wait sleeps on a blocking-sync event, it does not spin") {
  fake::Reset(WithDelay(milliseconds(100)));
  TestStream trainer;
  auto copier = MakeCopier();
  const size_t n = 3 * kChunk;
  DeviceBuffer source(n);
  Mapping staging(n);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
  const CopyRegion region{source.data(), staging.data(), n};
  auto ticket = copier->Enqueue({&region, 1}, trainer.get());
  REQUIRE_OK(ticket);
  const double cpu_before = ThreadCpuMillis();
  const auto start = Clock::now();
  REQUIRE_OK(copier->Wait(*ticket));
  const double waited = MillisSince(start);
  const double cpu = ThreadCpuMillis() - cpu_before;
  INFO("waited " << waited << " ms using " << cpu << " ms of CPU");
  CHECK(waited >= 250);
  CHECK(cpu < 50);
  const fake::Counters c = fake::GetCounters();
  CHECK(c.spinning_event_syncs == 0);
  CHECK(c.blocking_event_syncs >= 1);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
}

TEST_CASE("fake runtime: a copier on another device keeps the caller's current device") {
  fake::Config config;
  config.device_count = 2;
  fake::Reset(config);
  auto copier = MakeCopier(kChunk, /*device=*/1);
  CHECK(fake::CurrentDevice() == 0);
  DeviceBuffer source(kChunk);
  Mapping staging(kChunk);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), kChunk));
  const CopyRegion region{source.data(), staging.data(), kChunk};
  // nullptr: the legacy stream of the copier's device, not of the caller's.
  auto ticket = copier->Enqueue({&region, 1}, nullptr);
  REQUIRE_OK(ticket);
  REQUIRE_OK(copier->FenceBeforeUpdate(nullptr));
  REQUIRE_OK(copier->Wait(*ticket));
  CHECK(fake::CurrentDevice() == 0);
  const std::vector<fake::CopyRecord> copies = fake::Copies();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].device == 1);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  CHECK(fake::CurrentDevice() == 0);
  copier.reset();
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: UnregisterHostMemory unpins only after the copies into it") {
  fake::Reset(WithDelay(milliseconds(40)));
  TestStream trainer;
  auto copier = MakeCopier();
  const size_t n = 3 * kChunk;
  DeviceBuffer source(n);
  const Bytes want = Pattern(n, 9);
  std::memcpy(source.data(), want.data(), n);
  Mapping staging(n);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
  const CopyRegion region{source.data(), staging.data(), n};
  auto ticket = copier->Enqueue({&region, 1}, trainer.get());
  REQUIRE_OK(ticket);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));  // Copies still queued.
  CHECK(fake::GetCounters().freed_while_in_use == 0);
  CHECK(fake::GetCounters().host_registrations == 0);
  CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
  REQUIRE_OK(copier->Wait(*ticket));
}

TEST_CASE("fake runtime: destroying the copier waits for its copies and releases everything") {
  fake::Reset(WithDelay(milliseconds(30)));
  {
    TestStream trainer;
    auto copier = MakeCopier();
    const size_t n = 3 * kChunk;
    DeviceBuffer source(n);
    const Bytes want = Pattern(n, 5);
    std::memcpy(source.data(), want.data(), n);
    Mapping staging(n);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));  // Left registered.
    const CopyRegion region{source.data(), staging.data(), n};
    for (int i = 0; i < 3; ++i) REQUIRE_OK(copier->Enqueue({&region, 1}, trainer.get()));
    copier.reset();
    CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
  }
  CheckReleasedEverything();
}

// ---- Pinning refused. ----

TEST_CASE("fake runtime: a refused cudaHostRegister falls back to a bounce buffer, logged once") {
  fake::Reset(WithDelay(milliseconds(30)));
  const fake::ErrorCodes e = fake::Errors();
  fake::FailCall(fake::Api::kHostRegister, e.host_memory_already_registered, 0, -1);
  {
    TestStream trainer;
    auto copier = MakeCopier();
    const size_t n = 3 * kChunk + 10;
    DeviceBuffer source(n);
    const Bytes want = Pattern(n, 6);
    std::memcpy(source.data(), want.data(), n);
    Mapping staging(n), second(kChunk);
    testing::StderrCapture capture;
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
    REQUIRE_OK(copier->RegisterHostMemory(second.data(), kChunk));
    const std::string log = capture.Release();
    CHECK(testing::CountLinesWith(log, "cannot pin") == 1);
    CHECK(testing::CountLinesWith(log, "bounce buffer") == 1);
    CHECK(testing::CountLinesWith(log, "cudaErrorHostMemoryAlreadyRegistered") == 1);
    CHECK(fake::PeekLastError() == 0);  // The failed call's error was consumed.
    CHECK(fake::GetCounters().host_registrations == 0);
    CHECK(fake::GetCounters().pinned_allocations == 1);  // One bounce buffer.
    REQUIRE(StatusCodeIs(copier->RegisterHostMemory(staging.data(), n),
                         absl::StatusCode::kAlreadyExists));

    // Still asynchronous: the trainer stream holds the copies back for 150 ms.
    REQUIRE(fake::Stall(trainer.get(), milliseconds(150)) == 0);
    const CopyRegion region{source.data(), staging.data(), n};
    const auto start = Clock::now();
    auto ticket = copier->Enqueue({&region, 1}, trainer.get());
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
    CHECK(MillisSince(start) < 100);
    REQUIRE_OK(copier->Wait(*ticket));
    CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
    for (const fake::CopyRecord& c : fake::Copies()) {
      CHECK_FALSE(c.host_synchronous);
      CHECK((c.dst < staging.data() || c.dst >= staging.data() + n));  // Into the bounce buffer.
    }
    CHECK(fake::CallCount(fake::Api::kLaunchHostFunc) == 4);

    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
    REQUIRE(
        StatusCodeIs(copier->UnregisterHostMemory(staging.data()), absl::StatusCode::kNotFound));
    // Registering again falls back again, without another warning.
    testing::StderrCapture again;
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
    CHECK(testing::CountLinesWith(again.Release(), " W ") == 0);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
    REQUIRE_OK(copier->UnregisterHostMemory(second.data()));
    CHECK(fake::CallCount(fake::Api::kHostUnregister) == 0);
  }
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: with no pinned memory at all, copies are synchronous but correct") {
  fake::Reset();
  const fake::ErrorCodes e = fake::Errors();
  fake::FailCall(fake::Api::kHostRegister, e.memory_allocation, 0, -1);
  fake::FailCall(fake::Api::kMallocHost, e.memory_allocation, 0, -1);
  {
    TestStream trainer;
    auto copier = MakeCopier();
    const size_t n = 2 * kChunk;
    DeviceBuffer source(n);
    const Bytes want = Pattern(n, 7);
    std::memcpy(source.data(), want.data(), n);
    Mapping staging(n);
    testing::StderrCapture capture;
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
    const std::string log = capture.Release();
    CHECK(testing::CountLinesWith(log, "cannot pin") == 1);
    CHECK(testing::CountLinesWith(log, "synchronous") == 1);
    CHECK(fake::PeekLastError() == 0);
    const CopyRegion region{source.data(), staging.data(), n};
    auto ticket = copier->Enqueue({&region, 1}, trainer.get());
    REQUIRE_OK(ticket);
    // Synchronous: the copy thread issues them only as fast as the bytes
    // move, so they are done once the fence (which waits for the issue) returns.
    REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
    CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
    CHECK(fake::GetCounters().host_synchronous_copies == 2);
    REQUIRE_OK(copier->Wait(*ticket));
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }
  CheckReleasedEverything();
}

// ---- Errors. ----

TEST_CASE("fake runtime: without a usable device NewCudaCopier fails cleanly") {
  for (const fake::UnusableDevice& c : fake::UnusableDevices()) {
    INFO(c.what);
    fake::Reset(c.config);
    auto copier = NewCudaCopier(CudaCopierOptions());
    REQUIRE_FALSE(copier.ok());
    INFO(copier.status().ToString());
    CHECK(copier.status().code() == (c.transient ? absl::StatusCode::kUnavailable
                                                 : absl::StatusCode::kFailedPrecondition));
    CHECK(absl::StrContains(copier.status().message(), "no usable CUDA device"));
    CHECK(absl::StrContains(copier.status().message(), c.error_name));
    CHECK_FALSE(CudaDeviceAvailable());
    CHECK(fake::PeekLastError() == 0);
    CheckReleasedEverything();
  }
  fake::Reset();
  CudaCopierOptions options;
  options.device = 1;
  CHECK(NewCudaCopier(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.device = 0;
  options.chunk_bytes = 0;
  CHECK(NewCudaCopier(options).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CudaDeviceAvailable());
  CheckReleasedEverything();
}

TEST_CASE("fake runtime: CudaToStatus names the error in the status") {
  fake::Reset();
  const fake::ErrorCodes e = fake::Errors();
  const absl::Status st = CudaToStatus(e.memory_allocation, "cudaMalloc of 8 GiB");
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(st.message() == "cudaMalloc of 8 GiB: cudaErrorMemoryAllocation (2): out of memory");
  CHECK(CudaToStatus(e.host_memory_already_registered, "x").code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(CudaToStatus(e.no_device, "x").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(CudaToStatus(e.illegal_address, "x").code() == absl::StatusCode::kInternal);
}

// What the copier is doing when a fault hits, and the state it needs.
struct FaultScene {
  std::unique_ptr<DeviceCopier> copier;
  std::unique_ptr<DeviceBuffer> source;
  std::unique_ptr<Mapping> staging;
  CopyRegion snapshot;  // source -> staging
  CopyRegion restore;   // staging -> source
};

enum class Step { kCreate, kEnqueue, kFence, kWait, kCopyToDevice, kUnregister };

absl::Status RunStep(Step step, FaultScene& s, void* stream) {
  switch (step) {
    case Step::kCreate: {
      CudaCopierOptions options;
      options.chunk_bytes = kChunk;
      options.device = 1;  // Not the caller's current device: exercises cudaSetDevice.
      return NewCudaCopier(options).status();
    }
    case Step::kEnqueue:
      return s.copier->Enqueue({&s.snapshot, 1}, stream).status();
    case Step::kFence:
      return s.copier->FenceBeforeUpdate(stream);
    case Step::kWait: {
      auto ticket = s.copier->Enqueue({&s.snapshot, 1}, stream);
      if (!ticket.ok()) return absl::InternalError("setup: " + ticket.status().ToString());
      return s.copier->Wait(*ticket);
    }
    case Step::kCopyToDevice:
      return s.copier->CopyToDevice({&s.restore, 1}, stream);
    case Step::kUnregister:
      return s.copier->UnregisterHostMemory(s.staging->data());
  }
  return absl::InternalError("unreachable");
}

TEST_CASE("fake runtime: every failing CUDA call surfaces as a clear status") {
  const fake::ErrorCodes e = fake::Errors();
  const struct {
    fake::Api api;
    int error;
    int skip;
    Step step;
    const char* context;  // In the message, before the error's name.
  } cases[] = {
      {fake::Api::kGetDeviceCount, e.unknown, 0, Step::kCreate, "cudaGetDeviceCount"},
      {fake::Api::kGetDeviceProperties, e.unknown, 0, Step::kCreate, "cudaGetDeviceProperties(1)"},
      {fake::Api::kGetDevice, e.unknown, 0, Step::kCreate, "cudaGetDevice"},
      {fake::Api::kSetDevice, e.devices_unavailable, 0, Step::kCreate, "cudaSetDevice(1)"},
      {fake::Api::kDeviceGetStreamPriorityRange, e.unknown, 0, Step::kCreate,
       "cudaDeviceGetStreamPriorityRange"},
      {fake::Api::kStreamCreateWithPriority, e.memory_allocation, 0, Step::kCreate,
       "cudaStreamCreateWithPriority"},
      // On the trainer thread, inside Enqueue: the pool's first event, and
      // the record on the trainer's stream.
      {fake::Api::kEventCreateWithFlags, e.memory_allocation, 0, Step::kEnqueue,
       "cudaEventCreateWithFlags"},
      {fake::Api::kEventRecord, e.launch_failure, 0, Step::kEnqueue,
       "cudaEventRecord on the trainer's stream"},
      // On the copy thread, issuing the ticket: reported by Wait.
      {fake::Api::kEventCreateWithFlags, e.memory_allocation, 1, Step::kWait,
       "issuing copy ticket 1: cudaEventCreateWithFlags"},
      {fake::Api::kEventRecord, e.launch_failure, 1, Step::kWait,
       "issuing copy ticket 1: cudaEventRecord on the copy stream"},
      {fake::Api::kStreamWaitEvent, e.invalid_resource_handle, 0, Step::kWait,
       "issuing copy ticket 1: cudaStreamWaitEvent for the trainer's stream"},
      {fake::Api::kMemcpyAsync, e.invalid_value, 1, Step::kWait,
       "issuing copy ticket 1: cudaMemcpyAsync of region 0 (12288 bytes) at offset 4096"},
      {fake::Api::kEventSynchronize, e.illegal_address, 0, Step::kWait,
       "waiting for copy ticket 1"},
      {fake::Api::kStreamWaitEvent, e.invalid_resource_handle, 0, Step::kFence,
       "cudaStreamWaitEvent fencing the trainer's stream behind the copies"},
      {fake::Api::kMemcpyAsync, e.invalid_value, 0, Step::kCopyToDevice,
       "cudaMemcpyAsync of region 0"},
      {fake::Api::kEventSynchronize, e.launch_failure, 0, Step::kCopyToDevice,
       "waiting for the restore copies"},
      {fake::Api::kEventSynchronize, e.launch_failure, 0, Step::kUnregister,
       "waiting for copies before cudaHostUnregister"},
      {fake::Api::kHostUnregister, e.host_memory_not_registered, 0, Step::kUnregister,
       "releasing a CUDA stream, event or host registration"},
  };
  for (const auto& c : cases) {
    fake::Config config;
    config.device_count = 2;
    fake::Reset(config);
    const char* api_name = fake::ApiName(c.api);
    INFO(api_name << " failing (skip " << c.skip << ") during step " << static_cast<int>(c.step));
    {
      TestStream trainer;
      FaultScene scene;
      if (c.step != Step::kCreate) {
        scene.copier = MakeCopier();
        scene.source = std::make_unique<DeviceBuffer>(3 * kChunk);
        scene.staging = std::make_unique<Mapping>(3 * kChunk);
        REQUIRE_OK(scene.copier->RegisterHostMemory(scene.staging->data(), 3 * kChunk));
        scene.snapshot = {scene.source->data(), scene.staging->data(), 3 * kChunk};
        scene.restore = {scene.staging->data(), scene.source->data(), 3 * kChunk};
        if (c.step == Step::kFence || c.step == Step::kUnregister) {
          auto ticket = scene.copier->Enqueue({&scene.snapshot, 1}, trainer.get());
          REQUIRE_OK(ticket);
          // Issued (its copies may still run) before the fault is armed, so
          // that the copy thread does not meet the fault meant for the step.
          REQUIRE_OK(scene.copier->FenceBeforeUpdate(trainer.get()));
        }
      }
      fake::FailCall(c.api, c.error, c.skip, 1);
      const absl::Status st = RunStep(c.step, scene, trainer.get());
      INFO(st.ToString());
      REQUIRE_FALSE(st.ok());
      CHECK(st.code() == CudaToStatus(c.error, "").code());
      CHECK(absl::StrContains(st.message(), c.context));
      CHECK(absl::StrContains(st.message(), CudaToStatus(c.error, "").message()));
      CHECK(fake::PeekLastError() == 0);
      CHECK(fake::CallCount(c.api) >= c.skip + 1);
      if (scene.copier != nullptr) {
        // The fault was transient: the copier works on.
        if (c.step == Step::kUnregister && c.api == fake::Api::kEventSynchronize) {
          // Unregistering failed, so the mapping is still registered.
          REQUIRE_OK(scene.copier->UnregisterHostMemory(scene.staging->data()));
        } else if (c.step != Step::kUnregister) {
          auto ticket = scene.copier->Enqueue({&scene.snapshot, 1}, trainer.get());
          REQUIRE_OK(ticket);
          REQUIRE_OK(scene.copier->FenceBeforeUpdate(trainer.get()));
          REQUIRE_OK(scene.copier->Wait(*ticket));
          REQUIRE_OK(scene.copier->UnregisterHostMemory(scene.staging->data()));
        }
        scene.copier.reset();
      }
      CHECK(fake::GetCounters().freed_while_in_use == 0);
    }
    if (c.api == fake::Api::kHostUnregister) {
      // The driver refused to unpin; the copier forgot the mapping anyway.
      CHECK(fake::GetCounters().host_registrations == 1);
      continue;
    }
    CheckReleasedEverything();
  }
}

TEST_CASE("fake runtime: a copy failing on the device fails Wait with the sticky error") {
  fake::Reset();
  TestStream trainer;
  auto copier = MakeCopier();
  DeviceBuffer source(3 * kChunk);
  Mapping staging(3 * kChunk);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
  const CopyRegion region{source.data(), staging.data(), 3 * kChunk};
  fake::FailCopyExecution(fake::Errors().illegal_address, /*skip=*/1);
  // The error is asynchronous: Wait reports it, met either synchronising
  // on the ticket or already by the copy thread's later calls issuing it,
  // when the failing chunk ran before they were made (on a slow machine, or
  // under a sanitizer).
  auto ticket = copier->Enqueue({&region, 1}, trainer.get());
  REQUIRE_OK(ticket);
  const absl::Status st = copier->Wait(*ticket);
  INFO(st.ToString());
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(st.message(), "cudaErrorIllegalAddress"));
  CHECK(absl::StrContains(st.message(), "copy ticket 1: "));
  CHECK(copier->Wait(*ticket).code() == absl::StatusCode::kInternal);  // Every time.
  // The context is gone; the copier reports it on every call, never hangs.
  CHECK_FALSE(copier->Enqueue({&region, 1}, trainer.get()).ok());
  CHECK_FALSE(copier->UnregisterHostMemory(staging.data()).ok());
  copier.reset();  // Logs the errors of its releases; does not crash.
}

TEST_CASE("fake runtime: a ticket that failed to issue still fences the chunks it queued") {
  fake::Reset(WithDelay(milliseconds(40)));
  TestStream trainer;
  auto copier = MakeCopier();
  const size_t n = 4 * kChunk;
  DeviceBuffer source(n);
  const Bytes want = Pattern(n, 8);
  std::memcpy(source.data(), want.data(), n);
  Mapping staging(n);
  std::memset(staging.data(), 0, n);
  REQUIRE_OK(copier->RegisterHostMemory(staging.data(), n));
  fake::FailCall(fake::Api::kMemcpyAsync, fake::Errors().invalid_value, /*skip=*/2, 1);
  const CopyRegion region{source.data(), staging.data(), n};
  // Enqueue succeeds: the copy thread meets the failure later.
  auto failed = copier->Enqueue({&region, 1}, trainer.get());
  REQUIRE_OK(failed);
  CHECK(*failed == 1);
  REQUIRE_OK(copier->FenceBeforeUpdate(trainer.get()));
  // The two chunks queued before the failure have landed before the
  // trainer's next work runs.
  auto landed = std::make_shared<std::atomic<bool>>(false);
  unsigned char* staged = staging.data();
  const unsigned char* expected = want.data();
  REQUIRE(fake::LaunchHostWork(trainer.get(), [landed, staged, expected] {
            *landed = std::memcmp(staged, expected, 2 * kChunk) == 0;
          }) == 0);
  // Wait reports the failure, every time, and only once those chunks (80 ms
  // of copies) have landed.
  for (int i = 0; i < 2; ++i) {
    const absl::Status st = copier->Wait(*failed);
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(st.message(),
                            "issuing copy ticket 1: cudaMemcpyAsync of region 0 (16384 bytes) at "
                            "offset 8192"));
    CHECK(std::memcmp(staging.data(), want.data(), 2 * kChunk) == 0);
  }
  REQUIRE(fake::SynchronizeStream(trainer.get()) == 0);
  CHECK(*landed);
  // The next ticket works, and waiting for it does not clear the failure.
  auto ticket = copier->Enqueue({&region, 1}, trainer.get());
  REQUIRE_OK(ticket);
  CHECK(*ticket == 2);
  REQUIRE_OK(copier->Wait(*ticket));
  CHECK(copier->Wait(*failed).code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::memcmp(staging.data(), want.data(), n) == 0);
  REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
}

TEST_CASE("fake runtime: a failing release in the destructor is logged, not fatal") {
  fake::Reset();
  auto copier = MakeCopier();
  fake::FailCall(fake::Api::kStreamDestroy, fake::Errors().launch_failure, 0, 1);
  testing::StderrCapture capture;
  copier.reset();
  const std::string log = capture.Release();
  CHECK(testing::CountLinesWith(log, "releasing a CUDA stream, event or host registration") == 1);
  CHECK(testing::CountLinesWith(log, "cudaErrorLaunchFailure") == 1);
}

}  // namespace
}  // namespace zcc
