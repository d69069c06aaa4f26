// NcclCollective (cuda/nccl_collective.h) on the GPUs present: one
// communicator per device from ncclCommInitAll, one thread per member. Cases
// that need a device print why and return on machines without one
// (tools/gpu/run_gpu_checks.sh runs them on a GPU node).
#include <cuda_runtime.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/nccl_collective.h"

namespace zcc {
namespace {

int Devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
}

TEST_CASE("a null communicator is refused") {
  auto c = NewNcclCollective(nullptr, 0);
  CHECK(absl::IsInvalidArgument(c.status()));
}

TEST_CASE("all-gather and broadcast over every GPU of the node") {
  const int n = Devices();
  if (n == 0) {
    WARN("skipped: no CUDA device");
    return;
  }
  std::vector<ncclComm_t> comms(n);
  REQUIRE(ncclCommInitAll(comms.data(), n, nullptr) == ncclSuccess);
  // Catch2 asserts on the main thread only: each member writes its findings.
  std::vector<std::vector<std::string>> problems(n);
  constexpr size_t kBytes = 5 << 20;
  std::vector<std::thread> members;
  for (int d = 0; d < n; ++d) {
    members.emplace_back([&, d] {
      auto fail = [&](const std::string& what) { problems[d].push_back(what); };
      auto made = NewNcclCollective(comms[d], d);
      if (!made.ok()) return fail(made.status().ToString());
      Collective& c = **made;
      if (c.rank() != static_cast<uint32_t>(d) || c.size() != static_cast<uint32_t>(n)) {
        return fail("rank or size");
      }
      auto all = c.AllGather(std::string(100 * d + 3, static_cast<char>('a' + d)));
      if (!all.ok()) return fail(all.status().ToString());
      for (int r = 0; r < n; ++r) {
        if ((*all)[r] != std::string(100 * r + 3, static_cast<char>('a' + r))) fail("gathered");
      }
      cudaSetDevice(d);
      cudaStream_t stream = nullptr;
      cudaStreamCreate(&stream);
      void* device = nullptr;
      cudaMalloc(&device, kBytes);
      std::vector<uint8_t> host(kBytes), want(kBytes);
      for (int root = 0; root < n; ++root) {
        for (size_t i = 0; i < kBytes; ++i) want[i] = static_cast<uint8_t>(i * 13 + root);
        // Device memory in place; host memory through a bounce; a member
        // keeping nothing (null) when root + 1 is it.
        cudaMemset(device, 0, kBytes);
        if (d == root) cudaMemcpy(device, want.data(), kBytes, cudaMemcpyHostToDevice);
        absl::Status st = c.Broadcast(device, kBytes, root, stream);
        if (!st.ok()) return fail(st.ToString());
        cudaStreamSynchronize(stream);
        cudaMemcpy(host.data(), device, kBytes, cudaMemcpyDeviceToHost);
        if (host != want) fail(absl::StrCat("device broadcast from ", root));
        std::fill(host.begin(), host.end(), 0);
        if (d == root) host = want;
        const bool keeps = d == root || d != (root + 1) % n;
        st = c.Broadcast(keeps ? host.data() : nullptr, kBytes, root, stream);
        if (!st.ok()) return fail(st.ToString());
        cudaStreamSynchronize(stream);
        if (keeps && host != want) fail(absl::StrCat("host broadcast from ", root));
      }
      cudaFree(device);
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : members) t.join();
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  for (int d = 0; d < n; ++d) {
    INFO("device " << d);
    CHECK(problems[d] == std::vector<std::string>{});
  }
}

}  // namespace
}  // namespace zcc
