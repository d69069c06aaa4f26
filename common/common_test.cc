#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "common/futex.h"
#include "common/status.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "absl/strings/match.h"
#include "common/validate.h"

namespace zcc {
namespace {

TEST_CASE("job ids that could escape the checkpoint root are refused") {
  CHECK_OK(ValidateJobId("llama-70b_run.3"));
  for (const char* bad : {"", ".", "..", "../x", "a/b", "-rf", ".hidden", "a b", "x\n"}) {
    INFO(bad);
    CHECK(ValidateJobId(bad).code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(ValidateJobId(std::string("a\0b", 3)).ok());
  CHECK_FALSE(ValidateJobId(std::string(kMaxJobIdBytes + 1, 'a')).ok());
  CHECK_OK(ValidateJobId(std::string(kMaxJobIdBytes, 'a')));
}

TEST_CASE("job ids that name entries of a job directory are reserved") {
  for (const char* reserved : {"latest", "latest.tmp.12", "step-00000010", "step-5.partial"}) {
    INFO(reserved);
    const absl::Status st = ValidateJobId(reserved);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(st.message(), "reserved"));
  }
  CHECK_OK(ValidateJobId("latest-run"));
  CHECK_OK(ValidateJobId("steps"));
}

TEST_CASE("the safetensors metadata key cannot name a tensor") {
  const absl::Status st = ValidateTensorName("__metadata__");
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(st.message(), "reserved"));
  CHECK_OK(ValidateTensorName("__metadata__.x"));
  CHECK_OK(ValidateTensorName("model.__metadata__"));
}

TEST_CASE("tensor names allow '/' and '.' but not control characters") {
  CHECK_OK(ValidateTensorName("model.layers.0/attn.q_proj.weight"));
  CHECK_OK(ValidateTensorName("../not/a/path/it/is/a/key"));
  CHECK_FALSE(ValidateTensorName("").ok());
  CHECK_FALSE(ValidateTensorName(std::string("a\0b", 3)).ok());
  CHECK_FALSE(ValidateTensorName("tab\there").ok());
  CHECK_FALSE(ValidateTensorName("quote\"").ok());
  CHECK_FALSE(ValidateTensorName(std::string(kMaxTensorNameBytes + 1, 'x')).ok());
  CHECK_OK(ValidateTensorName(std::string(kMaxTensorNameBytes, 'x')));
  CHECK_OK(ValidateTensorName("gewicht.\xc3\xa4.\xe6\x9d\x83\xe9\x87\x8d"));
  CHECK_FALSE(ValidateTensorName("bad\xff").ok());
  CHECK_FALSE(ValidateTensorName("trunc\xc3").ok());
  CHECK_FALSE(ValidateTensorName("overlong\xc0\xaf").ok());
  CHECK_FALSE(ValidateTensorName("surrogate\xed\xa0\x80").ok());
}

TEST_CASE("errno maps to a status code with context") {
  const absl::Status st = ErrnoToStatus(ENOSPC, "write /x");
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(st.message().find("write /x") != absl::string_view::npos);
  CHECK(ErrnoToStatus(ENOENT, "open").code() == absl::StatusCode::kNotFound);
  CHECK(Annotate(absl::InternalError("boom"), "step 3").message() == "step 3: boom");
}

TEST_CASE("atomic file write, listing and root containment") {
  const std::string dir = testing::TempDir();
  REQUIRE_OK(MakeDirs(JoinPath(dir, "a/b/c")));
  const std::string file = JoinPath(dir, "a/f.txt");
  REQUIRE_OK(WriteFileAtomic(file, "first"));
  REQUIRE_OK(WriteFileAtomic(file, "second"));
  auto content = ReadFileToString(file, 100);
  REQUIRE_OK(content);
  CHECK(*content == "second");
  CHECK(ReadFileToString(file, 3).status().code() == absl::StatusCode::kFailedPrecondition);
  auto names = ListDir(JoinPath(dir, "a"));
  REQUIRE_OK(names);
  CHECK(names->size() == 2);  // b and f.txt, no temporary left behind

  REQUIRE(*IsUnderRoot(JoinPath(dir, "a/b"), dir));
  REQUIRE(symlink("/etc", JoinPath(dir, "a/escape").c_str()) == 0);
  CHECK_FALSE(*IsUnderRoot(JoinPath(dir, "a/escape"), dir));
  CHECK_FALSE(*IsUnderRoot("/tmp", dir));
  REQUIRE_OK(RemoveTree(dir));
  CHECK_FALSE(PathExists(dir));
}

TEST_CASE("futex wakes a waiter in another thread") {
  std::atomic<uint32_t> word{0};
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    while (word.load() == 0) FutexWait(&word, 0, absl::InfiniteDuration());
    woke = true;
  });
  word.store(1);
  FutexWakeAll(&word);
  waiter.join();
  CHECK(woke.load());
  // A wait on a value that already changed returns at once.
  FutexWait(&word, 0, absl::Seconds(10));
}

}  // namespace
}  // namespace zcc
