// zccd's configuration: defaults, validation and the paths derived from the
// environment. main() fills it from flags.
#ifndef ZCC_CONFIG_DAEMON_CONFIG_H_
#define ZCC_CONFIG_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zcc::daemon {

// A checkpoint root in an S3-compatible object store. Jobs name it (or a
// prefix under it) as their root, "s3://bucket/prefix/...". Settings left
// empty come from zccd's environment, as the AWS tools take them.
struct ObjectStoreRoot {
  std::string url;           // s3://bucket[/prefix]
  // Scheme, host and port, e.g. "http://10.0.0.5:9000". Empty:
  // AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS S3 in `region`.
  std::string endpoint_url;
  std::string region;      // empty: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
  std::string addressing;  // "path", "virtual"; empty: path with an endpoint_url
  // The shared credentials file's profile for this root. Empty: the
  // environment's keys (AWS_ACCESS_KEY_ID ...), else AWS_PROFILE or default.
  std::string profile;
  // A PEM file of CA certificates for https. Empty: AWS_CA_BUNDLE, else the
  // system's bundle (storage/s3/s3_location.h).
  std::string ca_bundle;
};

// The peer service (zccd to zccd over TCP, DESIGN.md 5c): replicas of other
// nodes' snapshot pieces held in this zccd's memory, served back after a node
// is lost. Off unless `listen` is set.
struct PeerConfig {
  // host:port on TCP; empty = off. Port 0 picks a free port (tests).
  std::string listen;
  // PEM files: this zccd's certificate (chain) and private key, and the
  // cluster's CA. Both sides of every peer connection present a certificate
  // the CA signed (mutual TLS); a zccd without one can neither push nor pull.
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  // Plaintext without authentication instead of TLS: tests only, never set
  // together with the files above.
  bool insecure = false;
  // This zccd's name among its peers; empty = the host name.
  std::string node_name;
  // The failure domain this node belongs to (a rack, a power feed); replicas
  // go to other domains. Empty = the node is a domain of its own.
  std::string failure_domain;
  // Memory for replicas held for other nodes, bytes; the oldest are dropped
  // first when a new one needs the room. Replicas count in
  // staging_budget_bytes too (when set), behind the trainers' staging.
  uint64_t replica_budget_bytes = 8ull << 30;
  // Every how many snapshots a rank's step is replicated to its buddies:
  // 0 = at each step the job checkpoints (its save_every), 1 = every step.
  uint32_t replicate_every = 0;
  // Buddies each node's replicas go to.
  uint32_t replicas = 1;
  // The most bytes per second replication sends from this zccd; 0 = no cap.
  uint64_t replicate_bytes_per_s = 0;
  // Every how long a zccd asks its buddies whether they still hold its
  // ranks' newest replicated steps, and pushes again what one dropped (its
  // memory went to a trainer's registration there); zero = never.
  absl::Duration check_buddies_every = absl::Seconds(30);
  // A rank's step's files sent to a buddy at a time, each on a TCP
  // connection of its own (one gRPC stream is bound by one core).
  uint32_t push_connections = 8;
  // Other zccds of the cluster (host:port of their peer services), besides
  // those the jobs' trainers report: a Kubernetes headless service's
  // members, a Slurm host list. They count as nodes of every job here, for
  // the buddies and for recovery.
  std::vector<std::string> static_peers;
};

struct DaemonConfig {
  // Unix-domain socket for the control and status services.
  std::string socket_path;
  uint32_t socket_mode = 0666;
  // Checkpoint root used when a job names none; created if missing.
  std::string default_root;
  // Roots a job may name. Empty = only default_root.
  std::vector<std::string> allowed_roots;
  // Object-store roots a job may name (AddAllowedRoot puts s3:// roots
  // here).
  std::vector<ObjectStoreRoot> object_store_roots;
  // Shared-memory object names start with "<shm_prefix>."; stale objects with
  // this prefix are removed at start, so two daemons on one machine need
  // different prefixes.
  std::string shm_prefix = "zcc";
  // Three: one slot held by a checkpoint being written, one being ingested,
  // one for the next step (shm/slot_ring.h).
  uint32_t default_num_slots = 3;
  // Upper bound on one slot (all of a rank's registered tensors).
  uint64_t max_slot_bytes = 256ull << 30;
  // Upper bound on all staging memory of this daemon together (the ranks'
  // EMAs in zccd's memory, retained snapshots, the staging pool and the peer
  // tier's replicas included: the last three give way to a registration);
  // 0 = no limit.
  uint64_t staging_budget_bytes = 0;
  // Staging memory made ready before registrations (daemon/memory/
  // staging_pool.h); 0 = none. Within staging_budget_bytes.
  uint64_t staging_pool_bytes = 0;
  // Each piece of it; 0 = sized by the registrations.
  uint64_t staging_pool_entry_bytes = 0;
  uint32_t max_tensors_per_rank = 1 << 20;
  uint32_t keep_last = 3;
  uint32_t keep_every = 0;
  // A started commit whose manifests are not all in after this long is
  // reported as failed, and its partial directory is removed.
  absl::Duration commit_timeout = absl::Minutes(10);
  // A rank whose trainer has not sent a heartbeat for this long is dropped.
  absl::Duration client_timeout = absl::Seconds(30);
  // A rank whose trainer died or exited keeps its newest snapshots in memory
  // this long, for a restore from memory (zero: not kept).
  absl::Duration retain_snapshots = absl::Minutes(10);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // After SIGTERM, zccd exits within this long even if a request or a disk
  // write never finishes (below systemd's TimeoutStopSec=120).
  absl::Duration stop_timeout = absl::Seconds(90);
  // zccd's EMA threads, shared by every rank.
  uint32_t ema_threads = 2;
  // zccd's checkpoint writer threads, shared by every rank.
  uint32_t writer_threads = 4;
  // Serve trainers that ask zccd to copy their device tensors (copy_backend
  // cuda_ipc, and auto): one CUDA context per GPU in zccd.
  bool daemon_pull = false;
  PeerConfig peer;
};

// /run/zcc/zccd.sock for root; $XDG_RUNTIME_DIR/zcc/zccd.sock or
// /tmp/zcc-<uid>/zccd.sock otherwise.
std::string DefaultSocketPath();

// /var/lib/zcc/checkpoints for root; $XDG_DATA_HOME/zcc/checkpoints or
// ~/.local/share/zcc/checkpoints otherwise.
std::string DefaultCheckpointRoot();

// Adds `root` to allowed_roots, or, for an s3:// URL, to object_store_roots
// with its settings from the environment.
void AddAllowedRoot(DaemonConfig& config, const std::string& root);

// What is wrong with an object-store root's settings ("" when nothing).
std::string CheckObjectStoreRoot(const ObjectStoreRoot& root);

// Fills empty paths with the defaults above.
DaemonConfig WithDefaults(DaemonConfig config);

// Every bad field is reported in one InvalidArgument message.
absl::Status ValidateConfig(const DaemonConfig& config);

}  // namespace zcc::daemon

#endif  // ZCC_CONFIG_DAEMON_CONFIG_H_
