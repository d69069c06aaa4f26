#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zcc::metrics {
namespace {

static_assert(std::atomic<double>::is_always_lock_free, "metrics need lock-free double atomics");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "metrics need lock-free 64-bit atomics");

// Registry misuse is a bug in the caller, found the first time the code runs.
[[noreturn]] void Die(absl::string_view message) {
  std::fprintf(stderr, "zcc metrics: %.*s\n", static_cast<int>(message.size()), message.data());
  std::abort();
}

void AtomicAdd(std::atomic<double>& target, double delta) {
  double old = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(old, old + delta, std::memory_order_relaxed)) {
  }
}

bool IsMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || c == ':' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsLabelName(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

// Prometheus float syntax: integers without a fraction, +Inf/-Inf/NaN, else
// the shortest form that reads back exactly.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  std::string s;
  for (int precision : {6, 15, 17}) {
    s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) break;
  }
  return s;
}

// HELP text: backslash and newline escaped.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Label values: backslash, double quote and newline escaped.
std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a="x",b="y"}" with `extra` (e.g. le) appended; "" when there are none.
std::string RenderLabels(const Labels& labels, const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::pair<std::string, std::string>& label) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, label.first, "=\"", EscapeLabelValue(label.second), "\"");
  };
  for (const auto& label : labels) add(label);
  if (extra != nullptr) add(*extra);
  out += "}";
  return out;
}

}  // namespace

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      Die("histogram bounds must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die("ExponentialBuckets needs start > 0, factor > 1, count >= 1");
  }
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

Registry::Series& Registry::FindOrAdd(absl::string_view name, absl::string_view help, Type type,
                                      const std::vector<double>& bounds, Labels labels) {
  if (!IsMetricName(name)) Die(absl::StrCat("bad metric name \"", name, "\""));
  if (type == Type::kCounter && !absl::EndsWith(name, "_total")) {
    Die(absl::StrCat("counter ", name, " must end in _total"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i].first;
    if (!IsLabelName(label) || (type == Type::kHistogram && label == "le")) {
      Die(absl::StrCat("bad label name \"", label, "\" for ", name));
    }
    for (size_t j = 0; j < i; ++j) {
      if (labels[j].first == label) Die(absl::StrCat("label ", label, " repeated for ", name));
    }
  }

  zcc::MutexLock lock(&mu_);
  Family* family = nullptr;
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    family = it->second;
    if (family->type != type || family->help != help || family->bounds != bounds) {
      Die(absl::StrCat("metric ", name, " registered again with another type, help or buckets"));
    }
  } else {
    // A histogram exports name_bucket/_sum/_count; no other family may use those.
    for (const auto& f : families_) {
      for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
        if ((f->type == Type::kHistogram && name == absl::StrCat(f->name, suffix)) ||
            (type == Type::kHistogram && f->name == absl::StrCat(name, suffix))) {
          Die(absl::StrCat("metric ", name, " collides with histogram samples of ", f->name));
        }
      }
    }
    auto owned = std::make_unique<Family>();
    owned->name = std::string(name);
    owned->help = std::string(help);
    owned->type = type;
    owned->bounds = bounds;
    family = owned.get();
    families_.push_back(std::move(owned));
    by_name_.emplace(family->name, family);
  }
  for (const auto& series : family->series) {
    if (series->labels == labels) return *series;
  }
  auto series = std::make_unique<Series>();
  series->labels = std::move(labels);
  switch (type) {
    case Type::kCounter:
      series->counter = std::make_unique<Counter>();
      break;
    case Type::kGauge:
      series->gauge = std::make_unique<Gauge>();
      break;
    case Type::kHistogram:
      series->histogram = std::make_unique<Histogram>(bounds);
      break;
  }
  family->series.push_back(std::move(series));
  return *family->series.back();
}

Counter& Registry::AddCounter(absl::string_view name, absl::string_view help, Labels labels) {
  return *FindOrAdd(name, help, Type::kCounter, {}, std::move(labels)).counter;
}

Gauge& Registry::AddGauge(absl::string_view name, absl::string_view help, Labels labels) {
  return *FindOrAdd(name, help, Type::kGauge, {}, std::move(labels)).gauge;
}

Histogram& Registry::AddHistogram(absl::string_view name, absl::string_view help,
                                  std::vector<double> bounds, Labels labels) {
  // Validates the bounds before anything is registered.
  Histogram check(bounds);
  return *FindOrAdd(name, help, Type::kHistogram, bounds, std::move(labels)).histogram;
}

std::string Registry::RenderPrometheusText() const {
  zcc::MutexLock lock(&mu_);
  std::string out;
  for (const auto& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ", EscapeHelp(family->help), "\n");
    const char* type = family->type == Type::kCounter ? "counter"
                       : family->type == Type::kGauge ? "gauge"
                                                      : "histogram";
    absl::StrAppend(&out, "# TYPE ", family->name, " ", type, "\n");
    for (const auto& series : family->series) {
      switch (family->type) {
        case Type::kCounter:
          absl::StrAppend(&out, family->name, RenderLabels(series->labels, nullptr), " ",
                          series->counter->value(), "\n");
          break;
        case Type::kGauge:
          absl::StrAppend(&out, family->name, RenderLabels(series->labels, nullptr), " ",
                          FormatValue(series->gauge->value()), "\n");
          break;
        case Type::kHistogram: {
          const Histogram::Snapshot s = series->histogram->snapshot();
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            const std::pair<std::string, std::string> le{
                "le", i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf"};
            absl::StrAppend(&out, family->name, "_bucket", RenderLabels(series->labels, &le), " ",
                            s.cumulative[i], "\n");
          }
          const std::string labels = RenderLabels(series->labels, nullptr);
          absl::StrAppend(&out, family->name, "_sum", labels, " ", FormatValue(s.sum), "\n");
          absl::StrAppend(&out, family->name, "_count", labels, " ", s.count, "\n");
          break;
        }
      }
    }
  }
  return out;
}

absl::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kWrite:
      return "write";
    case ErrorKind::kCommit:
      return "commit";
    case ErrorKind::kCommitTimeout:
      return "commit_timeout";
    case ErrorKind::kRestore:
      return "restore";
    case ErrorKind::kVerify:
      return "verify";
    case ErrorKind::kClientTimeout:
      return "client_timeout";
    case ErrorKind::kEma:
      return "ema";
    case ErrorKind::kRpc:
      return "rpc";
    case ErrorKind::kUpload:
      return "upload";
    case ErrorKind::kSegmentCut:
      return "segment_cut";
  }
  return "unknown";
}

ZccMetrics::ZccMetrics() {
  // Checkpoints of large models take seconds to many minutes.
  const std::vector<double> checkpoint_buckets = {0.1, 0.25, 0.5, 1,   2.5, 5,    10,  25,
                                                  50,  100,  250, 500, 1000, 2500, 5000};
  // Commits and EMA updates: milliseconds to a minute.
  const std::vector<double> short_buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1,     2.5,  5,     10,   30, 60};
  snapshots_ = &registry_.AddCounter("zcc_snapshots_total", "Snapshots copied into staging.");
  snapshots_skipped_ = &registry_.AddCounter(
      "zcc_snapshots_skipped_total", "Snapshots dropped because no staging slot was free.");
  bytes_written_ = &registry_.AddCounter("zcc_bytes_written_total",
                                         "Checkpoint bytes written to disk.");
  ema_bytes_ = &registry_.AddCounter("zcc_ema_bytes_total", "Bytes folded into EMA weights.");
  checkpoint_seconds_ = &registry_.AddHistogram(
      "zcc_checkpoint_seconds", "Seconds from a checkpoint step's snapshot to its shards on disk.",
      checkpoint_buckets);
  commit_latency_seconds_ = &registry_.AddHistogram(
      "zcc_commit_latency_seconds", "Seconds from a step's first manifest to its commit.",
      short_buckets);
  ema_seconds_ = &registry_.AddHistogram(
      "zcc_ema_seconds", "Seconds of one EMA update of one rank's tensors.", short_buckets);
  restore_seconds_ = &registry_.AddHistogram(
      "zcc_restore_seconds", "Seconds of one rank's restore, from request to bytes in its slot.",
      checkpoint_buckets);
  restores_[static_cast<int>(RestoreSource::kMemory)] = &registry_.AddCounter(
      "zcc_restores_total", "Restores served, by source.", {{"source", "memory"}});
  restores_[static_cast<int>(RestoreSource::kDisk)] = &registry_.AddCounter(
      "zcc_restores_total", "Restores served, by source.", {{"source", "disk"}});
  restore_bytes_read_ = &registry_.AddCounter("zcc_restore_bytes_read_total",
                                              "Checkpoint bytes restores read from disk.");
  restore_prefetches_[static_cast<int>(PrefetchOutcome::kUsed)] = &registry_.AddCounter(
      "zcc_restore_prefetches_total",
      "Reads of the newest step begun as a rank registered, by whether a restore used them.",
      {{"outcome", "used"}});
  restore_prefetches_[static_cast<int>(PrefetchOutcome::kDiscarded)] = &registry_.AddCounter(
      "zcc_restore_prefetches_total",
      "Reads of the newest step begun as a rank registered, by whether a restore used them.",
      {{"outcome", "discarded"}});
  for (const auto& [reason, label] :
       {std::pair{EmaLeftOut::kNonFinite, "nonfinite"},
        std::pair{EmaLeftOut::kOutOfOrder, "out_of_order"}}) {
    ema_left_out_[static_cast<int>(reason)] = &registry_.AddCounter(
        "zcc_ema_snapshots_left_out_total",
        "Snapshots an EMA did not fold in: a parameter held NaN or Inf, or the snapshot was "
        "taken in after a later one.",
        {{"reason", label}});
  }
  staging_bytes_ = &registry_.AddGauge(
      "zcc_staging_bytes",
      "Staging memory in use, bytes: the ranks' shared-memory segments, retained ones and "
      "registrations in flight, with the ranks' EMAs (in zccd's memory).");
  staging_pool_bytes_ = &registry_.AddGauge(
      "zcc_staging_pool_bytes",
      "Staging memory made ready before registrations (allocated and mapped), not yet taken.");
  peer_replica_bytes_ = &registry_.AddGauge(
      "zcc_peer_replica_bytes", "Memory holding replicas of other nodes' snapshot pieces, bytes.");
  peer_own_copy_bytes_ = &registry_.AddGauge(
      "zcc_peer_own_copy_bytes",
      "Memory holding this node's own replicated steps (kept in two failure domains), bytes.");
  replication_bytes_sent_ = &registry_.AddCounter(
      "zcc_replication_bytes_sent_total", "Bytes of replicated steps pushed to buddy zccds.");
  replication_pushed_again_ = &registry_.AddCounter(
      "zcc_replication_pushed_again_total",
      "Replicated steps pushed to a buddy again because it no longer held them.");
  replication_lag_seconds_ = &registry_.AddGauge(
      "zcc_replication_lag_seconds",
      "Longest wait of any job's oldest step not yet replicated to every buddy, seconds.");
  replication_lag_steps_ = &registry_.AddGauge(
      "zcc_replication_lag_steps",
      "Most steps any job's newest replicated step trails its newest step handed in.");
  peers_[0] = &registry_.AddGauge("zcc_peers", "Other zccds of this node's jobs, by state.",
                                  {{"state", "down"}});
  peers_[1] = &registry_.AddGauge("zcc_peers", "Other zccds of this node's jobs, by state.",
                                  {{"state", "up"}});
  retained_snapshot_bytes_ = &registry_.AddGauge(
      "zcc_retained_snapshot_bytes",
      "Staging memory holding dead or departed ranks' snapshots for a restore from memory.");
  registered_ranks_ = &registry_.AddGauge("zcc_registered_ranks", "Ranks currently registered.");
  upload_bytes_ = &registry_.AddCounter(
      "zcc_upload_bytes_total", "Bytes of committed steps uploaded to object stores (tiered mode).");
  upload_lag_seconds_ = &registry_.AddGauge(
      "zcc_upload_lag_seconds",
      "Longest wait of any job's oldest locally committed step for its object store.");
  for (int i = 0; i < kNumErrorKinds; ++i) {
    errors_[i] = &registry_.AddCounter(
        "zcc_errors_total", "Errors by kind.",
        {{"kind", std::string(ErrorKindName(static_cast<ErrorKind>(i)))}});
  }
}

}  // namespace zcc::metrics
