#include "storage/s3/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <pugixml.hpp>
#include <random>
#include <set>
#include <utility>
#include <zlib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace zcc::storage::s3 {
namespace {

// The most of an error or listing body kept in memory (a misbehaving server
// cannot make zccd buffer more).
constexpr size_t kMaxReplyBytes = 16 << 20;
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);
// The longest one attempt may take, whatever it moves (a store or proxy that
// trickles a byte now and then, above the stall limit, never ends one
// otherwise): 15 minutes, and a second more for each 256 KiB it carries (a
// part of 128 MiB at 1 MB/s takes about 2 minutes).
constexpr absl::Duration kMaxAttempt = absl::Minutes(15);
constexpr uint64_t kAttemptBytesPerSecond = 256 << 10;


void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

// What the store's error body says, when it is S3's <Error> document.
struct StoreError {
  std::string code;
  std::string message;
};

StoreError ParseError(const std::string& body) {
  StoreError e;
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) return e;
  pugi::xml_node err = doc.child("Error");
  e.code = err.child_value("Code");
  e.message = err.child_value("Message");
  return e;
}

bool RetryableCode(const std::string& code) {
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" ||
         code == "ServiceUnavailable" || code == "RequestTimeTooSkewed";
}

bool RetryableCurl(CURLcode code) {
  switch (code) {
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_LOGIN_DENIED:
    case CURLE_WRITE_ERROR:  // our callback refused the reply
    case CURLE_OUT_OF_MEMORY:
    case CURLE_NOT_BUILT_IN:
    case CURLE_UNKNOWN_OPTION:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_TOO_MANY_REDIRECTS:
    case CURLE_FILESIZE_EXCEEDED:
      return false;
    default:
      return true;
  }
}

absl::Time ParseHttpDate(const std::string& text) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime("%a, %d %b %Y %H:%M:%S GMT", text, absl::UTCTimeZone(), &t, &err)) return t;
  return absl::InfinitePast();
}

absl::Time ParseIsoTime(const std::string& text) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", text, absl::UTCTimeZone(), &t, &err)) return t;
  return absl::InfinitePast();
}

}  // namespace

std::string Crc32Checksum(absl::string_view bytes) {
  const uLong crc = crc32_z(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  const char be[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                      static_cast<char>(crc >> 8), static_cast<char>(crc)};
  return absl::Base64Escape(absl::string_view(be, 4));
}

struct S3Client::Request {
  std::string method;  // GET, PUT, HEAD, DELETE, POST
  std::string bucket;
  std::string key;
  std::string query;  // canonical: names sorted, values encoded; no '?'
  absl::string_view body;
  std::vector<std::string> headers;  // "Name: value"
  void* dst = nullptr;  // a GET's bytes go here (dst_size at most) ...
  size_t dst_size = 0;
  // ... or, without dst, into Response::body.

  std::string What() const {
    return absl::StrCat(method, " s3://", bucket, key.empty() ? "" : "/", key);
  }
};

struct S3Client::Response {
  long http = 0;
  std::string body;
  size_t dst_bytes = 0;
  std::map<std::string, std::string> headers;  // names lower-cased

  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One easy handle: its connections are kept alive between the requests it
// sends (curl_easy_reset keeps them).
class S3Client::Connection {
 public:
  Connection() : curl_(curl_easy_init()) {}
  ~Connection() {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  CURL* get() const { return curl_; }

 private:
  CURL* const curl_;
};

namespace {

struct Transfer {
  CURL* curl = nullptr;
  void* dst = nullptr;
  size_t dst_size = 0;
  size_t dst_bytes = 0;
  std::string* body = nullptr;
  std::map<std::string, std::string>* headers = nullptr;
  bool overflow = false;
};

size_t OnData(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  long http = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &http);
  // Only a success's bytes go to the caller's memory; an error's to the body.
  if (t->dst != nullptr && http >= 200 && http < 300) {
    if (t->dst_bytes + n > t->dst_size) {
      t->overflow = true;
      return 0;  // more than was asked for: refused
    }
    std::memcpy(static_cast<char*>(t->dst) + t->dst_bytes, data, n);
    t->dst_bytes += n;
    return n;
  }
  if (t->body->size() + n > kMaxReplyBytes) {
    t->overflow = true;
    return 0;
  }
  t->body->append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->headers->clear();  // a new response (after 100 Continue, a redirect)
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;
  (*t->headers)[Lower(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
      std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  return n;
}

}  // namespace

S3Client::S3Client(Endpoint endpoint, Credentials credentials)
    : endpoint_(std::move(endpoint)),
      credentials_(std::move(credentials)),
      sigv4_(absl::StrCat("aws:amz:", endpoint_.region, ":s3")) {
  InitCurlOnce();
}

S3Client::~S3Client() = default;

uint64_t S3Client::requests() const {
  zcc::MutexLock lock(&mu_);
  return requests_;
}

uint64_t S3Client::retries() const {
  zcc::MutexLock lock(&mu_);
  return retries_;
}

std::unique_ptr<S3Client::Connection> S3Client::TakeConnection() {
  {
    zcc::MutexLock lock(&mu_);
    ++requests_;
    if (!idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return std::make_unique<Connection>();
}

void S3Client::ReturnConnection(std::unique_ptr<Connection> connection) {
  zcc::MutexLock lock(&mu_);
  idle_.push_back(std::move(connection));
}

std::string UriEncode(absl::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string S3Client::Url(const std::string& bucket, const std::string& key,
                          const std::string& query) const {
  std::string base(absl::StripSuffix(endpoint_.url, "/"));
  std::string url;
  if (endpoint_.path_style) {
    url = absl::StrCat(base, "/", UriEncode(bucket, false));
  } else {
    const size_t scheme = base.find("://");
    url = scheme == std::string::npos
              ? absl::StrCat(bucket, ".", base)
              : absl::StrCat(base.substr(0, scheme + 3), bucket, ".", base.substr(scheme + 3));
  }
  if (!key.empty() || !endpoint_.path_style) absl::StrAppend(&url, "/", UriEncode(key, true));
  if (!query.empty()) absl::StrAppend(&url, "?", query);
  return url;
}

absl::StatusOr<S3Client::Response> S3Client::SendOnce(const Request& req, bool* retryable) {
  *retryable = false;
  std::unique_ptr<Connection> conn = TakeConnection();
  if (conn->get() == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  CURL* c = conn->get();
  curl_easy_reset(c);
  Response resp;
  Transfer t;
  t.curl = c;
  t.dst = req.dst;
  t.dst_size = req.dst_size;
  t.body = &resp.body;
  t.headers = &resp.headers;
  char errbuf[CURL_ERROR_SIZE] = {};

  const std::string url = Url(req.bucket, req.key, req.query);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(c, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  curl_easy_setopt(c, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(endpoint_.connect_timeout)));
  // A transfer that moves under 1 byte/s for stall_timeout is abandoned.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   std::max<long>(1, absl::ToInt64Seconds(endpoint_.stall_timeout)));
  const uint64_t carried = std::max<uint64_t>(req.body.size(), req.dst_size);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(
                       kMaxAttempt + absl::Seconds(carried / kAttemptBytesPerSecond))));
  // The key as given: no "." or ".." segment is taken out of it (S3Storage
  // refuses paths with them).
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
  if (!endpoint_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, endpoint_.ca_file.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);

  // The payload is not hashed into the signature (UNSIGNED-PAYLOAD, which S3
  // accepts): its integrity is zcc's per-tensor XXH3 end to end.
  struct curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!credentials_.session_token.empty()) {
    headers = curl_slist_append(
        headers, absl::StrCat("x-amz-security-token: ", credentials_.session_token).c_str());
  }
  for (const std::string& h : req.headers) headers = curl_slist_append(headers, h.c_str());
  if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT" || req.method == "POST") {
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    // A body over 1 MiB is announced with "Expect: 100-continue"; send it
    // without waiting for the store's go-ahead (a round trip per part).
    curl_easy_setopt(c, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    const std::string why = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    // The connection is dropped with the handle: it may be half-used.
    *retryable = RetryableCurl(rc) && !t.overflow;
    return t.overflow ? absl::DataLossError(
                            absl::StrCat(req.What(), ": the reply is larger than asked for"))
                      : absl::UnavailableError(absl::StrCat(req.What(), ": ", why));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.http);
  resp.dst_bytes = t.dst_bytes;
  ReturnConnection(std::move(conn));
  return resp;
}

namespace {

constexpr char kStoreErrorCodeUrl[] = "type.zcc/storage.s3.StoreErrorCode";

// The status of a reply that is not a success, by its HTTP status and the
// store's error; `retry` says whether it may be retried.
absl::Status StatusOfReply(const std::string& what, long http, const StoreError& e, bool* retry) {
  // (A HEAD's reply has no body: only its status says what went wrong.)
  const std::string detail =
      e.code.empty() ? absl::StrCat("HTTP ", http, http == 403 ? " Forbidden" : "")
                     : absl::StrCat(e.code, e.message.empty() ? "" : ": ", e.message, " (HTTP ",
                                    http, ")");
  const std::string msg = absl::StrCat(what, ": ", detail);
  *retry = http >= 500 || http == 429 || RetryableCode(e.code);
  if (*retry) return absl::UnavailableError(msg);
  if (http == 404 || e.code == "NoSuchKey" || e.code == "NoSuchBucket" || e.code == "NoSuchUpload") {
    return absl::NotFoundError(msg);
  }
  if (http == 401 || http == 403) {
    return absl::PermissionDeniedError(
        absl::StrCat(msg, "; check the credentials and the bucket's policy"));
  }
  if (http == 412 || http == 409) return absl::FailedPreconditionError(msg);
  if (http == 416) return absl::OutOfRangeError(msg);
  return absl::InvalidArgumentError(msg);
}

// The same with the store's error code attached (StoreErrorCode).
absl::Status ErrorOf(const std::string& what, long http, const std::string& body, bool* retry) {
  const StoreError e = ParseError(body);
  absl::Status status = StatusOfReply(what, http, e, retry);
  if (!e.code.empty()) status.SetPayload(kStoreErrorCodeUrl, absl::Cord(e.code));
  return status;
}

}  // namespace

std::string StoreErrorCode(const absl::Status& status) {
  const auto code = status.GetPayload(kStoreErrorCodeUrl);  // absl::optional<absl::Cord>
  return code.has_value() ? std::string(*code) : std::string();
}

absl::StatusOr<S3Client::Response> S3Client::Send(const Request& req, int* attempts) {
  const absl::Time deadline = absl::Now() + endpoint_.retry_deadline;
  absl::Duration backoff = kFirstBackoff;
  thread_local std::mt19937_64 rng(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    if (attempts != nullptr) *attempts = attempt;
    bool retry = false;
    absl::StatusOr<Response> r = SendOnce(req, &retry);
    absl::Status error;
    if (r.ok()) {
      if (r->http >= 200 && r->http < 300) return r;
      error = ErrorOf(req.What(), r->http, r->body, &retry);
    } else {
      error = r.status();
    }
    if (!retry) return error;
    // Full jitter: a random wait up to the backoff, which doubles.
    std::uniform_int_distribution<int64_t> pick(0, absl::ToInt64Microseconds(backoff));
    const absl::Duration wait = absl::Microseconds(pick(rng));
    if (absl::Now() + wait > deadline) {
      absl::Status gave_up(error.code(), absl::StrCat(error.message(), " (gave up after ",
                                                      attempt, " attempts)"));
      error.ForEachPayload([&gave_up](absl::string_view url, const absl::Cord& payload) {
        gave_up.SetPayload(url, payload);
      });
      return gave_up;
    }
    {
      zcc::MutexLock lock(&mu_);
      ++retries_;
    }
    absl::SleepFor(wait);  // backoff before a retry: nothing can wake it sooner
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::StatusOr<std::string> S3Client::Put(const std::string& bucket, const std::string& key,
                                          absl::string_view body, const PutCondition& condition) {
  Request req{"PUT", bucket, key, "", body};
  req.headers.push_back("x-amz-checksum-crc32: " + Crc32Checksum(body));
  if (condition.if_match.has_value()) req.headers.push_back("If-Match: " + *condition.if_match);
  if (condition.if_none_match) req.headers.push_back("If-None-Match: *");
  int attempts = 0;
  absl::StatusOr<Response> resp = Send(req, &attempts);
  if (absl::IsFailedPrecondition(resp.status()) && attempts > 1 &&
      (condition.if_match.has_value() || condition.if_none_match)) {
    // An attempt whose answer was lost may have written it: the retry then
    // finds its own write in the way. What the key holds says.
    std::string held(body.size(), '\0');
    Request get{"GET", bucket, key};
    get.dst = held.data();
    get.dst_size = held.size();
    absl::StatusOr<Response> read = Send(get);
    if (read.ok() && read->dst_bytes == body.size() && held == body) {
      return read->Header("etag");  // (the version read: the one written)
    }
  }
  ZCC_RETURN_IF_ERROR(resp.status());
  return resp->Header("etag");
}

absl::StatusOr<size_t> S3Client::GetRange(const std::string& bucket, const std::string& key,
                                          uint64_t offset, void* dst, size_t n) {
  if (n == 0) return 0;
  Request req{"GET", bucket, key};
  req.headers.push_back(absl::StrCat("Range: bytes=", offset, "-", offset + n - 1));
  req.dst = dst;
  req.dst_size = n;
  absl::StatusOr<Response> resp = Send(req);
  if (absl::IsOutOfRange(resp.status())) {
    return 0;  // 416: the range starts at or past the end
  }
  if (!resp.ok()) return resp.status();
  if (resp->http == 200 && offset != 0) {
    // A store that ignored the range sent the object from its start.
    return absl::DataLossError(absl::StrCat(req.What(), ": the store ignored the byte range"));
  }
  return resp->dst_bytes;
}

absl::StatusOr<ObjectInfo> S3Client::Head(const std::string& bucket, const std::string& key) {
  Request req{"HEAD", bucket, key};
  ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
  ObjectInfo info;
  info.key = key;
  if (!absl::SimpleAtoi(resp.Header("content-length"), &info.size)) {
    return absl::DataLossError(absl::StrCat(req.What(), ": no Content-Length in the reply"));
  }
  info.etag = resp.Header("etag");
  info.modified = ParseHttpDate(resp.Header("last-modified"));
  return info;
}

absl::StatusOr<Listing> S3Client::List(const std::string& bucket, const std::string& prefix,
                                       const std::string& delimiter, size_t max_keys) {
  Listing out;
  std::string token;
  std::set<std::string> tokens;  // seen: a store whose tokens cycle ends no loop
  while (true) {
    std::vector<std::string> q;
    if (!token.empty()) q.push_back("continuation-token=" + UriEncode(token, false));
    if (!delimiter.empty()) q.push_back("delimiter=" + UriEncode(delimiter, false));
    q.push_back("list-type=2");
    if (max_keys > 0) q.push_back(absl::StrCat("max-keys=", max_keys));
    q.push_back("prefix=" + UriEncode(prefix, false));
    Request req{"GET", bucket, "", absl::StrJoin(q, "&")};
    ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
    pugi::xml_document doc;
    if (!doc.load_buffer(resp.body.data(), resp.body.size())) {
      return absl::DataLossError(absl::StrCat(req.What(), " list: the reply is not XML"));
    }
    // What the listing says is trusted no further than it checks out: a
    // page taken for the whole (a removal that leaves objects, a directory
    // aged by half its objects) or a token that never ends the loop would
    // do harm.
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(req.What(), " list: ", why));
    };
    pugi::xml_node root = doc.child("ListBucketResult");
    if (!root) return bad("the reply holds no ListBucketResult");
    for (pugi::xml_node c : root.children("Contents")) {
      ObjectInfo o;
      o.key = c.child_value("Key");
      o.etag = c.child_value("ETag");
      if (!absl::SimpleAtoi(c.child_value("Size"), &o.size)) {
        return bad(absl::StrCat("the size of '", o.key, "' is not a number"));
      }
      o.modified = ParseIsoTime(c.child_value("LastModified"));
      if (o.modified == absl::InfinitePast()) {
        return bad(absl::StrCat("the time of '", o.key, "' does not parse"));
      }
      out.objects.push_back(std::move(o));
    }
    for (pugi::xml_node p : root.children("CommonPrefixes")) {
      out.prefixes.emplace_back(p.child_value("Prefix"));
    }
    const std::string next = root.child_value("NextContinuationToken");
    const std::string truncated = root.child_value("IsTruncated");
    if (truncated != "true" && truncated != "false") {
      return bad("a page does not say whether more follow (IsTruncated)");
    }
    if (truncated == "false" || (max_keys > 0 && out.objects.size() >= max_keys)) break;
    if (next.empty()) return bad("a page said more follows but gave no continuation token");
    if (!tokens.insert(next).second) return bad("a continuation token came again");
    token = next;
  }
  return out;
}

absl::Status S3Client::Delete(const std::string& bucket, const std::string& key) {
  absl::StatusOr<Response> resp = Send(Request{"DELETE", bucket, key});
  // A key that is not there is deleted already; a bucket that is not there
  // is an error (the root is misconfigured).
  if (absl::IsNotFound(resp.status()) && StoreErrorCode(resp.status()) != "NoSuchBucket") {
    return absl::OkStatus();
  }
  return resp.status();
}

absl::StatusOr<std::string> S3Client::CreateMultipart(const std::string& bucket,
                                                      const std::string& key) {
  Request req{"POST", bucket, key, "uploads="};
  req.headers.push_back("x-amz-checksum-algorithm: CRC32");
  ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
  pugi::xml_document doc;
  doc.load_buffer(resp.body.data(), resp.body.size());
  std::string id = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
  if (id.empty()) return absl::DataLossError(absl::StrCat(req.What(), ": no UploadId in the reply"));
  return id;
}

absl::StatusOr<PartReceipt> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, int number,
                                                 absl::string_view body) {
  Request req{"PUT", bucket, key,
              absl::StrCat("partNumber=", number, "&uploadId=", UriEncode(upload_id, false)), body};
  PartReceipt part;
  part.crc32 = Crc32Checksum(body);
  req.headers.push_back("x-amz-checksum-crc32: " + part.crc32);
  ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
  part.etag = resp.Header("etag");
  if (part.etag.empty()) {
    return absl::DataLossError(absl::StrCat(req.What(), ": part without an ETag"));
  }
  return part;
}

absl::StatusOr<std::string> S3Client::CompleteMultipart(const std::string& bucket,
                                                        const std::string& key,
                                                        const std::string& upload_id,
                                                        const std::vector<PartReceipt>& parts) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  for (size_t i = 0; i < parts.size(); ++i) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber").text().set(static_cast<unsigned>(i + 1));
    part.append_child("ETag").text().set(parts[i].etag.c_str());
    part.append_child("ChecksumCRC32").text().set(parts[i].crc32.c_str());
  }
  struct Writer : pugi::xml_writer {
    std::string out;
    void write(const void* data, size_t size) override {
      out.append(static_cast<const char*>(data), size);
    }
  } writer;
  doc.save(writer, "", pugi::format_raw);
  Request req{"POST", bucket, key, "uploadId=" + UriEncode(upload_id, false), writer.out};
  ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
  // S3 may answer 200 and report the failure in the body.
  pugi::xml_document reply;
  reply.load_buffer(resp.body.data(), resp.body.size());
  if (reply.child("Error")) {
    bool retry = false;
    return ErrorOf(req.What(), 500, resp.body, &retry);
  }
  // Nor is a 200 without the result a completion: S3 sends the status at
  // once and the result when the object is whole, and a reply cut between
  // them (or a proxy's page) says nothing of whether it is.
  std::string etag = reply.child("CompleteMultipartUploadResult").child_value("ETag");
  if (etag.empty()) {
    return absl::UnavailableError(
        absl::StrCat(req.What(), ": the store's reply holds no CompleteMultipartUploadResult "
                                 "with an ETag; the upload is not known to be complete"));
  }
  return etag;
}

absl::Status S3Client::AbortMultipart(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  absl::StatusOr<Response> resp =
      Send(Request{"DELETE", bucket, key, "uploadId=" + UriEncode(upload_id, false)});
  if (absl::IsNotFound(resp.status())) return absl::OkStatus();  // gone already
  return resp.status();
}

absl::StatusOr<std::vector<MultipartUpload>> S3Client::ListMultipart(const std::string& bucket,
                                                                     const std::string& prefix) {
  std::vector<MultipartUpload> out;
  std::string key_marker, id_marker;
  std::set<std::pair<std::string, std::string>> markers;  // seen
  while (true) {
    std::vector<std::string> q;
    if (!key_marker.empty()) q.push_back("key-marker=" + UriEncode(key_marker, false));
    q.push_back("prefix=" + UriEncode(prefix, false));
    if (!id_marker.empty()) q.push_back("upload-id-marker=" + UriEncode(id_marker, false));
    q.push_back("uploads=");
    Request req{"GET", bucket, "", absl::StrJoin(q, "&")};
    ZCC_ASSIGN_OR_RETURN(Response resp, Send(req));
    pugi::xml_document doc;
    if (!doc.load_buffer(resp.body.data(), resp.body.size())) {
      return absl::DataLossError(absl::StrCat(req.What(), " uploads: the reply is not XML"));
    }
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(req.What(), " uploads: ", why));
    };
    pugi::xml_node root = doc.child("ListMultipartUploadsResult");
    if (!root) return bad("the reply holds no ListMultipartUploadsResult");
    for (pugi::xml_node u : root.children("Upload")) {
      // (An upload of unknown age is never taken for an old one to abort.)
      const absl::Time initiated = ParseIsoTime(u.child_value("Initiated"));
      if (initiated == absl::InfinitePast()) {
        return bad(absl::StrCat("the time of the upload of '", u.child_value("Key"),
                                "' does not parse"));
      }
      out.push_back({u.child_value("Key"), u.child_value("UploadId"), initiated});
    }
    const std::string truncated = root.child_value("IsTruncated");
    if (truncated != "true" && truncated != "false") {
      return bad("a page does not say whether more follow (IsTruncated)");
    }
    if (truncated == "false") break;
    const std::string next_key = root.child_value("NextKeyMarker");
    const std::string next_id = root.child_value("NextUploadIdMarker");
    if (next_key.empty() && next_id.empty()) {
      return bad("a page said more follows but gave no markers");
    }
    if (!markers.insert({next_key, next_id}).second) return bad("the markers came again");
    key_marker = next_key;
    id_marker = next_id;
  }
  return out;
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  std::string body;
  if (endpoint_.region != "us-east-1") {
    body = absl::StrCat(
        "<CreateBucketConfiguration><LocationConstraint>", endpoint_.region,
        "</LocationConstraint></CreateBucketConfiguration>");
  }
  return Send(Request{"PUT", bucket, "", "", body}).status();
}

absl::StatusOr<S3Url> ParseS3Url(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an s3:// URL"));
  }
  const size_t slash = rest.find('/');
  S3Url out;
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) {
    absl::string_view prefix = rest.substr(slash + 1);
    while (absl::ConsumeSuffix(&prefix, "/")) {
    }
    out.prefix = std::string(prefix);
  }
  // S3's bucket naming rules: 3-63 of lower-case letters, digits, '.', '-'.
  const bool valid_bucket =
      out.bucket.size() >= 3 && out.bucket.size() <= 63 &&
      std::all_of(out.bucket.begin(), out.bucket.end(), [](char c) {
        return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-';
      });
  if (!valid_bucket) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "': '", out.bucket, "' is not a valid bucket name"));
  }
  if (absl::StrContains(out.prefix, "//")) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "': empty path segment"));
  }
  return out;
}

}  // namespace zcc::storage::s3
