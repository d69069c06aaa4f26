// The S3 client trusts a reply no further than it checks out. A listing
// that says more follows without saying where, that repeats its
// continuation token, or that is XML but not a listing, is an error, never a
// page taken for the whole listing nor a loop without end. A multipart
// upload is complete only when the store's reply says so with its result:
// a 200 carrying an error, or carrying nothing, is an error. The server here
// is a few lines of HTTP/1.1 answering each request with the next canned
// body, over loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_client.h"

namespace zcc::storage::s3 {
namespace {

// Answers the i-th request with bodies[min(i, last)], 200 OK, one request
// a connection; counts the requests. A canned reply that begins "HTTP/" is
// sent as it is, and kHangUp closes the connection without one (an answer
// lost on the way).
constexpr char kHangUp[] = "<hang up>";
class CannedServer {
 public:
  explicit CannedServer(std::vector<std::string> bodies) : bodies_(std::move(bodies)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~CannedServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int requests() const { return requests_; }

 private:
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      while (!absl::StrContains(request, "\r\n\r\n")) {
        const ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      // The request's body too (a reply before it is read resets the
      // connection under the client's feet).
      const size_t head = request.find("\r\n\r\n");
      const size_t length_at = absl::AsciiStrToLower(request).find("content-length: ");
      size_t length = 0;
      if (head != std::string::npos && length_at != std::string::npos && length_at < head) {
        length = std::strtoul(request.c_str() + length_at + 16, nullptr, 10);
        while (request.size() < head + 4 + length) {
          const ssize_t n = ::read(c, buf, sizeof(buf));
          if (n <= 0) break;
          request.append(buf, static_cast<size_t>(n));
        }
      }
      const int i = requests_++;
      const std::string& body = bodies_[std::min<size_t>(i, bodies_.size() - 1)];
      const std::string reply =
          absl::StartsWith(body, "HTTP/")
              ? body
              : absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n"
                             "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n",
                             body);
      if (body != kHangUp) (void)!::write(c, reply.data(), reply.size());
      ::close(c);
    }
  }

  std::vector<std::string> bodies_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

S3Client ClientOf(const CannedServer& server) {
  Endpoint e;
  e.url = server.url();
  e.retry_deadline = absl::Seconds(5);
  Credentials c;
  c.access_key_id = "AKIDEXAMPLE";
  c.secret_access_key = "secret";
  c.source = "the test";
  return S3Client(e, c);
}

std::string Page(const std::string& key, bool truncated, const std::string& token) {
  return absl::StrCat(
      "<?xml version=\"1.0\"?><ListBucketResult><Contents><Key>", key,
      "</Key><ETag>\"e\"</ETag><Size>4</Size><LastModified>2026-11-28T10:00:00.000Z"
      "</LastModified></Contents><IsTruncated>", truncated ? "true" : "false", "</IsTruncated>",
      token.empty() ? "" : absl::StrCat("<NextContinuationToken>", token,
                                        "</NextContinuationToken>"),
      "</ListBucketResult>");
}

TEST_CASE("s3 listing: pages are followed to the end") {
  CannedServer server({Page("a", true, "t1"), Page("b", true, "t2"), Page("c", false, "")});
  S3Client client = ClientOf(server);
  auto listed = client.List("bucket", "", "");
  REQUIRE(listed.ok());
  REQUIRE(listed->objects.size() == 3);
  CHECK(listed->objects[2].key == "c");
  CHECK(server.requests() == 3);
}

TEST_CASE("s3 listing: a page that says more follows without a token is an error") {
  CannedServer server({Page("a", true, "")});
  S3Client client = ClientOf(server);
  auto listed = client.List("bucket", "", "");
  CHECK(listed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(listed.status().message()), Catch::Contains("no continuation token"));
}

TEST_CASE("s3 listing: a continuation token that does not move ends the listing in an error") {
  CannedServer server({Page("a", true, "same")});  // (every page alike, for ever)
  S3Client client = ClientOf(server);
  auto listed = client.List("bucket", "", "");
  CHECK(listed.status().code() == absl::StatusCode::kDataLoss);
  CHECK(server.requests() == 2);
}

TEST_CASE("s3 listing: continuation tokens that cycle, or a page that does not say whether more "
          "follow, end the listing in an error") {
  {
    CannedServer server({Page("a", true, "t1"), Page("b", true, "t2"), Page("c", true, "t1")});
    S3Client client = ClientOf(server);
    auto listed = client.List("bucket", "", "");
    CHECK(listed.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(listed.status().message()), Catch::Contains("came again"));
    CHECK(server.requests() == 3);
  }
  CannedServer server({absl::StrReplaceAll(Page("a", false, ""),
                                           {{"<IsTruncated>false</IsTruncated>", ""}})});
  S3Client client = ClientOf(server);
  auto listed = client.List("bucket", "", "");
  CHECK(listed.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(listed.status().message()), Catch::Contains("IsTruncated"));
}

TEST_CASE("s3 conditional write: an attempt whose answer was lost, found written by the retry's "
          "refusal, is a success; another writer's bytes are not") {
  const std::string refused =
      "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  auto holding = [](const std::string& bytes) {
    return absl::StrCat("HTTP/1.1 200 OK\r\nETag: \"v2\"\r\nContent-Length: ", bytes.size(),
                        "\r\nConnection: close\r\n\r\n", bytes);
  };
  PutCondition condition;
  condition.if_match = "\"v1\"";
  {
    CannedServer server({kHangUp, refused, holding("step 20")});
    S3Client client = ClientOf(server);
    auto put = client.Put("bucket", "job/latest", "step 20", condition);
    REQUIRE(put.ok());
    CHECK(*put == "\"v2\"");
    CHECK(server.requests() == 3);
  }
  {
    CannedServer server({kHangUp, refused, holding("step 30")});
    S3Client client = ClientOf(server);
    CHECK(client.Put("bucket", "job/latest", "step 20", condition).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  // Refused at the first attempt: another writer's, nothing read back.
  CannedServer server({refused, holding("step 20")});
  S3Client client = ClientOf(server);
  CHECK(client.Put("bucket", "job/latest", "step 20", condition).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(server.requests() == 1);
}

TEST_CASE("s3 listing: a reply that is not a listing, or whose fields do not parse, is an error") {
  for (const std::string& body :
       {std::string("<?xml version=\"1.0\"?><Other/>"),
        absl::StrReplaceAll(Page("a", false, ""), {{"<Size>4", "<Size>four"}}),
        absl::StrReplaceAll(Page("a", false, ""), {{"2026-11-28T10", "yesterday"}})}) {
    INFO(body);
    CannedServer server({body});
    S3Client client = ClientOf(server);
    CHECK(client.List("bucket", "", "").status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("s3 listing: uploads under way: markers that do not move, or none, are an error") {
  const std::string page =
      "<?xml version=\"1.0\"?><ListMultipartUploadsResult><Upload><Key>k</Key><UploadId>u"
      "</UploadId><Initiated>2026-11-28T10:00:00.000Z</Initiated></Upload><IsTruncated>true"
      "</IsTruncated>";
  {
    CannedServer server({page + "<NextKeyMarker>k</NextKeyMarker><NextUploadIdMarker>u"
                                "</NextUploadIdMarker></ListMultipartUploadsResult>"});
    S3Client client = ClientOf(server);
    CHECK(client.ListMultipart("bucket", "").status().code() == absl::StatusCode::kDataLoss);
    CHECK(server.requests() == 2);
  }
  CannedServer server({page + "</ListMultipartUploadsResult>"});
  S3Client client = ClientOf(server);
  CHECK(client.ListMultipart("bucket", "").status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("s3 multipart: complete only when the reply holds the result") {
  const std::vector<PartReceipt> parts = {{"\"e1\"", "AAAAAA=="}, {"\"e2\"", "AAAAAA=="}};
  {
    CannedServer server({"<?xml version=\"1.0\"?><CompleteMultipartUploadResult><Bucket>b"
                         "</Bucket><Key>k</Key><ETag>\"3858f62230ac3c915f300c664312c11f-2\""
                         "</ETag></CompleteMultipartUploadResult>"});
    S3Client client = ClientOf(server);
    auto etag = client.CompleteMultipart("bucket", "k", "u", parts);
    REQUIRE(etag.ok());
    CHECK(*etag == "\"3858f62230ac3c915f300c664312c11f-2\"");
  }
  // 200 with the failure in the body (S3 reports errors found after the
  // status was sent so); 200 with no body, or a page that is not the
  // result (a reply cut short, a proxy's).
  for (const std::string& body :
       {std::string("<?xml version=\"1.0\"?><Error><Code>InvalidPart</Code><Message>One or "
                    "more of the specified parts could not be found.</Message></Error>"),
        std::string(), std::string("<html><body>gateway</body></html>"),
        std::string("<?xml version=\"1.0\"?><CompleteMultipartUploadResult><Key>k</Key>"
                    "</CompleteMultipartUploadResult>")}) {
    INFO(body);
    CannedServer server({body});
    S3Client client = ClientOf(server);
    auto etag = client.CompleteMultipart("bucket", "k", "u", parts);
    CHECK_FALSE(etag.ok());
    if (absl::StrContains(body, "InvalidPart")) {
      CHECK_THAT(std::string(etag.status().message()), Catch::Contains("InvalidPart"));
    } else {
      CHECK_THAT(std::string(etag.status().message()), Catch::Contains("not known to be complete"));
    }
  }
}

}  // namespace
}  // namespace zcc::storage::s3
