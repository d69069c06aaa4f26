#include "common/testing/temp_dir.h"

#include <stdlib.h>

// The listener interface (Catch::TestEventListenerBase) is compiled only with
// this defined.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/mutex.h"

namespace zcc::testing {
namespace {

// Directories made since the current test case began.
class MadeDirs {
 public:
  static MadeDirs& Get() {
    static MadeDirs* const dirs = new MadeDirs;
    return *dirs;
  }
  void Add(std::string path) {
    MutexLock lock(&mu_);
    paths_.push_back(std::move(path));
  }
  std::vector<std::string> Take() {
    MutexLock lock(&mu_);
    return std::exchange(paths_, {});
  }

 private:
  Mutex mu_;
  std::vector<std::string> paths_ ABSL_GUARDED_BY(mu_);
};

std::string Make(const std::string& parent, const std::string& name) {
  std::string path = JoinPath(parent, absl::StrCat(name, ".XXXXXX"));
  if (::mkdtemp(path.data()) == nullptr) {
    FAIL("mkdtemp " << path << ": " << std::strerror(errno));
  }
  MadeDirs::Get().Add(path);
  return path;
}

// Removes a passed test case's directories; names a failed one's.
class TempDirCleaner : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    const bool passed = stats.totals.assertions.allOk() && !stats.aborting;
    for (const std::string& dir : MadeDirs::Get().Take()) {
      if (!PathExists(dir)) continue;  // the test removed it itself
      if (!passed) {
        std::fprintf(stderr, "kept %s (test case \"%s\" failed)\n", dir.c_str(),
                     stats.testInfo.name.c_str());
        continue;
      }
      const absl::Status removed = RemoveTree(dir);
      if (!removed.ok()) {
        std::fprintf(stderr, "cannot remove %s: %s\n", dir.c_str(), removed.ToString().c_str());
      }
    }
  }
};

CATCH_REGISTER_LISTENER(TempDirCleaner)

}  // namespace

std::string TempDir() {
  const char* bazel_tmp = std::getenv("TEST_TMPDIR");
  return Make(bazel_tmp != nullptr ? bazel_tmp : "/tmp", "zcc_test");
}

std::string ShortTempDir(const std::string& tag) { return Make("/tmp", absl::StrCat("zcc-", tag)); }

std::string TempDirUnder(const std::string& parent) { return Make(parent, "zcc_test"); }

}  // namespace zcc::testing
