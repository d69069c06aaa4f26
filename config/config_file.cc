#include "config/config_file.h"

#include <arpa/inet.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status.h"
#include "config/zccd_config.pb.h"
#include "shm/control_block.h"

namespace zcc::config {
namespace {

using ::zcc::v1::DaemonConfigProto;

constexpr uint64_t kMaxConfigFileBytes = 1 << 20;
constexpr uint32_t kMaxThreads = 256;
constexpr double kMaxCommitTimeoutS = 7 * 24 * 3600;
constexpr double kMaxClientTimeoutS = 24 * 3600;
constexpr double kMinTextfileIntervalS = 1;
constexpr double kMaxTextfileIntervalS = 3600;
constexpr size_t kSunPathBytes = 108;
constexpr uint64_t kMinReplicaBudgetBytes = 1 << 20;
constexpr size_t kMaxPeerNameBytes = 253;
constexpr uint32_t kMaxReplicateEvery = 1000000;
constexpr uint32_t kMaxReplicas = 8;
constexpr uint32_t kMaxPushConnections = 64;
constexpr uint64_t kMinReplicateBytesPerS = 1 << 20;
constexpr size_t kMaxStaticPeers = 1024;

// Records the parser's first error (0-based position, as the tokenizer counts).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  bool has_error() const { return has_error_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  bool has_error_ = false;
  int line_ = -1;
  int column_ = 0;
  std::string message_;
};

// The tokenizer's column of byte `offset` within its line: tabs advance to the
// next multiple of 8.
int ColumnOf(absl::string_view line_text, size_t offset) {
  int column = 0;
  for (size_t i = 0; i < offset && i < line_text.size(); ++i) {
    column = line_text[i] == '\t' ? column + 8 - column % 8 : column + 1;
  }
  return column;
}

// The parser reports an unknown field, an unknown enum value or a repeated
// scalar at the token after the offending name (often the next line). Moves
// the position back to that name when it is on the same or an earlier line.
void PointAtName(absl::string_view text, const std::string& message, int* line, int* column) {
  std::string name;
  for (absl::string_view marker : {"has no field named \"", "Unknown enumeration value of \"",
                                   "Non-repeated field \""}) {
    const size_t at = message.find(std::string(marker));
    if (at == std::string::npos) continue;
    const size_t begin = at + marker.size();
    const size_t end = message.find('"', begin);
    if (end != std::string::npos) name = message.substr(begin, end - begin);
    break;
  }
  if (name.empty() || *line < 0) return;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  auto is_word = [](char c) { return absl::ascii_isalnum(c) || c == '_'; };
  for (int l = std::min<int>(*line, static_cast<int>(lines.size()) - 1); l >= 0; --l) {
    const absl::string_view t = lines[l];
    // On the reported line, only text before the reported column counts.
    size_t limit = t.size();
    if (l == *line) {
      limit = 0;
      while (limit < t.size() && ColumnOf(t, limit) < *column) ++limit;
    }
    const absl::string_view comment_free = t.substr(0, std::min(limit, t.find('#')));
    for (size_t pos = comment_free.rfind(name); pos != absl::string_view::npos;
         pos = pos == 0 ? absl::string_view::npos : comment_free.rfind(name, pos - 1)) {
      const size_t end = pos + name.size();
      if ((pos == 0 || !is_word(t[pos - 1])) && (end >= t.size() || !is_word(t[end]))) {
        *line = l;
        *column = ColumnOf(t, pos);
        return;
      }
    }
  }
}

// Where a field's value came from. `prefix` starts its messages:
// "zccd.conf:7:1: " for a field written in the file, "zccd.conf: " for a value
// from the base, "" when there is no file. `line` orders the messages (-1:
// not in the file). Index -1 for non-repeated fields, and for a repeated
// field as a whole (placed at its first entry).
struct Location {
  int line = -1;
  std::string prefix;
};
using Locator = std::function<Location(absl::string_view field, int index)>;

// Collects one message per bad field; reports them in file order, values not
// from the file last.
class Problems {
 public:
  explicit Problems(Locator locate) : locate_(std::move(locate)) {}

  void Add(absl::string_view field, int index, absl::string_view message) {
    const std::string name = index < 0 ? std::string(field) : absl::StrCat(field, "[", index, "]");
    Location loc = locate_(field, index);
    list_.push_back({loc.line < 0 ? INT_MAX : loc.line, absl::StrCat(loc.prefix, name, ": ", message)});
  }
  void Add(absl::string_view field, absl::string_view message) { Add(field, -1, message); }
  // A field accepted and ignored: reported, not an error.
  void Ignored(absl::string_view field, absl::string_view why) {
    Location loc = locate_(field, -1);
    ignored_.push_back({loc.line, absl::StrCat(loc.prefix, field, ": ", why)});
  }
  // In file order.
  std::vector<std::string> TakeIgnored() {
    std::stable_sort(ignored_.begin(), ignored_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> lines;
    for (auto& [line, text] : ignored_) lines.push_back(std::move(text));
    return lines;
  }
  absl::Status ToStatus() {
    if (list_.empty()) return absl::OkStatus();
    std::stable_sort(list_.begin(), list_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> lines;
    for (auto& [line, text] : list_) lines.push_back(std::move(text));
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }

 private:
  Locator locate_;
  std::vector<std::pair<int, std::string>> list_;
  std::vector<std::pair<int, std::string>> ignored_;
};

// `v` as an integer when it is one, else the shortest of %.6g, %.15g and
// %.17g that reads back as exactly `v`.
std::string FormatDouble(double v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  std::string s;
  for (int precision : {6, 15, 17}) {
    s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) break;
  }
  return s;
}

std::string Quote(absl::string_view s) { return absl::StrCat("\"", absl::Utf8SafeCEscape(s), "\""); }

bool IsAbsolute(const std::string& path) { return !path.empty() && path[0] == '/'; }

bool IsIpv4Literal(const std::string& host) {
  struct in_addr addr;
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const char c = host[i];
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    if (!absl::ascii_isalnum(c) && c != '-') return false;
    if (c == '-' && (label == 0 || i + 1 == host.size() || host[i + 1] == '.')) return false;
    if (++label > 63) return false;
  }
  return label > 0;
}

bool IsWildcard(const HostPort& hp) { return hp.host == "0.0.0.0" || hp.host == "::"; }

// A peer's node_name or failure_domain: at most 253 bytes from [A-Za-z0-9._-].
void CheckPeerName(absl::string_view field, const std::string& name, Problems& p) {
  if (name.size() > kMaxPeerNameBytes) {
    p.Add(field, absl::StrCat("must be at most ", kMaxPeerNameBytes, " bytes, got ", name.size()));
  } else if (name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789._-") != std::string::npos) {
    p.Add(field, absl::StrCat("must be characters from [A-Za-z0-9._-] only, got ", Quote(name)));
  }
}

// Other zccds' peer addresses: each host:port with a port other than 0, no
// two for the same host (case aside) and port, at most kMaxStaticPeers.
void CheckStaticPeers(const std::vector<std::string>& peers, Problems& p) {
  constexpr absl::string_view kField = "peer.static_peers";
  if (peers.size() > kMaxStaticPeers) {
    p.Add(kField, absl::StrCat("must be at most ", kMaxStaticPeers, " entries, got ", peers.size()));
  }
  std::map<std::string, size_t> seen;  // "host:port", lower case: its first index
  for (size_t i = 0; i < peers.size(); ++i) {
    const int index = static_cast<int>(i);
    absl::StatusOr<HostPort> addr = ParseHostPort(peers[i]);
    if (!addr.ok()) {
      p.Add(kField, index, addr.status().message());
      continue;
    }
    if (addr->port == 0) {
      p.Add(kField, index, absl::StrCat("port must be in [1, 65535], got 0 in ", Quote(peers[i])));
      continue;
    }
    std::string host = absl::AsciiStrToLower(addr->host);
    if (struct in6_addr a6; addr->ipv6 && ::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
      char text[INET6_ADDRSTRLEN];
      if (::inet_ntop(AF_INET6, &a6, text, sizeof(text)) != nullptr) host = text;
    }
    const auto [it, inserted] = seen.emplace(
        absl::StrCat(addr->ipv6 ? "[" : "", host, addr->ipv6 ? "]" : "", ":", addr->port), i);
    if (!inserted) {
      p.Add(kField, index,
            absl::StrCat("must not repeat ", kField, "[", it->second, "] (",
                         Quote(peers[it->second]), "), got ", Quote(peers[i])));
    }
  }
}

// The peer service's fields. The files and the budget are checked against
// listen: without it the service is off. Names and the replication settings
// are checked either way.
void CheckPeer(const daemon::PeerConfig& peer, Problems& p) {
  const bool on = !peer.listen.empty();
  if (on) {
    if (absl::StatusOr<HostPort> addr = ParseHostPort(peer.listen); !addr.ok()) {
      p.Add("peer.listen", addr.status().message());
    }
  }
  std::vector<std::string> set;
  std::vector<std::string> missing;
  const std::pair<const char*, const std::string*> files[] = {
      {"cert_file", &peer.cert_file}, {"key_file", &peer.key_file}, {"ca_file", &peer.ca_file}};
  for (const auto& [name, file] : files) {
    const std::string& value = *file;
    if (value.empty()) {
      missing.push_back(name);
      continue;
    }
    set.push_back(name);
    const std::string field = absl::StrCat("peer.", name);
    if (!IsAbsolute(value)) {
      p.Add(field, absl::StrCat("must be an absolute path, got ", Quote(value)));
    } else if (!on) {
      p.Add(field, "set without peer.listen (the peer service is off)");
    }
  }
  if (peer.insecure && !set.empty()) {
    p.Add("peer.insecure", absl::StrCat("true together with ", absl::StrJoin(set, ", "),
                                        ": choose one (plaintext, or mutual TLS)"));
  } else if (on && !peer.insecure && !missing.empty()) {
    p.Add("peer.listen", absl::StrCat("needs cert_file, key_file and ca_file (mutual TLS), or "
                                      "insecure: true (tests only); missing ",
                                      absl::StrJoin(missing, ", ")));
  }
  if (on && peer.replica_budget_bytes < kMinReplicaBudgetBytes) {
    p.Add("peer.replica_budget_bytes", absl::StrCat("must be at least ", kMinReplicaBudgetBytes,
                                                    " (1 MiB), got ", peer.replica_budget_bytes));
  }
  CheckPeerName("peer.node_name", peer.node_name, p);
  CheckPeerName("peer.failure_domain", peer.failure_domain, p);
  if (peer.replicate_every > kMaxReplicateEvery) {
    p.Add("peer.replicate_every", absl::StrCat("must be at most ", kMaxReplicateEvery, ", got ",
                                               peer.replicate_every));
  }
  if (peer.replicas < 1 || peer.replicas > kMaxReplicas) {
    p.Add("peer.replicas",
          absl::StrCat("must be in [1, ", kMaxReplicas, "], got ", peer.replicas));
  }
  if (peer.replicate_bytes_per_s > 0 && peer.replicate_bytes_per_s < kMinReplicateBytesPerS) {
    p.Add("peer.replicate_bytes_per_s",
          absl::StrCat("must be 0 or at least ", kMinReplicateBytesPerS, " (1 MiB/s), got ",
                       peer.replicate_bytes_per_s));
  }
  if (peer.push_connections < 1 || peer.push_connections > kMaxPushConnections) {
    p.Add("peer.push_connections", absl::StrCat("must be in [1, ", kMaxPushConnections,
                                                "], got ", peer.push_connections));
  }
  if (peer.check_buddies_every != absl::ZeroDuration() &&
      !(peer.check_buddies_every >= absl::Seconds(1))) {
    p.Add("peer.check_buddies_s",
          absl::StrCat("must be 0 (never) or at least 1 second, got ",
                       FormatDouble(absl::ToDoubleSeconds(peer.check_buddies_every))));
  }
  CheckStaticPeers(peer.static_peers, p);
}

// Field checks shared by the file loader and ValidateFullConfig.
void CheckFields(const FullConfig& c, Problems& p) {
  const daemon::DaemonConfig& d = c.daemon;
  const OpsConfig& o = c.ops;
  if (!d.socket_path.empty()) {
    if (!IsAbsolute(d.socket_path)) {
      p.Add("socket_path", absl::StrCat("must be an absolute path, got ", Quote(d.socket_path)));
    } else if (d.socket_path.size() >= kSunPathBytes) {
      p.Add("socket_path", absl::StrCat("must be shorter than ", kSunPathBytes,
                                        " bytes (the unix socket path limit), got ",
                                        d.socket_path.size()));
    }
  }
  if (d.socket_mode > 0777) {
    p.Add("socket_mode", absl::StrFormat("must be permission bits (at most 0777), got 0%o",
                                         d.socket_mode));
  }
  if (!d.default_root.empty() && !IsAbsolute(d.default_root)) {
    p.Add("default_root", absl::StrCat("must be an absolute path, got ", Quote(d.default_root)));
  }
  for (size_t i = 0; i < d.allowed_roots.size(); ++i) {
    if (!IsAbsolute(d.allowed_roots[i]) && !absl::StartsWith(d.allowed_roots[i], "s3://")) {
      p.Add("allowed_roots", static_cast<int>(i),
            absl::StrCat("must be an absolute path, got ", Quote(d.allowed_roots[i])));
    }
  }
  for (size_t i = 0; i < d.object_store_roots.size(); ++i) {
    if (std::string why = daemon::CheckObjectStoreRoot(d.object_store_roots[i]); !why.empty()) {
      p.Add("object_store_roots", static_cast<int>(i), why);
    }
  }
  if (d.shm_prefix.empty() || d.shm_prefix.size() > 32 ||
      d.shm_prefix.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos) {
    p.Add("shm_prefix", absl::StrCat("must be 1..32 characters from [A-Za-z0-9_-], got ",
                                     Quote(d.shm_prefix)));
  }
  if (absl::Status st = shm::ValidateNumSlots(d.default_num_slots, ""); !st.ok()) {
    p.Add("default_num_slots", st.message());
  }
  if (d.max_slot_bytes < shm::kPageBytes || d.max_slot_bytes > shm::kMaxSlotBytes) {
    p.Add("max_slot_bytes", absl::StrCat("must be ", shm::kPageBytes, " to ", shm::kMaxSlotBytes,
                                         ", got ", d.max_slot_bytes));
  }
  if (d.max_tensors_per_rank == 0) p.Add("max_tensors_per_rank", "must be at least 1, got 0");
  if (d.staging_budget_bytes > 0 && d.staging_pool_bytes > d.staging_budget_bytes) {
    p.Add("staging_pool_bytes", absl::StrCat("must fit in staging_budget_bytes (",
                                             d.staging_budget_bytes, "), got ",
                                             d.staging_pool_bytes));
  }
  // (Each piece is a mapping of its own: pieces of a page would be millions
  // of them, past vm.max_map_count.)
  constexpr uint64_t kMinPoolEntry = uint64_t{1} << 20;
  if (d.staging_pool_entry_bytes > 0 && d.staging_pool_entry_bytes < kMinPoolEntry) {
    p.Add("staging_pool_entry_bytes", absl::StrCat("must be 0 or at least ", kMinPoolEntry,
                                                   ", got ", d.staging_pool_entry_bytes));
  }
  if (d.keep_last == 0) p.Add("keep_last", "must be at least 1, got 0");

  auto check_duration = [&p](absl::string_view field, absl::Duration value, absl::Duration max) {
    if (value <= absl::ZeroDuration()) {
      p.Add(field, absl::StrCat("must be positive, got ", FormatDouble(absl::ToDoubleSeconds(value))));
    } else if (value > max) {
      p.Add(field, absl::StrCat("must be at most ", FormatDouble(absl::ToDoubleSeconds(max)),
                                ", got ", FormatDouble(absl::ToDoubleSeconds(value))));
    }
  };
  check_duration("commit_timeout_s", d.commit_timeout, absl::Seconds(kMaxCommitTimeoutS));
  check_duration("client_timeout_s", d.client_timeout, absl::Seconds(kMaxClientTimeoutS));
  check_duration("stop_timeout_s", d.stop_timeout, absl::Seconds(kMaxCommitTimeoutS));
  if (d.retain_snapshots < absl::ZeroDuration() ||
      d.retain_snapshots > absl::Seconds(kMaxClientTimeoutS)) {
    p.Add("retain_snapshots_s",
          absl::StrCat("must be in [0, ", FormatDouble(kMaxClientTimeoutS), "], got ",
                       FormatDouble(absl::ToDoubleSeconds(d.retain_snapshots))));
  }
  if (d.heartbeat_interval < absl::Milliseconds(1) || d.heartbeat_interval > absl::Minutes(1)) {
    p.Add("heartbeat_interval_ms",
          absl::StrCat("must be in [1, 60000], got ", absl::ToInt64Milliseconds(d.heartbeat_interval)));
  } else if (d.client_timeout > absl::ZeroDuration() && d.client_timeout <= d.heartbeat_interval) {
    p.Add("client_timeout_s",
          absl::StrCat("must be longer than heartbeat_interval_ms (",
                       absl::ToInt64Milliseconds(d.heartbeat_interval), " ms), got ",
                       FormatDouble(absl::ToDoubleSeconds(d.client_timeout)), " s"));
  }
  CheckPeer(d.peer, p);

  absl::StatusOr<HostPort> status_addr = absl::NotFoundError("off");
  absl::StatusOr<HostPort> metrics_addr = absl::NotFoundError("off");
  if (!o.status_tcp_listen.empty()) {
    status_addr = ParseHostPort(o.status_tcp_listen);
    if (!status_addr.ok()) p.Add("status_tcp_listen", status_addr.status().message());
  }
  if (!o.metrics_http_listen.empty()) {
    metrics_addr = ParseHostPort(o.metrics_http_listen);
    if (!metrics_addr.ok()) {
      p.Add("metrics_http_listen", metrics_addr.status().message());
    } else if (!IsIpv4Literal(metrics_addr->host)) {
      p.Add("metrics_http_listen",
            absl::StrCat("host must be an IPv4 address (127.0.0.1, or 0.0.0.0 for all "
                         "interfaces), got ", Quote(metrics_addr->host)));
    }
  }
  if (status_addr.ok() && metrics_addr.ok() && status_addr->port != 0 &&
      status_addr->port == metrics_addr->port &&
      (status_addr->host == metrics_addr->host || IsWildcard(*status_addr) ||
       IsWildcard(*metrics_addr))) {
    p.Add("metrics_http_listen", absl::StrCat("must not use the port of status_tcp_listen (",
                                              Quote(o.status_tcp_listen), ")"));
  }
  if (!o.metrics_textfile_dir.empty() && !IsAbsolute(o.metrics_textfile_dir)) {
    p.Add("metrics_textfile_dir",
          absl::StrCat("must be an absolute path, got ", Quote(o.metrics_textfile_dir)));
  }
  if (o.metrics_textfile_interval < absl::Seconds(kMinTextfileIntervalS) ||
      o.metrics_textfile_interval > absl::Seconds(kMaxTextfileIntervalS)) {
    p.Add("metrics_textfile_interval_s",
          absl::StrCat("must be in [", FormatDouble(kMinTextfileIntervalS), ", ",
                       FormatDouble(kMaxTextfileIntervalS), "], got ",
                       FormatDouble(absl::ToDoubleSeconds(o.metrics_textfile_interval))));
  }
  if (!ParseLogLevel(o.log_level).ok()) {
    p.Add("log_level",
          absl::StrCat("must be DEBUG, INFO, WARNING or ERROR, got ", Quote(o.log_level)));
  }
  if (o.ema_threads < 1 || o.ema_threads > kMaxThreads) {
    p.Add("ema_threads", absl::StrCat("must be in [1, ", kMaxThreads, "], got ", o.ema_threads));
  }
  if (o.writer_threads < 1 || o.writer_threads > kMaxThreads) {
    p.Add("writer_threads",
          absl::StrCat("must be in [1, ", kMaxThreads, "], got ", o.writer_threads));
  }
}

// Seconds from the file as a Duration; a value absl cannot represent (NaN,
// infinities) is reported and the base value kept.
void MergeSeconds(absl::string_view field, double seconds, absl::Duration* out, Problems& p) {
  if (!std::isfinite(seconds)) {
    p.Add(field, absl::StrCat("must be a finite number of seconds, got ", FormatDouble(seconds)));
    return;
  }
  *out = absl::Seconds(seconds);
}

// Applies the fields present in `proto` over `config`.
void Merge(const DaemonConfigProto& proto, FullConfig& config, Problems& p) {
  daemon::DaemonConfig& d = config.daemon;
  OpsConfig& o = config.ops;
  if (proto.has_socket_path()) d.socket_path = proto.socket_path();
  if (proto.has_socket_mode()) d.socket_mode = proto.socket_mode();
  if (proto.has_default_root()) d.default_root = proto.default_root();
  if (proto.allowed_roots_size() > 0) {
    d.allowed_roots.clear();
    d.object_store_roots.clear();
    for (const std::string& root : proto.allowed_roots()) daemon::AddAllowedRoot(d, root);
  }
  for (const auto& r : proto.object_store_roots()) {
    daemon::ObjectStoreRoot root;
    root.url = r.url();
    root.endpoint_url = r.endpoint_url();
    root.region = r.region();
    root.addressing = r.addressing();
    root.profile = r.profile();
    root.ca_bundle = r.ca_bundle();
    d.object_store_roots.push_back(root);
  }
  if (proto.has_shm_prefix()) d.shm_prefix = proto.shm_prefix();
  if (proto.has_default_num_slots()) d.default_num_slots = proto.default_num_slots();
  if (proto.has_max_slot_bytes()) d.max_slot_bytes = proto.max_slot_bytes();
  if (proto.has_staging_budget_bytes()) d.staging_budget_bytes = proto.staging_budget_bytes();
  if (proto.has_staging_pool_bytes()) d.staging_pool_bytes = proto.staging_pool_bytes();
  if (proto.has_staging_pool_entry_bytes()) {
    d.staging_pool_entry_bytes = proto.staging_pool_entry_bytes();
  }
  if (proto.has_max_tensors_per_rank()) d.max_tensors_per_rank = proto.max_tensors_per_rank();
  if (proto.has_keep_last()) d.keep_last = proto.keep_last();
  if (proto.has_keep_every()) d.keep_every = proto.keep_every();
  if (proto.has_commit_timeout_s()) {
    MergeSeconds("commit_timeout_s", proto.commit_timeout_s(), &d.commit_timeout, p);
  }
  if (proto.has_stop_timeout_s()) {
    MergeSeconds("stop_timeout_s", proto.stop_timeout_s(), &d.stop_timeout, p);
  }
  if (proto.has_client_timeout_s()) {
    MergeSeconds("client_timeout_s", proto.client_timeout_s(), &d.client_timeout, p);
  }
  if (proto.has_daemon_pull()) d.daemon_pull = proto.daemon_pull();
  if (proto.has_peer()) {
    const DaemonConfigProto::Peer& q = proto.peer();
    daemon::PeerConfig& peer = d.peer;
    if (q.has_listen()) peer.listen = q.listen();
    if (q.has_cert_file()) peer.cert_file = q.cert_file();
    if (q.has_key_file()) peer.key_file = q.key_file();
    if (q.has_ca_file()) peer.ca_file = q.ca_file();
    if (q.has_insecure()) peer.insecure = q.insecure();
    if (q.has_node_name()) peer.node_name = q.node_name();
    if (q.has_failure_domain()) peer.failure_domain = q.failure_domain();
    if (q.has_replica_budget_bytes()) peer.replica_budget_bytes = q.replica_budget_bytes();
    if (q.has_replicate_every()) peer.replicate_every = q.replicate_every();
    if (q.has_replicas()) peer.replicas = q.replicas();
    if (q.has_replicate_bytes_per_s()) peer.replicate_bytes_per_s = q.replicate_bytes_per_s();
    if (q.has_check_buddies_s()) {
      MergeSeconds("peer.check_buddies_s", q.check_buddies_s(), &peer.check_buddies_every, p);
    }
    if (q.has_push_connections()) peer.push_connections = q.push_connections();
    if (q.static_peers_size() > 0) {
      peer.static_peers.assign(q.static_peers().begin(), q.static_peers().end());
    }
  }
  if (proto.has_retain_snapshots_s()) {
    MergeSeconds("retain_snapshots_s", proto.retain_snapshots_s(), &d.retain_snapshots, p);
  }
  if (proto.has_heartbeat_interval_ms()) {
    d.heartbeat_interval = absl::Milliseconds(proto.heartbeat_interval_ms());
  }
  // Removed settings that never had an effect: a file written for an older
  // zccd still loads, and the operator is told to drop them. (Their fields
  // are deprecated in the schema; this is the one place that reads them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (proto.has_default_backpressure()) {
    p.Ignored("default_backpressure",
              "ignored (removed): each trainer chooses its own backpressure (SKIP unless it "
              "asks for BLOCK); delete the line");
  }
  if (proto.has_io_threads()) {
    p.Ignored("io_threads",
              "ignored (removed): each rank's checkpoint is written by a writer thread of "
              "its own; delete the line");
  }
#pragma GCC diagnostic pop
  if (proto.has_status_tcp_listen()) o.status_tcp_listen = proto.status_tcp_listen();
  if (proto.has_metrics_http_listen()) o.metrics_http_listen = proto.metrics_http_listen();
  if (proto.has_metrics_textfile_dir()) o.metrics_textfile_dir = proto.metrics_textfile_dir();
  if (proto.has_metrics_textfile_interval_s()) {
    MergeSeconds("metrics_textfile_interval_s", proto.metrics_textfile_interval_s(),
                 &o.metrics_textfile_interval, p);
  }
  if (proto.has_log_level()) {
    o.log_level = proto.log_level();
    if (ParseLogLevel(o.log_level).ok()) o.log_level = absl::AsciiStrToUpper(o.log_level);
  }
  if (proto.has_ema_threads()) o.ema_threads = proto.ema_threads();
  if (proto.has_writer_threads()) o.writer_threads = proto.writer_threads();
}

}  // namespace

absl::StatusOr<zcc::LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  if (upper == "DEBUG") return LogLevel::kDebug;
  if (upper == "INFO") return LogLevel::kInfo;
  if (upper == "WARNING") return LogLevel::kWarning;
  if (upper == "ERROR") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level must be DEBUG, INFO, WARNING or ERROR, got ", Quote(name)));
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  HostPort out;
  absl::string_view port_text;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find("]:");
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "must be host:port, e.g. [::1]:7070 for IPv6, got ", Quote(address)));
    }
    out.host = std::string(address.substr(1, close - 1));
    out.ipv6 = true;
    struct in6_addr addr6;
    if (::inet_pton(AF_INET6, out.host.c_str(), &addr6) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad IPv6 address ", Quote(out.host), " in ", Quote(address)));
    }
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "must be host:port, e.g. 127.0.0.1:9464, got ", Quote(address), " (no port)"));
    }
    out.host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
    if (out.host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "must be host:port with a host (0.0.0.0 for all interfaces), got ", Quote(address)));
    }
    if (out.host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "IPv6 addresses need brackets ([::1]:7070), got ", Quote(address)));
    }
    const bool numeric = out.host.find_first_not_of("0123456789.") == std::string::npos;
    if (numeric ? !IsIpv4Literal(out.host) : !IsDnsName(out.host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad host ", Quote(out.host), " in ", Quote(address)));
    }
  }
  uint32_t port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be a number in [0, 65535], got ", Quote(port_text), " in ",
                     Quote(address)));
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

absl::StatusOr<FullConfig> ParseConfigText(absl::string_view text, absl::string_view source_name,
                                           const FullConfig& base, const Overrides& overrides) {
  DaemonConfigProto proto;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  google::protobuf::TextFormat::ParseInfoTree locations;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&locations);
  if (!parser.ParseFromString(std::string(text), &proto)) {
    if (!errors.has_error()) return absl::InvalidArgumentError(absl::StrCat(source_name, ": parse error"));
    int line = errors.line();
    int column = errors.column();
    PointAtName(text, errors.message(), &line, &column);
    if (line < 0) return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", errors.message()));
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", line + 1, ":", column + 1, ": ", errors.message()));
  }

  const std::string source(source_name);
  // A field of a nested message is named by its path ("peer.listen").
  Problems problems([&](absl::string_view field, int index) -> Location {
    const google::protobuf::Message* message = &proto;
    const google::protobuf::TextFormat::ParseInfoTree* tree = &locations;
    const std::vector<std::string> path = absl::StrSplit(field, '.');
    for (size_t k = 0; k < path.size() && tree != nullptr; ++k) {
      const google::protobuf::FieldDescriptor* fd =
          message->GetDescriptor()->FindFieldByName(path[k]);
      if (fd == nullptr) break;
      if (k + 1 < path.size()) {
        if (fd->is_repeated() || fd->message_type() == nullptr) break;
        tree = tree->GetTreeForNested(fd, -1);
        message = &message->GetReflection()->GetMessage(*message, fd);
        continue;
      }
      const int i = fd->is_repeated() ? std::max(index, 0) : -1;
      const int count = fd->is_repeated() ? message->GetReflection()->FieldSize(*message, fd) : 1;
      if (!fd->is_repeated() || i < count) {
        const auto loc = tree->GetLocation(fd, i);
        if (loc.line >= 0) {
          return {loc.line, absl::StrCat(source, ":", loc.line + 1, ":", loc.column + 1, ": ")};
        }
      }
    }
    return {-1, absl::StrCat(source, ": ")};
  });

  FullConfig config = base;
  Merge(proto, config, problems);
  if (overrides) overrides(config);
  CheckFields(config, problems);
  ZCC_RETURN_IF_ERROR(problems.ToStatus());
  config.ignored = problems.TakeIgnored();
  // daemon::ValidateConfig stays the authority on the daemon's own fields.
  ZCC_RETURN_IF_ERROR(
      Annotate(daemon::ValidateConfig(daemon::WithDefaults(config.daemon)), source));
  return config;
}

absl::StatusOr<FullConfig> LoadConfigFile(const std::string& path, const FullConfig& base,
                                          const Overrides& overrides) {
  absl::StatusOr<std::string> text = ReadFileToString(path, kMaxConfigFileBytes);
  if (!text.ok()) return Annotate(text.status(), absl::StrCat("config file ", path));
  return ParseConfigText(*text, path, base, overrides);
}

absl::Status ValidateFullConfig(const FullConfig& config) {
  Problems problems([](absl::string_view, int) { return Location(); });
  CheckFields(config, problems);
  ZCC_RETURN_IF_ERROR(problems.ToStatus());
  return daemon::ValidateConfig(daemon::WithDefaults(config.daemon));
}

std::string DefaultConfigText(const FullConfig& config) {
  const daemon::DaemonConfig& d = config.daemon;
  const OpsConfig& o = config.ops;
  std::string out;
  // A field line, or a commented-out example when the value is empty.
  auto string_field = [&out](absl::string_view name, const std::string& value,
                             absl::string_view example) {
    if (value.empty()) {
      absl::StrAppend(&out, "# ", name, ": ", Quote(example), "\n");
    } else {
      absl::StrAppend(&out, name, ": ", Quote(value), "\n");
    }
  };

  absl::StrAppend(&out,
                  "# zccd configuration: Protobuf text format of zcc.v1.DaemonConfigProto\n"
                  "# (config/zccd_config.proto). Every field is optional; flags given on the\n"
                  "# command line override this file.\n\n");

  absl::StrAppend(&out, "# Control and status socket (empty: /run/zcc/zccd.sock as root).\n");
  string_field("socket_path", d.socket_path, daemon::DefaultSocketPath());
  absl::StrAppend(&out, "# Permission bits of the socket, octal.\n",
                  absl::StrFormat("socket_mode: 0%o\n\n", d.socket_mode));

  absl::StrAppend(&out, "# Checkpoint root for jobs that name none (empty: the default).\n");
  string_field("default_root", d.default_root, daemon::DefaultCheckpointRoot());
  absl::StrAppend(&out, "# Roots jobs may checkpoint under, one line each (none: default_root).\n");
  if (d.allowed_roots.empty()) {
    absl::StrAppend(&out, "# allowed_roots: ", Quote("/mnt/checkpoints"), "\n");
  }
  for (const std::string& root : d.allowed_roots) {
    absl::StrAppend(&out, "allowed_roots: ", Quote(root), "\n");
  }
  absl::StrAppend(&out, "# Object-store roots (s3://bucket/prefix), each with its endpoint,\n"
                        "# region, addressing, credentials profile and CA bundle (empty:\n"
                        "# environment).\n");
  if (d.object_store_roots.empty()) {
    absl::StrAppend(&out, "# object_store_roots { url: ", Quote("s3://bucket/zcc"),
                    " endpoint_url: ", Quote("http://10.0.0.5:9000"), " }\n");
  }
  for (const daemon::ObjectStoreRoot& r : d.object_store_roots) {
    absl::StrAppend(&out, "object_store_roots {\n  url: ", Quote(r.url), "\n");
    if (!r.endpoint_url.empty()) absl::StrAppend(&out, "  endpoint_url: ", Quote(r.endpoint_url), "\n");
    if (!r.region.empty()) absl::StrAppend(&out, "  region: ", Quote(r.region), "\n");
    if (!r.addressing.empty()) absl::StrAppend(&out, "  addressing: ", Quote(r.addressing), "\n");
    if (!r.profile.empty()) absl::StrAppend(&out, "  profile: ", Quote(r.profile), "\n");
    if (!r.ca_bundle.empty()) absl::StrAppend(&out, "  ca_bundle: ", Quote(r.ca_bundle), "\n");
    absl::StrAppend(&out, "}\n");
  }
  absl::StrAppend(&out, "\n");

  absl::StrAppend(
      &out, "# Shared-memory name prefix; two daemons on one machine need different ones.\n",
      "shm_prefix: ", Quote(d.shm_prefix), "\n",
      "# Staging slots per rank when the trainer asks for none (2..8).\n",
      "default_num_slots: ", d.default_num_slots, "\n",
      "# Largest slot (all of one rank's tensors), bytes.\n",
      "max_slot_bytes: ", d.max_slot_bytes, "\n",
      "# All staging memory of this daemon together, bytes; 0 = no limit.\n",
      "staging_budget_bytes: ", d.staging_budget_bytes, "\n",
      "# Staging memory made ready before trainers register (allocated, zeroed,\n"
      "# mapped), bytes; within the budget, given back under memory pressure.\n"
      "# 0 = none. Its pieces: staging_pool_entry_bytes (0 = sized by the\n"
      "# registrations, 1 GiB at first).\n",
      "staging_pool_bytes: ", d.staging_pool_bytes, "\n",
      "staging_pool_entry_bytes: ", d.staging_pool_entry_bytes, "\n",
      "max_tensors_per_rank: ", d.max_tensors_per_rank, "\n\n");

  absl::StrAppend(&out, "# Retention: the newest keep_last steps, and every keep_every-th (0 = off).\n",
                  "keep_last: ", d.keep_last, "\n", "keep_every: ", d.keep_every, "\n\n");

  absl::StrAppend(
      &out, "# Seconds a commit may wait for all ranks' manifests.\n",
      "commit_timeout_s: ", FormatDouble(absl::ToDoubleSeconds(d.commit_timeout)), "\n",
      "# Seconds without a trainer heartbeat before its registration is dropped.\n",
      "client_timeout_s: ", FormatDouble(absl::ToDoubleSeconds(d.client_timeout)), "\n",
      "# Seconds a dead or departed rank's newest snapshots stay in memory for a\n"
      "# restore from memory (0 = off).\n",
      "retain_snapshots_s: ", FormatDouble(absl::ToDoubleSeconds(d.retain_snapshots)), "\n",
      "# Copy trainers' GPU tensors into the slots in zccd (copy_backend cuda_ipc or\n"
      "# auto): one CUDA context per GPU in zccd.\n",
      "daemon_pull: ", d.daemon_pull ? "true" : "false", "\n",
      "heartbeat_interval_ms: ", absl::ToInt64Milliseconds(d.heartbeat_interval), "\n",
      "# Seconds zccd may take to stop after SIGTERM (below the unit's TimeoutStopSec).\n",
      "stop_timeout_s: ", FormatDouble(absl::ToDoubleSeconds(d.stop_timeout)), "\n\n");

  absl::StrAppend(&out, "# Read-only gRPC status and health service on TCP (empty: off).\n");
  string_field("status_tcp_listen", o.status_tcp_listen, "127.0.0.1:7070");
  absl::StrAppend(&out, "# Prometheus endpoint GET /metrics, IPv4 (empty: off).\n");
  string_field("metrics_http_listen", o.metrics_http_listen, "127.0.0.1:9464");
  absl::StrAppend(&out, "# node_exporter textfile collector directory (empty: off).\n");
  string_field("metrics_textfile_dir", o.metrics_textfile_dir,
               "/var/lib/prometheus/node-exporter");
  absl::StrAppend(&out, "metrics_textfile_interval_s: ",
                  FormatDouble(absl::ToDoubleSeconds(o.metrics_textfile_interval)), "\n\n");

  // The peer block: commented out as a whole while it holds the defaults.
  const daemon::PeerConfig& peer = d.peer;
  const daemon::PeerConfig default_peer;
  const bool peer_default = peer.listen.empty() && peer.cert_file.empty() &&
                            peer.key_file.empty() && peer.ca_file.empty() &&
                            peer.insecure == default_peer.insecure && peer.node_name.empty() &&
                            peer.failure_domain.empty() &&
                            peer.replica_budget_bytes == default_peer.replica_budget_bytes &&
                            peer.replicate_every == default_peer.replicate_every &&
                            peer.replicas == default_peer.replicas &&
                            peer.replicate_bytes_per_s == default_peer.replicate_bytes_per_s &&
                            peer.check_buddies_every == default_peer.check_buddies_every &&
                            peer.push_connections == default_peer.push_connections &&
                            peer.static_peers.empty();
  const std::string lead = peer_default ? "# " : "";
  auto peer_field = [&](absl::string_view name, const std::string& value,
                        absl::string_view example) {
    if (value.empty()) {
      absl::StrAppend(&out, lead, peer_default ? "  " : "  # ", name, ": ", Quote(example), "\n");
    } else {
      absl::StrAppend(&out, lead, "  ", name, ": ", Quote(value), "\n");
    }
  };
  absl::StrAppend(&out,
                  "# Peer service, zccd to zccd over TCP: replicas of other nodes' snapshots in\n"
                  "# memory (empty listen: off). Mutual TLS with the three PEM files, or\n"
                  "# insecure: true (tests only). node_name empty: the host name.\n",
                  lead, "peer {\n");
  peer_field("listen", peer.listen, "0.0.0.0:7071");
  peer_field("cert_file", peer.cert_file, "/etc/zcc/peer/node.crt");
  peer_field("key_file", peer.key_file, "/etc/zcc/peer/node.key");
  peer_field("ca_file", peer.ca_file, "/etc/zcc/peer/ca.crt");
  if (!peer_default) absl::StrAppend(&out, "  insecure: ", peer.insecure ? "true" : "false", "\n");
  peer_field("node_name", peer.node_name, "node-1");
  peer_field("failure_domain", peer.failure_domain, "rack-1");
  absl::StrAppend(&out, lead, "  # Memory for replicas held for other nodes, bytes.\n", lead,
                  "  replica_budget_bytes: ", peer.replica_budget_bytes, "\n");
  absl::StrAppend(
      &out, lead, "  # Every how many snapshots a step is replicated; 0 = at each checkpoint step.\n",
      lead, "  replicate_every: ", peer.replicate_every, "\n", lead,
      "  # Buddies each node's replicas go to (1..8).\n", lead, "  replicas: ", peer.replicas, "\n",
      lead, "  # The most bytes per second replication sends; 0 = no cap.\n", lead,
      "  replicate_bytes_per_s: ", peer.replicate_bytes_per_s, "\n", lead,
      "  # Every how many seconds the buddies are asked whether they still hold this\n", lead,
      "  # node's newest replicated steps (what one dropped is pushed again); 0 = never.\n",
      lead, "  check_buddies_s: ", FormatDouble(absl::ToDoubleSeconds(peer.check_buddies_every)),
      "\n", lead, "  # Files sent to a buddy at a time, of one rank's step or of several ranks'\n",
      lead, "  # (up to 8), each on a connection of its own (1..64).\n",
      lead, "  push_connections: ", peer.push_connections, "\n");
  absl::StrAppend(&out, lead,
                  "  # Other zccds (host:port of their peer services), one line each; they\n",
                  lead, "  # count as nodes of every job, for the buddies and for recovery.\n");
  if (peer.static_peers.empty()) peer_field("static_peers", "", "node-2:7071");
  for (const std::string& address : peer.static_peers) {
    absl::StrAppend(&out, lead, "  static_peers: ", Quote(address), "\n");
  }
  absl::StrAppend(&out, lead, "}\n\n");

  absl::StrAppend(&out, "# DEBUG, INFO, WARNING or ERROR.\n", "log_level: ", Quote(o.log_level),
                  "\n", "# zccd's threads for EMA updates, shared by all ranks (1..256).\n",
                  "ema_threads: ", o.ema_threads, "\n",
                  "# zccd's threads writing checkpoints, shared by all ranks (1..256).\n",
                  "writer_threads: ", o.writer_threads, "\n");
  return out;
}

std::string DefaultConfigText(const daemon::DaemonConfig& config) {
  FullConfig full;
  full.daemon = config;
  return DefaultConfigText(full);
}

}  // namespace zcc::config
