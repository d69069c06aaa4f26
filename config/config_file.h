// zccd's configuration file: Protobuf text format for zcc.v1.DaemonConfigProto
// (config/zccd_config.proto), loaded over a base configuration and validated
// field by field, with "file:line:column: message" errors.
//
//   absl::StatusOr<FullConfig> config = LoadConfigFile("/etc/zcc/zccd.conf");
//
// Precedence is the caller's: load the file over the built-in defaults, then
// apply the command-line flags that were given explicitly.
#ifndef ZCC_CONFIG_CONFIG_FILE_H_
#define ZCC_CONFIG_CONFIG_FILE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "config/daemon_config.h"

namespace zcc::config {

// Settings of the operations side of zccd (listeners, metrics, logging,
// threads) that daemon::DaemonConfig does not carry.
struct OpsConfig {
  // Read-only gRPC status + health service on TCP, "host:port"; empty = off.
  std::string status_tcp_listen;
  // Prometheus GET /metrics endpoint, "ipv4:port"; empty = off.
  std::string metrics_http_listen;
  // node_exporter textfile collector directory; empty = off.
  std::string metrics_textfile_dir;
  absl::Duration metrics_textfile_interval = absl::Seconds(15);
  // DEBUG, INFO, WARNING or ERROR (upper case after loading).
  std::string log_level = "INFO";
  uint32_t ema_threads = 2;
  uint32_t writer_threads = 4;
};

// Everything a configuration file can set.
struct FullConfig {
  daemon::DaemonConfig daemon;
  OpsConfig ops;
  // Fields the file set that this zccd accepts but ignores (settings that
  // were removed), one "<path>:<line>:<column>: <why>" line each, for zccd
  // to log at start. Not an error: an upgraded zccd starts with an old file.
  std::vector<std::string> ignored;
};

// A listen address split into host and port. `host` keeps IPv6 brackets off:
// "[::1]:7070" -> {"::1", 7070}.
struct HostPort {
  std::string host;
  uint16_t port = 0;
  bool ipv6 = false;
};

// Parses "host:port": host is an IPv4 address, a bracketed IPv6 address or a
// DNS name; port is 0..65535 (0 = ephemeral, the bound port is chosen by the
// kernel). InvalidArgument with the reason otherwise.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// "DEBUG", "INFO", "WARNING" or "ERROR", in any case.
absl::StatusOr<zcc::LogLevel> ParseLogLevel(absl::string_view name);

// Reads `path` (at most 1 MiB) and parses it as text format over `base`: each
// field present in the file replaces the base value (a repeated field, when
// listed at all, replaces the whole base list); fields left out keep the base
// value. Empty paths in the result (socket_path, default_root) still mean "the
// default for this user": pass the daemon part to daemon::WithDefaults.
//
// Errors: NotFound / PermissionDenied / ... when the file cannot be read;
// InvalidArgument "<path>:<line>:<column>: <message>" for a syntax error, an
// unknown field or a value of the wrong type (the parser stops at the first),
// and for values out of range, one line per bad field, all reported at once.
//
// `overrides` (command-line flags, say) is applied over the file's values
// before the checks, so that the checks judge the configuration that will
// run: a file that sets heartbeat_interval_ms past the default
// client_timeout_s is fine when the command line raises client_timeout_s.
using Overrides = std::function<void(FullConfig&)>;
absl::StatusOr<FullConfig> LoadConfigFile(const std::string& path, const FullConfig& base = {},
                                          const Overrides& overrides = nullptr);

// LoadConfigFile on text in memory; `source_name` stands for the path in
// error messages.
absl::StatusOr<FullConfig> ParseConfigText(absl::string_view text, absl::string_view source_name,
                                           const FullConfig& base = {},
                                           const Overrides& overrides = nullptr);

// Checks every field of an assembled configuration (for example after flags
// were applied over a loaded file): the checks LoadConfigFile runs, with the
// same per-field messages but without file positions. Empty socket_path and
// default_root are accepted (they mean the default).
absl::Status ValidateFullConfig(const FullConfig& config);

// A commented configuration file in text format that sets every field to its
// value in `config`; LoadConfigFile accepts it and yields `config` back.
// Empty strings (default paths, listeners that are off) are written as
// commented-out examples.
std::string DefaultConfigText(const FullConfig& config);
// The same with OpsConfig defaults.
std::string DefaultConfigText(const daemon::DaemonConfig& config);

}  // namespace zcc::config

#endif  // ZCC_CONFIG_CONFIG_FILE_H_
