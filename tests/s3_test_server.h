// An S3-compatible server for tests: tools/s3/test_server.py (moto's
// standalone server with request signatures checked) in a child process,
// from the virtual environment tools/setup.sh makes ($ZCC_S3_VENV, default
// ~/.cache/zcc/s3-venv). A test that needs it fails, saying how to set it
// up, when it is missing: it is never skipped.
#ifndef ZCC_TESTS_S3_TEST_SERVER_H_
#define ZCC_TESTS_S3_TEST_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/process_harness.h"

namespace zcc::testing {

struct S3TestServer {
  std::string endpoint;    // http://127.0.0.1:PORT
  std::string access_key;  // of the server's one user, allowed everything
  std::string secret_key;
  std::string bucket;      // made for the test
  std::unique_ptr<Subprocess> process;
};

// The interpreter of the S3 test server's environment, or
// FailedPrecondition saying how to make it.
absl::StatusOr<std::string> S3Python();

// Starts one, its log in `log_dir`; waits until it serves. `wrapper`: an
// argv prefix to run it under (a test node's `ip netns exec`), serving on
// `host` (that node's address).
absl::StatusOr<S3TestServer> StartS3TestServer(const std::string& log_dir,
                                               const std::vector<std::string>& wrapper = {},
                                               const std::string& host = "127.0.0.1");

// A proxy in front of `upstream` (tools/s3/fault_proxy.py) that answers the
// first `slowdown` requests with 503 SlowDown and cuts the connection of the
// first `cut` large uploads halfway through their bodies, then forwards
// every request unchanged (signatures still verify upstream).
struct S3FaultProxy {
  std::string endpoint;
  std::unique_ptr<Subprocess> process;
};
absl::StatusOr<S3FaultProxy> StartS3FaultProxy(const std::string& log_dir,
                                               const std::string& upstream, int slowdown,
                                               int cut = 0);

}  // namespace zcc::testing

#endif  // ZCC_TESTS_S3_TEST_SERVER_H_
