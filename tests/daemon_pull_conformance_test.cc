// The DeviceCopier conformance suite (copy/copier_conformance.h) against the
// daemon-pull copier, with a real zccd doing the copies: every section
// registers a fresh rank with zccd (daemon-pull required), maps its segment,
// and runs the trainer's half of the copier over the channel zccd serves.
// Sources are device memory, which zccd opens through CUDA IPC; staging is
// the registered segment's slots.
//
// Two builds of this file: over the fake CUDA runtime (zccd over the fake
// too; runs in CI), and with ZCC_REAL_CUDA against the real runtime and the
// real zccd, for GPU nodes (tools/gpu/run_gpu_checks.sh), where a spinning
// kernel stalls the trainer's stream.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "copy/copier_conformance.h"
#include "cuda/ipc_pull_copier.h"
#ifdef ZCC_REAL_CUDA
#include "cuda/cuda_copier.h"
#include "cuda/cuda_test_support.h"
#include "cuda/device_sources.h"
#else
#include "cuda/fake_cudart/fake_cudart.h"
#endif
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/pull_channel.h"
#include "shm/segment.h"
#include "tests/process_harness.h"

namespace zcc::testing {
namespace {

#ifndef ZCC_REAL_CUDA
namespace fake = ::zcc::fake_cudart;
#endif

constexpr size_t kChunk = size_t{64} << 10;
// One tensor this large: each slot holds the largest staging a section asks
// for (the fence case's 4 MiB).
constexpr int64_t kTensorFloats = (int64_t{5} << 20) / 4;

// zccd (over the fake runtime, or the real one) with daemon-pull on.
DaemonOptions PullDaemon() {
  DaemonOptions o;
#ifdef ZCC_REAL_CUDA
  o.binary = "daemon/zccd";
#else
  o.binary = "daemon/zccd_on_fake_cudart";
#endif
  o.extra_flags = {"--daemon_pull", "--client_timeout_s=3600"};
  return o;
}

// A registration with zccd: its segment stays mapped until the next section,
// since a section's staging may be checked after its copier is gone.
struct Registration {
  shm::Segment segment;
  uint64_t staging_begin = 0;
  uint64_t staging_end = 0;
  shm::PullChannel* channel = nullptr;
  shm::PullGeometry geometry;
};

std::vector<std::unique_ptr<Registration>>& Registrations() {
  static auto* all = new std::vector<std::unique_ptr<Registration>>();
  return *all;
}

Registration& Register(const std::string& socket) {
  static std::atomic<uint32_t> next_rank{0};
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto control = v1::Control::NewStub(channel);
  v1::RegisterRequest req;
  req.set_job_id("conformance");
  req.set_rank(next_rank++);
  req.set_world_size(4096);
  req.set_pid(getpid());
  req.set_num_slots(2);
  req.set_daemon_pull(v1::DAEMON_PULL_REQUIRED);
  req.set_cuda_device(0);
  v1::TensorSpec* t = req.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::F32);
  t->add_shape(kTensorFloats);
  t->set_kind(v1::PARAM);
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status st = control->Register(&ctx, req, &resp);
  INFO(st.error_message());
  REQUIRE(st.ok());
  REQUIRE(resp.daemon_pull());
  auto segment = shm::Segment::Open(resp.shm_name(), resp.segment_bytes());
  REQUIRE_OK(segment);
  auto r = std::make_unique<Registration>(Registration{std::move(*segment)});
  r->staging_begin = resp.slots_offset();
  r->staging_end = resp.pull_channel_offset();
  r->channel = reinterpret_cast<shm::PullChannel*>(r->segment.base() + resp.pull_channel_offset());
  r->geometry = shm::PullGeometryFor(1);
  Registrations().push_back(std::move(r));
  return *Registrations().back();
}

CopierConformanceEnv DaemonPullEnv(const Daemon& daemon, void* stream) {
  CopierConformanceEnv env;
  env.make_copier = [socket = daemon.socket()] {
    Registration& r = Register(socket);
    IpcPullCopierOptions o;
    o.device = 0;
    o.mapping = {r.segment.base(), r.staging_begin, r.staging_end, r.channel, r.geometry};
    o.host_chunk_bytes = kChunk;
    auto copier = NewIpcPullCopier(o);
    REQUIRE_OK(copier);
    return *std::move(copier);
  };
  env.chunk_bytes = kChunk;
  env.stream = stream;
  // The newest registration's slots (each section makes its copier first).
  env.alloc_staging = [](size_t n) -> void* {
    Registration& r = *Registrations().back();
    REQUIRE(n <= r.staging_end - r.staging_begin);
    return r.segment.base() + r.staging_begin;
  };
  env.free_staging = [](void*) {};
#ifdef ZCC_REAL_CUDA
  cuda_testing::UseDeviceSources(&env);
#else
  env.alloc_source = [](size_t n) { return fake::DeviceAlloc(n); };
  env.free_source = [](void* p) { fake::DeviceFree(p); };
  env.write_source = [](void* source, const void* host, size_t n, void* s) {
    auto bytes = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + n);
    REQUIRE(fake::LaunchHostWork(
                s, [source, bytes] { std::memcpy(source, bytes->data(), bytes->size()); }) == 0);
  };
  env.read_source = [](void* host, const void* source, size_t n, void* s) {
    REQUIRE(fake::SynchronizeStream(s) == 0);
    std::memcpy(host, source, n);
  };
  env.stall_stream = [](void* s) { REQUIRE(fake::Stall(s, std::chrono::milliseconds(100)) == 0); };
#endif
  return env;
}

void* NewTrainerStream() {
#ifdef ZCC_REAL_CUDA
  auto s = cuda_testing::NewStream();
  REQUIRE_OK(s);
  return *s;
#else
  void* stream = nullptr;
  REQUIRE(fake::NewStream(&stream) == 0);
  return stream;
#endif
}

void DestroyTrainerStream(void* stream) {
#ifdef ZCC_REAL_CUDA
  CHECK_OK(cuda_testing::DestroyStream(stream));
#else
  CHECK(fake::DestroyStream(stream) == 0);
#endif
}

// On a machine without a GPU the real-runtime build has nothing to test.
bool NoDevice() {
#ifdef ZCC_REAL_CUDA
  if (!CudaDeviceAvailable()) {
    WARN("skipped: no CUDA device");
    return true;
  }
#endif
  return false;
}

// Catch2 runs each TEST_CASE once per section: each run has a zccd of its own.
TEST_CASE("daemon-pull copier meets the DeviceCopier contract, zccd copying, default stream") {
  if (NoDevice()) return;
  Registrations().clear();
  Daemon daemon(ShortTempDir("it-pull-conf"), PullDaemon());
  REQUIRE(daemon.Start());
  RunCopierConformance(DaemonPullEnv(daemon, nullptr));
}

TEST_CASE("daemon-pull copier meets the DeviceCopier contract, zccd copying, trainer stream") {
  if (NoDevice()) return;
  Registrations().clear();
  Daemon daemon(ShortTempDir("it-pull-conf"), PullDaemon());
  REQUIRE(daemon.Start());
  void* stream = NewTrainerStream();
  RunCopierConformance(DaemonPullEnv(daemon, stream));
  DestroyTrainerStream(stream);
}

}  // namespace
}  // namespace zcc::testing
