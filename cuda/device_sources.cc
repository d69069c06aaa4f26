#include "cuda/device_sources.h"

#include <catch2/catch.hpp>
#include <memory>
#include <utility>

#include "common/testing/status_matchers.h"
#include "cuda/cuda_test_support.h"

namespace zcc::cuda_testing {

void UseDeviceSources(testing::CopierConformanceEnv* env) {
  auto uploads = PinnedUploads::Create(size_t{96} << 20);
  REQUIRE_OK(uploads);
  std::shared_ptr<PinnedUploads> shared = *std::move(uploads);
  env->alloc_source = [](size_t n) {
    auto p = DeviceAlloc(n);
    REQUIRE_OK(p);
    return *p;
  };
  env->free_source = [](void* p) { CHECK_OK(DeviceFree(p)); };
  env->write_source = [shared](void* source, const void* host, size_t n, void* s) {
    REQUIRE_OK(shared->UploadAsync(source, host, n, s));
  };
  env->read_source = [](void* host, const void* source, size_t n, void* s) {
    REQUIRE_OK(Download(host, source, n, s));
  };
  env->stall_stream = [](void* s) { REQUIRE_OK(StallStream(s, 200)); };
}

}  // namespace zcc::cuda_testing
