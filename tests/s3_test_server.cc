#include "tests/s3_test_server.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace zcc::testing {

absl::StatusOr<S3TestServer> StartS3TestServer(const std::string& log_dir) {
  const char* venv = std::getenv("ZCC_S3_VENV");
  const char* home = std::getenv("HOME");
  const std::string python =
      venv != nullptr && *venv != '\0'
          ? absl::StrCat(venv, "/bin/python")
          : absl::StrCat(home != nullptr ? home : "", "/.cache/zcc/s3-venv/bin/python");
  if (::access(python.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no ", python, ": the S3 test server's environment is missing (tools/setup.sh makes it)"));
  }
  // The script, from the test's runfiles.
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string script =
      srcdir != nullptr ? absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "zcc",
                                       "/tools/s3/test_server.py")
                        : "tools/s3/test_server.py";
  S3TestServer s;
  s.process = std::make_unique<Subprocess>(std::vector<std::string>{python, script},
                                           absl::StrCat(log_dir, "/s3_test_server.log"));
  if (!s.process->WaitForOutput("ready", absl::Seconds(90))) {
    return absl::UnavailableError(
        absl::StrCat("the S3 test server did not start:\n", s.process->Output()));
  }
  auto values = s.process->Values();
  s.endpoint = values["endpoint"];
  s.access_key = values["access_key"];
  s.secret_key = values["secret_key"];
  s.bucket = values["bucket"];
  if (s.endpoint.empty() || s.access_key.empty() || s.secret_key.empty() || s.bucket.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the S3 test server said too little:\n", s.process->Output()));
  }
  return s;
}

}  // namespace zcc::testing
