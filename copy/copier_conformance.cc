#include "copy/copier_conformance.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/testing/status_matchers.h"

namespace zcc::testing {
namespace {

using Bytes = std::vector<unsigned char>;

// common/testing's REQUIRE_STATUS_CODE cannot be used: its macro parameter
// `code` also replaces the `.code()` call in its body.
template <typename T>
absl::StatusCode StatusCodeOf(const T& status_or) {
  return ::zcc::testing::ToStatus(status_or).code();
}

// Fills the gaps between destination regions; a copy that runs over its region
// shows up as a changed sentinel.
constexpr unsigned char kSentinel = 0xEE;
constexpr size_t kGap = 61;  // Odd, so destinations are misaligned too.
constexpr size_t kNpos = static_cast<size_t>(-1);

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = rng();
    std::memcpy(b.data() + i, &word, std::min<size_t>(8, n - i));
  }
  return b;
}

size_t FirstMismatch(const unsigned char* got, const unsigned char* want, size_t n) {
  if (n == 0 || std::memcmp(got, want, n) == 0) return kNpos;
  return static_cast<size_t>(std::mismatch(got, got + n, want).first - got);
}

// Staging memory standing in for a staging slot of the segment: the
// environment's (alloc_staging), or an anonymous shared mapping.
class StagingMapping {
 public:
  StagingMapping(const CopierConformanceEnv& env, size_t bytes) : env_(env) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = std::max<size_t>(page, (bytes + page - 1) / page * page);
    if (env_.alloc_staging) {
      base_ = static_cast<unsigned char*>(env_.alloc_staging(bytes_));
      REQUIRE(base_ != nullptr);
    } else {
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      REQUIRE(p != MAP_FAILED);
      base_ = static_cast<unsigned char*>(p);
    }
    std::memset(base_, kSentinel, bytes_);
  }
  ~StagingMapping() {
    if (env_.alloc_staging) {
      env_.free_staging(base_);
    } else {
      munmap(base_, bytes_);
    }
  }
  StagingMapping(const StagingMapping&) = delete;
  StagingMapping& operator=(const StagingMapping&) = delete;

  unsigned char* data() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  const CopierConformanceEnv& env_;
  unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
};

// Source memory of the environment (the trainer's tensor), freed on destruction.
class SourceBuffer {
 public:
  SourceBuffer(const CopierConformanceEnv& env, size_t n) : env_(env), n_(n) {
    if (n_ > 0) {
      ptr_ = env_.alloc_source(n_);
      REQUIRE(ptr_ != nullptr);
    }
  }
  ~SourceBuffer() {
    if (ptr_ != nullptr) env_.free_source(ptr_);
  }
  SourceBuffer(const SourceBuffer&) = delete;
  SourceBuffer& operator=(const SourceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t size() const { return n_; }
  void Write(const Bytes& bytes) {
    REQUIRE(bytes.size() == n_);
    if (n_ > 0) env_.write_source(ptr_, bytes.data(), n_, env_.stream);
  }
  Bytes Read() const {
    Bytes out(n_);
    if (n_ > 0) env_.read_source(out.data(), ptr_, n_, env_.stream);
    return out;
  }

 private:
  const CopierConformanceEnv& env_;
  const size_t n_;
  void* ptr_ = nullptr;
};

// Source buffers filled with random bytes, and where each lands in staging.
struct CopyPlan {
  std::vector<std::unique_ptr<SourceBuffer>> sources;
  std::vector<Bytes> contents;
  std::vector<size_t> offsets;  // Of each region in the staging mapping.
  std::vector<CopyRegion> regions;
  size_t staging_bytes = kGap;
};

CopyPlan PlanCopies(const CopierConformanceEnv& env, const std::vector<size_t>& sizes,
                    uint64_t seed) {
  CopyPlan plan;
  for (size_t i = 0; i < sizes.size(); ++i) {
    plan.sources.push_back(std::make_unique<SourceBuffer>(env, sizes[i]));
    plan.contents.push_back(RandomBytes(sizes[i], seed + i));
    plan.sources.back()->Write(plan.contents.back());
    plan.offsets.push_back(plan.staging_bytes);
    plan.staging_bytes += sizes[i] + kGap;
  }
  return plan;
}

void PointRegionsAt(CopyPlan& plan, const StagingMapping& staging) {
  plan.regions.clear();
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    plan.regions.push_back({plan.sources[i]->get(),
                            plan.sources[i]->size() ? staging.data() + plan.offsets[i] : nullptr,
                            plan.sources[i]->size()});
  }
}

// Checks that every region arrived exactly and nothing around them changed.
void CheckArrived(const CopyPlan& plan, const StagingMapping& staging) {
  size_t gap_begin = 0;  // Regions lie in increasing offsets, kGap apart.
  auto check_gap = [&](size_t gap_end) {
    const unsigned char* begin = staging.data() + gap_begin;
    const unsigned char* end = staging.data() + gap_end;
    const unsigned char* clobbered =
        std::find_if(begin, end, [](unsigned char b) { return b != kSentinel; });
    INFO("staging byte " << (clobbered - staging.data())
                         << " outside every region was overwritten");
    CHECK(clobbered == end);
  };
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    const size_t n = plan.contents[i].size();
    INFO("region " << i << " of " << n << " bytes at staging offset " << plan.offsets[i]);
    CHECK(FirstMismatch(staging.data() + plan.offsets[i], plan.contents[i].data(), n) == kNpos);
    check_gap(plan.offsets[i]);
    gap_begin = plan.offsets[i] + n;
  }
  check_gap(staging.size());
}

std::vector<size_t> SizesAroundChunk(size_t chunk, uint64_t seed) {
  std::vector<size_t> sizes = {0, 1, 3, chunk - 1, chunk, chunk + 1, 2 * chunk + 17, 0, 5};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 8; ++i) sizes.push_back(rng() % (3 * chunk + 1));
  return sizes;
}

}  // namespace

CopierConformanceEnv HostMemoryConformanceEnv(
    std::function<std::unique_ptr<DeviceCopier>()> make_copier, size_t chunk_bytes) {
  CopierConformanceEnv env;
  env.make_copier = std::move(make_copier);
  env.chunk_bytes = chunk_bytes;
  env.alloc_source = [](size_t n) { return std::malloc(n); };
  env.free_source = [](void* p) { std::free(p); };
  env.write_source = [](void* source, const void* host, size_t n, void*) {
    std::memcpy(source, host, n);
  };
  env.read_source = [](void* host, const void* source, size_t n, void*) {
    std::memcpy(host, source, n);
  };
  return env;
}

void RunCopierConformance(const CopierConformanceEnv& env) {
  REQUIRE(env.make_copier);
  REQUIRE(env.chunk_bytes > 0);
  REQUIRE(env.alloc_source);
  REQUIRE(env.free_source);
  REQUIRE(env.write_source);
  REQUIRE(env.read_source);
  REQUIRE(static_cast<bool>(env.alloc_staging) == static_cast<bool>(env.free_staging));
  std::unique_ptr<DeviceCopier> copier = env.make_copier();
  REQUIRE(copier != nullptr);
  INFO("backend " << copier->name());
  const size_t chunk = env.chunk_bytes;
  void* const stream = env.stream;

  SECTION("has a name for logs") { CHECK_FALSE(copier->name().empty()); }

  SECTION("bytes arrive exactly, for empty, odd and chunk-straddling sizes") {
    CopyPlan plan = PlanCopies(env, SizesAroundChunk(chunk, 1), 100);
    StagingMapping staging(env, plan.staging_bytes);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    PointRegionsAt(plan, staging);
    auto ticket = copier->Enqueue(plan.regions, stream);
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->Wait(*ticket));
    CheckArrived(plan, staging);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("tickets start at 1 and increase by one per Enqueue") {
    Bytes src = RandomBytes(100, 7);
    StagingMapping staging(env, 100);
    for (CopyTicket want = 1; want <= 5; ++want) {
      // Host memory as the source works with every backend.
      const CopyRegion region{src.data(), staging.data(), src.size()};
      auto ticket = copier->Enqueue({&region, 1}, stream);
      REQUIRE_OK(ticket);
      CHECK(*ticket == want);
      REQUIRE_OK(copier->Wait(*ticket));
    }
    // A rejected Enqueue issues no ticket.
    const CopyRegion bad{nullptr, staging.data(), 1};
    REQUIRE(StatusCodeOf(copier->Enqueue({&bad, 1}, stream)) == absl::StatusCode::kInvalidArgument);
    auto ticket = copier->Enqueue({}, stream);
    REQUIRE_OK(ticket);
    CHECK(*ticket == 6);
    REQUIRE_OK(copier->Wait(6));
  }

  SECTION("Wait on a ticket never issued is InvalidArgument") {
    REQUIRE(StatusCodeOf(copier->Wait(0)) == absl::StatusCode::kInvalidArgument);
    REQUIRE(StatusCodeOf(copier->Wait(1)) == absl::StatusCode::kInvalidArgument);
    auto ticket = copier->Enqueue({}, stream);
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->Wait(*ticket));
    REQUIRE(StatusCodeOf(copier->Wait(*ticket + 1)) == absl::StatusCode::kInvalidArgument);
    // Waiting again on a finished ticket is fine.
    REQUIRE_OK(copier->Wait(*ticket));
  }

  SECTION("Wait on the last of many tickets in flight implies the earlier copies are done") {
    constexpr int kTickets = 24;
    std::vector<size_t> sizes;
    for (int i = 0; i < kTickets; ++i) sizes.push_back(2 * chunk + 13 * i);
    CopyPlan plan = PlanCopies(env, sizes, 200);
    StagingMapping staging(env, plan.staging_bytes);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    PointRegionsAt(plan, staging);
    CopyTicket last = 0;
    for (int i = 0; i < kTickets; ++i) {
      auto ticket = copier->Enqueue({&plan.regions[i], 1}, stream);
      REQUIRE_OK(ticket);
      CHECK(*ticket == last + 1);
      last = *ticket;
    }
    REQUIRE_OK(copier->Wait(last));
    CheckArrived(plan, staging);
    for (CopyTicket t = 1; t <= last; ++t) CHECK_OK(copier->Wait(t));
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("a notifier thread waits while the trainer thread keeps enqueuing") {
    constexpr int kTickets = 16;
    std::vector<size_t> sizes(kTickets, chunk + 5);
    CopyPlan plan = PlanCopies(env, sizes, 300);
    StagingMapping staging(env, plan.staging_bytes);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    PointRegionsAt(plan, staging);

    zcc::Mutex mu;
    std::vector<CopyTicket> issued;     // Guarded by mu.
    std::vector<std::string> failures;  // Written only by the notifier.
    std::thread notifier([&] {
      for (int i = 0; i < kTickets; ++i) {
        CopyTicket ticket;
        {
          zcc::MutexLock lock(&mu);
          auto have = [&] { return issued.size() > static_cast<size_t>(i); };
          mu.Await(absl::Condition(&have));
          ticket = issued[i];
        }
        const absl::Status st = copier->Wait(ticket);
        if (!st.ok()) {
          failures.push_back(st.ToString());
        } else if (FirstMismatch(staging.data() + plan.offsets[i], plan.contents[i].data(),
                                 sizes[i]) != kNpos) {
          failures.push_back("ticket " + std::to_string(ticket) + " incomplete after Wait");
        }
      }
    });
    for (int i = 0; i < kTickets; ++i) {
      auto ticket = copier->Enqueue({&plan.regions[i], 1}, stream);
      zcc::MutexLock lock(&mu);
      issued.push_back(ticket.ok() ? *ticket : 0);
    }
    notifier.join();
    for (const std::string& f : failures) FAIL_CHECK(f);
    CheckArrived(plan, staging);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("copies see the trainer's work issued before Enqueue") {
    const size_t n = std::max<size_t>(4 * chunk + 3, size_t{1} << 20);
    SourceBuffer source(env, n);
    source.Write(RandomBytes(n, 400));
    StagingMapping staging(env, n);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    if (env.stall_stream) env.stall_stream(stream);
    const Bytes want = RandomBytes(n, 401);
    source.Write(want);  // Still queued behind the stall on a device backend.
    const CopyRegion region{source.get(), staging.data(), n};
    auto ticket = copier->Enqueue({&region, 1}, stream);
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->Wait(*ticket));
    CHECK(FirstMismatch(staging.data(), want.data(), n) == kNpos);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("FenceBeforeUpdate keeps later updates of the source out of the copy") {
    const size_t n = std::max<size_t>(4 * chunk + 3, size_t{4} << 20);
    SourceBuffer source(env, n);
    const Bytes before = RandomBytes(n, 500);
    const Bytes after = RandomBytes(n, 501);
    source.Write(before);
    StagingMapping staging(env, n);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    if (env.stall_stream) env.stall_stream(stream);
    const CopyRegion region{source.get(), staging.data(), n};
    auto ticket = copier->Enqueue({&region, 1}, stream);
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->FenceBeforeUpdate(stream));
    source.Write(after);  // The "optimizer step".
    REQUIRE_OK(copier->Wait(*ticket));
    CHECK(FirstMismatch(staging.data(), before.data(), n) == kNpos);
    const Bytes now = source.Read();
    CHECK(FirstMismatch(now.data(), after.data(), n) == kNpos);
    // A fence with nothing in flight is a no-op.
    REQUIRE_OK(copier->FenceBeforeUpdate(stream));
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("a fence before any Enqueue returns at once") {
    REQUIRE_OK(copier->FenceBeforeUpdate(stream));
  }

  SECTION("CopyToDevice round-trips staging bytes into source memory") {
    const std::vector<size_t> sizes = SizesAroundChunk(chunk, 2);
    CopyPlan plan = PlanCopies(env, sizes, 600);
    StagingMapping staging(env, plan.staging_bytes);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    // Snapshot the sources, then restore different bytes into them.
    PointRegionsAt(plan, staging);
    auto ticket = copier->Enqueue(plan.regions, stream);
    REQUIRE_OK(ticket);
    REQUIRE_OK(copier->Wait(*ticket));
    for (size_t i = 0; i < sizes.size(); ++i) plan.sources[i]->Write(Bytes(sizes[i], 0));
    std::vector<CopyRegion> restore;
    for (size_t i = 0; i < sizes.size(); ++i) {
      restore.push_back({sizes[i] ? staging.data() + plan.offsets[i] : nullptr,
                         plan.sources[i]->get(), sizes[i]});
    }
    REQUIRE_OK(copier->CopyToDevice(restore, stream));
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO("region " << i << " of " << sizes[i] << " bytes");
      const Bytes got = plan.sources[i]->Read();
      CHECK(FirstMismatch(got.data(), plan.contents[i].data(), sizes[i]) == kNpos);
    }
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("invalid arguments are rejected") {
    StagingMapping staging(env, 4096);
    SourceBuffer source(env, 64);
    const CopyRegion ok{source.get(), staging.data(), 64};
    const CopyRegion null_src{nullptr, staging.data(), 8};
    const CopyRegion null_dst{source.get(), nullptr, 8};
    const CopyRegion empty_null{nullptr, nullptr, 0};
    for (const CopyRegion& bad : {null_src, null_dst}) {
      // A bad region anywhere rejects the whole Enqueue before anything is copied.
      const CopyRegion regions[] = {ok, bad};
      REQUIRE(StatusCodeOf(copier->Enqueue(regions, stream)) == absl::StatusCode::kInvalidArgument);
      REQUIRE(StatusCodeOf(copier->CopyToDevice({&bad, 1}, stream)) ==
              absl::StatusCode::kInvalidArgument);
    }
    CHECK(staging.data()[0] == kSentinel);
    auto ticket = copier->Enqueue({&empty_null, 1}, stream);
    REQUIRE_OK(ticket);
    CHECK(*ticket == 1);
    REQUIRE_OK(copier->Wait(*ticket));
    REQUIRE_OK(copier->CopyToDevice({&empty_null, 1}, stream));

    REQUIRE(StatusCodeOf(copier->RegisterHostMemory(nullptr, 4096)) ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(StatusCodeOf(copier->RegisterHostMemory(staging.data(), 0)) ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(StatusCodeOf(copier->UnregisterHostMemory(nullptr)) ==
            absl::StatusCode::kInvalidArgument);
  }

  SECTION("host memory registrations pair up") {
    StagingMapping staging(env, 3 * 4096);
    REQUIRE(StatusCodeOf(copier->UnregisterHostMemory(staging.data())) ==
            absl::StatusCode::kNotFound);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    REQUIRE(StatusCodeOf(copier->RegisterHostMemory(staging.data(), staging.size())) ==
            absl::StatusCode::kAlreadyExists);
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
    REQUIRE(StatusCodeOf(copier->UnregisterHostMemory(staging.data())) ==
            absl::StatusCode::kNotFound);
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    REQUIRE_OK(copier->UnregisterHostMemory(staging.data()));
  }

  SECTION("destroying the copier finishes the copies still in flight") {
    std::vector<size_t> sizes(6, 3 * chunk + 1);
    CopyPlan plan = PlanCopies(env, sizes, 700);
    StagingMapping staging(env, plan.staging_bytes);
    // Left registered on purpose: the destructor releases what is left.
    REQUIRE_OK(copier->RegisterHostMemory(staging.data(), staging.size()));
    PointRegionsAt(plan, staging);
    for (const CopyRegion& region : plan.regions) REQUIRE_OK(copier->Enqueue({&region, 1}, stream));
    copier.reset();
    CheckArrived(plan, staging);
  }
}

}  // namespace zcc::testing
