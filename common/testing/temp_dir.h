// Scratch directories for tests, removed when the test that made them passes.
//
// Every directory made here is recorded; when the Catch2 test case that made
// it ends, it is removed (with everything in it) if the test case passed, and
// kept, with its path printed, if it failed, so that logs and checkpoints of
// a failure can be inspected. Tests link //common/testing:temp_dir and need
// not clean up themselves.
//
// Thread-safety: all functions may be called from any thread.
#ifndef ZCC_COMMON_TESTING_TEMP_DIR_H_
#define ZCC_COMMON_TESTING_TEMP_DIR_H_

#include <string>

namespace zcc::testing {

// A fresh directory under $TEST_TMPDIR when Bazel sets it (on the work tree's
// disk), else under /tmp.
std::string TempDir();

// A fresh directory under /tmp, named /tmp/zcc-<tag>.XXXXXX: short enough for
// unix socket paths (108 bytes), which Bazel's $TEST_TMPDIR is not.
std::string ShortTempDir(const std::string& tag);

// A fresh directory under `parent` (for instance /dev/shm, for a tmpfs).
std::string TempDirUnder(const std::string& parent);

}  // namespace zcc::testing

#endif  // ZCC_COMMON_TESTING_TEMP_DIR_H_
