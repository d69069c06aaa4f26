// Fresh scratch directories for tests: under $TEST_TMPDIR when Bazel sets it
// (on the work tree's disk), else /tmp; or under a given parent such as
// /dev/shm. Left in place for inspection; Bazel cleans TEST_TMPDIR.
#ifndef ZCC_STORAGE_TESTING_TEMP_DIR_H_
#define ZCC_STORAGE_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "common/file_util.h"

namespace zcc::testing {

inline std::string TempDirUnder(const std::string& parent) {
  std::string tmpl = JoinPath(parent, "zcc_test.XXXXXX");
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

inline std::string TempDir() {
  const char* bazel_tmp = std::getenv("TEST_TMPDIR");
  return TempDirUnder(bazel_tmp != nullptr ? bazel_tmp : "/tmp");
}

}  // namespace zcc::testing

#endif  // ZCC_STORAGE_TESTING_TEMP_DIR_H_
