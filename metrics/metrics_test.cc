#include "metrics/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/testing/status_matchers.h"
#include "metrics/testing/exposition_parser.h"

namespace zcc::metrics {
namespace {

using testing::Exposition;
using testing::ParseExposition;

Exposition Parse(const std::string& text) {
  absl::StatusOr<Exposition> e = ParseExposition(text);
  INFO(text);
  REQUIRE_OK(e);
  return *e;
}

// True when `fn` aborts the process (run in a forked child).
bool Aborts(const std::function<void()>& fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Catch2's SIGABRT handler would report the expected abort as a failure.
    std::signal(SIGABRT, SIG_DFL);
    ::close(2);  // keep the expected message out of the test log
    fn();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

TEST_CASE("the exposition parser rejects malformed text") {
  for (const char* bad : {
           "x 1",                                            // no trailing newline
           "# TYPE x counter\nx{a=\"1\" 1\n",                // unterminated labels
           "# TYPE x counter\nx{a=1} 1\n",                   // unquoted value
           "# TYPE x counter\nx{a=\"\\t\"} 1\n",             // bad escape
           "# TYPE x counter\nx one\n",                      // bad value
           "# TYPE x counter\nx  1\n",                       // two spaces
           "# TYPE x counter\n9x 1\n",                       // bad name
           "x 1\n",                                          // no TYPE
           "# TYPE x counter\n# TYPE x gauge\n",             // TYPE twice
           "# TYPE x counter\nx 1\n# TYPE x counter\n",      // TYPE after samples
           "# TYPE x counter\nx 1\nx 2\n",                   // duplicate series
           "# TYPE x counter\n# TYPE y counter\nx 1\ny 1\nx{a=\"b\"} 1\n",  // split family
           "# TYPE x counter\nx -1\n",                       // negative counter
           "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  // no +Inf
           "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
           "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
           "# TYPE h histogram\nh 1\n",
       }) {
    INFO(bad);
    CHECK_FALSE(ParseExposition(bad).ok());
  }
  CHECK_OK(ParseExposition(""));
  CHECK_OK(ParseExposition("# a comment\n# TYPE x gauge\nx{a=\"q\\\"\\\\\\n\",} NaN 1700000000000\n"));
}

TEST_CASE("counters, gauges and histograms render as valid exposition text") {
  Registry r;
  Counter& c = r.AddCounter("zcc_things_total", "Things.\nSecond line with a \\ backslash.");
  Counter& io = r.AddCounter("zcc_errors_total", "Errors.", {{"kind", "io"}});
  Counter& odd = r.AddCounter("zcc_errors_total", "Errors.", {{"kind", "quote\" back\\ nl\n"}});
  Gauge& g = r.AddGauge("zcc_level_bytes", "A level.");
  Histogram& h = r.AddHistogram("zcc_op_seconds", "Op time.", {0.5, 1, 2.5});
  Histogram& hl = r.AddHistogram("zcc_lat_seconds", "Latency.", {1}, {{"op", "read"}});
  c.Increment();
  c.Increment(41);
  io.Increment(3);
  odd.Increment();
  g.Set(1.5);
  g.Add(-4);
  for (double v : {0.1, 0.5, 0.7, 1.0, 2.0, 3.0, 100.0}) h.Observe(v);
  h.Observe(std::nan(""));  // dropped
  hl.Observe(0.25);

  const std::string text = r.RenderPrometheusText();
  const Exposition e = Parse(text);
  CHECK(e.types.at("zcc_things_total") == "counter");
  CHECK(e.types.at("zcc_errors_total") == "counter");
  CHECK(e.types.at("zcc_level_bytes") == "gauge");
  CHECK(e.types.at("zcc_op_seconds") == "histogram");
  CHECK(e.helps.at("zcc_things_total") == "Things.\nSecond line with a \\ backslash.");
  CHECK(e.Value("zcc_things_total") == 42);
  CHECK(e.Value("zcc_errors_total", {{"kind", "io"}}) == 3);
  CHECK(e.Value("zcc_errors_total", {{"kind", "quote\" back\\ nl\n"}}) == 1);
  CHECK(e.Value("zcc_level_bytes") == -2.5);
  CHECK(e.Value("zcc_op_seconds_bucket", {{"le", "0.5"}}) == 2);  // 0.1, 0.5 (le is inclusive)
  CHECK(e.Value("zcc_op_seconds_bucket", {{"le", "1"}}) == 4);
  CHECK(e.Value("zcc_op_seconds_bucket", {{"le", "2.5"}}) == 5);
  CHECK(e.Value("zcc_op_seconds_bucket", {{"le", "+Inf"}}) == 7);
  CHECK(e.Value("zcc_op_seconds_count") == 7);
  CHECK(e.Value("zcc_op_seconds_sum") == Approx(107.3));
  CHECK(e.Value("zcc_lat_seconds_bucket", {{"op", "read"}, {"le", "1"}}) == 1);
  CHECK(e.Value("zcc_lat_seconds_sum", {{"op", "read"}}) == 0.25);

  // Exact text of the escapes and of one histogram series.
  CHECK_THAT(text, Catch::Contains("# HELP zcc_things_total Things.\\nSecond line with a \\\\ backslash.\n"));
  CHECK_THAT(text, Catch::Contains("zcc_errors_total{kind=\"quote\\\" back\\\\ nl\\n\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE zcc_op_seconds histogram\n"
                                   "zcc_op_seconds_bucket{le=\"0.5\"} 2\n"
                                   "zcc_op_seconds_bucket{le=\"1\"} 4\n"
                                   "zcc_op_seconds_bucket{le=\"2.5\"} 5\n"
                                   "zcc_op_seconds_bucket{le=\"+Inf\"} 7\n"
                                   "zcc_op_seconds_sum 107.3\n"
                                   "zcc_op_seconds_count 7\n"));
}

TEST_CASE("gauge values NaN and infinities use the format's spelling") {
  Registry r;
  Gauge& a = r.AddGauge("a", "a");
  Gauge& b = r.AddGauge("b", "b");
  Gauge& c = r.AddGauge("c", "c");
  a.Set(std::nan(""));
  b.Set(HUGE_VAL);
  c.Set(-HUGE_VAL);
  const std::string text = r.RenderPrometheusText();
  CHECK_THAT(text, Catch::Contains("\na NaN\n"));
  CHECK_THAT(text, Catch::Contains("\nb +Inf\n"));
  CHECK_THAT(text, Catch::Contains("\nc -Inf\n"));
  const Exposition e = Parse(text);
  CHECK(std::isnan(*e.Value("a")));
  CHECK(*e.Value("b") == HUGE_VAL);
}

TEST_CASE("registering a series again returns the same one") {
  Registry r;
  Counter& a = r.AddCounter("zcc_x_total", "X.", {{"kind", "a"}});
  CHECK(&r.AddCounter("zcc_x_total", "X.", {{"kind", "a"}}) == &a);
  CHECK(&r.AddCounter("zcc_x_total", "X.", {{"kind", "b"}}) != &a);
  Histogram& h = r.AddHistogram("zcc_h_seconds", "H.", {1, 2});
  CHECK(&r.AddHistogram("zcc_h_seconds", "H.", {1, 2}) == &h);
  const Exposition e = Parse(r.RenderPrometheusText());
  CHECK(e.samples.size() == 2 + 5);
}

TEST_CASE("misuse of the registry aborts with a message") {
  CHECK(Aborts([] { Registry().AddCounter("zcc_no_suffix", "x"); }));
  CHECK(Aborts([] { Registry().AddGauge("bad-name", "x"); }));
  CHECK(Aborts([] { Registry().AddGauge("g", "x", {{"__reserved", "v"}}); }));
  CHECK(Aborts([] { Registry().AddGauge("g", "x", {{"a", "1"}, {"a", "2"}}); }));
  CHECK(Aborts([] { Registry().AddHistogram("h", "x", {1}, {{"le", "1"}}); }));
  CHECK(Aborts([] { Registry().AddHistogram("h", "x", {2, 1}); }));
  CHECK(Aborts([] {
    Registry r;
    r.AddGauge("g", "x");
    r.AddCounter("g", "x");
  }));
  CHECK(Aborts([] {
    Registry r;
    r.AddHistogram("h", "x", {1});
    r.AddHistogram("h", "x", {2});
  }));
  CHECK(Aborts([] {
    Registry r;
    r.AddHistogram("h", "x", {1});
    r.AddGauge("h_count", "x");
  }));
  CHECK_FALSE(Aborts([] { Registry().AddGauge("fine:name_1", "x", {{"label_2", "v"}}); }));
}

TEST_CASE("concurrent updates from several threads sum exactly") {
  Registry r;
  Counter& c = r.AddCounter("zcc_n_total", "N.");
  Gauge& g = r.AddGauge("zcc_g", "G.");
  Histogram& h = r.AddHistogram("zcc_h_seconds", "H.", {1, 2, 3});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c.Increment();
        g.Add(0.5);
        h.Observe(static_cast<double>((i + t) % 4));  // 0,1,2,3: exact in binary
      }
    });
  }
  // Renders while the updates run: every rendering must stay valid.
  for (int i = 0; i < 20; ++i) Parse(r.RenderPrometheusText());
  for (auto& t : threads) t.join();

  constexpr uint64_t kTotal = uint64_t{kThreads} * kPerThread;
  CHECK(c.value() == kTotal);
  CHECK(g.value() == kTotal * 0.5);
  const Histogram::Snapshot s = h.snapshot();
  CHECK(s.count == kTotal);
  CHECK(s.cumulative == std::vector<uint64_t>{kTotal / 2, kTotal * 3 / 4, kTotal, kTotal});
  CHECK(s.sum == kTotal / 4 * (0 + 1 + 2 + 3));
  const Exposition e = Parse(r.RenderPrometheusText());
  CHECK(e.Value("zcc_n_total") == kTotal);
  CHECK(e.Value("zcc_h_seconds_count") == kTotal);
}

TEST_CASE("ZccMetrics exports exactly the standard zcc_ metrics") {
  ZccMetrics m;
  m.snapshots().Increment(10);
  m.snapshots_skipped().Increment(2);
  m.bytes_written().Increment(1 << 20);
  m.ema_bytes().Increment(4096);
  m.checkpoint_seconds().Observe(3.2);
  m.commit_latency_seconds().ObserveDuration(absl::Milliseconds(20));
  m.ema_seconds().Observe(0.004);
  m.restore_seconds().Observe(12);
  m.staging_bytes().Set(8 << 20);
  m.registered_ranks().Set(4);
  m.errors(ErrorKind::kCommitTimeout).Increment();
  m.restores(RestoreSource::kMemory).Increment(3);
  m.restores(RestoreSource::kDisk).Increment();
  m.restore_bytes_read().Increment(5000);
  m.restore_prefetches(PrefetchOutcome::kUsed).Increment(2);
  m.ema_left_out(EmaLeftOut::kOutOfOrder).Increment();
  m.retained_snapshot_bytes().Set(1 << 20);
  m.replication_bytes_sent().Increment(777);
  m.replication_pushed_again().Increment(2);
  m.replication_lag_seconds().Set(2.5);
  m.replication_lag_steps().Set(5);
  m.peers(true).Set(3);
  m.peers(false).Set(1);

  const Exposition e = Parse(m.RenderPrometheusText());
  const std::map<std::string, std::string> expected = {
      {"zcc_snapshots_total", "counter"},
      {"zcc_snapshots_skipped_total", "counter"},
      {"zcc_bytes_written_total", "counter"},
      {"zcc_ema_bytes_total", "counter"},
      {"zcc_checkpoint_seconds", "histogram"},
      {"zcc_commit_latency_seconds", "histogram"},
      {"zcc_ema_seconds", "histogram"},
      {"zcc_restore_seconds", "histogram"},
      {"zcc_staging_bytes", "gauge"},
      {"zcc_staging_pool_bytes", "gauge"},
      {"zcc_peer_replica_bytes", "gauge"},
      {"zcc_peer_own_copy_bytes", "gauge"},
      {"zcc_registered_ranks", "gauge"},
      {"zcc_errors_total", "counter"},
      {"zcc_restores_total", "counter"},
      {"zcc_restore_bytes_read_total", "counter"},
      {"zcc_restore_prefetches_total", "counter"},
      {"zcc_ema_snapshots_left_out_total", "counter"},
      {"zcc_retained_snapshot_bytes", "gauge"},
      {"zcc_upload_bytes_total", "counter"},
      {"zcc_upload_lag_seconds", "gauge"},
      {"zcc_replication_bytes_sent_total", "counter"},
      {"zcc_replication_pushed_again_total", "counter"},
      {"zcc_replication_lag_seconds", "gauge"},
      {"zcc_replication_lag_steps", "gauge"},
      {"zcc_peers", "gauge"},
  };
  CHECK(e.types == expected);
  for (const auto& [name, type] : e.types) {
    INFO(name);
    CHECK(absl::StartsWith(name, "zcc_"));
    CHECK_FALSE(e.helps.at(name).empty());
  }
  CHECK(e.Value("zcc_snapshots_total") == 10);
  CHECK(e.Value("zcc_snapshots_skipped_total") == 2);
  CHECK(e.Value("zcc_bytes_written_total") == (1 << 20));
  CHECK(e.Value("zcc_ema_bytes_total") == 4096);
  CHECK(e.Value("zcc_checkpoint_seconds_bucket", {{"le", "2.5"}}) == 0);
  CHECK(e.Value("zcc_checkpoint_seconds_bucket", {{"le", "5"}}) == 1);
  CHECK(e.Value("zcc_commit_latency_seconds_bucket", {{"le", "0.025"}}) == 1);
  CHECK(e.Value("zcc_commit_latency_seconds_bucket", {{"le", "0.01"}}) == 0);
  CHECK(e.Value("zcc_ema_seconds_sum") == 0.004);
  CHECK(e.Value("zcc_restore_seconds_count") == 1);
  CHECK(e.Value("zcc_staging_bytes") == (8 << 20));
  CHECK(e.Value("zcc_registered_ranks") == 4);
  CHECK(e.Value("zcc_restores_total", {{"source", "memory"}}) == 3);
  CHECK(e.Value("zcc_restores_total", {{"source", "disk"}}) == 1);
  CHECK(e.Value("zcc_restore_bytes_read_total") == 5000);
  CHECK(e.Value("zcc_restore_prefetches_total", {{"outcome", "used"}}) == 2);
  CHECK(e.Value("zcc_restore_prefetches_total", {{"outcome", "discarded"}}) == 0);
  CHECK(e.Value("zcc_ema_snapshots_left_out_total", {{"reason", "nonfinite"}}) == 0);
  CHECK(e.Value("zcc_ema_snapshots_left_out_total", {{"reason", "out_of_order"}}) == 1);
  CHECK(e.Value("zcc_replication_bytes_sent_total") == 777);
  CHECK(e.Value("zcc_replication_pushed_again_total") == 2);
  CHECK(e.Value("zcc_replication_lag_seconds") == 2.5);
  CHECK(e.Value("zcc_replication_lag_steps") == 5);
  CHECK(e.Value("zcc_peers", {{"state", "up"}}) == 3);
  CHECK(e.Value("zcc_peers", {{"state", "down"}}) == 1);
  CHECK(e.Value("zcc_retained_snapshot_bytes") == (1 << 20));
  // Every error kind is exported from the start.
  std::set<std::string> kinds;
  for (int i = 0; i < kNumErrorKinds; ++i) {
    const std::string kind(ErrorKindName(static_cast<ErrorKind>(i)));
    kinds.insert(kind);
    CHECK(e.Value("zcc_errors_total", {{"kind", kind}}) ==
          (static_cast<ErrorKind>(i) == ErrorKind::kCommitTimeout ? 1 : 0));
  }
  CHECK(kinds.size() == kNumErrorKinds);
  CHECK(kinds.count("unknown") == 0);
}

TEST_CASE("exponential buckets") {
  CHECK(ExponentialBuckets(1, 2, 3) == std::vector<double>{1, 2, 4});
}

}  // namespace
}  // namespace zcc::metrics
