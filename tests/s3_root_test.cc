// zccd with an object-store root (moto's server, signatures checked): real
// zccd and trainer processes checkpoint straight from the staging slots into
// the store, the steps commit there without renames, and new trainers
// restore them bit-exact from the store. Two zccds with separate local roots
// (no shared file system) commit one 4-rank job together through the store.
// Wrong credentials are a clear error that shows no secret.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/manifest.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_storage.h"
#include "storage/whole_file.h"
#include "tests/process_harness.h"
#include "tests/s3_test_server.h"

namespace zcc::testing {
namespace {

// The test's own view of the store: the bucket as a Storage.
struct Store {
  explicit Store(const S3TestServer& server)
      : client(Endpoint(server), {server.access_key, server.secret_key, "", "test"}),
        storage(&client, Options(server)) {}
  static storage::s3::Endpoint Endpoint(const S3TestServer& server) {
    storage::s3::Endpoint e;
    e.url = server.endpoint;
    return e;
  }
  static storage::s3::S3StorageOptions Options(const S3TestServer& server) {
    storage::s3::S3StorageOptions o;
    o.bucket = server.bucket;
    return o;
  }
  checkpoint::IoOptions Io() {
    checkpoint::IoOptions io;
    io.storage = &storage;
    io.direct_io = false;
    return io;
  }
  storage::s3::S3Client client;
  storage::s3::S3Storage storage;
};

// A zccd whose only extra root is the store's s3://bucket/ckpt, with the
// server's endpoint and keys in its environment (the secret as given).
DaemonOptions StoreDaemon(const std::string& dir, const S3TestServer& server,
                          const std::string& secret, const std::string& name = "zccd") {
  DaemonOptions o;
  o.name = name;
  o.root = JoinPath(dir, name + "-local");  // each node's local root is its own
  o.extra_flags = {absl::StrCat("--allowed_roots=s3://", server.bucket, "/ckpt"),
                   "--retain_snapshots_s=0"};  // restores read the store
  o.env = {"AWS_ENDPOINT_URL=" + server.endpoint, "AWS_ACCESS_KEY_ID=" + server.access_key,
           "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1"};
  return o;
}

std::string RootUrl(const S3TestServer& server) {
  return absl::StrCat("s3://", server.bucket, "/ckpt");
}

// Trainers of ranks `ranks` of a `world`-rank job on `daemon`.
std::vector<std::unique_ptr<Subprocess>> Trainers(const Daemon& daemon, const std::string& dir,
                                                  const std::string& root,
                                                  const std::vector<int>& ranks, int world,
                                                  const std::string& tag,
                                                  const std::vector<std::string>& flags) {
  std::vector<std::unique_ptr<Subprocess>> out;
  for (int rank : ranks) {
    std::vector<std::string> f = {"--root=" + root, absl::StrCat("--rank=", rank),
                                  absl::StrCat("--world=", world)};
    f.insert(f.end(), flags.begin(), flags.end());
    out.push_back(StartTrainer(daemon, dir, absl::StrCat(tag, rank), f));
  }
  return out;
}

void WaitAll(std::vector<std::unique_ptr<Subprocess>>& trainers, const std::string& logs) {
  for (auto& t : trainers) {
    INFO(t->Output() << logs);
    REQUIRE(t->Wait(absl::Seconds(120)) == 0);
  }
}

TEST_CASE("zccd writes, commits and restores a job straight in an object store") {
  const std::string dir = ShortTempDir("s3-root");
  auto started = StartS3TestServer(dir);
  REQUIRE_OK(started);
  S3TestServer& server = *started;
  Daemon daemon(dir, StoreDaemon(dir, server, server.secret_key));
  REQUIRE(daemon.Start());
  const std::string root = RootUrl(server);

  auto train = Trainers(daemon, dir, root, {0, 1}, 2, "train",
                        {"--steps=12", "--block", "--ema_decay=0.9"});
  WaitAll(train, daemon.Log());
  CHECK(train[0]->Values()["committed"] == "10");

  // In the store: the steps, committed in place, verified; `latest`; the
  // job's owner. No local disk was used.
  Store store(server);
  const std::string job = "/ckpt/itest";
  auto steps = checkpoint::ListCommittedSteps(job, &store.storage);
  REQUIRE_OK(steps);
  CHECK(*steps == std::vector<int64_t>{5, 10});
  CHECK(*checkpoint::ReadLatest(job, &store.storage) == 10);
  auto report = checkpoint::VerifyStep(JoinPath(job, "step-00000010"), store.Io());
  REQUIRE_OK(report);
  CHECK(report->ranks == 2);
  auto owner = storage::ReadWholeFile(store.storage, JoinPath(job, "OWNER"), 100);
  REQUIRE_OK(owner);
  CHECK(*owner == "uid 0\n");
  auto local = ListDir(daemon.root());
  CHECK((!local.ok() || local->empty()));
  // Nothing but committed steps, their files and the job's own objects.
  auto names = store.storage.List(job);
  REQUIRE_OK(names);
  CHECK(*names == std::vector<std::string>{"OWNER", "latest", "step-00000005", "step-00000010"});

  // zccctl lists the job through zccd, as on a local root.
  auto [code, listed] = Zccctl(dir, daemon, {"list", "itest", "--root", root});
  INFO(listed);
  CHECK(code == 0);
  CHECK(absl::StrContains(listed, "step-00000010"));
  CHECK(absl::StrContains(listed, "latest"));

  // New trainers restore the newest step from the store, bit-exact.
  auto restore = Trainers(daemon, dir, root, {0, 1}, 2, "restore",
                          {"--mode=restore", "--expect_step=10", "--expect_from=disk"});
  WaitAll(restore, daemon.Log());
  CHECK(restore[0]->Values()["mismatched_tensors"] == "0");
  CHECK(restore[1]->Values()["mismatched_tensors"] == "0");

  // A resumed run commits in the same store: step 15 after 10.
  auto resume = Trainers(daemon, dir, root, {0, 1}, 2, "resume",
                         {"--mode=resume", "--steps=5", "--block"});
  WaitAll(resume, daemon.Log());
  CHECK(resume[0]->Values()["committed"] == "15");
  CHECK(*checkpoint::ReadLatest(job, &store.storage) == 15);
  REQUIRE_OK(checkpoint::VerifyStep(JoinPath(job, "step-00000015"), store.Io()).status());

  REQUIRE(daemon.Stop() == 0);
  CHECK(ShmSegments(daemon.shm_prefix()).empty());
}

TEST_CASE("two zccds with no shared file system commit one 4-rank job in the store") {
  const std::string dir = ShortTempDir("s3-two");
  auto started = StartS3TestServer(dir);
  REQUIRE_OK(started);
  S3TestServer& server = *started;
  // Each node's zccd with its own local root, socket and shared memory.
  Daemon a(dir, StoreDaemon(dir, server, server.secret_key, "node-a"));
  Daemon b(dir, StoreDaemon(dir, server, server.secret_key, "node-b"));
  REQUIRE(a.Start());
  REQUIRE(b.Start());
  REQUIRE(a.root() != b.root());
  const std::string root = RootUrl(server);

  auto on_a = Trainers(a, dir, root, {0, 1}, 4, "a-train", {"--steps=5", "--block"});
  auto on_b = Trainers(b, dir, root, {2, 3}, 4, "b-train", {"--steps=5", "--block"});
  WaitAll(on_b, b.Log());
  WaitAll(on_a, a.Log());
  CHECK(on_a[0]->Values()["committed"] == "5");

  Store store(server);
  auto report = checkpoint::VerifyStep("/ckpt/itest/step-00000005", store.Io());
  REQUIRE_OK(report);
  CHECK(report->ranks == 4);

  // Each rank restores on the other node: everything comes from the store.
  auto back_b = Trainers(b, dir, root, {0, 1}, 4, "b-restore",
                         {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  auto back_a = Trainers(a, dir, root, {2, 3}, 4, "a-restore",
                         {"--mode=restore", "--expect_step=5", "--expect_from=disk"});
  WaitAll(back_b, b.Log());
  WaitAll(back_a, a.Log());
  for (auto& t : back_a) CHECK(t->Values()["mismatched_tensors"] == "0");
  for (auto& t : back_b) CHECK(t->Values()["mismatched_tensors"] == "0");
  REQUIRE(a.Stop() == 0);
  REQUIRE(b.Stop() == 0);
}

TEST_CASE("wrong credentials for the store: a clear refusal, no secret shown") {
  const std::string dir = ShortTempDir("s3-creds");
  auto started = StartS3TestServer(dir);
  REQUIRE_OK(started);
  S3TestServer& server = *started;
  const std::string wrong = "wrongSecretKeyThatMustNeverBePrinted0000";
  Daemon daemon(dir, StoreDaemon(dir, server, wrong));
  REQUIRE(daemon.Start());
  auto train = Trainers(daemon, dir, RootUrl(server), {0}, 1, "train", {"--steps=2"});
  const auto code = train[0]->Wait(absl::Seconds(60));
  INFO(train[0]->Output() << daemon.Log());
  CHECK(code != 0);
  CHECK(absl::StrContains(train[0]->Output(), "403 Forbidden; check the credentials"));
  CHECK_FALSE(absl::StrContains(train[0]->Output(), wrong));
  CHECK_FALSE(absl::StrContains(daemon.Log(), wrong));

  // A root outside the configured ones is refused by name.
  auto elsewhere = Trainers(daemon, dir, absl::StrCat("s3://", server.bucket, "/other"), {0}, 1,
                            "elsewhere", {"--steps=2"});
  CHECK(elsewhere[0]->Wait(absl::Seconds(60)) != 0);
  CHECK(absl::StrContains(elsewhere[0]->Output(), "not under an object-store root"));
  REQUIRE(daemon.Stop() == 0);
}

}  // namespace
}  // namespace zcc::testing
