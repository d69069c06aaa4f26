#include "storage/s3/s3_location.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace zcc::storage::s3 {

std::string SystemCaBundle() {
  for (const char* path : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                           "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}) {
    if (::access(path, R_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<Endpoint> EndpointFromEnvironment(const EnvLookup& lookup) {
  const EnvLookup env = lookup ? lookup : [](const char* name) { return std::getenv(name); };
  auto get = [&env](const char* name) {
    const char* v = env(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  Endpoint e;
  e.region = get("AWS_REGION");
  if (e.region.empty()) e.region = get("AWS_DEFAULT_REGION");
  if (e.region.empty()) e.region = "us-east-1";
  e.url = get("AWS_ENDPOINT_URL_S3");
  if (e.url.empty()) e.url = get("AWS_ENDPOINT_URL");
  e.path_style = !e.url.empty();
  if (e.url.empty()) e.url = absl::StrCat("https://s3.", e.region, ".amazonaws.com");
  e.ca_file = get("AWS_CA_BUNDLE");
  if (e.ca_file.empty()) {
    e.ca_file = SystemCaBundle();
  } else if (::access(e.ca_file.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AWS_CA_BUNDLE (or the root's ca_bundle) names ", e.ca_file,
        ", which cannot be read: ", std::strerror(errno)));
  }
  const std::string addressing = get("ZCC_S3_ADDRESSING");
  if (addressing == "path") {
    e.path_style = true;
  } else if (addressing == "virtual") {
    e.path_style = false;
  } else if (!addressing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZCC_S3_ADDRESSING is '", addressing, "'; 'path' or 'virtual'"));
  }
  return e;
}

absl::StatusOr<std::unique_ptr<S3Location>> S3Location::Open(absl::string_view url,
                                                             Endpoint endpoint,
                                                             Credentials credentials) {
  ZCC_ASSIGN_OR_RETURN(S3Url parsed, ParseS3Url(url));
  std::unique_ptr<S3Location> l(new S3Location());
  l->bucket_ = parsed.bucket;
  l->path_ = absl::StrCat("/", parsed.prefix);
  l->client_ = std::make_unique<S3Client>(std::move(endpoint), std::move(credentials));
  S3StorageOptions options;
  options.bucket = parsed.bucket;
  l->storage_ = std::make_unique<S3Storage>(l->client_.get(), options);
  return l;
}

std::string S3Location::Url(const std::string& path) const {
  return absl::StrCat("s3://", bucket_, path);
}

}  // namespace zcc::storage::s3
