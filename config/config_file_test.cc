#include "config/config_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"

namespace zcc::config {
namespace {

using ::zcc::testing::TempDir;

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? absl::StrCat(srcdir, "/zcc/", path) : path;
}

// The error message of parsing `text` as "zccd.conf"; fails the test if it parses.
std::string ParseError(const std::string& text) {
  absl::StatusOr<FullConfig> c = ParseConfigText(text, "zccd.conf");
  INFO(text);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

void RequireSameConfig(const FullConfig& a, const FullConfig& b) {
  const daemon::DaemonConfig& x = a.daemon;
  const daemon::DaemonConfig& y = b.daemon;
  CHECK(x.socket_path == y.socket_path);
  CHECK(x.socket_mode == y.socket_mode);
  CHECK(x.default_root == y.default_root);
  CHECK(x.allowed_roots == y.allowed_roots);
  CHECK(x.shm_prefix == y.shm_prefix);
  CHECK(x.default_num_slots == y.default_num_slots);
  CHECK(x.max_slot_bytes == y.max_slot_bytes);
  CHECK(x.staging_budget_bytes == y.staging_budget_bytes);
  CHECK(x.staging_pool_bytes == y.staging_pool_bytes);
  CHECK(x.staging_pool_entry_bytes == y.staging_pool_entry_bytes);
  CHECK(x.max_tensors_per_rank == y.max_tensors_per_rank);
  CHECK(x.keep_last == y.keep_last);
  CHECK(x.keep_every == y.keep_every);
  CHECK(x.commit_timeout == y.commit_timeout);
  CHECK(x.client_timeout == y.client_timeout);
  CHECK(x.retain_snapshots == y.retain_snapshots);
  CHECK(x.daemon_pull == y.daemon_pull);
  CHECK(x.heartbeat_interval == y.heartbeat_interval);
  CHECK(x.peer.listen == y.peer.listen);
  CHECK(x.peer.cert_file == y.peer.cert_file);
  CHECK(x.peer.key_file == y.peer.key_file);
  CHECK(x.peer.ca_file == y.peer.ca_file);
  CHECK(x.peer.insecure == y.peer.insecure);
  CHECK(x.peer.node_name == y.peer.node_name);
  CHECK(x.peer.failure_domain == y.peer.failure_domain);
  CHECK(x.peer.replica_budget_bytes == y.peer.replica_budget_bytes);
  CHECK(x.peer.replicate_every == y.peer.replicate_every);
  CHECK(x.peer.replicas == y.peer.replicas);
  CHECK(x.peer.replicate_bytes_per_s == y.peer.replicate_bytes_per_s);
  CHECK(x.peer.check_buddies_every == y.peer.check_buddies_every);
  CHECK(x.peer.push_connections == y.peer.push_connections);
  CHECK(x.peer.static_peers == y.peer.static_peers);
  CHECK(a.ops.status_tcp_listen == b.ops.status_tcp_listen);
  CHECK(a.ops.metrics_http_listen == b.ops.metrics_http_listen);
  CHECK(a.ops.metrics_textfile_dir == b.ops.metrics_textfile_dir);
  CHECK(a.ops.metrics_textfile_interval == b.ops.metrics_textfile_interval);
  CHECK(a.ops.log_level == b.ops.log_level);
  CHECK(a.ops.ema_threads == b.ops.ema_threads);
  CHECK(a.ops.writer_threads == b.ops.writer_threads);
}

TEST_CASE("an empty file, or one of comments only, yields the base configuration") {
  const FullConfig defaults;
  for (const char* text : {"", "\n\n", "# nothing set\n  # still nothing\n"}) {
    absl::StatusOr<FullConfig> c = ParseConfigText(text, "zccd.conf");
    REQUIRE_OK(c);
    RequireSameConfig(*c, defaults);
  }

  FullConfig base;
  base.daemon.keep_last = 9;
  base.daemon.allowed_roots = {"/a", "/b"};
  base.ops.ema_threads = 7;
  absl::StatusOr<FullConfig> c = ParseConfigText("", "zccd.conf", base);
  REQUIRE_OK(c);
  RequireSameConfig(*c, base);
}

TEST_CASE("a file setting every field is applied over the base") {
  const std::string text = R"(
    # a comment
    socket_path: "/run/zcc/test.sock"
    socket_mode: 0660            # octal, as in chmod
    default_root: "/mnt/ckpt"
    allowed_roots: "/mnt/ckpt"
    allowed_roots: "/scratch/ckpt"
    shm_prefix: "zcc-test_1"
    default_num_slots: 4
    max_slot_bytes: 1073741824
    staging_budget_bytes: 68719476736
    staging_pool_bytes: 8589934592
    staging_pool_entry_bytes: 2147483648
    max_tensors_per_rank: 5000
    keep_last: 5
    keep_every: 1000
    commit_timeout_s: 120.5
    client_timeout_s: 45
    retain_snapshots_s: 90
    heartbeat_interval_ms: 250
    peer {
      listen: "0.0.0.0:7071"
      cert_file: "/etc/zcc/peer/node.crt"
      key_file: "/etc/zcc/peer/node.key"
      ca_file: "/etc/zcc/peer/ca.crt"
      insecure: false
      node_name: "node-17.example"
      failure_domain: "rack_3"
      replica_budget_bytes: 2147483648
      replicate_every: 10
      replicas: 2
      replicate_bytes_per_s: 104857600
      check_buddies_s: 12.5
      push_connections: 4
      static_peers: "node-18.example:7071"
      static_peers: "[fd00::12]:7071"
    }
    status_tcp_listen: "[::1]:7070"
    metrics_http_listen: "0.0.0.0:9464"
    metrics_textfile_dir: "/var/lib/node_exporter/textfile"
    metrics_textfile_interval_s: 30
    log_level: "debug"
    ema_threads: 3
    writer_threads: 6
  )";
  FullConfig base;
  base.daemon.allowed_roots = {"/replaced"};
  base.daemon.peer.static_peers = {"replaced:7071"};
  absl::StatusOr<FullConfig> c = ParseConfigText(text, "zccd.conf", base);
  REQUIRE_OK(c);
  const daemon::DaemonConfig& d = c->daemon;
  CHECK(d.socket_path == "/run/zcc/test.sock");
  CHECK(d.socket_mode == 0660);
  CHECK(d.default_root == "/mnt/ckpt");
  CHECK(d.allowed_roots == std::vector<std::string>{"/mnt/ckpt", "/scratch/ckpt"});
  CHECK(d.shm_prefix == "zcc-test_1");
  CHECK(d.default_num_slots == 4);
  CHECK(d.max_slot_bytes == (1ull << 30));
  CHECK(d.staging_budget_bytes == (64ull << 30));
  CHECK(d.staging_pool_bytes == (8ull << 30));
  CHECK(d.staging_pool_entry_bytes == (2ull << 30));
  CHECK(d.max_tensors_per_rank == 5000);
  CHECK(d.keep_last == 5);
  CHECK(d.keep_every == 1000);
  CHECK(d.commit_timeout == absl::Milliseconds(120500));
  CHECK(d.client_timeout == absl::Seconds(45));
  CHECK(d.retain_snapshots == absl::Seconds(90));
  CHECK(d.heartbeat_interval == absl::Milliseconds(250));
  CHECK(d.peer.listen == "0.0.0.0:7071");
  CHECK(d.peer.cert_file == "/etc/zcc/peer/node.crt");
  CHECK(d.peer.key_file == "/etc/zcc/peer/node.key");
  CHECK(d.peer.ca_file == "/etc/zcc/peer/ca.crt");
  CHECK_FALSE(d.peer.insecure);
  CHECK(d.peer.node_name == "node-17.example");
  CHECK(d.peer.failure_domain == "rack_3");
  CHECK(d.peer.replica_budget_bytes == (2ull << 30));
  CHECK(d.peer.replicate_every == 10);
  CHECK(d.peer.replicas == 2);
  CHECK(d.peer.replicate_bytes_per_s == (100ull << 20));
  CHECK(d.peer.check_buddies_every == absl::Milliseconds(12500));
  CHECK(d.peer.push_connections == 4);
  CHECK(d.peer.static_peers ==
        std::vector<std::string>{"node-18.example:7071", "[fd00::12]:7071"});
  CHECK(c->ops.status_tcp_listen == "[::1]:7070");
  CHECK(c->ops.metrics_http_listen == "0.0.0.0:9464");
  CHECK(c->ops.metrics_textfile_dir == "/var/lib/node_exporter/textfile");
  CHECK(c->ops.metrics_textfile_interval == absl::Seconds(30));
  CHECK(c->ops.log_level == "DEBUG");
  CHECK(c->ignored.empty());
  CHECK(c->ops.ema_threads == 3);
  CHECK(c->ops.writer_threads == 6);
}

TEST_CASE("fields left out keep the base value") {
  FullConfig base;
  base.daemon.socket_path = "/tmp/base.sock";
  base.daemon.keep_every = 17;
  base.ops.metrics_http_listen = "127.0.0.1:1234";
  absl::StatusOr<FullConfig> c = ParseConfigText("keep_last: 4\n", "zccd.conf", base);
  REQUIRE_OK(c);
  CHECK(c->daemon.keep_last == 4);
  CHECK(c->daemon.socket_path == "/tmp/base.sock");
  CHECK(c->daemon.keep_every == 17);
  CHECK(c->ops.metrics_http_listen == "127.0.0.1:1234");
}

TEST_CASE("an unknown field is reported with file, line and column") {
  const std::string msg = ParseError("keep_last: 2\n\n    keep_lst: 3\n");
  CHECK(absl::StartsWith(msg, "zccd.conf:3:5: "));
  CHECK_THAT(msg, Catch::Contains(
                      "Message type \"zcc.v1.DaemonConfigProto\" has no field named \"keep_lst\""));
}

TEST_CASE("values of the wrong type are syntax errors with a position") {
  struct Case {
    const char* text;
    const char* expect;
  };
  for (const Case& c : std::vector<Case>{
           {"keep_last: \"three\"\n", "zccd.conf:1:12: "},
           {"keep_last: -1\n", "zccd.conf:1:12: "},
           {"keep_last: 1.5\n", "zccd.conf:1:12: "},
           {"keep_last: 4294967296\n", "zccd.conf:1:12: "},
           {"socket_path: 42\n", "zccd.conf:1:14: "},
           {"commit_timeout_s: \"ten\"\n", "zccd.conf:1:19: "},
           {"default_backpressure: SOMETIMES\n", "zccd.conf:1:23: "},
           {"allowed_roots: [\"/a\", 3]\n", "zccd.conf:1:23: "},
           {"keep_last 3 3\n", "zccd.conf:1:"},
           {"keep_last: 3\nkeep_last: 4\n", "zccd.conf:2:1: "},  // non-repeated field twice
           {"socket_path: \"/unterminated\n", "zccd.conf:1:"},
       }) {
    const std::string msg = ParseError(c.text);
    INFO(msg);
    CHECK(absl::StartsWith(msg, c.expect));
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK_THAT(ParseError("keep_last: \"three\"\n"), Catch::Contains("integer"));
  // The parser notices these at the next token; the position is moved back to the name.
  CHECK_THAT(ParseError("keep_last: 3\n\tdefault_backpressure: SOMETIMES  # c\n\nkeep_last: 3\n"),
             Catch::Equals("zccd.conf:2:31: Unknown enumeration value of \"SOMETIMES\" for field "
                           "\"default_backpressure\"."));
  CHECK_THAT(ParseError("keep_last: 3 keep_lst: 4"), Catch::StartsWith("zccd.conf:1:14: "));
  CHECK_THAT(ParseError("keep_last: 3\nkeep_last: 4\n"),
             Catch::Contains("specified multiple times"));
}

TEST_CASE("every out-of-range field is reported, one line each, with its position") {
  const std::string text =
      "default_num_slots: 9\n"           // 1
      "keep_last: 0\n"                   // 2
      "socket_mode: 01000\n"             // 3
      "max_slot_bytes: 100\n"            // 4
      "ema_threads: 300\n"               // 5
      "metrics_textfile_interval_s: 0.5\n"  // 6
      "log_level: \"verbose\"\n"         // 7
      "shm_prefix: \"a/b\"\n"            // 8
      "max_tensors_per_rank: 0\n"        // 9
      "  heartbeat_interval_ms: 0\n"     // 10
      "commit_timeout_s: 1e9\n";         // 11
  const std::string msg = ParseError(text);
  INFO(msg);
  const std::vector<std::string> lines = absl::StrSplit(msg, '\n');
  REQUIRE(lines.size() == 11);
  CHECK(absl::StartsWith(lines.front(), "zccd.conf:1:1: "));  // in file order
  CHECK(absl::StartsWith(lines.back(), "zccd.conf:11:1: "));
  for (const char* expected : {
           "zccd.conf:1:1: default_num_slots: must be in [2, 8], got 9",
           "zccd.conf:2:1: keep_last: must be at least 1, got 0",
           "zccd.conf:3:1: socket_mode: must be permission bits (at most 0777), got 01000",
           "zccd.conf:4:1: max_slot_bytes: must be 4096 to 70368744177664, got 100",
           "zccd.conf:5:1: ema_threads: must be in [1, 256], got 300",
           "zccd.conf:6:1: metrics_textfile_interval_s: must be in [1, 3600], got 0.5",
           "zccd.conf:7:1: log_level: must be DEBUG, INFO, WARNING or ERROR, got \"verbose\"",
           "zccd.conf:8:1: shm_prefix: must be 1..32 characters from [A-Za-z0-9_-], got \"a/b\"",
           "zccd.conf:9:1: max_tensors_per_rank: must be at least 1, got 0",
           "zccd.conf:10:3: heartbeat_interval_ms: must be in [1, 60000], got 0",
           "zccd.conf:11:1: commit_timeout_s: must be at most 604800, got 1000000000",
       }) {
    CHECK(std::find(lines.begin(), lines.end(), expected) != lines.end());
  }
}

TEST_CASE("a staging pool larger than the staging budget is refused") {
  CHECK_THAT(ParseError("staging_budget_bytes: 1048576\nstaging_pool_bytes: 2097152\n"),
             Catch::Equals("zccd.conf:2:1: staging_pool_bytes: must fit in staging_budget_bytes "
                           "(1048576), got 2097152"));
  // A slot size whose segment would overflow 64 bits.
  CHECK_THAT(ParseError("max_slot_bytes: 18446744073709551615\n"),
             Catch::Equals("zccd.conf:1:1: max_slot_bytes: must be 4096 to 70368744177664, "
                           "got 18446744073709551615"));
  CHECK_THAT(ParseError("staging_pool_entry_bytes: 100\n"),
             Catch::Equals("zccd.conf:1:1: staging_pool_entry_bytes: must be 0 or at least 1048576, "
                           "got 100"));
}

TEST_CASE("negative, zero and non-finite durations are refused") {
  CHECK_THAT(ParseError("commit_timeout_s: -5\n"),
             Catch::Equals("zccd.conf:1:1: commit_timeout_s: must be positive, got -5"));
  CHECK_THAT(ParseError("retain_snapshots_s: -1\n"),
             Catch::Equals("zccd.conf:1:1: retain_snapshots_s: must be in [0, 86400], got -1"));
  CHECK_THAT(ParseError("client_timeout_s: 0\n"),
             Catch::Equals("zccd.conf:1:1: client_timeout_s: must be positive, got 0"));
  CHECK_THAT(ParseError("metrics_textfile_interval_s: -15\n"),
             Catch::Contains("metrics_textfile_interval_s: must be in [1, 3600], got -15"));
  CHECK_THAT(ParseError("commit_timeout_s: nan\n"),
             Catch::Equals("zccd.conf:1:1: commit_timeout_s: must be a finite number of seconds, got nan"));
  CHECK_THAT(ParseError("client_timeout_s: inf\n"),
             Catch::Contains("client_timeout_s: must be a finite number of seconds, got inf"));
  CHECK_THAT(ParseError("writer_threads: 0\n"),
             Catch::Equals("zccd.conf:1:1: writer_threads: must be in [1, 256], got 0"));
  CHECK_THAT(ParseError("heartbeat_interval_ms: 60001\nclient_timeout_s: 120\n"),
             Catch::Equals("zccd.conf:1:1: heartbeat_interval_ms: must be in [1, 60000], got 60001"));
  CHECK_THAT(ParseError("client_timeout_s: 0.4\nheartbeat_interval_ms: 500\n"),
             Catch::Equals("zccd.conf:1:1: client_timeout_s: must be longer than "
                           "heartbeat_interval_ms (500 ms), got 0.4 s"));
}

TEST_CASE("relative paths are refused, each with its own message") {
  const std::string msg = ParseError(
      "socket_path: \"run/zccd.sock\"\n"
      "default_root: \"ckpt\"\n"
      "allowed_roots: \"/ok\"\n"
      "allowed_roots: \"rel\"\n"
      "metrics_textfile_dir: \"textfile\"\n");
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains(
                      "zccd.conf:1:1: socket_path: must be an absolute path, got \"run/zccd.sock\""));
  CHECK_THAT(msg, Catch::Contains("zccd.conf:2:1: default_root: must be an absolute path"));
  CHECK_THAT(msg, Catch::Contains("zccd.conf:4:1: allowed_roots[1]: must be an absolute path, got \"rel\""));
  CHECK_THAT(msg, Catch::Contains("zccd.conf:5:1: metrics_textfile_dir: must be an absolute path"));
  CHECK_FALSE(absl::StrContains(msg, "allowed_roots[0]"));
  CHECK_THAT(ParseError(absl::StrCat("socket_path: \"/", std::string(120, 's'), "\"\n")),
             Catch::Contains("must be shorter than 108 bytes"));
}

TEST_CASE("object-store roots: s3:// allowed roots and object_store_roots with their settings") {
  absl::StatusOr<FullConfig> c = ParseConfigText(
      "allowed_roots: \"/mnt/ckpt\"\n"
      "allowed_roots: \"s3://bucket/zcc\"\n"
      "object_store_roots { url: \"s3://other/x\" endpoint_url: \"http://10.0.0.5:9000\" "
      "region: \"eu-west-1\" addressing: \"path\" profile: \"zccd\" "
      "ca_bundle: \"/etc/zcc/store-ca.pem\" }\n",
      "zccd.conf");
  REQUIRE_OK(c);
  CHECK(c->daemon.allowed_roots == std::vector<std::string>{"/mnt/ckpt"});
  REQUIRE(c->daemon.object_store_roots.size() == 2);
  CHECK(c->daemon.object_store_roots[0].url == "s3://bucket/zcc");
  CHECK(c->daemon.object_store_roots[0].endpoint_url.empty());
  const daemon::ObjectStoreRoot& other = c->daemon.object_store_roots[1];
  CHECK(other.url == "s3://other/x");
  CHECK(other.endpoint_url == "http://10.0.0.5:9000");
  CHECK(other.region == "eu-west-1");
  CHECK(other.addressing == "path");
  CHECK(other.profile == "zccd");
  CHECK(other.ca_bundle == "/etc/zcc/store-ca.pem");
  // The printed default configuration shows them, and reads back the same.
  auto again = ParseConfigText(DefaultConfigText(*c), "printed.conf");
  REQUIRE_OK(again);
  REQUIRE(again->daemon.object_store_roots.size() == 2);
  CHECK(again->daemon.object_store_roots[1].profile == "zccd");
  CHECK(again->daemon.object_store_roots[1].ca_bundle == "/etc/zcc/store-ca.pem");

  auto bad = ParseConfigText(
      "object_store_roots { url: \"s3:///nobucket\" }\n"
      "object_store_roots { url: \"s3://b/x\" addressing: \"sideways\" }\n"
      "object_store_roots { url: \"s3://b/y\" endpoint_url: \"10.0.0.5:9000\" }\n"
      "object_store_roots { url: \"s3://b/z\" ca_bundle: \"ca.pem\" }\n",
      "zccd.conf");
  REQUIRE_FALSE(bad.ok());
  const std::string message(bad.status().message());
  CHECK(absl::StrContains(message, "names no bucket"));
  CHECK(absl::StrContains(message, "addressing must be path or virtual"));
  CHECK(absl::StrContains(message, "endpoint_url must start with http:// or https://"));
  CHECK(absl::StrContains(message, "ca_bundle must be an absolute path"));
}

TEST_CASE("listen addresses must be host:port with a valid port") {
  for (const char* good : {"127.0.0.1:7070", "0.0.0.0:9464", "localhost:1", "zccd.example.com:65535",
                           "[::1]:7070", "[::]:0", "10.1.2.3:0"}) {
    INFO(good);
    CHECK_OK(ParseHostPort(good));
  }
  for (const char* bad : {"", "7070", ":7070", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536",
                          "127.0.0.1:-1", "127.0.0.1:70a", "127.0.0.1:123456", "256.1.1.1:80",
                          "1.2.3:80", "::1:7070", "[::1]7070", "[nope]:80", "bad host:80",
                          "under_score:80", "-lead.example:80", "a..b:80"}) {
    INFO(bad);
    CHECK(ParseHostPort(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<HostPort> hp = ParseHostPort("[fe80::1]:9000");
  REQUIRE_OK(hp);
  CHECK(hp->host == "fe80::1");
  CHECK(hp->port == 9000);
  CHECK(hp->ipv6);

  CHECK_THAT(ParseError("status_tcp_listen: \"localhost\"\n"),
             Catch::Contains("zccd.conf:1:1: status_tcp_listen: must be host:port"));
  CHECK_THAT(ParseError("metrics_http_listen: \"127.0.0.1:99999\"\n"),
             Catch::Contains("zccd.conf:1:1: metrics_http_listen: port must be a number in [0, 65535]"));
  // The exporter binds IPv4 only.
  CHECK_THAT(ParseError("metrics_http_listen: \"localhost:9464\"\n"),
             Catch::Contains("metrics_http_listen: host must be an IPv4 address"));
  CHECK_THAT(ParseError("metrics_http_listen: \"[::1]:9464\"\n"),
             Catch::Contains("metrics_http_listen: host must be an IPv4 address"));
  CHECK_THAT(ParseError("status_tcp_listen: \"0.0.0.0:7070\"\nmetrics_http_listen: \"127.0.0.1:7070\"\n"),
             Catch::Contains("zccd.conf:2:1: metrics_http_listen: must not use the port of status_tcp_listen"));
  CHECK_OK(ParseConfigText("status_tcp_listen: \"127.0.0.1:7070\"\n"
                           "metrics_http_listen: \"127.0.0.1:9464\"\n",
                           "zccd.conf"));
}

TEST_CASE("peer: fields left out of the block keep the base value") {
  FullConfig base;
  base.daemon.peer.node_name = "base-node";
  base.daemon.peer.replica_budget_bytes = 1ull << 30;
  base.daemon.peer.replicate_every = 5;
  base.daemon.peer.replicas = 3;
  base.daemon.peer.replicate_bytes_per_s = 50ull << 20;
  base.daemon.peer.static_peers = {"node-2:7071", "node-3:7071"};
  absl::StatusOr<FullConfig> c = ParseConfigText(
      "peer {\n  listen: \"127.0.0.1:0\"\n  insecure: true\n}\n", "zccd.conf", base);
  REQUIRE_OK(c);
  CHECK(c->daemon.peer.listen == "127.0.0.1:0");
  CHECK(c->daemon.peer.insecure);
  CHECK(c->daemon.peer.node_name == "base-node");
  CHECK(c->daemon.peer.replica_budget_bytes == (1ull << 30));
  CHECK(c->daemon.peer.replicate_every == 5);
  CHECK(c->daemon.peer.replicas == 3);
  CHECK(c->daemon.peer.replicate_bytes_per_s == (50ull << 20));
  CHECK(c->daemon.peer.static_peers == std::vector<std::string>{"node-2:7071", "node-3:7071"});
  CHECK(c->daemon.peer.cert_file.empty());
  // Off (no listen): the built-in defaults pass, and so do names and a budget alone.
  CHECK_OK(ParseConfigText("peer { node_name: \"n1\" replica_budget_bytes: 1 }\n", "zccd.conf"));
  CHECK(FullConfig{}.daemon.peer.replica_budget_bytes == (8ull << 30));
  CHECK(FullConfig{}.daemon.peer.replicate_every == 0);
  CHECK(FullConfig{}.daemon.peer.replicas == 1);
  CHECK(FullConfig{}.daemon.peer.replicate_bytes_per_s == 0);
  CHECK(FullConfig{}.daemon.peer.static_peers.empty());
}

TEST_CASE("peer: static_peers, each entry checked, every problem with its position") {
  CHECK_OK(ParseConfigText("peer {\n  static_peers: \"node-2:7071\"\n"
                           "  static_peers: \"10.0.0.3:7071\"\n  static_peers: \"[::1]:7071\"\n"
                           "  static_peers: \"node-2:7072\"\n}\n",
                           "zccd.conf"));
  CHECK_THAT(ParseError("peer {\n  static_peers: \"node-2\"\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.static_peers[0]: must be host:port, e.g. "
                           "127.0.0.1:9464, got \"node-2\" (no port)"));
  CHECK_THAT(ParseError("peer { static_peers: \"node-2:7071\" static_peers: \"node-3:0\" }\n"),
             Catch::Equals("zccd.conf:1:36: peer.static_peers[1]: port must be in [1, 65535], got 0 "
                           "in \"node-3:0\""));
  CHECK_THAT(ParseError("peer {\n  static_peers: \"node-2:7071\"\n  static_peers: \"NODE-2:07071\"\n}\n"),
             Catch::Equals("zccd.conf:3:3: peer.static_peers[1]: must not repeat "
                           "peer.static_peers[0] (\"node-2:7071\"), got \"NODE-2:07071\""));
  CHECK_THAT(ParseError("peer { static_peers: [\"[fd00::1]:7071\", \"[fd00:0::1]:7071\"] }\n"),
             Catch::Contains("peer.static_peers[1]: must not repeat peer.static_peers[0]"));
  // All of them at once, in file order.
  const std::string msg = ParseError(
      "peer {\n"                               // 1
      "  static_peers: \"node-2:7071\"\n"       // 2
      "  static_peers: \"bad host:7071\"\n"     // 3
      "  static_peers: \"node-3:70000\"\n"      // 4
      "  static_peers: \"node-2:7071\"\n"       // 5
      "  static_peers: \"10.0.0.4:0\"\n"        // 6
      "  static_peers: \"\"\n"                  // 7
      "}\n");
  INFO(msg);
  const std::vector<std::string> lines = absl::StrSplit(msg, '\n');
  CHECK(lines == std::vector<std::string>{
                     "zccd.conf:3:3: peer.static_peers[1]: bad host \"bad host\" in \"bad host:7071\"",
                     "zccd.conf:4:3: peer.static_peers[2]: port must be a number in [0, 65535], got "
                     "\"70000\" in \"node-3:70000\"",
                     "zccd.conf:5:3: peer.static_peers[3]: must not repeat peer.static_peers[0] "
                     "(\"node-2:7071\"), got \"node-2:7071\"",
                     "zccd.conf:6:3: peer.static_peers[4]: port must be in [1, 65535], got 0 in "
                     "\"10.0.0.4:0\"",
                     "zccd.conf:7:3: peer.static_peers[5]: must be host:port, e.g. 127.0.0.1:9464, "
                     "got \"\" (no port)",
                 });
  // At most 1024 entries: the list as a whole, placed at its first entry.
  auto list = [](int n) {
    std::string text = "keep_last: 3\npeer {\n";
    for (int i = 0; i < n; ++i) absl::StrAppend(&text, "  static_peers: \"node-", i, ":7071\"\n");
    return absl::StrCat(text, "}\n");
  };
  CHECK_OK(ParseConfigText(list(1024), "zccd.conf"));
  CHECK_THAT(ParseError(list(1025)),
             Catch::Equals("zccd.conf:3:3: peer.static_peers: must be at most 1024 entries, got 1025"));
}

TEST_CASE("peer: each bad field is reported with its position") {
  // listen needs TLS files or insecure; what is missing is named.
  CHECK_THAT(ParseError("peer {\n  listen: \"0.0.0.0:7071\"\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.listen: needs cert_file, key_file and ca_file "
                           "(mutual TLS), or insecure: true (tests only); missing cert_file, "
                           "key_file, ca_file"));
  CHECK_THAT(ParseError("peer {\n  listen: \"0.0.0.0:7071\"\n  key_file: \"/k.pem\"\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.listen: needs cert_file, key_file and ca_file "
                           "(mutual TLS), or insecure: true (tests only); missing cert_file, "
                           "ca_file"));
  CHECK_THAT(ParseError("peer { listen: \"localhost\" insecure: true }\n"),
             Catch::Equals("zccd.conf:1:8: peer.listen: must be host:port, e.g. 127.0.0.1:9464, "
                           "got \"localhost\" (no port)"));
  CHECK_THAT(ParseError("peer { listen: \"127.0.0.1:70000\" insecure: true }\n"),
             Catch::Contains("zccd.conf:1:8: peer.listen: port must be a number in [0, 65535]"));
  // Plaintext and TLS files: choose one.
  CHECK_THAT(ParseError("peer {\n  listen: \"127.0.0.1:0\"\n  cert_file: \"/c.pem\"\n"
                        "  ca_file: \"/ca.pem\"\n  insecure: true\n}\n"),
             Catch::Equals("zccd.conf:5:3: peer.insecure: true together with cert_file, ca_file: "
                           "choose one (plaintext, or mutual TLS)"));
  // Files without listen.
  const std::string off = ParseError(
      "peer {\n  cert_file: \"/c.pem\"\n  key_file: \"/k.pem\"\n  ca_file: \"/ca.pem\"\n}\n");
  CHECK_THAT(off, Catch::Equals(
                      "zccd.conf:2:3: peer.cert_file: set without peer.listen (the peer service is off)\n"
                      "zccd.conf:3:3: peer.key_file: set without peer.listen (the peer service is off)\n"
                      "zccd.conf:4:3: peer.ca_file: set without peer.listen (the peer service is off)"));
  CHECK_THAT(ParseError("peer {\n  listen: \"127.0.0.1:0\"\n  cert_file: \"/c.pem\"\n"
                        "  key_file: \"node.key\"\n  ca_file: \"/ca.pem\"\n}\n"),
             Catch::Equals("zccd.conf:4:3: peer.key_file: must be an absolute path, got \"node.key\""));
  // The replica budget, with the service on.
  CHECK_THAT(ParseError("peer { listen: \"127.0.0.1:0\" insecure: true replica_budget_bytes: 1048575 }\n"),
             Catch::Equals("zccd.conf:1:45: peer.replica_budget_bytes: must be at least 1048576 "
                           "(1 MiB), got 1048575"));
  CHECK_OK(ParseConfigText(
      "peer { listen: \"127.0.0.1:0\" insecure: true replica_budget_bytes: 1048576 }\n", "zccd.conf"));
  // Names.
  CHECK_THAT(ParseError("peer { node_name: \"node 1\" }\n"),
             Catch::Equals("zccd.conf:1:8: peer.node_name: must be characters from [A-Za-z0-9._-] "
                           "only, got \"node 1\""));
  CHECK_THAT(ParseError("peer {\n  failure_domain: \"rack/3\"\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.failure_domain: must be characters from "
                           "[A-Za-z0-9._-] only, got \"rack/3\""));
  CHECK_THAT(ParseError(absl::StrCat("peer { node_name: \"", std::string(254, 'n'), "\" }\n")),
             Catch::Equals("zccd.conf:1:8: peer.node_name: must be at most 253 bytes, got 254"));
  CHECK_OK(ParseConfigText(absl::StrCat("peer { node_name: \"", std::string(253, 'n'), "\" }\n"),
                           "zccd.conf"));
  // Replication: checked with the service on or off.
  CHECK_THAT(ParseError("peer {\n  replicate_every: 1000001\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.replicate_every: must be at most 1000000, got "
                           "1000001"));
  CHECK_OK(ParseConfigText("peer { replicate_every: 1000000 }\n", "zccd.conf"));
  CHECK_THAT(ParseError("peer { replicas: 0 }\n"),
             Catch::Equals("zccd.conf:1:8: peer.replicas: must be in [1, 8], got 0"));
  CHECK_THAT(ParseError("peer { listen: \"127.0.0.1:0\" insecure: true replicas: 9 }\n"),
             Catch::Equals("zccd.conf:1:45: peer.replicas: must be in [1, 8], got 9"));
  CHECK_OK(ParseConfigText("peer { replicas: 8 }\n", "zccd.conf"));
  CHECK_THAT(ParseError("peer {\n  replicate_bytes_per_s: 1048575\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.replicate_bytes_per_s: must be 0 or at least "
                           "1048576 (1 MiB/s), got 1048575"));
  CHECK_OK(ParseConfigText("peer { replicate_bytes_per_s: 1048576 }\n", "zccd.conf"));
  CHECK_THAT(ParseError("peer {\n  push_connections: 0\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.push_connections: must be in [1, 64], got 0"));
  CHECK_THAT(ParseError("peer { push_connections: 65 }\n"),
             Catch::Contains("peer.push_connections: must be in [1, 64], got 65"));
  CHECK_OK(ParseConfigText("peer { push_connections: 64 }\n", "zccd.conf"));
  CHECK_OK(ParseConfigText("peer { replicate_bytes_per_s: 0 replicate_every: 0 }\n", "zccd.conf"));
  CHECK_THAT(ParseError("peer {\n  check_buddies_s: 0.5\n}\n"),
             Catch::Equals("zccd.conf:2:3: peer.check_buddies_s: must be 0 (never) or at least 1 "
                           "second, got 0.5"));
  CHECK_THAT(ParseError("peer { check_buddies_s: -3 }\n"),
             Catch::Equals("zccd.conf:1:8: peer.check_buddies_s: must be 0 (never) or at least 1 "
                           "second, got -3"));
  CHECK_OK(ParseConfigText("peer { check_buddies_s: 0 }\n", "zccd.conf"));
  CHECK_OK(ParseConfigText("peer { check_buddies_s: 1 }\n", "zccd.conf"));
}

TEST_CASE("peer: every problem is reported at once, in file order") {
  const std::string msg = ParseError(
      "keep_last: 0\n"                        // 1
      "peer {\n"                              // 2
      "  listen: \"0.0.0.0:7071\"\n"          // 3
      "  cert_file: \"c.pem\"\n"              // 4
      "  node_name: \"a:b\"\n"                // 5
      "  failure_domain: \"rack 3\"\n"        // 6
      "  replica_budget_bytes: 0\n"           // 7
      "  replicate_every: 2000000\n"         // 8
      "  replicas: 0\n"                      // 9
      "  replicate_bytes_per_s: 1\n"         // 10
      "}\n");
  INFO(msg);
  const std::vector<std::string> lines = absl::StrSplit(msg, '\n');
  CHECK(lines == std::vector<std::string>{
                     "zccd.conf:1:1: keep_last: must be at least 1, got 0",
                     "zccd.conf:3:3: peer.listen: needs cert_file, key_file and ca_file (mutual "
                     "TLS), or insecure: true (tests only); missing key_file, ca_file",
                     "zccd.conf:4:3: peer.cert_file: must be an absolute path, got \"c.pem\"",
                     "zccd.conf:5:3: peer.node_name: must be characters from [A-Za-z0-9._-] only, "
                     "got \"a:b\"",
                     "zccd.conf:6:3: peer.failure_domain: must be characters from [A-Za-z0-9._-] "
                     "only, got \"rack 3\"",
                     "zccd.conf:7:3: peer.replica_budget_bytes: must be at least 1048576 (1 MiB), "
                     "got 0",
                     "zccd.conf:8:3: peer.replicate_every: must be at most 1000000, got 2000000",
                     "zccd.conf:9:3: peer.replicas: must be in [1, 8], got 0",
                     "zccd.conf:10:3: peer.replicate_bytes_per_s: must be 0 or at least 1048576 "
                     "(1 MiB/s), got 1",
                 });
}

TEST_CASE("peer: overrides (the command line) over the file; values not from the file have no position") {
  const std::string text = "peer {\n  listen: \"0.0.0.0:7071\"\n  node_name: \"file-node\"\n}\n";
  CHECK_THAT(std::string(ParseConfigText(text, "zccd.conf").status().message()),
             Catch::StartsWith("zccd.conf:2:3: peer.listen: needs cert_file"));
  // As --peer_insecure --node_name=flag-node --replica_budget_mb=64 --replicate_every=4
  // --replicas=2 --replicate_mb_s=200 would.
  absl::StatusOr<FullConfig> c =
      ParseConfigText(text, "zccd.conf", FullConfig{}, [](FullConfig& config) {
        config.daemon.peer.insecure = true;
        config.daemon.peer.node_name = "flag-node";
        config.daemon.peer.replica_budget_bytes = 64ull << 20;
        config.daemon.peer.replicate_every = 4;
        config.daemon.peer.replicas = 2;
        config.daemon.peer.replicate_bytes_per_s = 200ull << 20;
      });
  REQUIRE_OK(c);
  CHECK(c->daemon.peer.listen == "0.0.0.0:7071");
  CHECK(c->daemon.peer.insecure);
  CHECK(c->daemon.peer.node_name == "flag-node");
  CHECK(c->daemon.peer.replica_budget_bytes == (64ull << 20));
  CHECK(c->daemon.peer.replicate_every == 4);
  CHECK(c->daemon.peer.replicas == 2);
  CHECK(c->daemon.peer.replicate_bytes_per_s == (200ull << 20));
  // As --peer_static=node-2:7071,node-3:7071 over a file listing one; as
  // --peer_static= (empty) it clears the file's list.
  const std::string listed = "peer {\n  static_peers: \"file-node:7071\"\n}\n";
  absl::StatusOr<FullConfig> s =
      ParseConfigText(listed, "zccd.conf", FullConfig{}, [](FullConfig& config) {
        config.daemon.peer.static_peers = {"node-2:7071", "node-3:7071"};
      });
  REQUIRE_OK(s);
  CHECK(s->daemon.peer.static_peers == std::vector<std::string>{"node-2:7071", "node-3:7071"});
  s = ParseConfigText(listed, "zccd.conf", FullConfig{},
                      [](FullConfig& config) { config.daemon.peer.static_peers.clear(); });
  REQUIRE_OK(s);
  CHECK(s->daemon.peer.static_peers.empty());
  // As --peer_static=node-2:7071,node-2:0 over a file without the list: no position.
  CHECK(ParseConfigText(text, "zccd.conf", FullConfig{},
                        [](FullConfig& config) {
                          config.daemon.peer.insecure = true;
                          config.daemon.peer.static_peers = {"node-2:7071", "node-2:0"};
                        })
            .status()
            .message() ==
        "zccd.conf: peer.static_peers[1]: port must be in [1, 65535], got 0 in \"node-2:0\"");
  // As --replicas=0 over the file: no position.
  CHECK(ParseConfigText(text, "zccd.conf", FullConfig{},
                        [](FullConfig& config) {
                          config.daemon.peer.insecure = true;
                          config.daemon.peer.replicas = 0;
                        })
            .status()
            .message() == "zccd.conf: peer.replicas: must be in [1, 8], got 0");
  // As --peer_cert=cert.pem over a file without it.
  CHECK(ParseConfigText(text, "zccd.conf", FullConfig{},
                        [](FullConfig& config) {
                          config.daemon.peer.insecure = true;
                          config.daemon.peer.cert_file = "cert.pem";
                        })
            .status()
            .message() ==
        "zccd.conf: peer.cert_file: must be an absolute path, got \"cert.pem\"\n"
        "zccd.conf: peer.insecure: true together with cert_file: choose one (plaintext, or "
        "mutual TLS)");

  FullConfig config;
  config.daemon.peer.listen = "127.0.0.1:7071";
  config.daemon.peer.ca_file = "/ca.pem";
  CHECK(ValidateFullConfig(config).message() ==
        "peer.listen: needs cert_file, key_file and ca_file (mutual TLS), or insecure: true "
        "(tests only); missing cert_file, key_file");
  config.daemon.peer.cert_file = "/c.pem";
  config.daemon.peer.key_file = "/k.pem";
  CHECK_OK(ValidateFullConfig(config));
  config.daemon.peer.replicate_bytes_per_s = 1000;
  CHECK(ValidateFullConfig(config).message() ==
        "peer.replicate_bytes_per_s: must be 0 or at least 1048576 (1 MiB/s), got 1000");
  config.daemon.peer.replicate_bytes_per_s = 0;
  config.daemon.peer.static_peers = {"node-2:7071", "node-2:7071"};
  CHECK(ValidateFullConfig(config).message() ==
        "peer.static_peers[1]: must not repeat peer.static_peers[0] (\"node-2:7071\"), got "
        "\"node-2:7071\"");
}

TEST_CASE("removed settings still load, each named with its line as ignored") {
  absl::StatusOr<FullConfig> c = ParseConfigText(
      "keep_last: 2\nio_threads: 16\n  default_backpressure: BLOCK\n", "zccd.conf");
  REQUIRE_OK(c);
  CHECK(c->daemon.keep_last == 2);
  REQUIRE(c->ignored.size() == 2);
  CHECK_THAT(c->ignored[0], Catch::StartsWith("zccd.conf:2:1: io_threads: ignored (removed)"));
  CHECK_THAT(c->ignored[1],
             Catch::StartsWith("zccd.conf:3:3: default_backpressure: ignored (removed)"));
  // Nothing the default file writes is ignored.
  absl::StatusOr<FullConfig> d = ParseConfigText(DefaultConfigText(FullConfig{}), "default.conf");
  REQUIRE_OK(d);
  CHECK(d->ignored.empty());
}

TEST_CASE("a bad value from the base is reported without a line") {
  FullConfig base;
  base.ops.ema_threads = 0;
  absl::StatusOr<FullConfig> c = ParseConfigText("keep_last: 2\n", "zccd.conf", base);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "zccd.conf: ema_threads: must be in [1, 256], got 0");

  CHECK(ValidateFullConfig(base).message() == "ema_threads: must be in [1, 256], got 0");
  CHECK_OK(ValidateFullConfig(FullConfig{}));
}

TEST_CASE("overrides (the command line) are applied over the file before the checks") {
  const std::string text = "heartbeat_interval_ms: 60000\nkeep_last: 4\n";
  // Alone, the file's interval is longer than the default client timeout.
  CHECK_THAT(std::string(ParseConfigText(text, "zccd.conf").status().message()),
             Catch::Contains("client_timeout_s: must be longer than heartbeat_interval_ms"));
  absl::StatusOr<FullConfig> c =
      ParseConfigText(text, "zccd.conf", FullConfig{}, [](FullConfig& config) {
        config.daemon.client_timeout = absl::Seconds(120);
        config.daemon.keep_last = 7;
      });
  REQUIRE_OK(c);
  CHECK(c->daemon.heartbeat_interval == absl::Seconds(60));
  CHECK(c->daemon.client_timeout == absl::Seconds(120));
  CHECK(c->daemon.keep_last == 7);  // the override wins over the file
  // An override that breaks a check is refused like a bad file.
  CHECK_FALSE(ParseConfigText("keep_last: 4\n", "zccd.conf", FullConfig{},
                              [](FullConfig& config) { config.daemon.keep_last = 0; })
                  .ok());
}

TEST_CASE("DefaultConfigText round-trips through the loader") {
  SECTION("built-in defaults with the paths filled in") {
    FullConfig config;
    config.daemon = daemon::WithDefaults(config.daemon);
    const std::string text = DefaultConfigText(config);
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "default.conf");
    REQUIRE_OK(back);
    RequireSameConfig(*back, config);
  }
  SECTION("built-in defaults with empty paths: the paths stay commented out") {
    const std::string text = DefaultConfigText(daemon::DaemonConfig{});
    CHECK_THAT(text, Catch::Contains("# socket_path: "));
    CHECK_THAT(text, Catch::Contains("# status_tcp_listen: \"127.0.0.1:7070\""));
    CHECK_THAT(text, Catch::Contains("# peer {\n"
                                     "#   listen: \"0.0.0.0:7071\"\n"
                                     "#   cert_file: \"/etc/zcc/peer/node.crt\"\n"
                                     "#   key_file: \"/etc/zcc/peer/node.key\"\n"
                                     "#   ca_file: \"/etc/zcc/peer/ca.crt\"\n"
                                     "#   node_name: \"node-1\"\n"
                                     "#   failure_domain: \"rack-1\"\n"));
    CHECK_THAT(text, Catch::Contains("#   replica_budget_bytes: 8589934592\n"));
    CHECK_THAT(text, Catch::Contains("#   replicate_every: 0\n"));
    CHECK_THAT(text, Catch::Contains("#   replicas: 1\n"));
    CHECK_THAT(text, Catch::Contains("#   replicate_bytes_per_s: 0\n"));
    CHECK_THAT(text, Catch::Contains("#   static_peers: \"node-2:7071\"\n# }\n"));
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "default.conf");
    REQUIRE_OK(back);
    RequireSameConfig(*back, FullConfig{});
  }
  SECTION("the commented-out peer block, uncommented, loads") {
    const std::string text = DefaultConfigText(daemon::DaemonConfig{});
    std::string block;
    bool in_block = false;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (line == "# peer {") in_block = true;
      if (in_block) absl::StrAppend(&block, line.substr(2), "\n");
      if (line == "# }") break;
    }
    INFO(block);
    absl::StatusOr<FullConfig> c = ParseConfigText(block, "peer.conf");
    REQUIRE_OK(c);
    CHECK(c->daemon.peer.listen == "0.0.0.0:7071");
    CHECK(c->daemon.peer.cert_file == "/etc/zcc/peer/node.crt");
    CHECK(c->daemon.peer.key_file == "/etc/zcc/peer/node.key");
    CHECK(c->daemon.peer.ca_file == "/etc/zcc/peer/ca.crt");
    CHECK(c->daemon.peer.node_name == "node-1");
    CHECK(c->daemon.peer.failure_domain == "rack-1");
    CHECK(c->daemon.peer.replica_budget_bytes == (8ull << 30));
    CHECK(c->daemon.peer.replicate_every == 0);
    CHECK(c->daemon.peer.replicas == 1);
    CHECK(c->daemon.peer.replicate_bytes_per_s == 0);
    CHECK(c->daemon.peer.static_peers == std::vector<std::string>{"node-2:7071"});
  }
  SECTION("a peer block with some fields set: the empty ones stay commented out") {
    FullConfig config;
    config.daemon.peer.listen = "127.0.0.1:0";
    config.daemon.peer.insecure = true;
    config.daemon.peer.replica_budget_bytes = 1ull << 20;
    config.daemon.peer.replicas = 2;
    const std::string text = DefaultConfigText(config);
    INFO(text);
    CHECK_THAT(text, Catch::Contains("\npeer {\n  listen: \"127.0.0.1:0\"\n"
                                     "  # cert_file: \"/etc/zcc/peer/node.crt\"\n"));
    CHECK_THAT(text, Catch::Contains("\n  insecure: true\n"));
    CHECK_THAT(text, Catch::Contains("\n  replicate_every: 0\n"));
    CHECK_THAT(text, Catch::Contains("\n  replicas: 2\n"));
    CHECK_THAT(text, Catch::Contains("\n  replicate_bytes_per_s: 0\n"));
    CHECK_THAT(text, Catch::Contains("\n  # static_peers: \"node-2:7071\"\n}\n"));
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "custom.conf");
    REQUIRE_OK(back);
    RequireSameConfig(*back, config);
  }
  SECTION("a replication setting alone writes the block, the service still off") {
    FullConfig config;
    config.daemon.peer.replicate_every = 3;
    const std::string text = DefaultConfigText(config);
    INFO(text);
    CHECK_THAT(text, Catch::Contains("\npeer {\n  # listen: \"0.0.0.0:7071\"\n"));
    CHECK_THAT(text, Catch::Contains("\n  replicate_every: 3\n"));
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "custom.conf");
    REQUIRE_OK(back);
    RequireSameConfig(*back, config);
  }
  SECTION("static peers alone write the block, one line each") {
    FullConfig config;
    config.daemon.peer.static_peers = {"node-2:7071", "[fd00::3]:7071"};
    const std::string text = DefaultConfigText(config);
    INFO(text);
    CHECK_THAT(text, Catch::Contains("\npeer {\n  # listen: \"0.0.0.0:7071\"\n"));
    CHECK_THAT(text, Catch::Contains("\n  static_peers: \"node-2:7071\"\n"
                                     "  static_peers: \"[fd00::3]:7071\"\n}\n"));
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "custom.conf");
    REQUIRE_OK(back);
    RequireSameConfig(*back, config);
  }
  SECTION("every field changed, with strings that need escaping") {
    FullConfig config;
    daemon::DaemonConfig& d = config.daemon;
    d.socket_path = "/run/zcc \"quoted\"\\x.sock";
    d.socket_mode = 0640;
    d.default_root = "/mnt/ckpt";
    d.allowed_roots = {"/mnt/ckpt", "/scratch/\xc3\xa4"};
    d.shm_prefix = "node-7";
    d.default_num_slots = 8;
    d.max_slot_bytes = 123456789;
    d.staging_budget_bytes = 1ull << 40;
    d.max_tensors_per_rank = 77;
    d.keep_last = 11;
    d.keep_every = 500;
    d.commit_timeout = absl::Milliseconds(1500);
    d.client_timeout = absl::Seconds(0.1);
    d.heartbeat_interval = absl::Milliseconds(20);
    d.peer.listen = "[::]:7071";
    d.peer.cert_file = "/etc/zcc/peer \"a\".crt";
    d.peer.key_file = "/etc/zcc/peer/node.key";
    d.peer.ca_file = "/etc/zcc/peer/ca.crt";
    d.peer.node_name = "node-7.example";
    d.peer.failure_domain = "rack_2";
    d.peer.replica_budget_bytes = 3ull << 30;
    d.peer.replicate_every = 1000000;
    d.peer.replicas = 8;
    d.peer.replicate_bytes_per_s = 1ull << 20;
    d.peer.check_buddies_every = absl::Seconds(90);
    d.peer.static_peers = {"node-8.example:7071", "10.0.0.9:7071"};
    config.ops.status_tcp_listen = "[::]:7070";
    config.ops.metrics_http_listen = "127.0.0.1:9464";
    config.ops.metrics_textfile_dir = "/var/lib/node_exporter";
    config.ops.metrics_textfile_interval = absl::Seconds(60);
    config.ops.log_level = "WARNING";
    config.ops.ema_threads = 256;
    REQUIRE_OK(ValidateFullConfig(config));
    const std::string text = DefaultConfigText(config);
    absl::StatusOr<FullConfig> back = ParseConfigText(text, "custom.conf");
    INFO(text);
    REQUIRE_OK(back);
    RequireSameConfig(*back, config);
  }
}

TEST_CASE("files: loaded from disk; missing, unreadable or huge files give clear errors") {
  const std::string dir = TempDir();
  const std::string path = JoinPath(dir, "zccd.conf");
  REQUIRE_OK(WriteFileAtomic(path, "keep_last: 6\nlog_level: \"ERROR\"\n"));
  absl::StatusOr<FullConfig> c = LoadConfigFile(path);
  REQUIRE_OK(c);
  CHECK(c->daemon.keep_last == 6);
  CHECK(c->ops.log_level == "ERROR");

  REQUIRE_OK(WriteFileAtomic(path, "keep_last: 0\n"));
  CHECK(LoadConfigFile(path).status().message() ==
        absl::StrCat(path, ":1:1: keep_last: must be at least 1, got 0"));

  const std::string missing = JoinPath(dir, "missing.conf");
  absl::StatusOr<FullConfig> m = LoadConfigFile(missing);
  CHECK(m.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(m.status().message()), Catch::Contains("config file " + missing));
  CHECK_THAT(std::string(m.status().message()), Catch::Contains("No such file or directory"));

  absl::StatusOr<FullConfig> d = LoadConfigFile(dir);  // a directory
  CHECK_FALSE(d.ok());
  CHECK_THAT(std::string(d.status().message()), Catch::Contains("config file " + dir));

  REQUIRE_OK(WriteFileAtomic(path, std::string(2 << 20, '#')));
  absl::StatusOr<FullConfig> big = LoadConfigFile(path);
  CHECK_FALSE(big.ok());
  CHECK_THAT(std::string(big.status().message()), Catch::Contains("at most 1048576"));

  if (::geteuid() != 0) {  // root reads mode-000 files anyway
    REQUIRE_OK(WriteFileAtomic(path, "keep_last: 6\n"));
    REQUIRE(::chmod(path.c_str(), 0) == 0);
    CHECK(LoadConfigFile(path).status().code() == absl::StatusCode::kPermissionDenied);
  }
  REQUIRE_OK(RemoveTree(dir));
}

TEST_CASE("deploy/zccd.conf.example loads and sets what it says") {
  absl::StatusOr<FullConfig> c = LoadConfigFile(Runfile("deploy/zccd.conf.example"));
  REQUIRE_OK(c);
  CHECK(c->daemon.socket_path == "/run/zcc/zccd.sock");
  CHECK(c->daemon.default_root == "/var/lib/zcc/checkpoints");
  CHECK(c->ops.status_tcp_listen == "127.0.0.1:7070");
  CHECK(c->ops.metrics_http_listen == "127.0.0.1:9464");
  CHECK(c->daemon.keep_last >= 1);
  CHECK(c->daemon.peer.listen.empty());  // the peer block is commented out
  CHECK(c->daemon.peer.static_peers.empty());
}

TEST_CASE("the zccd.conf of the Kubernetes ConfigMap loads") {
  absl::StatusOr<std::string> yaml =
      ReadFileToString(Runfile("deploy/k8s/zccd-daemonset.yaml"), 1 << 20);
  REQUIRE_OK(yaml);
  // The block scalar under "zccd.conf: |", indented by 4 spaces.
  std::string conf;
  bool in_block = false;
  for (absl::string_view line : absl::StrSplit(*yaml, '\n')) {
    if (in_block) {
      if (!line.empty() && !absl::StartsWith(line, "    ")) break;
      absl::StrAppend(&conf, line.substr(std::min<size_t>(4, line.size())), "\n");
    } else if (line == "  zccd.conf: |") {
      in_block = true;
    }
  }
  REQUIRE_FALSE(conf.empty());
  absl::StatusOr<FullConfig> c = ParseConfigText(conf, "zccd-daemonset.yaml:zccd.conf");
  REQUIRE_OK(c);
  CHECK(c->daemon.socket_path == "/run/zcc/zccd.sock");
  CHECK(c->ops.status_tcp_listen == "0.0.0.0:7070");
  CHECK(c->ops.metrics_http_listen == "0.0.0.0:9464");
}

}  // namespace
}  // namespace zcc::config
