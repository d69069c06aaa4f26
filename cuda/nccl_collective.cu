#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "cuda/cuda_status.h"
#include "cuda/nccl_collective.h"

namespace zcc {
namespace {

absl::Status NcclToStatus(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(r));
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define ZCC_CUDA_OK(call) ZCC_RETURN_IF_ERROR(CudaToStatus(static_cast<int>(call), #call))

// A device buffer freed (stream-ordered) when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  absl::Status Allocate(size_t bytes, cudaStream_t stream) {
    stream_ = stream;
    return CudaToStatus(cudaMallocAsync(&data_, std::max<size_t>(bytes, 1), stream),
                        absl::StrCat("cudaMallocAsync of ", bytes, " bytes"));
  }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, int device, uint32_t rank, uint32_t size, cudaStream_t stream)
      : comm_(comm), device_(device), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCollective() override {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }

  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view mine) override {
    ZCC_CUDA_OK(cudaSetDevice(device_));
    // The lengths first, then every message padded to the longest.
    DeviceBuffer lengths;
    ZCC_RETURN_IF_ERROR(lengths.Allocate(sizeof(uint64_t) * size_, stream_));
    std::vector<uint64_t> host_lengths(size_);
    host_lengths[rank_] = mine.size();
    auto* dl = static_cast<uint64_t*>(lengths.get());
    ZCC_CUDA_OK(cudaMemcpyAsync(dl + rank_, &host_lengths[rank_], sizeof(uint64_t),
                                cudaMemcpyHostToDevice, stream_));
    ZCC_RETURN_IF_ERROR(NcclToStatus(
        ncclAllGather(dl + rank_, dl, 1, ncclUint64, comm_, stream_), "ncclAllGather of lengths"));
    ZCC_CUDA_OK(cudaMemcpyAsync(host_lengths.data(), dl, sizeof(uint64_t) * size_,
                                cudaMemcpyDeviceToHost, stream_));
    ZCC_CUDA_OK(cudaStreamSynchronize(stream_));
    const uint64_t longest = std::max<uint64_t>(
        1, *std::max_element(host_lengths.begin(), host_lengths.end()));
    DeviceBuffer all;
    ZCC_RETURN_IF_ERROR(all.Allocate(longest * size_, stream_));
    auto* da = static_cast<uint8_t*>(all.get());
    std::string padded(longest, '\0');
    std::memcpy(padded.data(), mine.data(), mine.size());
    ZCC_CUDA_OK(cudaMemcpyAsync(da + rank_ * longest, padded.data(), longest,
                                cudaMemcpyHostToDevice, stream_));
    ZCC_RETURN_IF_ERROR(NcclToStatus(
        ncclAllGather(da + rank_ * longest, da, longest, ncclUint8, comm_, stream_),
        "ncclAllGather"));
    std::string packed(longest * size_, '\0');
    ZCC_CUDA_OK(cudaMemcpyAsync(packed.data(), da, packed.size(), cudaMemcpyDeviceToHost, stream_));
    ZCC_CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<std::string> out(size_);
    for (uint32_t r = 0; r < size_; ++r) {
      if (host_lengths[r] > longest) return absl::DataLossError("ncclAllGather: bad length");
      out[r] = packed.substr(r * longest, host_lengths[r]);
    }
    return out;
  }

  absl::Status Broadcast(void* data, uint64_t bytes, uint32_t root, void* stream) override {
    if (root >= size_) return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root));
    if (bytes == 0) return absl::OkStatus();  // every rank skips alike
    ZCC_CUDA_OK(cudaSetDevice(device_));
    auto s = static_cast<cudaStream_t>(stream);
    bool host = false;
    if (data != nullptr) {
      cudaPointerAttributes attributes{};
      ZCC_CUDA_OK(cudaPointerGetAttributes(&attributes, data));
      host = attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged;
    } else if (rank_ == root) {
      return absl::InvalidArgumentError("the broadcast root has no data");
    }
    DeviceBuffer bounce;
    void* on_device = data;
    if (data == nullptr || host) {
      ZCC_RETURN_IF_ERROR(bounce.Allocate(bytes, s));
      on_device = bounce.get();
      if (host && rank_ == root) {
        ZCC_CUDA_OK(cudaMemcpyAsync(on_device, data, bytes, cudaMemcpyHostToDevice, s));
      }
    }
    ZCC_RETURN_IF_ERROR(NcclToStatus(
        ncclBroadcast(on_device, on_device, bytes, ncclUint8, static_cast<int>(root), comm_, s),
        absl::StrCat("ncclBroadcast of ", bytes, " bytes from rank ", root)));
    if (host && rank_ != root) {
      ZCC_CUDA_OK(cudaMemcpyAsync(data, on_device, bytes, cudaMemcpyDeviceToHost, s));
      ZCC_CUDA_OK(cudaStreamSynchronize(s));
    }
    return absl::OkStatus();
  }

 private:
  ncclComm_t comm_;
  int device_;
  uint32_t rank_;
  uint32_t size_;
  cudaStream_t stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> NewNcclCollective(void* comm, int device) {
  if (comm == nullptr) return absl::InvalidArgumentError("NCCL collective: no communicator");
  auto c = static_cast<ncclComm_t>(comm);
  int rank = 0, size = 0;
  ZCC_RETURN_IF_ERROR(NcclToStatus(ncclCommUserRank(c, &rank), "ncclCommUserRank"));
  ZCC_RETURN_IF_ERROR(NcclToStatus(ncclCommCount(c, &size), "ncclCommCount"));
  ZCC_CUDA_OK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  ZCC_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Collective>(new NcclCollective(c, device, static_cast<uint32_t>(rank),
                                                        static_cast<uint32_t>(size), stream));
}

}  // namespace zcc
