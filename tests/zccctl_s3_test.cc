// zccctl verify and export of a step in an S3-compatible store (moto's
// server, signatures checked): a committed step written on disk is uploaded
// as it is, then verified and exported from s3:// straight into a local
// folder, byte for byte what the export of the local copy writes; damage in
// the store is found; wrong credentials are a clear refusal that shows no
// secret.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/testing/sliced_step.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_storage.h"
#include "storage/whole_file.h"
#include "tests/process_harness.h"
#include "tests/s3_test_server.h"

namespace zcc::testing {
namespace {

// Copies the local tree `dir` to `to` (a path of `s3`), file by file.
void Upload(const std::string& dir, storage::Storage& s3, const std::string& to) {
  REQUIRE_OK(s3.MakeDirs(to));
  auto names = ListDir(dir);
  REQUIRE_OK(names);
  for (const std::string& name : *names) {
    const std::string local = JoinPath(dir, name);
    struct stat st;
    REQUIRE(::stat(local.c_str(), &st) == 0);
    if (S_ISDIR(st.st_mode)) {
      Upload(local, s3, JoinPath(to, name));
      continue;
    }
    auto content = ReadFileToString(local, uint64_t{1} << 30);
    REQUIRE_OK(content);
    REQUIRE_OK(storage::WriteFileAtomic(s3, JoinPath(to, name), *content));
  }
}

// Every file of the local tree `dir`: name -> content.
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> out;
  auto names = ListDir(dir);
  REQUIRE_OK(names);
  for (const std::string& name : *names) {
    auto content = ReadFileToString(JoinPath(dir, name), uint64_t{1} << 30);
    REQUIRE_OK(content);
    out[name] = *content;
  }
  return out;
}

struct Run {
  int code = -1;
  std::string output;
};

Run Zccctl(const std::string& log_dir, const S3TestServer& server, std::vector<std::string> args,
           const std::string& secret) {
  static int n = 0;
  std::vector<std::string> argv = {Runfile("tools/zccctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv, absl::StrCat(log_dir, "/zccctl.", n++, ".log"), -1,
               {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_ACCESS_KEY_ID=" + server.access_key,
                "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1"});
  Run r;
  r.code = p.Wait(absl::Seconds(120)).value_or(-1);
  r.output = p.Output();
  return r;
}

TEST_CASE("zccctl verifies and exports a step from an S3 store into a local folder") {
  const std::string dir = TempDir();
  auto started = StartS3TestServer(dir);
  REQUIRE_OK(started);
  S3TestServer& server = *started;

  // A committed 4-rank step of sliced tensors, on disk, then in the store.
  const std::string job_dir = JoinPath(dir, "job");
  REQUIRE_OK(checkpoint::testing::WriteSlicedStep(job_dir, "job", 7, {}));
  storage::s3::Endpoint endpoint;
  endpoint.url = server.endpoint;
  storage::s3::Credentials credentials{server.access_key, server.secret_key, "", "test"};
  storage::s3::S3Client client(endpoint, credentials);
  storage::s3::S3StorageOptions options;
  options.bucket = server.bucket;
  storage::s3::S3Storage s3(&client, options);
  Upload(job_dir, s3, "/jobs/job");
  const std::string url = absl::StrCat("s3://", server.bucket, "/jobs/job");

  // The job's URL names its newest committed step.
  Run verified = Zccctl(dir, server, {"verify", url}, server.secret_key);
  INFO(verified.output);
  CHECK(verified.code == 0);
  CHECK(absl::StrContains(verified.output, url + "/step-00000007: OK (4 ranks"));
  CHECK(absl::StrContains(verified.output, "verifying " + url + "/step-00000007 (the step " + url +
                                               "/latest names)"));

  // list, offline: the store's committed steps, as zccd lists a job's.
  Run listed = Zccctl(dir, server, {"--json", "list", url}, server.secret_key);
  INFO(listed.output);
  REQUIRE(listed.code == 0);
  const size_t json_at = listed.output.find('{');
  REQUIRE(json_at != std::string::npos);
  const auto list = nlohmann::json::parse(listed.output.substr(json_at));
  REQUIRE(list["checkpoints"].size() == 1);
  CHECK(list["checkpoints"][0]["step"] == 7);
  CHECK(list["checkpoints"][0]["is_latest"] == true);
  CHECK(list["checkpoints"][0]["world_size"] == 4);
  CHECK(list["checkpoints"][0]["path"] == url + "/step-00000007");
  Run local_list = Zccctl(dir, server, {"list", job_dir}, server.secret_key);
  CHECK(local_list.code == 0);
  CHECK(absl::StrContains(local_list.output, job_dir + "/step-00000007  (latest)"));

  const std::string from_store = JoinPath(dir, "hf-from-store");
  Run exported = Zccctl(dir, server, {"export", url + "/step-00000007", from_store, "--dtype", "bf16"},
                        server.secret_key);
  INFO(exported.output);
  REQUIRE(exported.code == 0);
  const std::string from_disk = JoinPath(dir, "hf-from-disk");
  Run local = Zccctl(dir, server, {"export", job_dir + "/step-00000007", from_disk, "--dtype", "bf16"},
                     server.secret_key);
  REQUIRE(local.code == 0);
  const auto store_files = Files(from_store);
  CHECK(store_files.size() >= 1);
  CHECK(store_files == Files(from_disk));

  // A shard damaged in the store: verify and export refuse it.
  const std::string bad = "/jobs/bad";
  Upload(job_dir, s3, bad);
  const std::string shard = JoinPath(bad, "step-00000007/model-r00001.safetensors");
  auto content = storage::ReadWholeFile(s3, shard, uint64_t{1} << 30);
  REQUIRE_OK(content);
  (*content)[content->size() - 3] ^= 0x5a;
  REQUIRE_OK(storage::WriteFileAtomic(s3, shard, *content));
  const std::string bad_url = absl::StrCat("s3://", server.bucket, bad, "/step-00000007");
  Run damaged = Zccctl(dir, server, {"verify", bad_url}, server.secret_key);
  INFO(damaged.output);
  CHECK(damaged.code == 1);
  CHECK(absl::StrContains(damaged.output, "FAILED"));
  Run refused_export = Zccctl(dir, server, {"export", bad_url, JoinPath(dir, "never")},
                              server.secret_key);
  CHECK(refused_export.code == 1);
  CHECK_FALSE(PathExists(JoinPath(dir, "never/model.safetensors")));

  // What an interrupted write leaves (an uncommitted step, an incomplete
  // upload) goes with gc; the committed step stays.
  REQUIRE_OK(s3.MakeDirs("/jobs/job/step-00000009.partial"));
  REQUIRE_OK(storage::WriteFileAtomic(s3, "/jobs/job/step-00000009.partial/model-r00000.safetensors",
                                      "half"));
  Run young = Zccctl(dir, server, {"gc", url}, server.secret_key);  // default: older than 1 h
  INFO(young.output);
  CHECK(young.code == 0);
  CHECK(absl::StrContains(young.output, "0 uncommitted director(ies) or temporary file(s) removed"));
  CHECK(s3.Stat("/jobs/job/step-00000009.partial").ok());
  // (moto reports every upload as started in 2010, so an upload's age is
  // not tested here: it is aborted by any gc.)
  REQUIRE_OK(client.CreateMultipart(server.bucket, "jobs/job/metadata/tokenizer.json").status());
  Run gc = Zccctl(dir, server, {"gc", url, "--older-than", "0"}, server.secret_key);
  INFO(gc.output);
  CHECK(gc.code == 0);
  CHECK(absl::StrContains(gc.output, "removed " + url + "/step-00000009.partial"));
  CHECK(absl::StrContains(gc.output, "1 incomplete upload(s) aborted"));
  CHECK(s3.Stat("/jobs/job/step-00000009.partial").status().code() == absl::StatusCode::kNotFound);
  auto uploads = client.ListMultipart(server.bucket, "jobs/job/");
  REQUIRE_OK(uploads);
  CHECK(uploads->empty());
  CHECK(Zccctl(dir, server, {"verify", url}, server.secret_key).code == 0);

  // Wrong credentials: refused by the store, said clearly, no secret shown.
  const std::string wrong = "wrong-secret-0123456789abcdef";
  Run denied = Zccctl(dir, server, {"verify", url}, wrong);
  INFO(denied.output);
  CHECK(denied.code == 1);
  // (The first request is a HEAD, whose reply has no body to name the code.)
  CHECK(absl::StrContains(denied.output, "HTTP 403 Forbidden; check the credentials"));
  CHECK_FALSE(absl::StrContains(denied.output, wrong));
}

}  // namespace
}  // namespace zcc::testing
