// fake_ipc_peer: the other process of fake_cudart_test's CUDA IPC cases, a
// command interpreter over the fake runtime (protocol: fake_ipc_peer.h).
// A separate binary rather than a fork of the test: the fake's stream
// workers are threads, which a fork would not carry over.
#include "cuda/fake_cudart/fake_ipc_peer.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/fake_cudart/fake_cudart.h"

namespace zcc::fake_cudart {
namespace {

struct Memory {
  unsigned char* ptr = nullptr;
  size_t bytes = 0;
};

class Peer {
 public:
  Peer() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }

  // One command; the reply line, without its newline.
  std::string Run(const std::string& line) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::ostringstream out;
    const cudaError_t err = Dispatch(command, in, out);
    if (err != cudaSuccess) return "err " + std::to_string(static_cast<int>(err));
    const std::string results = out.str();
    return results.empty() ? "ok" : "ok " + results;
  }

 private:
  cudaError_t Dispatch(const std::string& command, std::istringstream& in, std::ostringstream& out) {
    if (command == "alloc") {
      size_t bytes = 0;
      int byte = 0;
      in >> bytes >> byte;
      void* p = nullptr;
      if (cudaError_t e = cudaMalloc(&p, bytes)) return e;
      std::memset(p, byte, bytes);  // The fake's device memory is host memory.
      cudaIpcMemHandle_t handle;
      if (cudaError_t e = cudaIpcGetMemHandle(&handle, p)) return e;
      memory_.push_back({static_cast<unsigned char*>(p), bytes});
      out << memory_.size() - 1 << " " << ToHex(&handle, sizeof(handle));
      return cudaSuccess;
    }
    if (command == "free") return cudaFree(MemoryAt(in).ptr);
    if (command == "open_mem") {
      std::string hex;
      in >> hex;
      cudaIpcMemHandle_t handle;
      if (!FromHex(hex, &handle, sizeof(handle))) return cudaErrorInvalidValue;
      void* p = nullptr;
      if (cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess)) {
        return e;
      }
      memory_.push_back({static_cast<unsigned char*>(p), ImportSize(p)});
      const auto address = reinterpret_cast<uintptr_t>(p);
      out << memory_.size() - 1 << " " << ToHex(&address, sizeof(address));
      return cudaSuccess;
    }
    if (command == "close_mem") return cudaIpcCloseMemHandle(MemoryAt(in).ptr);
    if (command == "read" || command == "write") {
      const Memory m = MemoryAt(in);
      size_t offset = 0;
      in >> offset;
      std::string arg;
      in >> arg;
      const bool read = command == "read";
      const size_t bytes = read ? std::stoul(arg) : arg.size() / 2;
      void* host = nullptr;
      if (cudaError_t e = cudaMallocHost(&host, bytes)) return e;
      std::memset(host, 0, bytes);
      if (!read) FromHex(arg, host, bytes);
      cudaError_t e = read ? cudaMemcpyAsync(host, m.ptr + offset, bytes, cudaMemcpyDeviceToHost,
                                             stream_)
                           : cudaMemcpyAsync(m.ptr + offset, host, bytes, cudaMemcpyHostToDevice,
                                             stream_);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
      if (e == cudaSuccess && read) out << ToHex(host, bytes);
      cudaFreeHost(host);
      return e;
    }
    if (command == "fill") {
      const Memory m = MemoryAt(in);
      int byte = 0;
      in >> byte;
      return static_cast<cudaError_t>(
          LaunchHostWork(stream_, [m, byte] { std::memset(m.ptr, byte, m.bytes); }));
    }
    if (command == "stall") {
      int ms = 0;
      in >> ms;
      return static_cast<cudaError_t>(Stall(stream_, std::chrono::milliseconds(ms)));
    }
    if (command == "event") {
      cudaEvent_t e = nullptr;
      if (cudaError_t err = cudaEventCreateWithFlags(
              &e, cudaEventInterprocess | cudaEventDisableTiming | cudaEventBlockingSync)) {
        return err;
      }
      cudaIpcEventHandle_t handle;
      if (cudaError_t err = cudaIpcGetEventHandle(&handle, e)) return err;
      events_.push_back(e);
      out << events_.size() - 1 << " " << ToHex(&handle, sizeof(handle));
      return cudaSuccess;
    }
    if (command == "open_event") {
      std::string hex;
      in >> hex;
      cudaIpcEventHandle_t handle;
      if (!FromHex(hex, &handle, sizeof(handle))) return cudaErrorInvalidValue;
      cudaEvent_t e = nullptr;
      if (cudaError_t err = cudaIpcOpenEventHandle(&e, handle)) return err;
      events_.push_back(e);
      out << events_.size() - 1;
      return cudaSuccess;
    }
    if (command == "record") return cudaEventRecord(EventAt(in), stream_);
    if (command == "wait") return cudaStreamWaitEvent(stream_, EventAt(in), 0);
    if (command == "query") return cudaEventQuery(EventAt(in));
    if (command == "event_sync") return cudaEventSynchronize(EventAt(in));
    if (command == "destroy_event") return cudaEventDestroy(EventAt(in));
    if (command == "sync") return cudaStreamSynchronize(stream_);
    if (command == "reset") {
      if (cudaError_t e = cudaDeviceReset()) return e;
      return cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    }
    if (command == "counters") {
      const Counters c = GetCounters();
      out << c.ipc_mem_imports << " " << c.ipc_event_imports << " " << c.device_allocations << " "
          << c.live_events;
      return cudaSuccess;
    }
    return cudaErrorNotSupported;
  }

  Memory MemoryAt(std::istringstream& in) {
    size_t slot = 0;
    in >> slot;
    return slot < memory_.size() ? memory_[slot] : Memory();
  }

  cudaEvent_t EventAt(std::istringstream& in) {
    size_t slot = 0;
    in >> slot;
    return slot < events_.size() ? events_[slot] : nullptr;
  }

  // An import's size, as zccd learns it: from the driver's address range.
  static size_t ImportSize(const void* p) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        fn == nullptr) {
      return 0;
    }
    using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult result = reinterpret_cast<GetAddressRange>(fn)(
        &base, &size, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)));
    return result == CUDA_SUCCESS ? size : 0;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<Memory> memory_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace
}  // namespace zcc::fake_cudart

int main() {
  // A test that dies must not leave its peer behind (stalled for a minute).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  zcc::fake_cudart::Peer peer;
  std::string line;
  while (std::getline(std::cin, line) && line != "exit") {
    std::cout << peer.Run(line) << std::endl;  // Flushed: the test waits for it.
  }
  return 0;
}
