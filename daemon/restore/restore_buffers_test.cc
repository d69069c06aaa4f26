#include "daemon/restore/restore_buffers.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "shm/segment.h"

namespace zcc::daemon {
namespace {

shm::Segment MakeSegment(const std::string& what, uint64_t bytes) {
  auto segment =
      shm::Segment::Create(absl::StrCat("/zcc-test-restore-buffers-", getpid(), "-", what), bytes);
  REQUIRE_OK(segment.status());
  return *std::move(segment);
}

TEST_CASE("restore buffers are counted from their creation until they are released") {
  RestoreBuffers buffers;
  CHECK(buffers.bytes() == 0);

  // Being filled: counted before it is held.
  std::optional<RestoreBuffers::Filling> filling = buffers.BeingFilled(1 << 20);
  CHECK(buffers.bytes() == (1 << 20));
  shm::Segment first = MakeSegment("first", 1 << 20);
  const uint64_t first_bytes = first.size();
  const uint64_t id = buffers.Add(std::move(first), 7);
  filling.reset();  // held now: counted once
  CHECK(buffers.bytes() == first_bytes);

  // A restore from the staging segment holds no buffer of its own.
  const uint64_t in_staging = buffers.Add(std::nullopt, 8);
  CHECK(buffers.bytes() == first_bytes);

  {
    // A fill given up (the read failed): nothing stays counted.
    RestoreBuffers::Filling given_up = buffers.BeingFilled(4096);
    RestoreBuffers::Filling moved = std::move(given_up);
    CHECK(buffers.bytes() == first_bytes + 4096);
  }
  CHECK(buffers.bytes() == first_bytes);

  auto step = buffers.Remove(id);
  REQUIRE_OK(step.status());
  CHECK(*step == 7);
  CHECK(buffers.bytes() == 0);
  CHECK(buffers.Remove(id).status().code() == absl::StatusCode::kNotFound);

  buffers.Add(MakeSegment("second", 8192), 9);
  CHECK(buffers.bytes() == 8192);
  buffers.Clear();  // the rank goes
  CHECK(buffers.bytes() == 0);
  CHECK(buffers.Remove(in_staging).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace zcc::daemon
