#include "daemon/peer/peer_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_credentials.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/peer_recovery.h"
#include "checkpoint/rank_step_bytes.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "storage/memory_storage.h"
#include "storage/whole_file.h"
#include "common/testing/eventually.h"
#include "daemon/peer/replica_proto.h"
#include "daemon/peer/testing/peer_fixtures.h"
#include "format/checksum.h"

namespace zcc::daemon::peer {
namespace {

using testing::Hold;
using testing::PeerServer;
using testing::StepFiles;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// The CA, node-a, node-b and a rogue node signed by another CA
// (tools/testing/make_test_certs.sh), made once per test binary.
const std::string& CertDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const char* src = std::getenv("TEST_SRCDIR");
    REQUIRE(tmp != nullptr);
    REQUIRE(src != nullptr);
    std::string d = absl::StrCat(tmp, "/certs");
    const std::string cmd =
        absl::StrCat(src, "/zcc/tools/testing/make_test_certs.sh ", d, " node-a node-b");
    REQUIRE(std::system(cmd.c_str()) == 0);
    return d;
  }();
  return dir;
}

PeerConfig Tls(const std::string& node, const std::string& ca = "ca") {
  PeerConfig c;
  c.cert_file = absl::StrCat(CertDir(), "/", node, ".pem");
  c.key_file = absl::StrCat(CertDir(), "/", node, ".key");
  c.ca_file = absl::StrCat(CertDir(), "/", ca, ".pem");
  return c;
}

PeerClient ClientOf(const PeerServer& s, const PeerConfig& config) {
  auto creds = LoadPeerCredentials(config);
  REQUIRE_OK(creds.status());
  return PeerClient(s.target(), creds->channel);
}

std::string ReadFile(const std::string& path) {
  std::string out;
  std::FILE* f = std::fopen(path.c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 251);
  return s;
}

const ReplicaKey kKey{"llama", 1000, 3, 20, "model.layers.0.mlp.w1"};

TEST_CASE("peer service: a piece pushed over mutual TLS comes back exactly") {
  PeerServer a(Tls("node-a"));
  PeerClient b = ClientOf(a, Tls("node-b"));
  auto hello = b.Hello("node-b", "rack-2", kTimeout);
  REQUIRE_OK(hello.status());
  CHECK(hello->node() == "node-a");
  CHECK(hello->failure_domain() == "rack-1");
  // This run of the service, the same at every hello; another run's differs.
  CHECK(hello->instance().size() == 16);
  CHECK(hello->instance() == a.service.instance());
  auto again = b.Hello("node-b", "rack-2", kTimeout);
  REQUIRE_OK(again.status());
  CHECK(again->instance() == hello->instance());
  ReplicaStore other_store(1 << 20);
  CHECK(PeerService("node-a", "rack-1", &other_store).instance() != a.service.instance());
  // Several chunks and a partial last one.
  const std::string bytes = Pattern(3 * kReplicaChunkBytes + 12345);
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), kTimeout));
  CHECK(a.store.bytes_held() == bytes.size());
  auto back = b.Pull(kKey, kTimeout);
  REQUIRE_OK(back.status());
  CHECK(*back == bytes);
  auto listed = b.List("llama", 1000, kTimeout);
  REQUIRE_OK(listed.status());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].key == kKey);
  CHECK((*listed)[0].nbytes == bytes.size());
  CHECK((*listed)[0].xxh3 == format::Xxh3(bytes.data(), bytes.size()));
  // The pusher's name from its certificate.
  CHECK((*listed)[0].from_node.find("node-b") != std::string::npos);
  // An empty piece is a piece too.
  const ReplicaKey empty{"llama", 1000, 3, 20, "rng"};
  REQUIRE_OK(b.Push(empty, "", 0, kTimeout));
  auto none = b.Pull(empty, kTimeout);
  REQUIRE_OK(none.status());
  CHECK(none->empty());
  // A piece is a file of a step's directory, named by one path component.
  for (const char* name : {"../step-00000010/model.safetensors", "a/b", ".."}) {
    const absl::Status refused = b.Push(ReplicaKey{"llama", 1000, 3, 20, name}, "x", 1, kTimeout);
    CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("peer service: a zccd without the cluster's certificate can neither push nor pull") {
  PeerServer a(Tls("node-a"));
  PeerClient b = ClientOf(a, Tls("node-b"));
  const std::string bytes = Pattern(1000);
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), kTimeout));

  // Signed by another CA (it trusts the cluster's CA, so only its own
  // certificate is wrong).
  PeerConfig rogue = Tls("rogue");
  PeerClient r = ClientOf(a, rogue);
  CHECK_FALSE(r.Hello("rogue", "", kTimeout).ok());
  CHECK_FALSE(r.Push(ReplicaKey{"llama", 1000, 3, 21, "x"}, "evil", 4, kTimeout).ok());
  CHECK_FALSE(r.Pull(kKey, kTimeout).ok());
  CHECK_FALSE(r.List("llama", 1000, kTimeout).ok());
  CHECK(a.store.bytes_held() == bytes.size());

  // No certificate at all.
  grpc::SslCredentialsOptions anonymous;
  anonymous.pem_root_certs = ReadFile(Tls("node-b").ca_file);
  PeerClient anon(a.target(), grpc::SslCredentials(anonymous));
  CHECK_FALSE(anon.Hello("anon", "", kTimeout).ok());
  CHECK_FALSE(anon.Pull(kKey, kTimeout).ok());

  // Plaintext against the TLS listener.
  PeerClient plain(a.target(), grpc::InsecureChannelCredentials());
  CHECK_FALSE(plain.Pull(kKey, kTimeout).ok());

  // And the other way: a listener with the rogue certificate is not trusted
  // by a zccd of the cluster, which sends it nothing.
  PeerServer impostor(Tls("rogue", "ca"));
  PeerClient fooled = ClientOf(impostor, Tls("node-b"));
  CHECK_FALSE(fooled.Push(kKey, bytes.data(), bytes.size(), kTimeout).ok());
  CHECK(impostor.store.bytes_held() == 0);
}

TEST_CASE("peer service: a piece pushed in parts side by side is kept whole, once all arrived") {
  PeerServer a(Tls("node-a"));
  PeerClient b = ClientOf(a, Tls("node-b"));
  auto hello = b.Hello("node-b", "rack-2", kTimeout);
  REQUIRE_OK(hello.status());
  CHECK(hello->takes_parts());
  const std::string bytes = Pattern(3 << 20);
  const uint64_t sum = format::Xxh3(bytes.data(), bytes.size());
  // The last part first: nothing is kept until every part arrived.
  bool kept = true;
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1, 2 << 20, 1 << 20,
                    &kept));
  CHECK_FALSE(kept);
  CHECK_FALSE(a.store.Get(kKey).ok());
  // Its room is taken in the store from its first part on.
  CHECK(a.store.held().incoming_bytes == bytes.size());
  CHECK(a.store.bytes_held() == bytes.size());
  PeerClient c = ClientOf(a, Tls("node-b"));
  PeerClient* clients[2] = {&b, &c};
  std::vector<std::thread> parts;
  std::vector<absl::Status> results(2);
  bool kept_by[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    parts.emplace_back([&, i] {
      results[i] = clients[i]->Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1,
                                    uint64_t(i) << 20, 1 << 20, &kept_by[i]);
    });
  }
  for (std::thread& t : parts) t.join();
  for (const absl::Status& st : results) REQUIRE_OK(st);
  CHECK(kept_by[0] != kept_by[1]);  // the one that completed it
  auto held = a.store.Get(kKey);
  REQUIRE_OK(held.status());
  CHECK((*held)->bytes == bytes);
  auto pulled = b.Pull(kKey, kTimeout);
  REQUIRE_OK(pulled.status());
  CHECK(*pulled == bytes);
  // Dropped here (its memory went to a trainer), then pushed again in parts
  // (its owner found it gone): kept again, not answered from memory.
  REQUIRE(a.store.ShrinkTo(0, "other-job", 0) > 0);
  REQUIRE_FALSE(a.store.Get(kKey).ok());
  for (uint64_t at = 0; at < bytes.size(); at += 1 << 20) {
    REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1, at, 1 << 20));
  }
  auto again = a.store.Get(kKey);
  REQUIRE_OK(again.status());
  CHECK((*again)->bytes == bytes);
  // A part whose piece's whole does not match its checksum is refused by
  // the part that completes it; nothing is kept.
  ReplicaKey other = kKey;
  other.piece = "other";
  REQUIRE_OK(b.Push(other, bytes.data(), bytes.size(), sum ^ 1, kTimeout, nullptr, -1, 0, 1 << 20));
  CHECK(b.Push(other, bytes.data(), bytes.size(), sum ^ 1, kTimeout, nullptr, -1, 1 << 20,
               2 << 20)
            .code() == absl::StatusCode::kDataLoss);
  CHECK_FALSE(a.store.Get(other).ok());
  CHECK(a.store.held().incoming_bytes == 0);
}

TEST_CASE("peer service: a piece being received takes its room from the start, and gives it back "
          "to a trainer's registration") {
  PeerServer a(Tls("node-a"), 8 << 20);
  PeerClient b = ClientOf(a, Tls("node-b"));
  const std::string bytes = Pattern(3 << 20);
  const uint64_t sum = format::Xxh3(bytes.data(), bytes.size());
  // The first part of a piece in parts takes its 3 MiB.
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1, 0, 1 << 20));
  CHECK(a.store.bytes_held() == bytes.size());
  // A whole piece is refused before its bytes are read where the room of
  // the pieces being received leaves too little.
  ReplicaKey big = kKey;
  big.piece = "big";
  const std::string six(6 << 20, 'x');
  const absl::Status refused = b.Push(big, six.data(), six.size(), kTimeout);
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(a.store.bytes_held() == bytes.size());
  // A registration takes the room back: the piece's next part is refused,
  // and the parts that arrived are dropped.
  CHECK(a.store.ShrinkTo(0, "other-job", 0) == bytes.size());
  CHECK(a.store.bytes_held() == 0);
  const absl::Status next =
      b.Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1, 1 << 20, 1 << 20);
  CHECK(next.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(next.message()), Catch::Contains("taken back"));
  // Pushed again from its first part, it is kept.
  for (uint64_t at = 0; at < bytes.size(); at += 1 << 20) {
    REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), sum, kTimeout, nullptr, -1, at, 1 << 20));
  }
  auto held = a.store.Get(kKey);
  REQUIRE_OK(held.status());
  CHECK((*held)->bytes == bytes);
  CHECK(a.store.held().incoming_bytes == 0);
  // A whole push that fits now is kept beside it.
  const std::string four(4 << 20, 'y');
  REQUIRE_OK(b.Push(big, four.data(), four.size(), kTimeout));
  CHECK(a.store.bytes_held() == (7 << 20));
}

TEST_CASE("peer service: a manifest makes its step whole only where the pieces it names are "
          "held") {
  PeerServer a(Tls("node-a"));
  PeerClient b = ClientOf(a, Tls("node-b"));
  const ReplicaKey manifest{"llama", 1000, 3, 20, "r00003.manifest.json"};
  const std::string json = "{}";
  const uint64_t sum = format::Xxh3(json.data(), json.size());
  const std::vector<std::string> with = {kKey.piece};
  // Its data never came (or went): refused, saying which piece.
  const absl::Status refused = b.Push(manifest, json.data(), json.size(), sum, kTimeout, nullptr,
                                      -1, 0, 0, nullptr, &with);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Catch::Contains(kKey.piece));
  CHECK_FALSE(a.store.Get(manifest).ok());
  const std::string bytes = Pattern(1000);
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), kTimeout));
  REQUIRE_OK(b.Push(manifest, json.data(), json.size(), sum, kTimeout, nullptr, -1, 0, 0, nullptr,
                    &with));
  CHECK(a.store.Get(manifest).ok());
  // A part names no pieces.
  const std::string big = Pattern(2 << 20);
  const absl::Status part =
      b.Push(ReplicaKey{"llama", 1000, 3, 21, "w"}, big.data(), big.size(),
             format::Xxh3(big.data(), big.size()), kTimeout, nullptr, -1, 0, 1 << 20, nullptr,
             &with);
  CHECK(part.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("peer service: a piece is served only for the job and uid it was pushed for") {
  PeerServer a(Tls("node-a"));
  PeerClient b = ClientOf(a, Tls("node-b"));
  const std::string bytes = Pattern(5000);
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), kTimeout));
  ReplicaKey other_uid = kKey;
  other_uid.uid = 1001;
  CHECK(b.Pull(other_uid, kTimeout).status().code() == absl::StatusCode::kNotFound);
  ReplicaKey other_job = kKey;
  other_job.job_id = "other";
  CHECK(b.Pull(other_job, kTimeout).status().code() == absl::StatusCode::kNotFound);
  auto listed = b.List("llama", 1001, kTimeout);
  REQUIRE_OK(listed.status());
  CHECK(listed->empty());
}

TEST_CASE("peer service: damaged bytes from a peer are refused, by either side") {
  PeerConfig insecure;
  insecure.insecure = true;
  PeerServer a(insecure);
  PeerClient b = ClientOf(a, insecure);

  SECTION("a peer that serves bytes not matching their checksum") {
    Replica bad;
    bad.info.key = kKey;
    bad.bytes = Pattern(3000);
    bad.info.xxh3 = format::Xxh3(bad.bytes.data(), bad.bytes.size());
    bad.bytes[1234] ^= 1;  // flipped after the checksum: memory gone bad
    REQUIRE_OK(a.store.Put(std::move(bad)));
    const auto pulled = b.Pull(kKey, kTimeout);
    CHECK(pulled.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(pulled.status().message()), Catch::Contains("checksum"));
  }

  auto stub = v1::Peer::NewStub(grpc::CreateChannel(a.target(), grpc::InsecureChannelCredentials()));
  auto push = [&](uint64_t nbytes, uint64_t xxh3, const std::string& data,
                  const ReplicaKey& key = kKey) {
    grpc::ClientContext ctx;
    v1::PushReplicaResponse resp;
    auto w = stub->PushReplica(&ctx, &resp);
    v1::ReplicaChunk c;
    *c.mutable_header()->mutable_key() = ToProto(key);
    c.mutable_header()->set_nbytes(nbytes);
    c.mutable_header()->set_xxh3(xxh3);
    w->Write(c);
    c.Clear();
    c.set_data(data);
    w->Write(c);
    w->WritesDone();
    return w->Finish();
  };
  const std::string data = Pattern(100);
  const uint64_t sum = format::Xxh3(data.data(), data.size());

  SECTION("a push whose bytes do not match its checksum") {
    CHECK(push(100, sum ^ 1, data).error_code() == grpc::StatusCode::DATA_LOSS);
  }
  SECTION("a push that ends short") {
    CHECK(push(200, sum, data).error_code() == grpc::StatusCode::DATA_LOSS);
  }
  SECTION("a push with more bytes than its header says") {
    CHECK(push(50, sum, data).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  SECTION("a push with a bad job id or piece name") {
    CHECK(push(100, sum, data, ReplicaKey{"../etc", 1000, 0, 1, "w"}).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(push(100, sum, data, ReplicaKey{"job", 1000, 0, -1, "w"}).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
  }
  SECTION("a piece larger than the budget is refused before its bytes are read") {
    CHECK(push(uint64_t{1} << 40, sum, data).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  SECTION("a push that does not begin with a header") {
    grpc::ClientContext ctx;
    v1::PushReplicaResponse resp;
    auto w = stub->PushReplica(&ctx, &resp);
    v1::ReplicaChunk c;
    c.set_data(data);
    w->Write(c);
    w->WritesDone();
    CHECK(w->Finish().error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Whatever a section pushed was refused: only the first section's piece
  // (put into the store directly) is held.
  CHECK(a.store.bytes_held() == (a.store.List("llama", 1000).empty() ? 0 : 3000));
  CHECK(a.store.List("llama", 1000).size() <= 1);
}

TEST_CASE("peer service: a range of a piece, straight into the caller's memory") {
  PeerConfig insecure;
  insecure.insecure = true;
  PeerServer a(insecure);
  PeerClient b = ClientOf(a, insecure);
  const std::string bytes = Pattern(3 << 20);  // three chunks' worth
  REQUIRE_OK(b.Push(kKey, bytes.data(), bytes.size(), kTimeout));

  SECTION("any range, across the server's chunks") {
    for (const auto& [offset, n] : std::vector<std::pair<uint64_t, size_t>>{
             {0, 10}, {(1 << 20) - 5, 2 << 20}, {bytes.size() - 7, 7}, {0, bytes.size()}}) {
      std::string got(n, '\0');
      REQUIRE_OK(b.PullRange(kKey, bytes.size(), offset, got.data(), n, /*check_held=*/true, kTimeout));
      CHECK(got == bytes.substr(offset, n));
    }
  }
  SECTION("a range past the piece's end is refused, and writes nothing") {
    std::string got(16, 'x');
    const absl::Status st = b.PullRange(kKey, bytes.size(), bytes.size() - 8, got.data(), 16, false,
                                        kTimeout);
    CHECK(st.code() == absl::StatusCode::kOutOfRange);
    CHECK(got == std::string(16, 'x'));
  }
  SECTION("a piece damaged in the holder's memory: refused when the holder is asked to check") {
    Replica bad;
    bad.info.key = ReplicaKey{"llama", 1000, 3, 21, "w"};
    bad.bytes = Pattern(5000);
    bad.info.xxh3 = format::Xxh3(bad.bytes.data(), bad.bytes.size());
    bad.bytes[4000] ^= 1;
    REQUIRE_OK(a.store.Put(std::move(bad)));
    std::string got(100, '\0');
    const absl::Status st =
        b.PullRange(ReplicaKey{"llama", 1000, 3, 21, "w"}, 5000, 0, got.data(), 100, true, kTimeout);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(st.message()), Catch::Contains("no longer match their checksum"));
    // Unchecked, the range (before the flipped byte) comes: the reader's
    // own checksums are what find damage inside a range.
    REQUIRE_OK(
        b.PullRange(ReplicaKey{"llama", 1000, 3, 21, "w"}, 5000, 0, got.data(), 100, false, kTimeout));
    CHECK(got == Pattern(5000).substr(0, 100));
  }
  SECTION("a copy of another size (another run's) is refused, and writes nothing") {
    std::string got(16, 'x');
    const absl::Status st = b.PullRange(kKey, bytes.size() + 1, 0, got.data(), 16, false, kTimeout);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(got == std::string(16, 'x'));
  }
  SECTION("another uid's piece is not served") {
    std::string got(10, '\0');
    const absl::Status st = b.PullRange(ReplicaKey{"llama", 1001, 3, 20, kKey.piece}, bytes.size(), 0,
                                        got.data(), 10, false, kTimeout);
    CHECK(st.code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("peer service: a listing larger than gRPC's default 4 MB message comes back whole") {
  // Every piece one zccd holds for a job, in one answer: about 140 bytes
  // each, 40,000 of them about 6 MB.
  PeerConfig insecure;
  insecure.insecure = true;
  PeerServer a(insecure);
  constexpr int kPieces = 40'000;
  const std::string padding(96, 'p');
  for (int i = 0; i < kPieces; ++i) {
    Replica r;
    r.info.key = ReplicaKey{"llama", 1000, static_cast<uint32_t>(i % 64), 20,
                            absl::StrCat(padding, i)};
    r.info.from_node = "node-b";
    r.info.xxh3 = format::Xxh3(r.bytes.data(), 0);
    REQUIRE_OK(a.store.Put(std::move(r)));
  }
  PeerClient b = ClientOf(a, insecure);
  auto listed = b.List("llama", 1000, kTimeout);
  REQUIRE_OK(listed.status());
  CHECK(listed->size() == kPieces);
}

TEST_CASE("peer directory: probes the peers it watches, up and down") {
  auto server = std::make_unique<PeerServer>(Tls("node-a"));
  const std::string target = server->target();
  auto creds = LoadPeerCredentials(Tls("node-b"));
  REQUIRE_OK(creds.status());
  PeerDirectory::Options options;
  options.self_node = "node-b";
  options.self_failure_domain = "rack-2";
  options.probe_interval = absl::Milliseconds(100);
  options.probe_timeout = absl::Milliseconds(500);
  PeerDirectory dir(options, creds->channel);
  CHECK_FALSE(dir.State(target).has_value());
  dir.Watch(target);
  REQUIRE(zcc::testing::Eventually([&] { return dir.State(target)->up; }, absl::Seconds(10)));
  CHECK(dir.State(target)->node == "node-a");
  CHECK(dir.State(target)->failure_domain == "rack-1");
  CHECK(dir.State(target)->last_seen > absl::Now() - absl::Seconds(10));
  const std::string instance = server->service.instance();
  CHECK(dir.State(target)->instance == instance);
  // Its client is the one the directory keeps.
  CHECK(dir.Client(target) == dir.Client(target));
  const int port = server->port;
  server.reset();
  REQUIRE(zcc::testing::Eventually([&] { return !dir.State(target)->up; }, absl::Seconds(10)));
  CHECK_FALSE(dir.State(target)->error.empty());
  CHECK(dir.State(target)->node == "node-a");  // what it was when last seen
  // Back on the same address, a new run: the directory sees it restarted.
  // (The port is free again unless another process took it meanwhile:
  // rare, and then tried again.)
  for (int attempt = 0; attempt < 50 && server == nullptr; ++attempt) {
    server = PeerServer::At(Tls("node-a"), port);
    if (server == nullptr) absl::SleepFor(absl::Milliseconds(100));
  }
  REQUIRE(server != nullptr);
  REQUIRE(zcc::testing::Eventually([&] { return dir.State(target)->up; }, absl::Seconds(10)));
  CHECK(dir.State(target)->instance == server->service.instance());
  CHECK(dir.State(target)->instance != instance);
}

// Recovers the tier's newest step into `fs`: step 4, with `rank`'s files as
// they were written.
void RecoversStep4With(storage::MemoryStorage& fs, const RecoverySources& sources,
                       const checkpoint::RankStepBytes& rank) {
  auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
  REQUIRE_OK(got.status());
  REQUIRE(got->has_value());
  CHECK(**got == 4);
  for (const auto& f : rank.files) {
    auto bytes = storage::ReadWholeFile(fs, "/ckpt/job/step-00000004/" + f.name, 1 << 30);
    REQUIRE_OK(bytes.status());
    CHECK(*bytes == f.bytes);
  }
}

TEST_CASE("peer recovery: the newest complete step, each file from a holder that serves it intact") {
  PeerConfig insecure;
  insecure.insecure = true;
  PeerServer x(insecure), y(insecure);
  // The holder tried first (the lower address) serves rank 1's shards damaged.
  PeerServer& bad = x.target() < y.target() ? x : y;
  PeerServer& good = &bad == &x ? y : x;
  const auto r0 = StepFiles(0, 4), r1 = StepFiles(1, 4), r1_old = StepFiles(1, 2);
  ReplicaStore own(64 << 20);
  Hold(own, r0, false);
  Hold(own, StepFiles(0, 2), false);
  Hold(bad.store, r1, true);
  Hold(good.store, r1, false);
  Hold(good.store, r1_old, false);
  auto creds = LoadPeerCredentials(insecure);
  REQUIRE_OK(creds.status());
  PeerDirectory::Options options;
  PeerDirectory directory(options, creds->channel);
  RecoverySources sources;
  sources.own = &own;
  sources.directory = &directory;
  sources.timeout = kTimeout;

  SECTION("both holders: step 4, with rank 1's shards from the good one") {
    sources.peers = {bad.target(), good.target()};
    storage::MemoryStorage fs;
    // What a zccd that crashed mid-pull left: never committed with the step.
    REQUIRE_OK(fs.MakeDirs("/ckpt/job/step-00000004.recovered.partial"));
    REQUIRE_OK(storage::WriteFileAtomic(
        fs, "/ckpt/job/step-00000004.recovered.partial/x.pull.1.0", "torn"));
    // The job writing its own step 4 meanwhile (after a restore that fell
    // back past it): its directory is its own, untouched.
    const std::string own = "/ckpt/job/step-00000004.partial/" + r0.files.front().name;
    REQUIRE_OK(fs.MakeDirs("/ckpt/job/step-00000004.partial"));
    REQUIRE_OK(storage::WriteFileAtomic(fs, own, "the job's own"));
    auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    REQUIRE(got->has_value());
    CHECK(**got == 4);
    CHECK(fs.Stat("/ckpt/job/step-00000004/COMMITTED").ok());
    for (const auto* step : {&r0, &r1}) {
      for (const auto& f : step->files) {
        auto bytes = storage::ReadWholeFile(fs, "/ckpt/job/step-00000004/" + f.name, 1 << 30);
        REQUIRE_OK(bytes.status());
        CHECK(*bytes == f.bytes);
      }
    }
    // A damaged pull streamed into a temporary file leaves none behind.
    auto names = fs.List("/ckpt/job/step-00000004");
    REQUIRE_OK(names.status());
    for (const std::string& n : *names) CHECK(n.find(".pull.") == std::string::npos);
    CHECK_FALSE(fs.Stat("/ckpt/job/step-00000004.recovered.partial").ok());
    auto theirs = storage::ReadWholeFile(fs, own, 1 << 20);
    REQUIRE_OK(theirs.status());
    CHECK(*theirs == "the job's own");
    // Nothing newer than what the directory has: nothing to do.
    auto again = RecoverNewestStep("job", 1000, "/ckpt/job", 4, fs, sources);
    REQUIRE_OK(again.status());
    CHECK_FALSE(again->has_value());
  }
  SECTION("only the damaged holder: step 4 cannot be had whole; step 2 can") {
    sources.peers = {bad.target()};
    Hold(bad.store, r1_old, false);
    storage::MemoryStorage fs;
    auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    REQUIRE(got->has_value());
    CHECK(**got == 2);
    CHECK_FALSE(fs.Stat("/ckpt/job/step-00000004/COMMITTED").ok());
    // What was written of step 4 goes with it, temporary files and all.
    CHECK_FALSE(fs.Stat("/ckpt/job/step-00000004.recovered.partial").ok());
  }
  SECTION("this zccd's own copy, damaged in its memory, is passed over for a peer's") {
    sources.peers = {good.target()};
    Hold(own, r1, true);
    storage::MemoryStorage fs;
    RecoversStep4With(fs, sources, r1);
  }
  SECTION("what the manifest names is written, as long as it says: not a holder's other names "
          "nor a longer file") {
    sources.peers = {bad.target(), good.target()};
    // The holder tried first serves rank 1's files intact by their
    // checksums but longer, and lists files of its own, one outside the
    // step's directory (as a peer that lies would).
    for (const auto& f : r1.files) {
      if (f.name.find("manifest") != std::string::npos) continue;
      Replica r;
      r.info.key = ReplicaKey{"job", 1000, 1, 4, f.name};
      r.bytes = f.bytes + "more";
      r.info.xxh3 = format::Xxh3(r.bytes.data(), r.bytes.size());
      REQUIRE_OK(bad.store.Put(std::move(r)));
    }
    for (const std::string name : {"stray.bin", "../evil"}) {
      Replica r;
      r.info.key = ReplicaKey{"job", 1000, 1, 4, name};
      r.bytes = "x";
      r.info.xxh3 = format::Xxh3(r.bytes.data(), r.bytes.size());
      REQUIRE_OK(bad.store.Put(std::move(r)));
    }
    storage::MemoryStorage fs;
    RecoversStep4With(fs, sources, r1);
    auto names = fs.List("/ckpt/job/step-00000004");
    REQUIRE_OK(names.status());
    for (const std::string& n : *names) CHECK(n.find("stray") == std::string::npos);
    auto top = fs.List("/ckpt/job");
    REQUIRE_OK(top.status());
    for (const std::string& n : *top) CHECK(n.find("evil") == std::string::npos);
    CHECK_FALSE(fs.Stat("/ckpt/job/step-00000004.partial/../evil").ok());
  }
  SECTION("a rank nobody holds: nothing") {
    sources.peers = {};
    storage::MemoryStorage fs;
    auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    CHECK_FALSE(got->has_value());
  }
  SECTION("another uid's replicas are not this job's") {
    sources.peers = {good.target()};
    storage::MemoryStorage fs;
    auto got = RecoverNewestStep("job", 1001, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    CHECK_FALSE(got->has_value());
  }
}

TEST_CASE("peer recovery: a step of one run and timeline, each rank's files from the holders of "
          "its manifest on it; a step held whole on two is passed over") {
  PeerConfig insecure;
  insecure.insecure = true;
  PeerServer peer(insecure);
  ReplicaStore own(64 << 20);
  // Step 2 of the job, whole on its first timeline (none).
  Hold(own, StepFiles(0, 2), false);
  Hold(peer.store, StepFiles(1, 2), false);
  // Step 4 written twice: on the timeline the ranks left (this zccd's rank
  // 0) and on the one they went on in ("t2", other bytes).
  const auto left = StepFiles(0, 4, 40), r0 = StepFiles(0, 4, -1, "t2"),
             r1 = StepFiles(1, 4, -1, "t2");
  Hold(own, left, false);
  auto creds = LoadPeerCredentials(insecure);
  REQUIRE_OK(creds.status());
  PeerDirectory::Options options;
  PeerDirectory directory(options, creds->channel);
  RecoverySources sources;
  sources.own = &own;
  sources.directory = &directory;
  sources.timeout = kTimeout;
  sources.peers = {peer.target()};

  SECTION("rank 0 held on both, rank 1 on the new one: step 4 on the new one") {
    Hold(peer.store, r0, false);
    Hold(peer.store, r1, false);
    storage::MemoryStorage fs;
    RecoversStep4With(fs, sources, r0);
    for (const auto& f : r1.files) {
      auto bytes = storage::ReadWholeFile(fs, "/ckpt/job/step-00000004/" + f.name, 1 << 30);
      REQUIRE_OK(bytes.status());
      CHECK(*bytes == f.bytes);
    }
  }
  SECTION("no run and timeline held whole: step 2") {
    Hold(peer.store, r1, false);
    storage::MemoryStorage fs;
    auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    REQUIRE(got->has_value());
    CHECK(**got == 2);
  }
  SECTION("both held whole: which the job went on in cannot be told, step 2") {
    // Rank 1's step 4 on the timeline left at another holder (a holder
    // keeps one piece of a name), the one asked first (holders are asked
    // in address order): the step is whole there on both timelines.
    PeerServer other(insecure);
    PeerServer& first = other.target() < peer.target() ? other : peer;
    PeerServer& second = &first == &other ? peer : other;
    Hold(first.store, StepFiles(1, 4, 40), false);
    Hold(second.store, r0, false);
    Hold(second.store, r1, false);
    sources.peers.push_back(other.target());
    storage::MemoryStorage fs;
    auto got = RecoverNewestStep("job", 1000, "/ckpt/job", -1, fs, sources);
    REQUIRE_OK(got.status());
    REQUIRE(got->has_value());
    CHECK(**got == 2);
  }
}

TEST_CASE("peer credentials: missing or malformed files are named") {
  PeerConfig c = Tls("node-a");
  c.cert_file = "/nonexistent/node.pem";
  auto missing = LoadPeerCredentials(c);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("/nonexistent/node.pem"));
  c = Tls("node-a");
  c.ca_file = c.key_file + ".not-there";
  CHECK_FALSE(LoadPeerCredentials(c).ok());
  c = Tls("node-a");
  c.ca_file = "/etc/hostname";
  auto not_pem = LoadPeerCredentials(c);
  CHECK_THAT(std::string(not_pem.status().message()), Catch::Contains("no PEM block"));
}

}  // namespace
}  // namespace zcc::daemon::peer
