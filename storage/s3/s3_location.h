// An s3:// URL opened for a command-line tool (zccctl verify and export): the
// endpoint and region from the usual AWS variables (AWS_ENDPOINT_URL_S3,
// AWS_ENDPOINT_URL, AWS_REGION, AWS_DEFAULT_REGION; ZCC_S3_ADDRESSING=path or
// virtual), credentials from LoadCredentials, and a Storage over the URL's
// bucket in which the URL's key is the absolute path path().
//
// Thread-safety: as S3Storage. Ownership: owns its client and storage.
#ifndef ZCC_STORAGE_S3_S3_LOCATION_H_
#define ZCC_STORAGE_S3_S3_LOCATION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_storage.h"

namespace zcc::storage::s3 {

// The endpoint the environment names: AWS S3 in the region (virtual-hosted
// addressing) unless AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL names another
// store (path-style addressing, what MinIO, Ceph and moto expect, unless
// ZCC_S3_ADDRESSING=virtual). Its CA bundle is AWS_CA_BUNDLE, else the
// system's (SystemCaBundle). InvalidArgument for a bad ZCC_S3_ADDRESSING or
// an AWS_CA_BUNDLE that names no readable file.
absl::StatusOr<Endpoint> EndpointFromEnvironment(const EnvLookup& env = nullptr);

// The first of the places Linux distributions keep their CA bundle that
// exists: /etc/ssl/certs/ca-certificates.crt (Debian, Ubuntu, Arch),
// /etc/pki/tls/certs/ca-bundle.crt (RHEL, Fedora), /etc/ssl/ca-bundle.pem
// (SUSE), /etc/ssl/cert.pem (Alpine); empty when none does (libcurl's built-in
// default then applies). zcc's wheel carries a libcurl built on Debian, whose
// built-in path other distributions lack: hence the search.
std::string SystemCaBundle();

class S3Location {
 public:
  // InvalidArgument for a URL that is not s3://bucket[/key].
  static absl::StatusOr<std::unique_ptr<S3Location>> Open(absl::string_view url,
                                                          Endpoint endpoint,
                                                          Credentials credentials);

  S3Storage& storage() { return *storage_; }
  // The URL's key as a path of storage(): "/" + key.
  const std::string& path() const { return path_; }
  // A path of storage() as an s3:// URL again, for messages.
  std::string Url(const std::string& path) const;

 private:
  S3Location() = default;
  std::string bucket_;
  std::string path_;
  std::unique_ptr<S3Client> client_;
  std::unique_ptr<S3Storage> storage_;
};

}  // namespace zcc::storage::s3

#endif  // ZCC_STORAGE_S3_S3_LOCATION_H_
