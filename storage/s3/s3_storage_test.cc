// The object-store backend against a real S3-compatible server that checks
// every request's signature (moto's, started by tests/s3_test_server): the
// storage conformance suite, streamed multipart writes, uploads that are
// never completed, conditional writes, listing and removal by prefix, and a
// wrong secret refused. Credentials and URL parsing need no server.
#include "storage/s3/s3_storage.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "storage/aligned_buffer.h"
#include "storage/io_pipeline.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_client.h"
#include "storage/testing/conformance.h"
#include "storage/whole_file.h"
#include "tests/s3_test_server.h"

namespace zcc::storage::s3 {
namespace {

using ::zcc::testing::S3TestServer;

// One server for the whole test binary (it takes seconds to start).
S3TestServer& Server() {
  static S3TestServer* server = [] {
    auto s = ::zcc::testing::StartS3TestServer(::zcc::testing::TempDir());
    if (!s.ok()) FAIL(s.status().ToString());
    return new S3TestServer(*std::move(s));
  }();
  return *server;
}

Endpoint EndpointOf(const S3TestServer& s) {
  Endpoint e;
  e.url = s.endpoint;
  e.retry_deadline = absl::Seconds(10);
  return e;
}

Credentials CredentialsOf(const S3TestServer& s) {
  Credentials c;
  c.access_key_id = s.access_key;
  c.secret_access_key = s.secret_key;
  c.source = "the test server";
  return c;
}

std::string Unique(const std::string& name) {
  static int n = 0;
  return absl::StrCat(name, "-", ::getpid(), "-", ++n);
}

TEST_CASE("S3: a part's checksum is its CRC32 (IEEE), big-endian, in base64") {
  // The CRC-32 check value: "123456789" -> 0xCBF43926.
  CHECK(Crc32Checksum("123456789") == "y/Q5Jg==");
  CHECK(Crc32Checksum("") == "AAAAAA==");
}

TEST_CASE("storage conformance: S3 (moto, signatures checked)") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  S3StorageOptions options;
  options.bucket = server.bucket;
  options.prefix = Unique("conformance");
  S3Storage storage(&client, options);
  storage::testing::CheckStorageConformance(storage, "/dir");
}

TEST_CASE("S3: a wrong secret is refused by the server, and never shown") {
  S3TestServer& server = Server();
  Credentials wrong = CredentialsOf(server);
  wrong.secret_access_key = "not-the-secret-0123456789";
  S3Client client(EndpointOf(server), wrong);
  absl::StatusOr<std::string> put = client.Put(server.bucket, "refused", "x");
  REQUIRE_FALSE(put.ok());
  CHECK(put.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(put.status().message(), "SignatureDoesNotMatch"));
  CHECK_FALSE(absl::StrContains(put.status().message(), wrong.secret_access_key));
  CHECK(client.retries() == 0);  // a refusal is not retried
  // Nothing was written.
  S3Client right(EndpointOf(server), CredentialsOf(server));
  CHECK(right.Head(server.bucket, "refused").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("S3: a streamed file goes up in parts; one closed without Sync leaves nothing") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  S3StorageOptions options;
  options.bucket = server.bucket;
  options.prefix = Unique("stream");
  options.part_bytes = 5 << 20;
  options.concurrency = 3;
  S3Storage storage(&client, options);
  REQUIRE_OK(storage.MakeDirs("/d"));

  // Three parts' worth and a tail, written as a direct writer does (in
  // order, 1 MiB requests, the last block padded, then cut to size).
  const size_t size = 3 * options.part_bytes + 12345;
  AlignedBuffer data(AlignUp(size, kDirectIoAlignment));
  for (size_t i = 0; i < data.size(); ++i) data.data()[i] = static_cast<uint8_t>(i * 131 + 7);
  OpenOptions direct;
  direct.direct = true;
  direct.queue_depth = 4;
  {
    auto file = storage.OpenForWrite("/d/big.bin", direct);
    REQUIRE_OK(file);
    IoPipeline pipe(file->get());
    const size_t chunk = 1 << 20;
    for (size_t off = 0; off < data.size(); off += chunk) {
      if (pipe.full()) REQUIRE_OK(pipe.RetireOldest());
      REQUIRE_OK(pipe.SubmitWrite(off, data.data() + off, std::min(chunk, data.size() - off)));
    }
    REQUIRE_OK(pipe.Finish());
    // Until Sync nothing is visible.
    CHECK(storage.Stat("/d/big.bin").status().code() == absl::StatusCode::kNotFound);
    REQUIRE_OK((*file)->Truncate(size));
    REQUIRE_OK((*file)->Sync());
    REQUIRE_OK((*file)->Close());
  }
  auto info = client.Head(server.bucket, storage.Key("/d/big.bin"));
  REQUIRE_OK(info);
  CHECK(info->size == size);
  // A multipart object of 3 parts of whole requests: 6 MiB less the 4 KiB
  // held back (cut once 5 MiB and those 4 KiB were there), 5 MiB, the rest.
  CHECK(absl::StrContains(info->etag, "-3"));
  auto back = ReadWholeFile(storage, "/d/big.bin", 1 << 30);
  REQUIRE_OK(back);
  CHECK(*back == std::string(reinterpret_cast<const char*>(data.data()), size));
  // Readers are told to ask for large ranges.
  auto reading = storage.OpenForRead("/d/big.bin", {});
  REQUIRE_OK(reading);
  CHECK((*reading)->preferred_request_bytes() == options.read_request_bytes);
  // A write out of order is refused.
  {
    auto file = storage.OpenForWrite("/d/gap.bin", direct);
    REQUIRE_OK(file);
    REQUIRE_OK(WriteAt(**file, 0, data.data(), 4096));
    CHECK(WriteAt(**file, 8192, data.data(), 4096).code() ==
          absl::StatusCode::kFailedPrecondition);
  }

  // A small file closed without Sync: nothing either.
  {
    auto file = storage.OpenForWrite("/d/unsynced.txt", {});
    REQUIRE_OK(file);
    REQUIRE_OK(WriteAt(**file, 0, data.data(), 100));
    REQUIRE_OK((*file)->Close());
  }
  CHECK(storage.Stat("/d/unsynced.txt").status().code() == absl::StatusCode::kNotFound);

  // Closed without Sync after parts went up: no object, no upload left.
  {
    auto file = storage.OpenForWrite("/d/abandoned.bin", direct);
    REQUIRE_OK(file);
    REQUIRE_OK(WriteAt(**file, 0, data.data(), 2 * options.part_bytes + 8192));
    REQUIRE_OK((*file)->Close());
  }
  CHECK(storage.Stat("/d/abandoned.bin").status().code() == absl::StatusCode::kNotFound);
  // Dropped without Close after parts went up (an owner's error path): the
  // same.
  {
    auto file = storage.OpenForWrite("/d/dropped.bin", direct);
    REQUIRE_OK(file);
    REQUIRE_OK(WriteAt(**file, 0, data.data(), options.part_bytes + 8192));
  }
  CHECK(storage.Stat("/d/dropped.bin").status().code() == absl::StatusCode::kNotFound);
  auto uploads = client.ListMultipart(server.bucket, options.prefix + "/");
  REQUIRE_OK(uploads);
  CHECK(uploads->empty());

  REQUIRE_OK(storage.RemoveTree("/d"));
  auto left = client.List(server.bucket, options.prefix + "/", "");
  REQUIRE_OK(left);
  CHECK(left->objects.empty());
}

TEST_CASE("S3: conditional writes (If-Match on the ETag, If-None-Match)") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  const std::string key = Unique("latest");
  auto first = client.Put(server.bucket, key, "step-1", PutCondition{std::nullopt, true});
  REQUIRE_OK(first);
  // Created once only.
  CHECK(client.Put(server.bucket, key, "step-9", PutCondition{std::nullopt, true}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // Replaced only by one who saw the current version.
  auto second = client.Put(server.bucket, key, "step-2", PutCondition{*first, false});
  REQUIRE_OK(second);
  CHECK(client.Put(server.bucket, key, "step-0", PutCondition{*first, false}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  char buf[16] = {};
  auto n = client.GetRange(server.bucket, key, 0, buf, sizeof(buf));
  REQUIRE_OK(n);
  CHECK(std::string(buf, *n) == "step-2");
  // Ranges at and past the end.
  CHECK(*client.GetRange(server.bucket, key, 4, buf, sizeof(buf)) == 2);
  CHECK(*client.GetRange(server.bucket, key, 6, buf, sizeof(buf)) == 0);
}

TEST_CASE("S3: parts whose connection is cut mid-body are sent again; the object is whole") {
  S3TestServer& server = Server();
  const std::string dir = ::zcc::testing::TempDir();
  auto proxy = ::zcc::testing::StartS3FaultProxy(dir, server.endpoint, 0, /*cut=*/2);
  REQUIRE_OK(proxy);
  Endpoint through = EndpointOf(server);
  through.url = proxy->endpoint;
  S3Client client(through, CredentialsOf(server));
  S3StorageOptions options;
  options.bucket = server.bucket;
  options.prefix = Unique("cut");
  options.part_bytes = 5 << 20;
  S3Storage storage(&client, options);
  REQUIRE_OK(storage.MakeDirs("/d"));
  std::string data(12 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  OpenOptions direct;
  direct.direct = true;
  {
    auto file = storage.OpenForWrite("/d/cut.bin", direct);
    REQUIRE_OK(file);
    REQUIRE_OK(WriteAt(**file, 0, data.data(), data.size()));
    REQUIRE_OK((*file)->Sync());
    REQUIRE_OK((*file)->Close());
  }
  CHECK(client.retries() >= 2);
  CHECK(absl::StrContains(proxy->process->Output(), "injected 2 (cut)"));
  auto back = ReadWholeFile(storage, "/d/cut.bin", 1 << 30);
  REQUIRE_OK(back);
  CHECK(*back == data);
}

TEST_CASE("S3Storage: a compare-and-swap of a small file on its ETag") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  S3StorageOptions options;
  options.bucket = server.bucket;
  options.prefix = Unique("versioned");
  S3Storage storage(&client, options);
  REQUIRE_OK(storage.MakeDirs("/job"));
  CHECK(absl::IsNotFound(storage.ReadVersioned("/job/latest", 100).status()));
  // Created only where nothing is.
  REQUIRE_OK(storage.WriteIfVersion("/job/latest", "step-1", ""));
  CHECK(absl::IsFailedPrecondition(storage.WriteIfVersion("/job/latest", "step-9", "")));
  auto first = storage.ReadVersioned("/job/latest", 100);
  REQUIRE_OK(first);
  CHECK(first->content == "step-1");
  // Replaced by one who read the current version; then that version is old.
  REQUIRE_OK(storage.WriteIfVersion("/job/latest", "step-2", first->version));
  CHECK(absl::IsFailedPrecondition(storage.WriteIfVersion("/job/latest", "step-0", first->version)));
  auto second = storage.ReadVersioned("/job/latest", 100);
  REQUIRE_OK(second);
  CHECK(second->content == "step-2");
  CHECK(second->version != first->version);
  CHECK(absl::IsFailedPrecondition(storage.ReadVersioned("/job/latest", 3).status()));
}

TEST_CASE("S3Storage: a path with a '.' or '..' segment is refused, not sent as another key") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  S3StorageOptions options;
  options.bucket = server.bucket;
  options.prefix = Unique("dots");
  S3Storage storage(&client, options);
  REQUIRE_OK(storage.MakeDirs("/job"));
  REQUIRE_OK(storage::WriteFileAtomic(storage, "/job/kept", "mine"));
  for (const std::string path : {"/job/../job/kept", "/job/./kept", "/job/step/.."}) {
    INFO(path);
    CHECK(storage.Stat(path).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(storage.RemoveTree(path).code() == absl::StatusCode::kInvalidArgument);
  }
  REQUIRE_OK(storage.Stat("/job/kept").status());
}

TEST_CASE("S3: SlowDown (503) is retried with backoff until the store recovers, or the deadline") {
  S3TestServer& server = Server();
  const std::string dir = ::zcc::testing::TempDir();
  {
    auto proxy = ::zcc::testing::StartS3FaultProxy(dir, server.endpoint, 3);
    REQUIRE_OK(proxy);
    Endpoint through = EndpointOf(server);
    through.url = proxy->endpoint;
    S3Client client(through, CredentialsOf(server));
    REQUIRE_OK(client.Put(server.bucket, Unique("throttled"), "payload"));
    CHECK(client.retries() == 3);
  }
  {
    auto proxy = ::zcc::testing::StartS3FaultProxy(dir, server.endpoint, 1000);
    REQUIRE_OK(proxy);
    Endpoint through = EndpointOf(server);
    through.url = proxy->endpoint;
    through.retry_deadline = absl::Milliseconds(500);
    S3Client client(through, CredentialsOf(server));
    const absl::Time start = absl::Now();
    auto put = client.Put(server.bucket, Unique("never"), "payload");
    REQUIRE_FALSE(put.ok());
    CHECK(put.status().code() == absl::StatusCode::kUnavailable);
    INFO(put.status().message());
    CHECK(absl::StrContains(put.status().message(), "SlowDown"));
    CHECK(absl::StrContains(put.status().message(), "gave up after"));
    CHECK(client.retries() >= 2);
    CHECK(absl::Now() - start < absl::Seconds(5));
  }
}

TEST_CASE("S3: a missing bucket is a clear NotFound") {
  S3TestServer& server = Server();
  S3Client client(EndpointOf(server), CredentialsOf(server));
  auto put = client.Put("no-such-bucket-zcc", "k", "x");
  REQUIRE_FALSE(put.ok());
  CHECK(put.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(put.status().message(), "NoSuchBucket"));
  CHECK(StoreErrorCode(put.status()) == "NoSuchBucket");
  // Deleting from a missing bucket is an error; deleting a missing key is
  // not, whatever the key is called.
  absl::Status gone = client.Delete("no-such-bucket-zcc", "k");
  CHECK(absl::IsNotFound(gone));
  CHECK(StoreErrorCode(gone) == "NoSuchBucket");
  CHECK_OK(client.Delete(server.bucket, Unique("NoSuchBucket") + "/Bucket-named-key"));
}

TEST_CASE("S3 URLs: bucket and prefix, and what is refused") {
  auto u = ParseS3Url("s3://my-bucket/some/prefix/");
  REQUIRE_OK(u);
  CHECK(u->bucket == "my-bucket");
  CHECK(u->prefix == "some/prefix");
  CHECK(ParseS3Url("s3://bucket.with.dots")->prefix.empty());
  for (const char* bad : {"/local/path", "s3://", "s3://ab", "s3://Upper/x", "s3://b_u/x",
                          "s3://bucket/a//b"}) {
    INFO(bad);
    CHECK(ParseS3Url(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(UriEncode("a b/c~d+e", true) == "a%20b/c~d%2Be");
  CHECK(UriEncode("a/b", false) == "a%2Fb");
}

TEST_CASE("credentials: the environment first, then the shared file's profile") {
  const std::string home = ::zcc::testing::TempDir();
  REQUIRE_OK(::zcc::MakeDirs(JoinPath(home, ".aws")));
  REQUIRE_OK(::zcc::WriteFileAtomic(JoinPath(home, ".aws/credentials"),
                             "[default]\naws_access_key_id = AKIDDEFAULT1234\n"
                             "aws_secret_access_key = defaultsecret\n"
                             "[ci]\naws_access_key_id=AKIDCI5678\naws_secret_access_key=cisecret\n"
                             "aws_session_token=tok\n[half]\naws_access_key_id=AKIDHALF\n"));
  std::map<std::string, std::string> vars{{"HOME", home}};
  auto env = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  auto c = LoadCredentials(env);
  REQUIRE_OK(c);
  CHECK(c->access_key_id == "AKIDDEFAULT1234");
  CHECK(c->secret_access_key == "defaultsecret");
  CHECK(Describe(*c) == absl::StrCat("credentials from ", home,
                                     "/.aws/credentials [default] (key id ...1234)"));
  CHECK_FALSE(absl::StrContains(Describe(*c), "defaultsecret"));
  vars["AWS_PROFILE"] = "ci";
  c = LoadCredentials(env);
  REQUIRE_OK(c);
  CHECK(c->access_key_id == "AKIDCI5678");
  CHECK(c->session_token == "tok");
  vars["AWS_PROFILE"] = "half";
  CHECK(LoadCredentials(env).status().code() == absl::StatusCode::kInvalidArgument);
  vars["AWS_PROFILE"] = "absent";
  CHECK(LoadCredentials(env).status().code() == absl::StatusCode::kNotFound);
  vars["AWS_ACCESS_KEY_ID"] = "AKIDENV0000";
  CHECK(LoadCredentials(env).status().code() == absl::StatusCode::kInvalidArgument);  // no secret
  vars["AWS_SECRET_ACCESS_KEY"] = "envsecret";
  c = LoadCredentials(env);
  REQUIRE_OK(c);
  CHECK(c->access_key_id == "AKIDENV0000");
  CHECK(c->source == "the environment");
}

}  // namespace
}  // namespace zcc::storage::s3
