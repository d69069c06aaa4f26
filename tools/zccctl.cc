// zccctl: operator's view of a node's zccd.
//
//   zccctl [--socket PATH] [--json] status [JOB]
//   zccctl [--socket PATH] [--json] list JOB [--root ROOT]
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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/exporter.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/default_paths.h"
#include "common/status.h"
#include "storage/posix_storage.h"
#include "storage/s3/s3_location.h"
#include "proto/zcc.grpc.pb.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;

const char kUsage[] =
    "usage: zccctl [--socket PATH] [--json] COMMAND [ARGS]\n"
    "commands:\n"
    "  status [JOB]          daemon and job status\n"
    "  list JOB [--root R]   committed checkpoints of JOB\n"
    "  save JOB              persist the next full snapshot zccd takes in from every\n"
    "                        local rank of JOB (one already enqueued counts)\n"
    "  gc JOB [--root R]     apply the retention policy now, remove abandoned partials\n"
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
    "      --no-job-files           do not copy the job's stored files\n"
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

void PrintStatus(const zcc::v1::StatusResponse& s) {
  std::printf("%s  pid %d  up %.0fs  %d job(s)\n", s.version().c_str(), s.pid(),
              s.uptime_seconds(), s.jobs_size());
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
    if (job.retained_bytes() > 0) {
      std::printf(" + %.2f GB retained for restarted trainers", job.retained_bytes() / 1e9);
    }
    std::printf("\n");
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

// Where a step operand lives: a local path, or an s3:// URL (then `s3`
// holds the store, and `path` the URL's key as a path of its storage).
struct StepSource {
  std::unique_ptr<zcc::storage::s3::S3Location> s3;
  std::string path;
  zcc::storage::Storage* storage() { return s3 != nullptr ? &s3->storage() : nullptr; }
  std::string Name(const std::string& p) const { return s3 != nullptr ? s3->Url(p) : p; }
};

absl::StatusOr<StepSource> OpenStepSource(const std::string& operand) {
  StepSource source;
  source.path = operand;
  if (!absl::StartsWith(operand, "s3://")) return source;
  ZCC_ASSIGN_OR_RETURN(zcc::storage::s3::Endpoint endpoint,
                       zcc::storage::s3::EndpointFromEnvironment());
  ZCC_ASSIGN_OR_RETURN(zcc::storage::s3::Credentials credentials,
                       zcc::storage::s3::LoadCredentials());
  ZCC_ASSIGN_OR_RETURN(source.s3, zcc::storage::s3::S3Location::Open(operand, endpoint,
                                                                    std::move(credentials)));
  source.path = source.s3->path();
  return source;
}

// The step directory `source` names (a step, a job directory: its newest
// committed step, or a job's latest), said on stderr when it was chosen; the
// path itself when it names none (the command then reports why).
std::string StepDirOf(StepSource& source, const char* doing) {
  auto resolved = zcc::checkpoint::ResolveStepDir(source.path, source.storage());
  if (!resolved.ok()) return source.path;
  if (!resolved->how.empty()) {
    std::string how = resolved->how;
    if (source.s3 != nullptr) {  // paths of the store, said as URLs
      std::string root = source.path;
      while (root.size() > 1 && root.back() == '/') root.pop_back();
      how = absl::StrReplaceAll(how, {{" " + root, " " + source.Name(root)}});
    }
    std::fprintf(stderr, "zccctl: %s %s (%s)\n", doing, source.Name(resolved->dir).c_str(),
                 how.c_str());
  }
  return resolved->dir;
}

// How a step is read: through the object store, or the local disk.
zcc::checkpoint::IoOptions ReadOptions(StepSource& source) {
  zcc::checkpoint::IoOptions io;
  io.storage = source.storage();
  if (source.s3 != nullptr) io.direct_io = false;
  return io;
}

int Verify(const std::string& operand, bool json) {
  auto opened = OpenStepSource(operand);
  if (!opened.ok()) {
    std::fprintf(stderr, "zccctl: %s: %s\n", operand.c_str(),
                 std::string(opened.status().message()).c_str());
    return kExitError;
  }
  StepSource& source = *opened;
  const std::string dir_path = StepDirOf(source, "verifying");
  const std::string dir = source.Name(dir_path);
  auto report = zcc::checkpoint::VerifyStep(dir_path, ReadOptions(source));
  if (!report.ok()) {
    if (json) {
      std::printf("{\"ok\": false, \"error\": \"%s\"}\n",
                  absl::CHexEscape(report.status().message()).c_str());
    } else {
      std::fprintf(stderr, "zccctl: %s: FAILED: %s\n", dir.c_str(),
                   std::string(report.status().message()).c_str());
    }
    return kExitError;
  }
  if (json) {
    std::printf(
        "{\"ok\": true, \"ranks\": %u, \"tensors\": %llu, \"global_tensors\": %llu, "
        "\"bytes\": %llu}\n",
        report->ranks, static_cast<unsigned long long>(report->tensors),
        static_cast<unsigned long long>(report->global_tensors),
        static_cast<unsigned long long>(report->bytes_checked));
  } else {
    std::printf("%s: OK (%u ranks, %llu pieces of %llu global tensors, %.3f GB checked)\n",
                dir.c_str(), report->ranks, static_cast<unsigned long long>(report->tensors),
                static_cast<unsigned long long>(report->global_tensors),
                report->bytes_checked / 1e9);
  }
  return kExitOk;
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
  std::vector<std::string> args;  // the command and its operands
  // The operand after the command (a job id), or "" when there is none.
  const std::string& operand() const {
    static const std::string none;
    return args.size() > 1 ? args[1] : none;
  }
};

int ExportUsage(const std::string& message) {
  std::fprintf(stderr, "zccctl: export: %s\n", message.c_str());
  return kExitUsage;
}

// Offline: writes a committed step as a Hugging Face checkpoint. Progress on
// stderr (a line per shard), the summary on stdout.
int RunExport(const Options& o) {
  auto opened = OpenStepSource(o.args[1]);
  if (!opened.ok()) {
    std::fprintf(stderr, "zccctl: export %s: %s\n", o.args[1].c_str(),
                 std::string(opened.status().message()).c_str());
    return kExitError;
  }
  StepSource& source = *opened;
  const std::string step_dir = StepDirOf(source, "exporting");
  const std::string& out_dir = o.args[2];
  zcc::checkpoint::ExportOptions options;
  if (source.s3 != nullptr) {
    // From the store into a local folder.
    options.io = ReadOptions(source);
    options.out_storage = zcc::storage::DefaultStorage();
  }
  options.force = o.force;
  options.job_files = !o.no_job_files;
  for (const auto& [flag, value] : o.export_flags) {
    absl::Status st;
    if (flag == "--what") {
      auto what = zcc::checkpoint::ParseExportWhat(value);
      if (what.ok()) options.what = *what;
      st = what.status();
    } else if (flag == "--dtype") {
      auto dtype = zcc::checkpoint::ParseExportDType(value);
      if (dtype.ok()) options.dtype = *dtype;
      st = dtype.status();
    } else if (flag == "--max-shard-size") {
      auto size = zcc::checkpoint::ParseByteSize(value);
      if (size.ok()) options.max_shard_bytes = *size;
      st = size.status();
    } else {  // --extra-file
      options.extra_files.push_back(value);
    }
    if (!st.ok()) return ExportUsage(std::string(st.message()));
  }
  options.on_shard = [](const zcc::checkpoint::ExportedShard& s) {
    std::fprintf(stderr, "[%zu/%zu] %s: %llu tensors, %.1f MB, %.0f MB/s\n", s.index, s.count,
                 s.file.c_str(), static_cast<unsigned long long>(s.tensors), s.bytes / 1e6,
                 s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  };
  auto report = zcc::checkpoint::ExportStep(step_dir, out_dir, options);
  if (!report.ok()) {
    if (o.json) {
      std::printf("{\"ok\": false, \"error\": \"%s\"}\n",
                  absl::CHexEscape(report.status().message()).c_str());
    } else {
      std::fprintf(stderr, "zccctl: export %s: FAILED: %s\n", source.Name(step_dir).c_str(),
                   std::string(report.status().message()).c_str());
    }
    return kExitError;
  }
  const double gbps = report->seconds > 0 ? report->file_bytes / 1e9 / report->seconds : 0;
  if (report->params_without_ema > 0) {
    std::fprintf(stderr, "note: %llu parameter(s) without an EMA exported as they are\n",
                 static_cast<unsigned long long>(report->params_without_ema));
  }
  if (o.json) {
    std::printf(
        "{\"ok\": true, \"kind\": \"%s\", \"tensors\": %llu, \"shards\": %zu, "
        "\"total_size\": %llu, \"bytes\": %llu, \"bytes_read\": %llu, \"seconds\": %.3f, "
        "\"gbps\": %.3f, \"indexed\": %s, \"peak_buffer_bytes\": %llu, "
        "\"params_without_ema\": %llu}\n",
        report->kind.c_str(), static_cast<unsigned long long>(report->tensors),
        report->shards.size(), static_cast<unsigned long long>(report->tensor_bytes),
        static_cast<unsigned long long>(report->file_bytes),
        static_cast<unsigned long long>(report->bytes_read), report->seconds, gbps,
        report->indexed ? "true" : "false",
        static_cast<unsigned long long>(report->peak_buffer_bytes),
        static_cast<unsigned long long>(report->params_without_ema));
  } else {
    std::printf(
        "exported %llu %s tensors in %zu shard(s) to %s: %.3f GB written (%.3f GB read and "
        "verified) in %.2fs (%.2f GB/s)\n",
        static_cast<unsigned long long>(report->tensors), report->kind.c_str(),
        report->shards.size(), out_dir.c_str(), report->file_bytes / 1e9,
        report->bytes_read / 1e9, report->seconds, gbps);
  }
  return kExitOk;
}

// zccd's two services over its unix socket; every call has a 10 s deadline.
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

int RunList(const Options& o, Daemon& d) {
  zcc::v1::ListCheckpointsRequest req;
  req.set_job_id(o.operand());
  req.set_checkpoint_root(o.root);
  zcc::v1::ListCheckpointsResponse resp;
  const grpc::Status st =
      d.Call(d.status(), &zcc::v1::Status::Stub::ListCheckpoints, req, &resp);
  if (!st.ok()) return Fail(st);
  return Report(o, resp, [](const zcc::v1::ListCheckpointsResponse& r) {
    std::printf("%-10s %-7s %-12s %-22s %s\n", "step", "ranks", "GB", "committed", "path");
    for (const auto& c : r.checkpoints()) {
      std::printf("%-10lld %-7u %-12.3f %-22s %s%s\n", static_cast<long long>(c.step()),
                  c.world_size(), c.total_bytes() / 1e9, c.committed_at().c_str(),
                  c.path().c_str(), c.is_latest() ? "  (latest)" : "");
    }
  });
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

int RunVerify(const Options& o) { return Verify(o.operand(), o.json); }

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
    Daemon daemon(o.socket);
    return c.run(o, daemon);
  }
  std::fprintf(stderr, "zccctl: unknown command '%s'\n%s", o.args[0].c_str(), kUsage);
  return kExitUsage;
}
