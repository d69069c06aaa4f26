#include "fuzz/fuzz_targets.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "format/manifest.h"
#include "fuzz/fuzz_util.h"

namespace zcc::fuzz {

using internal::AsView;

namespace {

// One job directory per process for the `latest` file, under $TEST_TMPDIR
// (which fuzz/run.sh and Bazel create and remove around the process). It is
// deliberately not removed by the process itself: an atexit cleanup could run
// while the fuzzing thread was still between writing `latest` and reading it
// back, and then looked like a vanished file (see fuzz/findings/README.md).
const std::string& LatestJobDir() {
  static const std::string* const dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/zcc-fuzz-latest.XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return new std::string(tmpl);
  }();
  return *dir;
}

void WriteOrDie(const std::string& path, absl::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr ||
      (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

}  // namespace

int FuzzStepDirLatest(const uint8_t* data, size_t size) {
  const absl::string_view name = AsView(data, size);
  const auto step = format::ParseStepDirName(name);
  if (step.ok()) {
    // Exactly one spelling per step, and it is the one the committer writes.
    FUZZ_CHECK(*step >= 0, absl::StrCat(*step));
    FUZZ_CHECK(format::StepDirName(*step) == name, std::string(name));
    FUZZ_CHECK(!format::ParseStepDirName(format::PartialStepDirName(*step)).ok(),
               "a partial directory name parses as a step");
  } else {
    FUZZ_CHECK(step.status().code() == absl::StatusCode::kInvalidArgument,
               step.status().ToString());
  }

  const std::string& job_dir = LatestJobDir();
  WriteOrDie(job_dir + "/" + format::kLatestFileName, name);
  const auto latest = checkpoint::ReadLatest(job_dir);
  if (latest.ok()) {
    const auto expected = format::ParseStepDirName(absl::StripAsciiWhitespace(name));
    FUZZ_CHECK(expected.ok() && *expected == *latest, absl::StrCat(*latest));
  } else {
    FUZZ_CHECK(latest.status().code() != absl::StatusCode::kNotFound,
               "latest exists but ReadLatest says NotFound");
  }
  return 0;
}

}  // namespace zcc::fuzz
