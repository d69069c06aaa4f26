#include "config/daemon_config.h"

#include "common/default_paths.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shm/control_block.h"

namespace zcc::daemon {

std::string DefaultSocketPath() { return zcc::DefaultSocketPath(); }

std::string DefaultCheckpointRoot() {
  if (::geteuid() == 0) return "/var/lib/zcc/checkpoints";
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/zcc/checkpoints");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return absl::StrCat(home, "/.local/share/zcc/checkpoints");
  }
  return absl::StrCat("/tmp/zcc-", ::geteuid(), "/checkpoints");
}

void AddAllowedRoot(DaemonConfig& config, const std::string& root) {
  if (absl::StartsWith(root, "s3://")) {
    ObjectStoreRoot store;
    store.url = root;
    config.object_store_roots.push_back(store);
    return;
  }
  config.allowed_roots.push_back(root);
}

std::string CheckObjectStoreRoot(const ObjectStoreRoot& r) {
  const std::string where = absl::StrCat("object-store root '", r.url, "'");
  if (!absl::StartsWith(r.url, "s3://")) return absl::StrCat(where, " must be an s3:// URL");
  const absl::string_view rest = absl::string_view(r.url).substr(5);
  const absl::string_view bucket = rest.substr(0, rest.find('/'));
  if (bucket.empty()) return absl::StrCat(where, " names no bucket (s3://bucket/prefix)");
  for (absl::string_view part : absl::StrSplit(rest, '/')) {
    if (part == "." || part == "..") return absl::StrCat(where, " may not hold . or ..");
  }
  if (absl::StrContains(rest, "//")) return absl::StrCat(where, " may not hold an empty name");
  if (!r.endpoint_url.empty() && !absl::StartsWith(r.endpoint_url, "http://") &&
      !absl::StartsWith(r.endpoint_url, "https://")) {
    return absl::StrCat(where, ": endpoint_url must start with http:// or https://, got '",
                        r.endpoint_url, "'");
  }
  if (!r.ca_bundle.empty() && !absl::StartsWith(r.ca_bundle, "/")) {
    return absl::StrCat(where, ": ca_bundle must be an absolute path, got '", r.ca_bundle, "'");
  }
  if (!r.addressing.empty() && r.addressing != "path" && r.addressing != "virtual") {
    return absl::StrCat(where, ": addressing must be path or virtual, got '", r.addressing, "'");
  }
  return "";
}

DaemonConfig WithDefaults(DaemonConfig config) {
  if (config.socket_path.empty()) config.socket_path = DefaultSocketPath();
  if (config.default_root.empty()) config.default_root = DefaultCheckpointRoot();
  if (config.allowed_roots.empty()) config.allowed_roots = {config.default_root};
  return config;
}

absl::Status ValidateConfig(const DaemonConfig& c) {
  std::vector<std::string> errors;
  if (c.socket_path.empty() || c.socket_path[0] != '/') {
    errors.push_back("socket_path must be an absolute path");
  } else if (c.socket_path.size() >= 108) {
    errors.push_back("socket_path must be shorter than 108 bytes (sun_path limit)");
  }
  if (c.socket_mode > 0777) errors.push_back("socket_mode must be a permission mode (<= 0777)");
  if (c.default_root.empty() || c.default_root[0] != '/') {
    errors.push_back("default_root must be an absolute path");
  }
  for (const std::string& root : c.allowed_roots) {
    if (root.empty() || root[0] != '/') {
      errors.push_back(absl::StrCat("allowed root '", root, "' must be an absolute path"));
    }
  }
  for (const ObjectStoreRoot& root : c.object_store_roots) {
    if (std::string why = CheckObjectStoreRoot(root); !why.empty()) errors.push_back(why);
  }
  if (c.shm_prefix.empty() || c.shm_prefix.size() > 32 ||
      c.shm_prefix.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos) {
    errors.push_back("shm_prefix must be 1..32 characters from [A-Za-z0-9_-]");
  }
  if (absl::Status st = shm::ValidateNumSlots(c.default_num_slots, "default_num_slots");
      !st.ok()) {
    errors.push_back(std::string(st.message()));
  }
  if (c.max_slot_bytes < shm::kPageBytes || c.max_slot_bytes > shm::kMaxSlotBytes) {
    errors.push_back(absl::StrCat("max_slot_bytes must be ", shm::kPageBytes, " to ",
                                  shm::kMaxSlotBytes));
  }
  if (c.max_tensors_per_rank == 0) errors.push_back("max_tensors_per_rank must be positive");
  if (c.keep_last == 0) errors.push_back("keep_last must be at least 1");
  if (c.commit_timeout <= absl::ZeroDuration()) errors.push_back("commit_timeout must be positive");
  if (c.stop_timeout <= absl::ZeroDuration()) errors.push_back("stop_timeout must be positive");
  if (c.client_timeout <= c.heartbeat_interval) {
    errors.push_back("client_timeout must be longer than heartbeat_interval");
  }
  if (c.heartbeat_interval <= absl::ZeroDuration()) {
    errors.push_back("heartbeat_interval must be positive");
  }
  if (c.ema_threads == 0 || c.ema_threads > 256) errors.push_back("ema_threads must be in [1, 256]");
  if (c.writer_threads == 0 || c.writer_threads > 256) {
    errors.push_back("writer_threads must be in [1, 256]");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("bad configuration: ", absl::StrJoin(errors, "; ")));
}

}  // namespace zcc::daemon
