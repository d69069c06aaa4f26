// The daemon-pull copier, zccd's half (see ipc_puller.h and
// shm/pull_channel.h). Host code only: no kernels.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/tsan.h"
#include "cuda/cuda_handle.h"
#include "cuda/ipc_puller.h"
#include "cuda/nvml_memory.h"
#include "shm/pull_channel.h"

namespace zcc {
namespace {

using cuda_internal::Check;
using cuda_internal::CudaEvent;
using cuda_internal::CudaStream;
using cuda_internal::NewEvent;

// How often an idle puller wakes to see whether it should stop.
constexpr absl::Duration kIdlePoll = absl::Milliseconds(100);

std::string HandleKey(const unsigned char* handle) {
  return std::string(reinterpret_cast<const char*>(handle), shm::kIpcHandleBytes);
}

// zccd's context on one device, shared by the pullers on it. Pulls run
// concurrently; a reset after a fault waits for them to leave, and those that
// come later see a new generation and re-open everything they had.
class DeviceContext {
 public:
  explicit DeviceContext(int device) : device_(device) {}

  int device() const { return device_; }

  // Enters a pull; returns the generation its handles must belong to.
  uint64_t Enter() {
    zcc::MutexLock lock(&mu_);
    auto not_resetting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !resetting_; };
    mu_.Await(absl::Condition(&not_resetting));
    ++active_;
    return generation_;
  }
  void Leave() {
    zcc::MutexLock lock(&mu_);
    --active_;
  }

  // Resets the device's context after a fault met in `generation`, unless
  // another puller already did.
  void Reset(uint64_t generation, const absl::Status& why) {
    zcc::MutexLock lock(&mu_);
    if (generation != generation_ || resetting_) return;
    resetting_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
    mu_.Await(absl::Condition(&idle));
    ZCC_LOG(WARNING) << "daemon-pull: resetting zccd's CUDA context on device " << device_
                     << " after " << why;
    (void)cudaSetDevice(device_);
    const cudaError_t reset = cudaDeviceReset();
    (void)cudaGetLastError();
    if (reset != cudaSuccess) {
      ZCC_LOG(ERROR) << "daemon-pull: " << CudaToStatus(reset, "cudaDeviceReset");
    }
    ++generation_;
    ++resets_;
    owners_.clear();  // every import is gone; the pullers re-open theirs
    resetting_ = false;
  }

  // Claims the allocation behind `handle` for `owner`: PermissionDenied when
  // another owner holds it.
  absl::Status Claim(const std::string& key, const std::string& owner) {
    zcc::MutexLock lock(&mu_);
    auto [it, inserted] = owners_.emplace(key, owner);
    if (!inserted && it->second != owner) {
      return absl::PermissionDeniedError(
          absl::StrCat("the allocation behind this IPC handle is already mapped for ", it->second,
                       "; zccd refuses a handle of another job's or user's memory"));
    }
    return absl::OkStatus();
  }
  void Release(const std::string& key, const std::string& owner) {
    zcc::MutexLock lock(&mu_);
    auto it = owners_.find(key);
    if (it != owners_.end() && it->second == owner) owners_.erase(it);
  }

  void AddPuller(int delta) {
    zcc::MutexLock lock(&mu_);
    pullers_ += delta;
  }

  PullDeviceStatus Status() const {
    zcc::MutexLock lock(&mu_);
    PullDeviceStatus s;
    s.device = device_;
    s.rank_pullers = static_cast<uint32_t>(pullers_);
    s.resets = resets_;
    return s;
  }

 private:
  const int device_;
  mutable zcc::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int pullers_ ABSL_GUARDED_BY(mu_) = 0;
  bool resetting_ ABSL_GUARDED_BY(mu_) = false;
  // Owner ("job x rank r uid u") of each imported allocation, by handle bytes.
  std::map<std::string, std::string> owners_ ABSL_GUARDED_BY(mu_);
};

// What one puller opened in one generation of its device's context. After a
// reset the runtime has already destroyed all of it: it is dropped unreleased.
struct Imports {
  uint64_t generation = 0;
  bool ready = false;  // stream, events and pinning are set up
  CudaStream stream;
  CudaEvent done;
  cudaEvent_t ready_events[shm::kPullRequests] = {};
  cudaEvent_t copied = nullptr;
  std::vector<void*> sources;  // opened bases; nullptr: not opened yet
  std::vector<uint64_t> source_bytes;  // checked against what each maps
  std::vector<std::string> claimed;  // handle keys claimed in the context
  void* pinned = nullptr;            // cudaHostRegister'ed staging, if it worked
  cuda_internal::GetAddressRangeFn get_range = nullptr;

  // Releases what was opened, when its generation is still the live one.
  void Release(bool live, DeviceContext* ctx, const std::string& owner) {
    for (const std::string& key : claimed) ctx->Release(key, owner);
    claimed.clear();
    if (!live) {
      // Destroyed by the reset: forget the handles without touching them.
      (void)stream.Abandon();
      (void)done.Abandon();
      std::fill(std::begin(ready_events), std::end(ready_events), nullptr);
      copied = nullptr;
      sources.clear();
      pinned = nullptr;
      return;
    }
    // Everything is released whatever fails; the first failure is logged
    // (a handle left open keeps the trainer's memory mapped in zccd).
    absl::Status first;
    auto note = [&first](cudaError_t err, const char* what) {
      if (err != cudaSuccess && first.ok()) first = CudaToStatus(static_cast<int>(err), what);
    };
    for (void* base : sources) {
      if (base != nullptr) note(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
    }
    sources.clear();
    for (cudaEvent_t& e : ready_events) {
      if (e != nullptr) note(cudaEventDestroy(std::exchange(e, nullptr)), "cudaEventDestroy");
    }
    if (copied != nullptr) note(cudaEventDestroy(std::exchange(copied, nullptr)), "cudaEventDestroy");
    if (pinned != nullptr) {
      note(cudaHostUnregister(std::exchange(pinned, nullptr)), "cudaHostUnregister");
    }
    (void)cudaGetLastError();
    if (!first.ok()) {
      ZCC_LOG(WARNING) << "daemon-pull for " << owner << ": releasing its CUDA resources: "
                       << first.message() << " (the others were released)";
    }
  }
};

class RankPullerImpl final : public RankPuller {
 public:
  RankPullerImpl(PullAttachment a, std::shared_ptr<DeviceContext> ctx)
      : a_(std::move(a)), ctx_(std::move(ctx)) {
    ctx_->AddPuller(1);
    thread_ = std::thread([this] { Run(); });
  }

  ~RankPullerImpl() override { Stop(); }

  void Stop() override {
    stop_.store(true, std::memory_order_release);
    FutexWakeAll(&a_.mapping.channel->doorbell);
    if (thread_.joinable()) {
      thread_.join();
      ctx_->AddPuller(-1);
    }
  }

  PullerStats Stats() const override {
    PullerStats s;
    s.pulls = pulls_.load(std::memory_order_relaxed);
    s.failed = failed_.load(std::memory_order_relaxed);
    s.bytes = bytes_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void Run() {
    (void)cudaSetDevice(a_.device);
    shm::PullChannel* ch = a_.mapping.channel;
    uint64_t served = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      const uint32_t bell = ch->doorbell.load(std::memory_order_acquire);
      const uint64_t requested = ch->requested.load(std::memory_order_acquire);
      if (requested <= served) {
        ch->puller_waiting.store(1, std::memory_order_release);
        if (ch->requested.load(std::memory_order_acquire) <= served) {
          FutexWait(&ch->doorbell, bell, kIdlePoll);
        }
        ch->puller_waiting.store(0, std::memory_order_release);
        continue;
      }
      if (requested - served > shm::kPullRequests) {
        // More requests than the channel has records: the trainer's counter
        // is not one the client keeps. Served one by one, each would fail
        // at once and be logged, for as long as the session lives: its
        // requests up to the counter are taken as failed, said once.
        const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
            "the trainer's pull request counter (", requested, ") ran ", requested - served,
            " ahead of the requests served; the channel holds ", shm::kPullRequests));
        failed_.fetch_add(1, std::memory_order_relaxed);
        ch->failed.fetch_add(1, std::memory_order_relaxed);
        if (a_.on_failure) a_.on_failure(requested, bad);
        served = requested;
        continue;
      }
      const uint64_t ticket = served + 1;
      Serve(ticket);
      served = ticket;
    }
    // Inside the context's gate: a reset cannot destroy the handles while
    // they are being closed.
    const uint64_t generation = ctx_->Enter();
    imports_.Release(imports_.generation == generation, ctx_.get(), Owner());
    imports_ = Imports();  // the stream and event too, on this thread
    ctx_->Leave();
  }

  std::string Owner() const { return absl::StrCat(a_.owner, " (uid ", a_.uid, ")"); }

  // Pulls `ticket` and reports its outcome in the channel.
  void Serve(uint64_t ticket) {
    shm::PullChannel* ch = a_.mapping.channel;
    shm::PullRequest& req = ch->requests[ticket % shm::kPullRequests];
    uint64_t copied_bytes = 0;
    absl::Status st = Pull(ticket, req, &copied_bytes);
    if (st.ok()) {
      pulls_.fetch_add(1, std::memory_order_relaxed);
      bytes_.fetch_add(copied_bytes, std::memory_order_relaxed);
      req.status_code = 0;
    } else {
      failed_.fetch_add(1, std::memory_order_relaxed);
      ch->failed.fetch_add(1, std::memory_order_relaxed);
      req.status_code = static_cast<int32_t>(st.code());
      const std::string msg(st.message());
      std::memset(req.error, 0, sizeof(req.error));
      std::memcpy(req.error, msg.data(), std::min(msg.size(), sizeof(req.error) - 1));
      if (a_.on_failure) a_.on_failure(ticket, st);
    }
    Publish(&shm::PullChannel::issued, ticket);
    // The slot reaches zccd's ingest through the trainer (common/tsan.h).
    TsanRelease(a_.mapping.segment_base);
    Publish(&shm::PullChannel::completed, ticket);
  }

  void Publish(std::atomic<uint64_t> shm::PullChannel::*counter, uint64_t ticket) {
    shm::PullChannel* ch = a_.mapping.channel;
    if ((ch->*counter).load(std::memory_order_acquire) >= ticket) return;
    (ch->*counter).store(ticket, std::memory_order_release);
    ch->bell.fetch_add(1, std::memory_order_acq_rel);
    FutexWakeAll(&ch->bell);
  }

  absl::Status Pull(uint64_t ticket, shm::PullRequest& req, uint64_t* copied_bytes) {
    shm::PullChannel* ch = a_.mapping.channel;
    // Copy the request out of shared memory before checking it: the trainer
    // could change it under us.
    const uint64_t req_ticket = req.ticket;
    const uint32_t n = req.num_regions;
    if (req_ticket != ticket) {
      return absl::InvalidArgumentError(
          absl::StrCat("request record holds ticket ", req_ticket, ", expected ", ticket));
    }
    if (n > a_.mapping.geometry.regions_per_request) {
      return absl::InvalidArgumentError(absl::StrCat("request of ", n,
                                                     " regions; the channel takes ",
                                                     a_.mapping.geometry.regions_per_request));
    }
    std::vector<shm::PullRegion> regions(n);
    if (n > 0) {
      std::memcpy(regions.data(),
                  shm::PullRegions(ch, a_.mapping.geometry, ticket % shm::kPullRequests),
                  n * sizeof(shm::PullRegion));
    }
    if (ch->attached.load(std::memory_order_acquire) != 1) {
      return absl::FailedPreconditionError("the trainer has not attached to the channel");
    }
    const uint64_t sources = std::min<uint64_t>(ch->num_sources.load(std::memory_order_acquire),
                                                a_.mapping.geometry.max_sources);
    for (size_t i = 0; i < regions.size(); ++i) {
      const shm::PullRegion& r = regions[i];
      if (r.source >= sources) {
        return absl::InvalidArgumentError(
            absl::StrCat("region ", i, " names source ", r.source, " of ", sources));
      }
      if (r.staging_offset < a_.mapping.staging_begin ||
          r.staging_offset > a_.mapping.staging_end ||
          r.bytes > a_.mapping.staging_end - r.staging_offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("region ", i, " writes outside the staging slots"));
      }
    }

    // The slot came back from zccd's ingest or writer through the trainer,
    // which claimed it again (common/tsan.h).
    TsanAcquire(a_.mapping.segment_base);
    const uint64_t generation = ctx_->Enter();
    absl::Status st = PullInContext(generation, ticket, regions, copied_bytes);
    ctx_->Leave();
    if (!st.ok() && st.code() == absl::StatusCode::kInternal) {
      // A fault (the trainer's memory vanished under the copy): zccd's context
      // is unusable until it is reset.
      ctx_->Reset(generation, st);
    }
    return st;
  }

  absl::Status PullInContext(uint64_t generation, uint64_t ticket,
                             const std::vector<shm::PullRegion>& regions, uint64_t* copied_bytes) {
    if (imports_.generation != generation || !imports_.ready) {
      imports_.Release(imports_.generation == generation, ctx_.get(), Owner());
      imports_ = Imports();
      imports_.generation = generation;
      ZCC_RETURN_IF_ERROR(SetUp());
    }
    shm::PullChannel* ch = a_.mapping.channel;
    for (const shm::PullRegion& r : regions) {
      ZCC_RETURN_IF_ERROR(OpenSource(r.source));
      if (r.source_offset > imports_.source_bytes[r.source] ||
          r.bytes > imports_.source_bytes[r.source] - r.source_offset) {
        return absl::InvalidArgumentError(absl::StrCat("a region reads past the end of source ",
                                                       r.source, " (",
                                                       imports_.source_bytes[r.source], " bytes)"));
      }
    }
    const cudaStream_t s = imports_.stream.get();
    ZCC_RETURN_IF_ERROR(
        Check(cudaStreamWaitEvent(s, imports_.ready_events[ticket % shm::kPullRequests], 0),
              "cudaStreamWaitEvent on the trainer's ready event"));
    uint64_t total = 0;
    for (const shm::PullRegion& r : regions) {
      const uint8_t* src =
          static_cast<const uint8_t*>(imports_.sources[r.source]) + r.source_offset;
      uint8_t* dst = a_.mapping.segment_base + r.staging_offset;
      for (uint64_t done = 0; done < r.bytes;) {
        const uint64_t chunk = std::min<uint64_t>(a_.chunk_bytes, r.bytes - done);
        ZCC_RETURN_IF_ERROR(
            Check(cudaMemcpyAsync(dst + done, src + done, chunk, cudaMemcpyDeviceToHost, s),
                  absl::StrCat("cudaMemcpyAsync of ", chunk, " bytes from the trainer's memory")));
        done += chunk;
      }
      total += r.bytes;
    }
    ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(imports_.copied, s),
                              "cudaEventRecord of the trainer's copied event"));
    Publish(&shm::PullChannel::issued, ticket);
    ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(imports_.done.get(), s), "cudaEventRecord"));
    ZCC_RETURN_IF_ERROR(Check(cudaEventSynchronize(imports_.done.get()),
                              "waiting for the copies out of the trainer's memory"));
    *copied_bytes = total;
    return absl::OkStatus();
  }

  // The stream, events and pinned staging of this generation.
  absl::Status SetUp() {
    int least = 0;
    int greatest = 0;
    ZCC_RETURN_IF_ERROR(Check(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                              "cudaDeviceGetStreamPriorityRange"));
    cudaStream_t stream = nullptr;
    ZCC_RETURN_IF_ERROR(Check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least),
                              "cudaStreamCreateWithPriority"));
    imports_.stream = CudaStream(stream);
    ZCC_ASSIGN_OR_RETURN(imports_.get_range, cuda_internal::LoadGetAddressRange());
    ZCC_ASSIGN_OR_RETURN(imports_.done, NewEvent(cudaEventDisableTiming | cudaEventBlockingSync));
    shm::PullChannel* ch = a_.mapping.channel;
    for (uint32_t i = 0; i < shm::kPullRequests; ++i) {
      cudaIpcEventHandle_t h;
      std::memcpy(&h, ch->ready_events[i], sizeof(h));
      ZCC_RETURN_IF_ERROR(Check(cudaIpcOpenEventHandle(&imports_.ready_events[i], h),
                                "cudaIpcOpenEventHandle of a ready event"));
    }
    cudaIpcEventHandle_t h;
    std::memcpy(&h, ch->copied_event, sizeof(h));
    ZCC_RETURN_IF_ERROR(Check(cudaIpcOpenEventHandle(&imports_.copied, h),
                              "cudaIpcOpenEventHandle of the copied event"));
    // Pinned staging lets the copies run at the link's speed; without it
    // they still work, slower (the runtime stages them).
    void* staging = a_.mapping.segment_base + a_.mapping.staging_begin;
    const cudaError_t pinned = cudaHostRegister(
        staging, a_.mapping.staging_end - a_.mapping.staging_begin, cudaHostRegisterDefault);
    if (pinned == cudaSuccess) {
      imports_.pinned = staging;
    } else {
      (void)cudaGetLastError();
      ZCC_LOG(WARNING) << "daemon-pull for " << a_.owner << ": "
                       << CudaToStatus(pinned, "cudaHostRegister of the staging slots")
                       << "; copying into pageable memory";
    }
    imports_.sources.assign(a_.mapping.geometry.max_sources, nullptr);
    imports_.source_bytes.assign(a_.mapping.geometry.max_sources, 0);
    imports_.ready = true;
    return absl::OkStatus();
  }

  absl::Status OpenSource(uint32_t index) {
    if (imports_.sources[index] != nullptr) return absl::OkStatus();
    // Copied out of shared memory before it is checked and used.
    shm::PullSource source;
    std::memcpy(&source, &shm::PullSources(a_.mapping.channel, a_.mapping.geometry)[index],
                sizeof(source));
    const std::string key = HandleKey(source.handle);
    ZCC_RETURN_IF_ERROR(ctx_->Claim(key, Owner()));
    cudaIpcMemHandle_t h;
    std::memcpy(&h, source.handle, sizeof(h));
    void* base = nullptr;
    const absl::Status opened =
        Check(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
              absl::StrCat("cudaIpcOpenMemHandle of source ", index));
    if (!opened.ok()) {
      ctx_->Release(key, Owner());
      // A handle zccd cannot open fails this pull; it is not a fault.
      return absl::FailedPreconditionError(opened.message());
    }
    // The size the trainer wrote bounds every copy out of this source: it
    // must be no more than the allocation the handle maps (a copy past it
    // faults zccd's context, every job's pulls on this device with it).
    CUdeviceptr range_base = 0;
    size_t mapped = 0;
    const CUresult range =
        imports_.get_range(&range_base, &mapped, reinterpret_cast<CUdeviceptr>(base));
    // (What it maps from `base` on.)
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(base);
    const uint64_t after = range == CUDA_SUCCESS && range_base <= at && at - range_base <= mapped
                               ? mapped - (at - range_base)
                               : 0;
    if (range != CUDA_SUCCESS || source.bytes > after) {
      (void)Check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
      ctx_->Release(key, Owner());
      return absl::FailedPreconditionError(
          range != CUDA_SUCCESS
              ? absl::StrCat("source ", index, ": cuMemGetAddressRange of its mapping failed ",
                             "(CUresult ", static_cast<int>(range), ")")
              : absl::StrCat("source ", index, " claims ", source.bytes,
                             " bytes; the allocation its handle maps holds ", after));
    }
    imports_.claimed.push_back(key);
    imports_.sources[index] = base;
    imports_.source_bytes[index] = source.bytes;
    return absl::OkStatus();
  }

  const PullAttachment a_;
  const std::shared_ptr<DeviceContext> ctx_;
  Imports imports_;  // used by the puller's thread only
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> pulls_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> bytes_{0};
  std::thread thread_;
};

// "dddddddd:bb:dd.0", NVML's name for the device; empty when unknown.
std::string PciBusId(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  char id[32];
  std::snprintf(id, sizeof(id), "%08x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID,
                prop.pciDeviceID);
  return id;
}

class CudaPullEngine final : public PullEngine {
 public:
  explicit CudaPullEngine(int device_count) : device_count_(device_count) {}

  absl::StatusOr<std::unique_ptr<RankPuller>> Attach(PullAttachment a) override {
    if (a.mapping.segment_base == nullptr || a.mapping.channel == nullptr ||
        a.mapping.staging_end <= a.mapping.staging_begin || a.chunk_bytes == 0 ||
        a.mapping.geometry.max_sources == 0 || a.mapping.geometry.regions_per_request == 0) {
      return absl::InvalidArgumentError("incomplete daemon-pull attachment");
    }
    if (a.device < 0 || a.device >= device_count_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the trainer's tensors are on CUDA device ", a.device, "; zccd sees ", device_count_,
          " device(s) (is CUDA_VISIBLE_DEVICES set differently for zccd and the trainer?)"));
    }
    std::shared_ptr<DeviceContext> ctx;
    {
      zcc::MutexLock lock(&mu_);
      auto& slot = devices_[a.device];
      if (slot == nullptr) slot = std::make_shared<DeviceContext>(a.device);
      ctx = slot;
    }
    return std::unique_ptr<RankPuller>(new RankPullerImpl(std::move(a), std::move(ctx)));
  }

  std::vector<PullDeviceStatus> Devices() const override {
    std::vector<std::shared_ptr<DeviceContext>> devices;
    {
      zcc::MutexLock lock(&mu_);
      for (const auto& [device, ctx] : devices_) devices.push_back(ctx);
    }
    std::vector<PullDeviceStatus> out;
    for (const auto& ctx : devices) {
      PullDeviceStatus s = ctx->Status();
      s.gpu_memory_bytes = NvmlProcessMemory(PciBusId(ctx->device()), getpid());
      out.push_back(s);
    }
    return out;
  }

 private:
  const int device_count_;
  mutable zcc::Mutex mu_;
  std::map<int, std::shared_ptr<DeviceContext>> devices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<PullEngine>> NewPullEngine() {
  int count = 0;
  ZCC_RETURN_IF_ERROR(Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device");
  return std::unique_ptr<PullEngine>(new CudaPullEngine(count));
}

}  // namespace zcc
