// zccctl: operator's view of a node's zccd.
//
//   zccctl [--socket PATH] [--json] status [JOB]
//   zccctl [--socket PATH] [--json] list JOB [--root ROOT]
//   zccctl [--socket PATH] save JOB
//   zccctl [--socket PATH] [--json] gc JOB [--root ROOT]
//   zccctl [--socket PATH] watch [JOB] [--interval S] [--count N]
//   zccctl verify STEP_DIR            (offline: reads the files, no daemon)
//
// Exit codes: 0 success, 1 the daemon or the check reported an error,
// 2 usage error, 3 zccd not reachable.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/default_paths.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "checkpoint/reader.h"
#include "proto/zcc.grpc.pb.h"
#include <google/protobuf/util/json_util.h>

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
    "  save JOB              persist the next snapshot of every local rank of JOB\n"
    "  gc JOB [--root R]     apply the retention policy now, remove abandoned partials\n"
    "  watch [JOB]           live status, refreshed every --interval seconds (default 2)\n"
    "                        until interrupted, or --count times\n"
    "  verify STEP_DIR       check a checkpoint's manifests and checksums offline\n"
    "exit codes: 0 ok, 1 error reported, 2 usage, 3 zccd not reachable\n";

int Fail(const grpc::Status& st) {
  std::fprintf(stderr, "zccctl: %s\n", st.error_message().c_str());
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
             ? kExitUnreachable
             : kExitError;
}

void PrintJson(const google::protobuf::Message& msg) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(msg, &out, opts);
  std::printf("%s\n", out.c_str());
}

std::string Step(int64_t step) { return step < 0 ? "-" : absl::StrCat(step); }

void PrintStatus(const zcc::v1::StatusResponse& s) {
  std::printf("%s  pid %d  up %.0fs  %d job(s)\n", s.version().c_str(), s.pid(),
              s.uptime_seconds(), s.jobs_size());
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
    if (job.pending_commits_size() > 0) {
      std::printf("  pending commits:");
      for (const auto& p : job.pending_commits()) std::printf(" %s", p.c_str());
      std::printf("\n");
    }
    if (!job.last_error().empty()) std::printf("  last error: %s\n", job.last_error().c_str());
    std::printf("  %-5s %-8s %-6s %-10s %-10s %-10s %-9s %-8s %-6s %s\n", "rank", "pid", "alive",
                "snapshot", "ema", "persisted", "ingested", "skipped", "slots", "error");
    for (const auto& r : job.ranks()) {
      std::printf("  %-5u %-8d %-6s %-10s %-10s %-10s %-9llu %-8llu %-6u %s\n", r.rank(), r.pid(),
                  r.client_alive() ? "yes" : "no", Step(r.last_snapshot_step()).c_str(),
                  Step(r.last_ema_step()).c_str(), Step(r.last_persisted_step()).c_str(),
                  static_cast<unsigned long long>(r.snapshots_ingested()),
                  static_cast<unsigned long long>(r.snapshots_skipped()), r.slots_in_use(),
                  r.last_error().c_str());
    }
  }
}

int Verify(const std::string& dir, bool json) {
  auto report = zcc::checkpoint::VerifyStep(dir);
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
    std::printf("{\"ok\": true, \"ranks\": %u, \"tensors\": %llu, \"bytes\": %llu}\n",
                report->ranks, static_cast<unsigned long long>(report->tensors),
                static_cast<unsigned long long>(report->bytes_checked));
  } else {
    std::printf("%s: OK (%u ranks, %llu tensors, %.3f GB checked)\n", dir.c_str(), report->ranks,
                static_cast<unsigned long long>(report->tensors), report->bytes_checked / 1e9);
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket = zcc::DefaultSocketPath();
  std::string root;
  bool json = false;
  double interval_s = 2;
  long count = -1;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "--root" && i + 1 < argc) {
      root = argv[++i];
    } else if (a == "--interval" && i + 1 < argc) {
      interval_s = std::atof(argv[++i]);
    } else if (a == "--count" && i + 1 < argc) {
      count = std::atol(argv[++i]);
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return kExitOk;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zccctl: unknown flag %s\n%s", a.c_str(), kUsage);
      return kExitUsage;
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return kExitUsage;
  }
  const std::string& cmd = args[0];
  if (cmd == "verify") {
    if (args.size() != 2) {
      std::fprintf(stderr, "zccctl: verify takes one step directory\n");
      return kExitUsage;
    }
    return Verify(args[1], json);
  }

  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(10);
  };
  if (cmd == "watch") {
    if (args.size() > 2 || interval_s <= 0) return kExitUsage;
    auto stub = zcc::v1::Status::NewStub(channel);
    for (long i = 0; count < 0 || i < count; ++i) {
      zcc::v1::StatusRequest req;
      if (args.size() == 2) req.set_job_id(args[1]);
      zcc::v1::StatusResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      const grpc::Status st = stub->GetStatus(&ctx, req, &resp);
      if (!st.ok()) return Fail(st);
      if (json) {
        PrintJson(resp);
      } else {
        if (isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");  // clear the screen
        PrintStatus(resp);
      }
      std::fflush(stdout);
      if (count < 0 || i + 1 < count) usleep(static_cast<useconds_t>(interval_s * 1e6));
    }
    return kExitOk;
  }
  if (cmd == "status") {
    if (args.size() > 2) return kExitUsage;
    auto stub = zcc::v1::Status::NewStub(channel);
    zcc::v1::StatusRequest req;
    if (args.size() == 2) req.set_job_id(args[1]);
    zcc::v1::StatusResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->GetStatus(&ctx, req, &resp);
    if (!st.ok()) return Fail(st);
    if (json) {
      PrintJson(resp);
    } else {
      PrintStatus(resp);
    }
    return kExitOk;
  }
  if (cmd == "list") {
    if (args.size() != 2) {
      std::fprintf(stderr, "zccctl: list takes a job id\n");
      return kExitUsage;
    }
    auto stub = zcc::v1::Status::NewStub(channel);
    zcc::v1::ListCheckpointsRequest req;
    req.set_job_id(args[1]);
    req.set_checkpoint_root(root);
    zcc::v1::ListCheckpointsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->ListCheckpoints(&ctx, req, &resp);
    if (!st.ok()) return Fail(st);
    if (json) {
      PrintJson(resp);
      return kExitOk;
    }
    std::printf("%-10s %-7s %-12s %-22s %s\n", "step", "ranks", "GB", "committed", "path");
    for (const auto& c : resp.checkpoints()) {
      std::printf("%-10lld %-7u %-12.3f %-22s %s%s\n", static_cast<long long>(c.step()),
                  c.world_size(), c.total_bytes() / 1e9, c.committed_at().c_str(),
                  c.path().c_str(), c.is_latest() ? "  (latest)" : "");
    }
    return kExitOk;
  }
  if (cmd == "save") {
    if (args.size() != 2) {
      std::fprintf(stderr, "zccctl: save takes a job id\n");
      return kExitUsage;
    }
    auto stub = zcc::v1::Control::NewStub(channel);
    zcc::v1::SaveNowRequest req;
    req.set_job_id(args[1]);
    zcc::v1::SaveNowResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->SaveNow(&ctx, req, &resp);
    if (!st.ok()) return Fail(st);
    if (json) {
      PrintJson(resp);
    } else {
      std::printf("%u rank(s) will persist their next snapshot\n", resp.ranks_flagged());
    }
    return kExitOk;
  }
  if (cmd == "gc") {
    if (args.size() != 2) {
      std::fprintf(stderr, "zccctl: gc takes a job id\n");
      return kExitUsage;
    }
    auto stub = zcc::v1::Control::NewStub(channel);
    zcc::v1::CollectGarbageRequest req;
    req.set_job_id(args[1]);
    req.set_checkpoint_root(root);
    zcc::v1::CollectGarbageResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->CollectGarbage(&ctx, req, &resp);
    if (!st.ok()) return Fail(st);
    if (json) {
      PrintJson(resp);
      return kExitOk;
    }
    std::printf("removed %d step(s)", resp.removed_steps_size());
    for (int64_t s : resp.removed_steps()) std::printf(" %lld", static_cast<long long>(s));
    std::printf(", %d abandoned partial(s); kept", resp.removed_partials_size());
    for (int64_t s : resp.kept_steps()) std::printf(" %lld", static_cast<long long>(s));
    std::printf("\n");
    return kExitOk;
  }
  std::fprintf(stderr, "zccctl: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return kExitUsage;
}
