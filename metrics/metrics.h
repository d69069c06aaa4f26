// In-process metrics for zccd and their Prometheus text exposition (format
// 0.0.4): counters, gauges and fixed-bucket histograms, each optionally with
// labels. Updates are single relaxed atomic operations, so they can sit on the
// snapshot and write paths; only registration and rendering take a lock.
//
//   ZccMetrics m;
//   m.snapshots().Increment();
//   m.checkpoint_seconds().Observe(absl::ToDoubleSeconds(elapsed));
//   std::string text = m.registry().RenderPrometheusText();
#ifndef ZCC_METRICS_METRICS_H_
#define ZCC_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace zcc::metrics {

// Label name/value pairs of one series, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A count that only goes up. Thread-safe, lock-free.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets, plus their sum. Thread-safe,
// lock-free. A bucket with upper bound b counts observations v <= b; the last,
// implicit bucket (+Inf) counts the rest. NaN observations are dropped.
class Histogram {
 public:
  // `bounds`: strictly increasing, finite upper bounds.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  // A consistent-enough copy: `cumulative[i]` counts observations <= bounds[i],
  // `cumulative.back()` (the +Inf bucket) equals `count`. Under concurrent
  // Observe calls `sum` may lag the counts by the observations in flight.
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  // Per-bucket (not cumulative) counts; the last entry is the +Inf bucket.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Bounds start, start*factor, ... (`count` of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Owns metric families and renders them. Thread-safe: Add* and Render lock a
// mutex; the returned Counter/Gauge/Histogram references stay valid for the
// registry's lifetime and are updated without locking.
//
// Names follow Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*), counters end in
// "_total", label names are [a-zA-Z_][a-zA-Z0-9_]* without a "__" prefix and
// "le" is reserved for histogram buckets. Add* with the name and labels of an
// existing series returns that series. Breaking these rules, or registering a
// name again with another type, help text or bucket layout, is a programming
// error: the process is aborted with a message naming the metric.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter& AddCounter(absl::string_view name, absl::string_view help, Labels labels = {});
  Gauge& AddGauge(absl::string_view name, absl::string_view help, Labels labels = {});
  Histogram& AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds, Labels labels = {});

  // Every family in registration order, its series in registration order:
  // "# HELP", "# TYPE", then the samples; histograms as name_bucket{le=...}
  // (cumulative, ending with le="+Inf"), name_sum and name_count.
  std::string RenderPrometheusText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name;
    std::string help;
    Type type;
    std::vector<double> bounds;
    std::vector<std::unique_ptr<Series>> series;
  };

  Series& FindOrAdd(absl::string_view name, absl::string_view help, Type type,
                    const std::vector<double>& bounds, Labels labels);

  mutable zcc::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Family*, std::less<>> by_name_ ABSL_GUARDED_BY(mu_);
};

// Kinds of zcc_errors_total{kind=...}. Every kind is exported from the start
// (at 0), so alerts on increase() see the first error.
enum class ErrorKind {
  kWrite,          // writing a shard or manifest to disk failed
  kCommit,         // a commit failed (other than by timeout)
  kCommitTimeout,  // a commit did not get all ranks' manifests in time
  kRestore,        // a restore failed
  kVerify,         // a checkpoint failed verification (checksum, manifest)
  kClientTimeout,  // a trainer stopped sending heartbeats and was dropped
  kEma,            // an EMA update failed
  kRpc,            // a control request was refused for a reason other than the above
  kUpload,         // the tiered mode's upload of a step to the object store failed
  kSegmentCut,     // a trainer cut its staging segment short and was dropped
};
inline constexpr int kNumErrorKinds = 10;
absl::string_view ErrorKindName(ErrorKind kind);

// Where a restore came from: zcc_restores_total{source=...}.
enum class RestoreSource { kMemory, kDisk };

// How a read begun at registration ended: zcc_restore_prefetches_total{outcome=...}.
enum class PrefetchOutcome { kUsed, kDiscarded };

// Why a snapshot was left out of a rank's EMA:
// zcc_ema_snapshots_left_out_total{reason=...}.
enum class EmaLeftOut { kNonFinite, kOutOfOrder };

// The standard metrics of zccd, registered in an owned Registry. Thread-safe
// like Registry; the accessors return references valid for this object's
// lifetime. Durations are observed in seconds, sizes in bytes.
class ZccMetrics {
 public:
  ZccMetrics();
  ZccMetrics(const ZccMetrics&) = delete;
  ZccMetrics& operator=(const ZccMetrics&) = delete;

  // zcc_snapshots_total: snapshots copied into staging.
  Counter& snapshots() { return *snapshots_; }
  // zcc_snapshots_skipped_total: snapshots dropped because no slot was free.
  Counter& snapshots_skipped() { return *snapshots_skipped_; }
  // zcc_bytes_written_total: checkpoint bytes written to disk (write GB/s =
  // rate of this).
  Counter& bytes_written() { return *bytes_written_; }
  // zcc_ema_bytes_total: bytes folded into EMA weights (EMA GB/s = rate of this).
  Counter& ema_bytes() { return *ema_bytes_; }
  // zcc_checkpoint_seconds: from a checkpoint step's snapshot to its shards on disk.
  Histogram& checkpoint_seconds() { return *checkpoint_seconds_; }
  // zcc_commit_latency_seconds: from a step's first manifest to its commit.
  Histogram& commit_latency_seconds() { return *commit_latency_seconds_; }
  // zcc_ema_seconds: one EMA update of one rank's tensors.
  Histogram& ema_seconds() { return *ema_seconds_; }
  // zcc_restore_seconds: one rank's restore, from request to bytes in its slot.
  Histogram& restore_seconds() { return *restore_seconds_; }
  // zcc_restores_total{source="memory"|"disk"}: restores served.
  Counter& restores(RestoreSource source) { return *restores_[static_cast<int>(source)]; }
  // zcc_restore_bytes_read_total: checkpoint bytes restores read from disk.
  Counter& restore_bytes_read() { return *restore_bytes_read_; }
  // zcc_restore_prefetches_total{outcome="used"|"discarded"}: reads of the
  // newest step begun as a rank registered (daemon/restore/restore_prefetch.h),
  // by whether a restore used them.
  Counter& restore_prefetches(PrefetchOutcome outcome) {
    return *restore_prefetches_[static_cast<int>(outcome)];
  }
  // zcc_ema_snapshots_left_out_total{reason="nonfinite"|"out_of_order"}:
  // snapshots an EMA did not fold in, because a parameter held NaN or Inf,
  // or because it was taken in after a later one.
  Counter& ema_left_out(EmaLeftOut reason) {
    return *ema_left_out_[static_cast<int>(reason)];
  }
  // zcc_staging_bytes: shared memory currently allocated for staging
  // (retained snapshots included).
  Gauge& staging_bytes() { return *staging_bytes_; }
  // zcc_staging_pool_bytes: staging memory made ready before registrations
  // (allocated and mapped), not yet taken.
  Gauge& staging_pool_bytes() { return *staging_pool_bytes_; }
  // zcc_peer_replica_bytes: memory holding replicas of other nodes'
  // snapshot pieces (the peer service).
  Gauge& peer_replica_bytes() { return *peer_replica_bytes_; }
  // zcc_peer_own_copy_bytes: memory holding this node's own replicated
  // steps, kept so that each exists in two failure domains.
  Gauge& peer_own_copy_bytes() { return *peer_own_copy_bytes_; }
  // zcc_replication_bytes_sent_total: bytes of replicated steps pushed to
  // buddy zccds (the peer tier).
  Counter& replication_bytes_sent() { return *replication_bytes_sent_; }
  // zcc_replication_pushed_again_total: replicated steps pushed to a buddy
  // again because it no longer held them (peer.check_buddies_s).
  Counter& replication_pushed_again() { return *replication_pushed_again_; }
  // zcc_replication_lag_seconds / zcc_replication_lag_steps: the longest
  // any job's oldest step not yet at every buddy has waited, and the most
  // steps any job's newest replicated step trails its newest one handed in.
  Gauge& replication_lag_seconds() { return *replication_lag_seconds_; }
  Gauge& replication_lag_steps() { return *replication_lag_steps_; }
  // zcc_peers{state="up"|"down"}: the other zccds of this node's jobs (and
  // the static peers), by whether their last probe answered.
  Gauge& peers(bool up) { return *peers_[up ? 1 : 0]; }
  // zcc_retained_snapshot_bytes: staging memory holding the snapshots of
  // ranks whose trainer died or exited, kept for a restore from memory.
  Gauge& retained_snapshot_bytes() { return *retained_snapshot_bytes_; }
  // zcc_registered_ranks: ranks currently registered.
  Gauge& registered_ranks() { return *registered_ranks_; }
  // zcc_upload_bytes_total: bytes the tiered mode uploaded to object stores.
  Counter& upload_bytes() { return *upload_bytes_; }
  // zcc_upload_lag_seconds: the longest any job's oldest locally committed
  // step has waited for its object store (the durability lag; 0: none).
  Gauge& upload_lag_seconds() { return *upload_lag_seconds_; }
  // zcc_errors_total{kind="..."}.
  Counter& errors(ErrorKind kind) { return *errors_[static_cast<int>(kind)]; }

  Registry& registry() { return registry_; }
  std::string RenderPrometheusText() const { return registry_.RenderPrometheusText(); }

 private:
  Registry registry_;
  Counter* snapshots_;
  Counter* snapshots_skipped_;
  Counter* bytes_written_;
  Counter* ema_bytes_;
  Histogram* checkpoint_seconds_;
  Histogram* commit_latency_seconds_;
  Histogram* ema_seconds_;
  Histogram* restore_seconds_;
  Counter* restores_[2];
  Counter* restore_bytes_read_;
  Counter* restore_prefetches_[2];
  Counter* ema_left_out_[2];
  Gauge* staging_bytes_;
  Gauge* staging_pool_bytes_;
  Gauge* peer_replica_bytes_;
  Gauge* peer_own_copy_bytes_;
  Counter* replication_bytes_sent_;
  Counter* replication_pushed_again_;
  Gauge* replication_lag_seconds_;
  Gauge* replication_lag_steps_;
  Gauge* peers_[2];
  Gauge* retained_snapshot_bytes_;
  Gauge* registered_ranks_;
  Counter* upload_bytes_;
  Gauge* upload_lag_seconds_;
  Counter* errors_[kNumErrorKinds];
};

}  // namespace zcc::metrics

#endif  // ZCC_METRICS_METRICS_H_
