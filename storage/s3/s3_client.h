// S3Client: the requests zcc makes of an S3-compatible object store (AWS S3,
// MinIO, Ceph's RADOS Gateway, moto), over HTTP(S) with libcurl, which signs
// each request with AWS Signature Version 4 itself (CURLOPT_AWS_SIGV4). The
// replies' XML is read with pugixml. Nothing here writes HTTP or signatures
// by hand.
//
// Each request is retried with exponential backoff and full jitter while the
// store answers 5xx, SlowDown or RequestTimeout, or the connection fails or
// times out, until the retry deadline; other errors return at once, mapped to
// absl codes: NotFound (no such key or bucket), PermissionDenied (wrong or
// unknown credentials, access denied), FailedPrecondition (a conditional
// write whose condition failed). Messages name the request and the store's
// error code, never a credential.
//
// Thread-safety: thread-safe; requests from many threads run at once, each on
// a pooled connection (kept alive between requests).
// Ownership: owns its connections.
#ifndef ZCC_STORAGE_S3_S3_CLIENT_H_
#define ZCC_STORAGE_S3_S3_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "storage/s3/credentials.h"

namespace zcc::storage::s3 {

struct Endpoint {
  // Scheme, host and port: "https://s3.us-east-1.amazonaws.com",
  // "http://127.0.0.1:9000".
  std::string url;
  std::string region = "us-east-1";
  // Path-style addressing (url/bucket/key), what MinIO, Ceph and moto
  // expect; false for virtual-hosted style (bucket.host/key).
  bool path_style = true;
  absl::Duration connect_timeout = absl::Seconds(10);
  // A request that moves no byte for this long is abandoned (and retried).
  absl::Duration stall_timeout = absl::Seconds(30);
  // How long one request may keep being retried.
  absl::Duration retry_deadline = absl::Seconds(60);
  // A CA bundle for https (default: the system's).
  std::string ca_file;
};

// The CRC32 of `bytes` (zlib's, the IEEE polynomial), big-endian and
// base64: S3's x-amz-checksum-crc32.
std::string Crc32Checksum(absl::string_view bytes);

// An uploaded part: its ETag, and the CRC32 of its bytes (base64, as S3's
// x-amz-checksum-crc32) that the store checked on arrival.
struct PartReceipt {
  std::string etag;
  std::string crc32;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // with its quotes, as the store sends it
  absl::Time modified;
};

struct Listing {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> prefixes;  // common prefixes (with a delimiter)
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
  absl::Time initiated;
};

// Conditions of a PUT (S3's conditional writes).
struct PutCondition {
  std::optional<std::string> if_match;  // the ETag the object must have now
  bool if_none_match = false;           // the object must not exist
};

class S3Client {
 public:
  S3Client(Endpoint endpoint, Credentials credentials);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const Endpoint& endpoint() const { return endpoint_; }

  // Whole-object PUT; returns the new ETag.
  absl::StatusOr<std::string> Put(const std::string& bucket, const std::string& key,
                                  absl::string_view body, const PutCondition& condition = {});
  // Up to `n` bytes at `offset` into `dst`; fewer at the end, 0 past it.
  absl::StatusOr<size_t> GetRange(const std::string& bucket, const std::string& key,
                                  uint64_t offset, void* dst, size_t n);
  absl::StatusOr<ObjectInfo> Head(const std::string& bucket, const std::string& key);
  // Every object under `prefix` (all pages); with a delimiter, the common
  // prefixes instead of what lies under them. At most `max_keys` objects
  // when it is not 0.
  absl::StatusOr<Listing> List(const std::string& bucket, const std::string& prefix,
                               const std::string& delimiter, size_t max_keys = 0);
  // OK when the object is gone, whether or not it was there.
  absl::Status Delete(const std::string& bucket, const std::string& key);

  // An upload whose parts each carry their CRC32 (the store checks each
  // part's bytes as they arrive, and the object's composite checksum).
  absl::StatusOr<std::string> CreateMultipart(const std::string& bucket, const std::string& key);
  // Part `number` (1-based) of an upload, sent with its CRC32.
  absl::StatusOr<PartReceipt> UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int number,
                                         absl::string_view body);
  // `parts` in part order (part i + 1 is parts[i]); returns the object's ETag.
  absl::StatusOr<std::string> CompleteMultipart(const std::string& bucket, const std::string& key,
                                                const std::string& upload_id,
                                                const std::vector<PartReceipt>& parts);
  absl::Status AbortMultipart(const std::string& bucket, const std::string& key,
                              const std::string& upload_id);
  absl::StatusOr<std::vector<MultipartUpload>> ListMultipart(const std::string& bucket,
                                                             const std::string& prefix);
  absl::Status CreateBucket(const std::string& bucket);

  // Requests sent, attempts retried (for tests and metrics).
  uint64_t requests() const;
  uint64_t retries() const;

 private:
  struct Request;
  struct Response;
  class Connection;

  // Sends `request`, retrying what may be retried, until the deadline;
  // `attempts` (may be null): how many it took.
  absl::StatusOr<Response> Send(const Request& request, int* attempts = nullptr);
  // One attempt; on a transport error, *retryable says whether to try again.
  absl::StatusOr<Response> SendOnce(const Request& request, bool* retryable);
  std::string Url(const std::string& bucket, const std::string& key,
                  const std::string& query) const;
  std::unique_ptr<Connection> TakeConnection();
  void ReturnConnection(std::unique_ptr<Connection> connection);

  const Endpoint endpoint_;
  const Credentials credentials_;
  const std::string sigv4_;  // CURLOPT_AWS_SIGV4's provider:region:service
  mutable zcc::Mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mu_);
  uint64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
};

// The store's error code ("NoSuchBucket", "NoSuchKey", ...) an S3Client
// status carries, or "" for none (a transport error, a reply without a body).
std::string StoreErrorCode(const absl::Status& status);

// What an S3 URI names: s3://bucket/prefix (the prefix without slashes at
// either end; may be empty). InvalidArgument for anything else.
struct S3Url {
  std::string bucket;
  std::string prefix;
};
absl::StatusOr<S3Url> ParseS3Url(absl::string_view url);

// AWS's URI encoding (RFC 3986 unreserved characters kept, the rest %XX),
// keeping '/' when `keep_slash` (object keys in a path).
std::string UriEncode(absl::string_view text, bool keep_slash);

}  // namespace zcc::storage::s3

#endif  // ZCC_STORAGE_S3_S3_CLIENT_H_
