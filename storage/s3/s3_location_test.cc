#include "storage/s3/s3_location.h"

#include <unistd.h>

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"

namespace zcc::storage::s3 {
namespace {

EnvLookup Env(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST_CASE("endpoint: AWS S3 in the region unless the environment names another store") {
  absl::StatusOr<Endpoint> aws = EndpointFromEnvironment(Env({{"AWS_REGION", "eu-west-1"}}));
  REQUIRE_OK(aws);
  CHECK(aws->url == "https://s3.eu-west-1.amazonaws.com");
  CHECK_FALSE(aws->path_style);
  absl::StatusOr<Endpoint> minio = EndpointFromEnvironment(
      Env({{"AWS_ENDPOINT_URL", "http://10.0.0.5:9000"}, {"AWS_DEFAULT_REGION", "x"}}));
  REQUIRE_OK(minio);
  CHECK(minio->url == "http://10.0.0.5:9000");
  CHECK(minio->region == "x");
  CHECK(minio->path_style);
  absl::StatusOr<Endpoint> bad = EndpointFromEnvironment(Env({{"ZCC_S3_ADDRESSING", "up"}}));
  REQUIRE_FALSE(bad.ok());
  CHECK(absl::IsInvalidArgument(bad.status()));
}

TEST_CASE("endpoint: the CA bundle is AWS_CA_BUNDLE, else the system's, never a missing file") {
  const std::string dir = zcc::testing::TempDir();
  const std::string pem = dir + "/store-ca.pem";
  REQUIRE_OK(WriteFileAtomic(pem, "-----BEGIN CERTIFICATE-----\n"));
  absl::StatusOr<Endpoint> given = EndpointFromEnvironment(Env({{"AWS_CA_BUNDLE", pem}}));
  REQUIRE_OK(given);
  CHECK(given->ca_file == pem);

  absl::StatusOr<Endpoint> missing =
      EndpointFromEnvironment(Env({{"AWS_CA_BUNDLE", dir + "/none.pem"}}));
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsInvalidArgument(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), "none.pem"));

  // Unset: the distribution's bundle, which must exist where it is named.
  absl::StatusOr<Endpoint> system = EndpointFromEnvironment(Env({}));
  REQUIRE_OK(system);
  CHECK(system->ca_file == SystemCaBundle());
  if (!system->ca_file.empty()) CHECK(::access(system->ca_file.c_str(), R_OK) == 0);
  // This machine is Debian: its bundle is the first place searched.
  if (::access("/etc/ssl/certs/ca-certificates.crt", R_OK) == 0) {
    CHECK(system->ca_file == "/etc/ssl/certs/ca-certificates.crt");
  }
}

}  // namespace
}  // namespace zcc::storage::s3
