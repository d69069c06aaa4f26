#include "tests/s3_test_server.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace zcc::testing {

absl::StatusOr<std::string> S3Python() {
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
  return python;
}

absl::StatusOr<S3TestServer> StartS3TestServer(const std::string& log_dir,
                                               const std::vector<std::string>& wrapper,
                                               const std::string& host) {
  auto python = S3Python();
  if (!python.ok()) return python.status();
  S3TestServer s;
  std::vector<std::string> argv = wrapper;
  for (std::string a : {*python, Runfile("tools/s3/test_server.py"), std::string("--host"), host}) {
    argv.push_back(std::move(a));
  }
  s.process = std::make_unique<Subprocess>(std::move(argv),
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

absl::StatusOr<S3FaultProxy> StartS3FaultProxy(const std::string& log_dir,
                                               const std::string& upstream, int slowdown,
                                               int cut) {
  static std::atomic<int> proxies{0};  // a log of its own each
  auto python = S3Python();
  if (!python.ok()) return python.status();
  S3FaultProxy p;
  p.process = std::make_unique<Subprocess>(
      std::vector<std::string>{*python, Runfile("tools/s3/fault_proxy.py"), "--upstream", upstream,
                               "--slowdown", absl::StrCat(slowdown), "--cut", absl::StrCat(cut)},
      absl::StrCat(log_dir, "/s3_fault_proxy.", proxies.fetch_add(1), ".log"));
  if (!p.process->WaitForOutput("ready", absl::Seconds(30))) {
    return absl::UnavailableError(
        absl::StrCat("the S3 fault proxy did not start:\n", p.process->Output()));
  }
  p.endpoint = p.process->Values()["endpoint"];
  return p;
}

}  // namespace zcc::testing
