// The line protocol of fake_ipc_peer, the second process of fake_cudart_test's
// CUDA IPC cases, and the hex encoding both sides use for handles and bytes.
//
// The peer reads one command per line on stdin and answers each with one
// line on stdout: "ok" and its results, or "err <cudaError_t>". Memory and
// events get slot numbers in the order the peer makes or opens them. All its
// work runs on one non-blocking stream of device 0 (remade by "reset").
//
//   alloc <bytes> <byte>        cudaMalloc, filled -> ok <slot> <mem handle>
//   free <slot>                 cudaFree
//   open_mem <mem handle>       cudaIpcOpenMemHandle -> ok <slot> <pointer>
//   close_mem <slot>            cudaIpcCloseMemHandle
//   read <slot> <offset> <n>    device to pinned host, then synchronize -> ok <bytes>
//   write <slot> <offset> <bytes>  pinned host to device, then synchronize
//   fill <slot> <byte>          on the stream (queued, not waited for)
//   stall <ms>                  occupies the stream
//   event                       interprocess event -> ok <slot> <event handle>
//   open_event <event handle>   cudaIpcOpenEventHandle -> ok <slot>
//   record <slot> | wait <slot> cudaEventRecord / cudaStreamWaitEvent on the stream
//   query <slot> | event_sync <slot> | destroy_event <slot>
//   sync                        cudaStreamSynchronize
//   reset                       cudaDeviceReset (and a new stream)
//   counters                    -> ok <ipc_mem_imports> <ipc_event_imports>
//                                     <device_allocations> <live_events>
//   exit
// Handles, bytes and pointers are lowercase hex.
#ifndef ZCC_CUDA_FAKE_CUDART_FAKE_IPC_PEER_H_
#define ZCC_CUDA_FAKE_CUDART_FAKE_IPC_PEER_H_

#include <cstddef>
#include <string>

namespace zcc::fake_cudart {

inline std::string ToHex(const void* data, size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 15]);
  }
  return out;
}

// Decodes `hex` into exactly `bytes` bytes at `out`; false if it is not that.
inline bool FromHex(const std::string& hex, void* out, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = digit(hex[2 * i]);
    const int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace zcc::fake_cudart

#endif  // ZCC_CUDA_FAKE_CUDART_FAKE_IPC_PEER_H_
