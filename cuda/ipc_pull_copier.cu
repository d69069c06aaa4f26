// The daemon-pull copier, the trainer's half (see ipc_pull_copier.h and
// shm/pull_channel.h). Host code only: no kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "copy/device_copier.h"
#include "copy/host_copier.h"
#include "cuda/cuda_handle.h"
#include "cuda/ipc_pull_copier.h"
#include "shm/pull_channel.h"

namespace zcc {
namespace {

using cuda_internal::CallerStream;
using cuda_internal::Check;
using cuda_internal::CudaEvent;
using cuda_internal::GetAddressRangeFn;
using cuda_internal::LoadGetAddressRange;
using cuda_internal::NewEvent;
using cuda_internal::ScopedDevice;

// True when `ptr` is device memory (of any device) rather than host memory.
absl::StatusOr<bool> IsDeviceMemory(const void* ptr) {
  cudaPointerAttributes attr{};
  ZCC_RETURN_IF_ERROR(Check(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes"));
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

class IpcPullCopier final : public DeviceCopier {
 public:
  IpcPullCopier(IpcPullCopierOptions options, std::unique_ptr<HostCopier> host,
                GetAddressRangeFn get_range)
      : options_(std::move(options)), host_(std::move(host)), get_range_(get_range) {}

  ~IpcPullCopier() override {
    uint64_t last;
    {
      zcc::MutexLock lock(&mu_);
      last = next_ticket_;
    }
    // zccd may still be copying out of the tensors and into the segment.
    const absl::Status st = AwaitChannel(&shm::PullChannel::completed, last);
    if (!st.ok()) ZCC_LOG(WARNING) << "daemon-pull copier: " << st;
    host_.reset();  // finishes the host copies
  }

  std::string name() const override { return "cuda_ipc"; }

  absl::Status Attach() {
    ZCC_RETURN_IF_ERROR(
        shm::ValidatePullChannel(*options_.mapping.channel, options_.mapping.geometry));
    if (options_.mapping.channel->device != options_.device) {
      return absl::FailedPreconditionError(
          absl::StrCat("the daemon-pull channel is for device ", options_.mapping.channel->device,
                       ", the copier for device ", options_.device));
    }
    ScopedDevice on(options_.device);
    ZCC_RETURN_IF_ERROR(on.status());
    constexpr unsigned kFlags = cudaEventInterprocess | cudaEventDisableTiming;
    for (uint32_t i = 0; i < shm::kPullRequests; ++i) {
      ZCC_ASSIGN_OR_RETURN(ready_[i], NewEvent(kFlags));
      ZCC_RETURN_IF_ERROR(ExportEvent(ready_[i].get(), options_.mapping.channel->ready_events[i]));
    }
    ZCC_ASSIGN_OR_RETURN(copied_, NewEvent(kFlags));
    ZCC_RETURN_IF_ERROR(ExportEvent(copied_.get(), options_.mapping.channel->copied_event));
    options_.mapping.channel->attached.store(1, std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status RegisterHostMemory(void* base, size_t bytes) override {
    if (base == nullptr || bytes == 0) {
      return absl::InvalidArgumentError("RegisterHostMemory needs a non-null base and a size");
    }
    zcc::MutexLock lock(&mu_);
    if (!registered_.emplace(reinterpret_cast<uintptr_t>(base), bytes).second) {
      return absl::AlreadyExistsError("host memory at this base is already registered");
    }
    return absl::OkStatus();
  }

  absl::Status UnregisterHostMemory(void* base) override {
    if (base == nullptr) return absl::InvalidArgumentError("UnregisterHostMemory of null");
    uint64_t last;
    {
      zcc::MutexLock lock(&mu_);
      if (registered_.count(reinterpret_cast<uintptr_t>(base)) == 0) {
        return absl::NotFoundError("host memory at this base is not registered");
      }
      last = next_ticket_;
    }
    // zccd may still be writing into it.
    const absl::Status st = AwaitChannel(&shm::PullChannel::completed, last);
    if (!st.ok()) ZCC_LOG(WARNING) << "daemon-pull copier: " << st;
    zcc::MutexLock lock(&mu_);
    registered_.erase(reinterpret_cast<uintptr_t>(base));
    return absl::OkStatus();
  }

  absl::Status Prepare(absl::Span<const CopyRegion> regions) override {
    ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
    zcc::MutexLock lock(&mu_);
    for (const CopyRegion& r : regions) {
      if (r.nbytes == 0) continue;
      ZCC_ASSIGN_OR_RETURN(bool device, IsDevice(r.src));
      if (device) ZCC_RETURN_IF_ERROR(SourceOf(r.src, r.nbytes).status());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CopyTicket> Enqueue(absl::Span<const CopyRegion> regions, void* stream) override {
    ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
    zcc::MutexLock lock(&mu_);
    std::vector<shm::PullRegion> remote;
    std::vector<CopyRegion> local;
    for (size_t i = 0; i < regions.size(); ++i) {
      const CopyRegion& r = regions[i];
      if (r.nbytes == 0) continue;
      ZCC_ASSIGN_OR_RETURN(bool device, IsDevice(r.src));
      if (!device) {
        local.push_back(r);
        continue;
      }
      const uint8_t* dst = static_cast<const uint8_t*>(r.dst);
      const uint8_t* begin = options_.mapping.segment_base + options_.mapping.staging_begin;
      const uint8_t* end = options_.mapping.segment_base + options_.mapping.staging_end;
      if (dst < begin || dst > end || r.nbytes > static_cast<size_t>(end - dst) ||
          !InRegistered(dst, r.nbytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("copy region ", i,
                         " reads device memory into memory outside the registered staging "
                         "slots zccd maps; daemon-pull copies device memory only into them"));
      }
      ZCC_ASSIGN_OR_RETURN(auto source, SourceOf(r.src, r.nbytes));
      shm::PullRegion pr{};
      pr.source = source.first;
      pr.source_offset = source.second;
      pr.staging_offset = static_cast<uint64_t>(dst - options_.mapping.segment_base);
      pr.bytes = r.nbytes;
      remote.push_back(pr);
    }
    if (remote.size() > options_.mapping.geometry.regions_per_request) {
      return absl::InvalidArgumentError(
          absl::StrCat(remote.size(),
                       " device regions in one snapshot; the daemon-pull channel "
                       "takes at most ",
                       options_.mapping.geometry.regions_per_request));
    }
    const CopyTicket ticket = next_ticket_ + 1;
    const uint32_t record = static_cast<uint32_t>(ticket % shm::kPullRequests);
    // The record's previous ticket must be finished before it is rewritten.
    if (ticket > shm::kPullRequests) {
      ZCC_RETURN_IF_ERROR(AwaitChannel(&shm::PullChannel::completed, ticket - shm::kPullRequests));
    }
    Harvest();

    // zccd reads the record only once `requested` says so.
    shm::PullChannel* ch = options_.mapping.channel;
    shm::PullRequest& req = ch->requests[record];
    req.ticket = ticket;
    req.num_regions = static_cast<uint32_t>(remote.size());
    if (!remote.empty()) {
      std::memcpy(shm::PullRegions(ch, options_.mapping.geometry, record), remote.data(),
                  remote.size() * sizeof(shm::PullRegion));
    }
    {
      ScopedDevice on(options_.device);
      ZCC_RETURN_IF_ERROR(on.status());
      ZCC_RETURN_IF_ERROR(Check(cudaEventRecord(ready_[record].get(), CallerStream(stream)),
                                "cudaEventRecord of the daemon-pull ready event"));
    }
    // Last, since the host copier keeps a span of the part's regions: a
    // failure after it would leave that span dangling.
    if (!local.empty()) {
      auto part = std::make_unique<LocalPart>();
      part->ticket = ticket;
      part->regions = std::move(local);
      ZCC_ASSIGN_OR_RETURN(part->host_ticket, host_->Enqueue(part->regions, stream));
      local_.push_back(std::move(part));
    }
    next_ticket_ = ticket;
    ch->requested.store(ticket, std::memory_order_release);
    ch->doorbell.fetch_add(1, std::memory_order_acq_rel);
    if (ch->puller_waiting.load(std::memory_order_acquire) != 0) FutexWakeAll(&ch->doorbell);
    return ticket;
  }

  absl::Status Wait(CopyTicket ticket) override {
    {
      zcc::MutexLock lock(&mu_);
      if (ticket == 0 || ticket > next_ticket_) {
        return absl::InvalidArgumentError(
            absl::StrCat("Wait on ticket ", ticket, ", which was never issued"));
      }
    }
    ZCC_RETURN_IF_ERROR(AwaitChannel(&shm::PullChannel::completed, ticket));
    absl::Status pulled;
    CopyTicket host_ticket = 0;
    {
      zcc::MutexLock lock(&mu_);
      Harvest();
      auto failed = failures_.find(ticket);
      if (failed != failures_.end()) pulled = failed->second;
      for (const auto& part : local_) {
        if (part->ticket == ticket) host_ticket = part->host_ticket;
      }
    }
    if (host_ticket != 0) {
      const absl::Status host = host_->Wait(host_ticket);
      if (pulled.ok()) pulled = host;
      zcc::MutexLock lock(&mu_);
      // The host copier finishes in ticket order: earlier parts are done too.
      while (!local_.empty() && local_.front()->host_ticket <= host_ticket) local_.pop_front();
    }
    return pulled;
  }

  absl::Status FenceBeforeUpdate(void* stream) override {
    uint64_t last;
    {
      zcc::MutexLock lock(&mu_);
      last = next_ticket_;
    }
    if (last > 0) {
      const absl::Status st = AwaitChannel(&shm::PullChannel::issued, last);
      if (st.ok()) {
        ScopedDevice on(options_.device);
        ZCC_RETURN_IF_ERROR(on.status());
        ZCC_RETURN_IF_ERROR(Check(cudaStreamWaitEvent(CallerStream(stream), copied_.get(), 0),
                                  "cudaStreamWaitEvent on the daemon-pull copied event"));
      } else if (st.code() != absl::StatusCode::kUnavailable) {
        return st;
      }
      // Unavailable: zccd is gone, and its copies with it.
    }
    return host_->FenceBeforeUpdate(stream);
  }

  absl::Status CopyToDevice(absl::Span<const CopyRegion> regions, void* stream) override {
    ZCC_RETURN_IF_ERROR(ValidateRegions(regions));
    ScopedDevice on(options_.device);
    ZCC_RETURN_IF_ERROR(on.status());
    const cudaStream_t s = CallerStream(stream);
    for (const CopyRegion& r : regions) {
      if (r.nbytes == 0) continue;
      ZCC_RETURN_IF_ERROR(Check(cudaMemcpyAsync(r.dst, r.src, r.nbytes, cudaMemcpyDefault, s),
                                absl::StrCat("cudaMemcpyAsync of ", r.nbytes, " restored bytes")));
    }
    return Check(cudaStreamSynchronize(s), "cudaStreamSynchronize after a restore");
  }

 private:
  // A ticket's host-memory regions, copied here by the host copier (which
  // keeps a span of `regions` until its Wait).
  struct LocalPart {
    CopyTicket ticket = 0;
    CopyTicket host_ticket = 0;
    std::vector<CopyRegion> regions;
  };

  static absl::Status ExportEvent(cudaEvent_t event, unsigned char* out) {
    cudaIpcEventHandle_t handle;
    ZCC_RETURN_IF_ERROR(Check(cudaIpcGetEventHandle(&handle, event), "cudaIpcGetEventHandle"));
    static_assert(sizeof(handle) == shm::kIpcHandleBytes);
    std::memcpy(out, &handle, sizeof(handle));
    return absl::OkStatus();
  }

  // Whether `ptr` is device memory: from the sources exported and the host
  // pointers seen before, without a runtime call on the trainer thread once
  // Prepare() has seen the snapshot's regions.
  absl::StatusOr<bool> IsDevice(const void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = sources_.upper_bound(p);
    if (it != sources_.begin() && p - std::prev(it)->first < std::prev(it)->second.bytes) {
      return true;
    }
    if (host_sources_.count(p) != 0) return false;
    ZCC_ASSIGN_OR_RETURN(bool device, IsDeviceMemory(ptr));
    if (!device) host_sources_.insert(p);
    return device;
  }

  bool InRegistered(const uint8_t* p, size_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = registered_.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == registered_.begin()) return false;
    --it;
    const uintptr_t off = reinterpret_cast<uintptr_t>(p) - it->first;
    return off <= it->second && n <= it->second - off;
  }

  // The channel's source index of the allocation holding [ptr, ptr + n) and
  // ptr's offset in it, exporting the allocation on first sight.
  absl::StatusOr<std::pair<uint32_t, uint64_t>> SourceOf(const void* ptr, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = sources_.upper_bound(p);
    if (it != sources_.begin()) {
      --it;
      if (p - it->first < it->second.bytes) {
        if (n > it->second.bytes - (p - it->first)) {
          return absl::InvalidArgumentError("a copy region runs past the end of its allocation");
        }
        return std::make_pair(it->second.index, static_cast<uint64_t>(p - it->first));
      }
    }
    ScopedDevice on(options_.device);
    ZCC_RETURN_IF_ERROR(on.status());
    CUdeviceptr base = 0;
    size_t bytes = 0;
    const CUresult range = get_range_(&base, &bytes, static_cast<CUdeviceptr>(p));
    if (range != CUDA_SUCCESS) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuMemGetAddressRange found no allocation holding device memory at 0x",
                       absl::Hex(p), " (CUresult ", static_cast<int>(range), ")"));
    }
    cudaIpcMemHandle_t handle;
    const cudaError_t exported = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
    if (exported != cudaSuccess) {
      const absl::Status st = Check(exported, "cudaIpcGetMemHandle");
      return absl::FailedPreconditionError(absl::StrCat(
          st.message(),
          ": the tensor's memory cannot be shared through CUDA IPC (memory from "
          "cudaMallocAsync pools or PyTorch's expandable segments cannot); use copy_backend "
          "cuda instead of cuda_ipc"));
    }
    shm::PullChannel* ch = options_.mapping.channel;
    const uint32_t index = ch->num_sources.load(std::memory_order_relaxed);
    if (index >= options_.mapping.geometry.max_sources) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the tensors live in more than ", options_.mapping.geometry.max_sources,
                       " device allocations, the daemon-pull channel's limit"));
    }
    shm::PullSource& out = shm::PullSources(ch, options_.mapping.geometry)[index];
    static_assert(sizeof(handle) == shm::kIpcHandleBytes);
    std::memcpy(out.handle, &handle, sizeof(handle));
    out.bytes = bytes;
    ch->num_sources.store(index + 1, std::memory_order_release);
    sources_[static_cast<uintptr_t>(base)] = Source{bytes, index};
    if (p + n > base + bytes) {
      return absl::InvalidArgumentError("a copy region runs past the end of its allocation");
    }
    return std::make_pair(index, static_cast<uint64_t>(p - base));
  }

  // Reads the outcome of every ticket zccd finished since the last look,
  // before their records can be rewritten.
  void Harvest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t done =
        std::min(options_.mapping.channel->completed.load(std::memory_order_acquire), next_ticket_);
    for (uint64_t t = harvested_ + 1; t <= done; ++t) {
      const shm::PullRequest& req = options_.mapping.channel->requests[t % shm::kPullRequests];
      if (req.status_code == 0) continue;
      char error[shm::kPullErrorBytes + 1] = {};
      std::memcpy(error, req.error, shm::kPullErrorBytes);
      const int code = req.status_code;
      failures_[t] =
          absl::Status(code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                           ? static_cast<absl::StatusCode>(code)
                           : absl::StatusCode::kInternal,
                       absl::StrCat("zccd's copy of snapshot ticket ", t, " failed: ", error));
    }
    harvested_ = std::max(harvested_, done);
    while (!failures_.empty() && failures_.begin()->first + 4096 < harvested_) {
      failures_.erase(failures_.begin());
    }
  }

  // Sleeps until the channel's `counter` reaches `ticket`; Unavailable when
  // zccd goes away first.
  absl::Status AwaitChannel(std::atomic<uint64_t> shm::PullChannel::*counter, uint64_t ticket) {
    shm::PullChannel* ch = options_.mapping.channel;
    while (true) {
      const uint32_t bell = ch->bell.load(std::memory_order_acquire);
      if ((ch->*counter).load(std::memory_order_acquire) >= ticket) return absl::OkStatus();
      if (options_.daemon_alive && !options_.daemon_alive()) {
        return absl::UnavailableError(
            absl::StrCat("zccd went away before it copied snapshot ticket ", ticket));
      }
      FutexWait(&ch->bell, bell, options_.poll_interval);
    }
  }

  struct Source {
    size_t bytes = 0;
    uint32_t index = 0;
  };

  const IpcPullCopierOptions options_;
  std::unique_ptr<HostCopier> host_;
  const GetAddressRangeFn get_range_;
  CudaEvent ready_[shm::kPullRequests];
  CudaEvent copied_;

  zcc::Mutex mu_;
  CopyTicket next_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // the newest ticket issued
  uint64_t harvested_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<CopyTicket, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<uintptr_t, size_t> registered_ ABSL_GUARDED_BY(mu_);
  std::map<uintptr_t, Source> sources_ ABSL_GUARDED_BY(mu_);  // by allocation base
  std::set<uintptr_t> host_sources_ ABSL_GUARDED_BY(mu_);    // host memory seen as a source
  std::deque<std::unique_ptr<LocalPart>> local_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewIpcPullCopier(IpcPullCopierOptions options) {
  if (options.mapping.segment_base == nullptr || options.mapping.channel == nullptr ||
      options.mapping.staging_end <= options.mapping.staging_begin ||
      options.host_chunk_bytes == 0 || options.mapping.geometry.regions_per_request == 0 ||
      options.mapping.geometry.max_sources == 0) {
    return absl::InvalidArgumentError(
        "a daemon-pull copier needs the segment, a non-empty staging range, the channel and its "
        "geometry");
  }
  ScopedDevice on(options.device);
  ZCC_RETURN_IF_ERROR(on.status());
  ZCC_ASSIGN_OR_RETURN(GetAddressRangeFn get_range, LoadGetAddressRange());
  HostCopierOptions host_options;
  host_options.chunk_bytes = options.host_chunk_bytes;
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<HostCopier> host, HostCopier::Create(host_options));
  auto copier = std::make_unique<IpcPullCopier>(std::move(options), std::move(host), get_range);
  ZCC_RETURN_IF_ERROR(copier->Attach());
  return std::unique_ptr<DeviceCopier>(std::move(copier));
}

}  // namespace zcc
