// zccctl: operator's view of a node's zccd.
//
//   zccctl [--socket PATH] [--json] status [JOB]
//   zccctl [--socket PATH] [--json] list JOB [--root ROOT]
//   zccctl [--json] list JOB_DIR|s3://BUCKET/JOB_KEY   (offline)
//   zccctl [--json] gc JOB_DIR|s3://BUCKET/JOB_KEY [--older-than S]   (offline)
//   zccctl [--socket PATH] save JOB
//   zccctl [--socket PATH] [--json] gc JOB [--root ROOT]
//   zccctl [--socket PATH] watch [JOB] [--interval S] [--count N]
//   zccctl verify STEP            (offline: reads the files, no daemon)
//   zccctl [--json] export STEP OUT_DIR [--what model|ema|optim]
//          [--dtype bf16|f16|f32|keep] [--max-shard-size 5GB] [--extra-file PATH]...
//          [--force]                  (offline: a Hugging Face checkpoint)
// STEP: a step directory, a job directory (its newest committed step) or a
// job's latest file, local or in an S3-compatible store (s3://bucket/key;
// endpoint and credentials from the AWS variables: storage/s3/s3_location.h).
//
// Exit codes: 0 success, 1 the daemon or the check reported an error,
// 2 usage error, 3 zccd not reachable.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/default_paths.h"
#include "proto/zcc.grpc.pb.h"
#include "tools/zccctl_steps.h"

namespace {

using zcc::zccctl::kExitError;
using zcc::zccctl::kExitOk;
using zcc::zccctl::kExitUnreachable;
using zcc::zccctl::kExitUsage;

const char kUsage[] =
    "usage: zccctl [--socket PATH] [--json] COMMAND [ARGS]\n"
    "commands:\n"
    "  status [JOB]          daemon and job status\n"
    "  list JOB [--root R]   committed checkpoints of JOB\n"
    "  list DIR|s3://URL     committed checkpoints of a job directory, offline\n"
    "  save JOB              persist the next full snapshot zccd takes in from every\n"
    "                        local rank of JOB (one already enqueued counts)\n"
    "  gc JOB [--root R]     apply the retention policy now, remove abandoned partials\n"
    "  gc DIR|s3://URL [--older-than S]\n"
    "                        offline: remove what interrupted writes left (uncommitted\n"
    "                        steps, temporary files; incomplete uploads in a store)\n"
    "                        older than S seconds (default 3600); keeps every committed step\n"
    "  watch [JOB]           live status, refreshed every --interval seconds (default 2)\n"
    "                        until interrupted, or --count times\n"
    "  verify STEP           check a checkpoint's manifests and checksums offline\n"
    "                        (STEP: a step directory, a job directory for its newest\n"
    "                        committed step, or a job's latest file; local, or\n"
    "                        s3://bucket/key with AWS_ENDPOINT_URL, AWS_REGION and\n"
    "                        the AWS credentials of the environment or ~/.aws)\n"
    "  export STEP OUT_DIR\n"
    "                        write a committed step as a Hugging Face checkpoint (whole\n"
    "                        tensors, model-0000k-of-0000n.safetensors + index, or\n"
    "                        model.safetensors when one shard), offline, streaming:\n"
    "      --what model|ema|optim   which tensors (default model; ema: the EMA under the\n"
    "                               parameter names, parameters without one as they are)\n"
    "      --dtype bf16|f16|f32|keep  convert floating tensors (default keep); the\n"
    "                               exported config.json's torch_dtype says so\n"
    "      --max-shard-size SIZE    e.g. 5GB (default), 500MB, 1GiB\n"
    "      --extra-file PATH        copy a file into OUT_DIR (config.json, tokenizer\n"
    "                               files); repeatable; the files the trainer stored\n"
    "                               with the job (PutJobFile) are copied too; one\n"
    "                               of the same name is an error without --force\n"
    "      --no-job-files           do not copy the job's stored files, nor follow its\n"
    "                               zcc_export.json (2-D tensors a framework asks to\n"
    "                               have transposed, such as Paddle's [in, out] Linear\n"
    "                               weights for Hugging Face's [out, in])\n"
    "      --force                  write into a non-empty OUT_DIR; let an --extra-file\n"
    "                               replace the job's stored file of its name\n"
    "exit codes: 0 ok, 1 error reported, 2 usage, 3 zccd not reachable\n";

int Fail(const grpc::Status& st) {
  std::fprintf(stderr, "zccctl: %s\n", st.error_message().c_str());
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
             ? kExitUnreachable
             : kExitError;
}

// Proto3's JSON mapping writes 64-bit integers as strings (JavaScript's
// numbers lose precision past 2^53); scripts reading zccctl expect numbers
// for steps and byte counts, and every such value here fits a double well.
// Turns them back into numbers, field by field, as `type` describes `json`.
void NumbersFor64BitFields(const google::protobuf::Descriptor& type, nlohmann::json& json) {
  if (!json.is_object()) return;
  for (auto& [name, value] : json.items()) {
    const google::protobuf::FieldDescriptor* field = type.FindFieldByName(name);
    if (field == nullptr) continue;
    auto each = [&](nlohmann::json& v) {
      using Cpp = google::protobuf::FieldDescriptor::CppType;
      if (field->cpp_type() == Cpp::CPPTYPE_MESSAGE) {
        NumbersFor64BitFields(*field->message_type(), v);
      } else if (v.is_string() && field->cpp_type() == Cpp::CPPTYPE_INT64) {
        int64_t n;
        if (absl::SimpleAtoi(v.get<std::string>(), &n)) v = n;
      } else if (v.is_string() && field->cpp_type() == Cpp::CPPTYPE_UINT64) {
        uint64_t n;
        if (absl::SimpleAtoi(v.get<std::string>(), &n)) v = n;
      }
    };
    if (value.is_array()) {
      for (nlohmann::json& v : value) each(v);
    } else {
      each(value);
    }
  }
}

void PrintJson(const google::protobuf::Message& msg) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(msg, &out, opts);
  nlohmann::json json = nlohmann::json::parse(out);
  NumbersFor64BitFields(*msg.GetDescriptor(), json);
  std::printf("%s\n", json.dump(2).c_str());
}

std::string Step(int64_t step) { return step < 0 ? "-" : absl::StrCat(step); }

// The tiered mode: how far the store is behind (the durability lag).
void PrintUpload(const zcc::v1::JobStatus& job) {
  if (job.upload_dir().empty()) return;
  if (job.upload_node_local()) {
    // Each node sends its ranks' part; the step commits once all are there.
    std::printf("  sent to %s (this node's ranks): step %s, committed there: step %s",
                job.upload_dir().c_str(), Step(job.last_uploaded_step()).c_str(),
                Step(job.last_committed_step()).c_str());
  } else {
    std::printf("  uploaded to %s: step %s", job.upload_dir().c_str(),
                Step(job.last_uploaded_step()).c_str());
  }
  if (job.upload_pending_step() >= 0) {
    std::printf(", step %s waiting %.1f s", Step(job.upload_pending_step()).c_str(),
                job.upload_lag_seconds());
  }
  std::printf("\n");
  if (!job.upload_error().empty()) std::printf("  UPLOAD FAILING: %s\n", job.upload_error().c_str());
}

// The peer tier: the job's zccds, whether each answers, which hold this
// node's replicas.
void PrintJobPeers(const zcc::v1::JobStatus& job) {
  if (job.peers().empty()) return;
  if (job.replication_newest_step() >= 0) {
    std::printf("  replication: step %s at every buddy, newest %s", Step(job.replicated_step()).c_str(),
                Step(job.replication_newest_step()).c_str());
    if (job.replication_newest_step() > job.replicated_step()) {
      std::printf(" (lagging %.1f s)", job.replication_lag_seconds());
    }
    std::printf(", %.2f GB sent", job.replication_bytes_sent() / 1e9);
    if (job.replication_pushed_again() > 0) {
      std::printf(", %llu step(s) pushed again after a buddy dropped them",
                  static_cast<unsigned long long>(job.replication_pushed_again()));
    }
    std::printf("\n");
    if (job.memory_tier_step() >= 0) {
      std::printf("  memory tier: step %s whole (every rank's files in some zccd's memory)\n",
                  Step(job.memory_tier_step()).c_str());
    }
    if (!job.replication_error().empty()) {
      std::printf("  REPLICATION FAILING: %s\n", job.replication_error().c_str());
    }
  }
  std::printf("  peers:\n");
  for (const auto& p : job.peers()) {
    std::string ranks;
    for (uint32_t r : p.ranks()) absl::StrAppend(&ranks, ranks.empty() ? "" : ",", r);
    std::string state = p.self() ? "this zccd" : p.up() ? "up" : "DOWN";
    if (!p.self() && p.seconds_since_seen() >= 0) {
      absl::StrAppend(&state, absl::StrFormat(", seen %.0f s ago", p.seconds_since_seen()));
    } else if (!p.self() && !p.up()) {
      absl::StrAppend(&state, ", never answered");
    }
    if (!p.self() && !p.up() && !p.error().empty()) absl::StrAppend(&state, ": ", p.error());
    std::string who = p.address();
    if (!p.node().empty()) {
      absl::StrAppend(&who, " (", p.node(),
                      p.failure_domain().empty() ? "" : absl::StrCat(" in ", p.failure_domain()),
                      ")");
    }
    std::printf("    %s  ranks %s  %s%s\n", who.c_str(), ranks.empty() ? "-" : ranks.c_str(),
                state.c_str(),
                p.buddy() ? "  [buddy]" : "");
  }
}

// The run and timeline the job's live ranks here write their steps in (a
// rank whose trainer is gone writes none): one line where they agree, a line
// per run and timeline where they do not (a step commits only from
// manifests of one run and timeline; the others' wait).
void PrintRunsAndTimelines(const zcc::v1::JobStatus& job) {
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> by_pair;
  for (const auto& r : job.ranks()) {
    if (r.client_alive()) by_pair[{r.run_id(), r.timeline()}].push_back(r.rank());
  }
  if (by_pair.empty() || (by_pair.size() == 1 && by_pair.begin()->first.first.empty() &&
                          by_pair.begin()->first.second.empty())) {
    return;
  }
  auto name = [](const std::string& v) { return v.empty() ? std::string("none") : "'" + v + "'"; };
  if (by_pair.size() == 1) {
    std::printf("  run %s  timeline %s\n", name(by_pair.begin()->first.first).c_str(),
                name(by_pair.begin()->first.second).c_str());
    return;
  }
  std::printf("  RANKS ON DIFFERENT RUNS OR TIMELINES (their steps do not commit together):\n");
  for (const auto& [pair, ranks] : by_pair) {
    std::printf("    run %s  timeline %s  ranks %s\n", name(pair.first).c_str(),
                name(pair.second).c_str(), absl::StrJoin(ranks, ",").c_str());
  }
}

void PrintStatus(const zcc::v1::StatusResponse& s) {
  std::printf("%s  pid %d  up %.0fs  %d job(s)\n", s.version().c_str(), s.pid(),
              s.uptime_seconds(), s.jobs_size());
  if (s.staging_budget_bytes() > 0) {
    const uint64_t replicas = s.has_peer() ? s.peer().replica_bytes_held() : 0;
    std::printf("staging budget: %.2f of %.2f GB in use: %.2f GB staging, EMAs and retained, "
                "%.2f GB pool, %.2f GB the peer tier's replicas (they give way to "
                "registrations)\n",
                (s.staging_bytes() + s.staging_pool_bytes() + replicas) / 1e9,
                s.staging_budget_bytes() / 1e9, s.staging_bytes() / 1e9,
                s.staging_pool_bytes() / 1e9, replicas / 1e9);
  }
  if (s.staging_pool_target_bytes() > 0) {
    std::printf("staging pool: %.2f of %.2f GB ready for the next registrations (%llu taken)\n",
                s.staging_pool_bytes() / 1e9, s.staging_pool_target_bytes() / 1e9,
                static_cast<unsigned long long>(s.staging_pool_taken()));
  }
  if (s.has_peer()) {
    const zcc::v1::PeerStatus& p = s.peer();
    std::printf("peer service: node %s%s%s, port %d (%s); replicas: %u piece(s), %.2f of %.2f "
                "GB: %u piece(s), %.2f GB held for other nodes, %u piece(s), %.2f GB this "
                "node's own replicated steps, %.2f GB being received (%llu dropped for room)\n",
                p.node().c_str(), p.failure_domain().empty() ? "" : " in ",
                p.failure_domain().c_str(), p.port(),
                p.tls() ? "mutual TLS" : "PLAINTEXT, insecure", p.replicas_held(),
                p.replica_bytes_held() / 1e9, p.replica_budget_bytes() / 1e9,
                p.replicas_held() - p.own_copy_pieces(),
                (p.replica_bytes_held() - p.own_copy_bytes() - p.replica_bytes_incoming()) / 1e9,
                p.own_copy_pieces(), p.own_copy_bytes() / 1e9, p.replica_bytes_incoming() / 1e9,
                static_cast<unsigned long long>(p.replicas_dropped()));
  }
  // Daemon-pull: what zccd's CUDA contexts cost, per device.
  if (s.daemon_pull_enabled()) {
    std::printf("daemon-pull: on%s%s\n", s.daemon_pull_unavailable().empty() ? "" : ", unusable: ",
                s.daemon_pull_unavailable().c_str());
    for (const auto& d : s.pull_devices()) {
      std::printf("  cuda device %d: %u rank(s) served, zccd's GPU memory %s, %llu context "
                  "reset(s)\n",
                  d.device(), d.rank_pullers(),
                  d.gpu_memory_bytes() > 0 ? absl::StrCat(d.gpu_memory_bytes() >> 20, " MiB").c_str()
                                           : "unknown (no NVML)",
                  static_cast<unsigned long long>(d.context_resets()));
    }
  }
  for (const auto& job : s.jobs()) {
    std::printf("\njob %s  world %u  dir %s\n", job.job_id().c_str(), job.world_size(),
                job.checkpoint_dir().c_str());
    std::printf("  last committed step %s", Step(job.last_committed_step()).c_str());
    if (job.last_checkpoint_bytes() > 0) {
      std::printf("  (%.2f GB in %.2fs from first write to commit, %.2f GB/s)",
                  job.last_checkpoint_bytes() / 1e9, job.last_checkpoint_seconds(),
                  job.last_checkpoint_gbps());
    }
    std::printf("\n");
    // What the job holds in /dev/shm here: what a node must plan memory for.
    std::printf("  staging memory %.2f GB for %d rank(s) here", job.staging_bytes() / 1e9,
                job.ranks_size());
    uint64_t ema_bytes = 0;
    for (const auto& r : job.ranks()) ema_bytes += r.ema_bytes();
    if (ema_bytes > 0) std::printf(" + %.2f GB of EMA in zccd's memory", ema_bytes / 1e9);
    if (job.retained_bytes() > 0) {
      std::printf(" + %.2f GB retained for restarted trainers", job.retained_bytes() / 1e9);
    }
    std::printf("\n");
    PrintUpload(job);
    PrintJobPeers(job);
    if (job.pending_commits_size() > 0) {
      std::printf("  pending commits:");
      for (const auto& p : job.pending_commits()) std::printf(" %s", p.c_str());
      std::printf("\n");
    }
    // Snapshots kept for a restarted trainer to restore from memory.
    for (const auto& kept : job.retained()) {
      std::printf("  in memory for rank %u: step(s)", kept.rank());
      for (int64_t step : kept.steps()) std::printf(" %lld", static_cast<long long>(step));
      std::printf(" (%.2f GB, kept %.0f s more)\n", kept.bytes() / 1e9,
                  kept.expires_in_seconds());
    }
    // Failing checkpoints come first and in capitals: a job that trains on
    // while none of its checkpoints land must not look healthy at a glance.
    for (const auto& r : job.ranks()) {
      if (r.persist_failures() == 0) continue;
      std::printf("  CHECKPOINTS FAILING: rank %u, %llu failed write(s)%s%s\n", r.rank(),
                  static_cast<unsigned long long>(r.persist_failures()),
                  r.last_error().empty() ? "" : "; last: ", r.last_error().c_str());
    }
    for (const auto& r : job.ranks()) {
      if (!r.daemon_pull()) continue;
      std::printf("  rank %u daemon-pull: %llu snapshot(s) copied by zccd (%.2f GB), %llu failed\n",
                  r.rank(), static_cast<unsigned long long>(r.pulls()), r.pull_bytes() / 1e9,
                  static_cast<unsigned long long>(r.pull_failures()));
    }
    for (const auto& r : job.ranks()) {
      if (r.replications_skipped() == 0) continue;
      std::printf("  rank %u peer tier: %llu due step(s) left out while the previous one "
                  "serialized (each made up for by the next snapshot)\n",
                  r.rank(), static_cast<unsigned long long>(r.replications_skipped()));
    }
    for (const auto& r : job.ranks()) {
      if (r.ema_skipped_nonfinite() == 0 && r.ema_out_of_order() == 0) continue;
      std::printf("  rank %u EMA: snapshots left out: %llu holding NaN or Inf, %llu taken in "
                  "after a later one\n",
                  r.rank(), static_cast<unsigned long long>(r.ema_skipped_nonfinite()),
                  static_cast<unsigned long long>(r.ema_out_of_order()));
    }
    PrintRunsAndTimelines(job);
    if (!job.last_error().empty()) std::printf("  last error: %s\n", job.last_error().c_str());
    std::printf("  %-5s %-8s %-6s %-10s %-10s %-10s %-9s %-8s %-7s %-6s %s\n", "rank", "pid",
                "alive", "snapshot", "ema", "persisted", "ingested", "skipped", "failed", "slots",
                "error");
    for (const auto& r : job.ranks()) {
      std::printf("  %-5u %-8d %-6s %-10s %-10s %-10s %-9llu %-8llu %-7llu %-6u %s\n", r.rank(),
                  r.pid(), r.client_alive() ? "yes" : "no", Step(r.last_snapshot_step()).c_str(),
                  Step(r.last_ema_step()).c_str(), Step(r.last_persisted_step()).c_str(),
                  static_cast<unsigned long long>(r.snapshots_ingested()),
                  static_cast<unsigned long long>(r.snapshots_skipped()),
                  static_cast<unsigned long long>(r.persist_failures()), r.slots_in_use(),
                  r.last_error().c_str());
    }
  }
}

struct Options {
  std::string socket = zcc::DefaultSocketPath();
  std::string root;
  bool json = false;
  double interval_s = 2;
  long count = -1;
  // export's flags, as given (parsed by the exporter's parsers).
  std::vector<std::pair<std::string, std::string>> export_flags;
  bool force = false;
  bool no_job_files = false;
  double older_than_s = -1;  // gc DIR|URL: what interrupted writes left, this old (default 3600)
  std::vector<std::string> args;  // the command and its operands
  // The operand after the command (a job id), or "" when there is none.
  const std::string& operand() const {
    static const std::string none;
    return args.size() > 1 ? args[1] : none;
  }
};

// zccd's two services over its unix socket; every call has a 10 s deadline.
// Offline: a committed step as a Hugging Face checkpoint (zccctl_steps.h).
int RunExport(const Options& o) {
  return zcc::zccctl::ExportCommand(
      {o.args[1], o.args[2], o.json, o.force, o.no_job_files, o.export_flags});
}

int RunVerify(const Options& o) { return zcc::zccctl::VerifyCommand(o.operand(), o.json); }

class Daemon {
 public:
  explicit Daemon(const std::string& socket)
      : channel_(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials())),
        control_(zcc::v1::Control::NewStub(channel_)),
        status_(zcc::v1::Status::NewStub(channel_)) {}

  zcc::v1::Control::Stub* control() { return control_.get(); }
  zcc::v1::Status::Stub* status() { return status_.get(); }

  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(Stub* stub,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return (stub->*method)(&ctx, request, response);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<zcc::v1::Control::Stub> control_;
  std::unique_ptr<zcc::v1::Status::Stub> status_;
};

// Prints `response` as JSON with --json, else with `print`.
template <typename Response, typename Print>
int Report(const Options& o, const Response& response, Print print) {
  if (o.json) {
    PrintJson(response);
  } else {
    print(response);
  }
  return kExitOk;
}

int RunStatus(const Options& o, Daemon& d) {
  zcc::v1::StatusRequest req;
  req.set_job_id(o.operand());
  zcc::v1::StatusResponse resp;
  const grpc::Status st = d.Call(d.status(), &zcc::v1::Status::Stub::GetStatus, req, &resp);
  if (!st.ok()) return Fail(st);
  return Report(o, resp, PrintStatus);
}

int RunWatch(const Options& o, Daemon& d) {
  zcc::v1::StatusRequest req;
  req.set_job_id(o.operand());
  for (long i = 0; o.count < 0 || i < o.count; ++i) {
    zcc::v1::StatusResponse resp;
    const grpc::Status st = d.Call(d.status(), &zcc::v1::Status::Stub::GetStatus, req, &resp);
    if (!st.ok()) return Fail(st);
    Report(o, resp, [](const zcc::v1::StatusResponse& r) {
      if (isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");  // clear the screen
      PrintStatus(r);
    });
    std::fflush(stdout);
    if (o.count < 0 || i + 1 < o.count) usleep(static_cast<useconds_t>(o.interval_s * 1e6));
  }
  return kExitOk;
}

void PrintCheckpoints(const zcc::v1::ListCheckpointsResponse& r) {
  // Steps above the one `latest` names were left behind by a run that went
  // back to an older step: listed, never restored.
  int64_t latest = -1;
  for (const auto& c : r.checkpoints()) {
    if (c.is_latest()) latest = c.step();
  }
  std::printf("%-10s %-7s %-12s %-22s %s\n", "step", "ranks", "GB", "committed", "path");
  for (const auto& c : r.checkpoints()) {
    const std::string tier = c.tier().empty() ? "" : "  [" + c.tier() + "]";
    const bool local = c.tier().empty() || absl::StartsWith(c.tier(), "local");
    const char* mark = c.is_latest()                               ? "  (latest)"
                       : latest >= 0 && local && c.step() > latest ? "  (left behind: above latest)"
                                                                   : "";
    // The run and timeline of its ranks (a going back together starts a
    // new timeline: the steps it left keep theirs).
    std::string line;
    if (!c.run_id().empty()) absl::StrAppend(&line, "  run '", c.run_id(), "'");
    if (!c.timeline().empty()) absl::StrAppend(&line, "  timeline '", c.timeline(), "'");
    std::printf("%-10lld %-7u %-12.3f %-22s %s%s%s%s\n", static_cast<long long>(c.step()),
                c.world_size(), c.total_bytes() / 1e9, c.committed_at().c_str(),
                c.path().c_str(), mark, tier.c_str(), line.c_str());
  }
}

// list with a job directory or an s3:// URL instead of a job id: read from
// the files, without zccd.
int ListOffline(const Options& o) {
  auto source = zcc::zccctl::OpenStepSource(o.operand());
  absl::StatusOr<zcc::v1::ListCheckpointsResponse> listed =
      source.ok() ? zcc::zccctl::ListCommitted(*source) : source.status();
  if (!listed.ok()) {
    std::fprintf(stderr, "zccctl: list %s: %s\n", o.operand().c_str(),
                 std::string(listed.status().message()).c_str());
    return kExitError;
  }
  return Report(o, *listed, PrintCheckpoints);
}

int RunList(const Options& o, Daemon& d) {
  zcc::v1::ListCheckpointsRequest req;
  req.set_job_id(o.operand());
  req.set_checkpoint_root(o.root);
  zcc::v1::ListCheckpointsResponse resp;
  const grpc::Status st =
      d.Call(d.status(), &zcc::v1::Status::Stub::ListCheckpoints, req, &resp);
  if (!st.ok()) return Fail(st);
  return Report(o, resp, PrintCheckpoints);
}

int RunSave(const Options& o, Daemon& d) {
  zcc::v1::SaveNowRequest req;
  req.set_job_id(o.operand());
  zcc::v1::SaveNowResponse resp;
  const grpc::Status st = d.Call(d.control(), &zcc::v1::Control::Stub::SaveNow, req, &resp);
  if (!st.ok()) return Fail(st);
  return Report(o, resp, [](const zcc::v1::SaveNowResponse& r) {
    std::printf("%u rank(s) will persist the next full snapshot zccd takes in from them\n",
                r.ranks_flagged());
  });
}

int RunGc(const Options& o, Daemon& d) {
  zcc::v1::CollectGarbageRequest req;
  req.set_job_id(o.operand());
  req.set_checkpoint_root(o.root);
  zcc::v1::CollectGarbageResponse resp;
  const grpc::Status st =
      d.Call(d.control(), &zcc::v1::Control::Stub::CollectGarbage, req, &resp);
  if (!st.ok()) return Fail(st);
  return Report(o, resp, [](const zcc::v1::CollectGarbageResponse& r) {
    std::printf("removed %d step(s)", r.removed_steps_size());
    for (int64_t s : r.removed_steps()) std::printf(" %lld", static_cast<long long>(s));
    std::printf(", %d abandoned partial(s); kept", r.removed_partials_size());
    for (int64_t s : r.kept_steps()) std::printf(" %lld", static_cast<long long>(s));
    std::printf("\n");
  });
}


struct Command {
  const char* name;
  // The command's operands: "a job id", "a step directory", or "" for an
  // optional job id.
  const char* operand;
  size_t operands;  // how many `operand` names (0: at most one job id)
  int (*run)(const Options&, Daemon&);  // null: offline
  int (*offline)(const Options&);
};

constexpr Command kCommands[] = {
    {"status", "", 0, RunStatus, nullptr},
    {"watch", "", 0, RunWatch, nullptr},
    {"list", "a job id", 1, RunList, nullptr},
    {"save", "a job id", 1, RunSave, nullptr},
    {"gc", "a job id", 1, RunGc, nullptr},
    {"verify", "a step directory", 1, nullptr, RunVerify},
    {"export", "a step directory and an output directory", 2, nullptr, RunExport},
};

bool IsExportFlag(const std::string& a) {
  return a == "--what" || a == "--dtype" || a == "--max-shard-size" || a == "--extra-file";
}

// Parses the command line into `o`; returns an exit code to stop with, or -1.
int ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o->json = true;
    } else if (a == "--socket" && i + 1 < argc) {
      o->socket = argv[++i];
    } else if (a == "--root" && i + 1 < argc) {
      o->root = argv[++i];
    } else if (a == "--interval" && i + 1 < argc) {
      o->interval_s = std::atof(argv[++i]);
    } else if (a == "--count" && i + 1 < argc) {
      o->count = std::atol(argv[++i]);
    } else if (IsExportFlag(a) && i + 1 < argc) {
      o->export_flags.emplace_back(a, argv[++i]);
    } else if (a == "--older-than" && i + 1 < argc) {
      o->older_than_s = std::atof(argv[++i]);
      if (!(o->older_than_s >= 0)) {
        std::fprintf(stderr, "zccctl: --older-than must be a number of seconds >= 0\n");
        return kExitUsage;
      }
    } else if (a == "--force") {
      o->force = true;
    } else if (a == "--no-job-files") {
      o->no_job_files = true;
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return kExitOk;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zccctl: unknown flag %s\n%s", a.c_str(), kUsage);
      return kExitUsage;
    } else {
      o->args.push_back(a);
    }
  }
  if (o->args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return kExitUsage;
  }
  if (!(o->interval_s > 0)) {
    std::fprintf(stderr, "zccctl: --interval must be a positive number of seconds\n");
    return kExitUsage;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int code = ParseArgs(argc, argv, &o); code >= 0) return code;
  for (const Command& c : kCommands) {
    if (o.args[0] != c.name) continue;
    const bool required = c.operands > 0;
    if (o.args.size() > 1 + std::max<size_t>(c.operands, 1) ||
        (required && o.args.size() != 1 + c.operands)) {
      std::fprintf(stderr, "zccctl: %s takes %s\n", c.name,
                   required ? c.operand : "at most one job id");
      return kExitUsage;
    }
    if ((!o.export_flags.empty() || o.force || o.no_job_files) && c.offline != RunExport) {
      std::fprintf(stderr, "zccctl: --what, --dtype, --max-shard-size, --extra-file, --force and "
                           "--no-job-files belong to export\n");
      return kExitUsage;
    }
    if (c.offline != nullptr) return c.offline(o);
    // A job directory or an s3:// URL instead of a job id: offline.
    if (c.run == RunList && absl::StrContains(o.operand(), "/")) return ListOffline(o);
    if (c.run == RunGc && absl::StrContains(o.operand(), "/")) {
      return zcc::zccctl::GcCommand(
          o.operand(), absl::Seconds(o.older_than_s >= 0 ? o.older_than_s : 3600), o.json);
    }
    if (o.older_than_s >= 0) {
      std::fprintf(stderr, "zccctl: --older-than belongs to gc of a job directory or URL\n");
      return kExitUsage;
    }
    Daemon daemon(o.socket);
    return c.run(o, daemon);
  }
  std::fprintf(stderr, "zccctl: unknown command '%s'\n%s", o.args[0].c_str(), kUsage);
  return kExitUsage;
}
