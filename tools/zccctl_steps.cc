#include "tools/zccctl_steps.h"

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/exporter.h"
#include "checkpoint/reader.h"
#include "checkpoint/retention.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "proto/checkpoint_info.h"
#include "storage/posix_storage.h"

namespace zcc::zccctl {
namespace {

// The step directory `source` names (a step, a job directory: its newest
// committed step, or a job's latest), said on stderr when it was chosen; the
// path itself when it names none (the command then reports why).
std::string StepDirOf(StepSource& source, const char* doing) {
  auto resolved = checkpoint::ResolveStepDir(source.path, source.storage());
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
checkpoint::IoOptions ReadOptions(StepSource& source) {
  checkpoint::IoOptions io;
  io.storage = source.storage();
  if (source.s3 != nullptr) {
    // Each request to a store costs one of its own: larger ranged GETs than
    // from a disk (16 MiB, what bench/s3 found even with boto3's transfers).
    io.direct_io = false;
    io.chunk_bytes = size_t{16} << 20;
  }
  return io;
}

int ExportUsage(const std::string& message) {
  std::fprintf(stderr, "zccctl: export: %s\n", message.c_str());
  return kExitUsage;
}

}  // namespace

absl::StatusOr<StepSource> OpenStepSource(const std::string& operand) {
  StepSource source;
  source.path = operand;
  if (!absl::StartsWith(operand, "s3://")) return source;
  ZCC_ASSIGN_OR_RETURN(storage::s3::Endpoint endpoint,
                       storage::s3::EndpointFromEnvironment());
  ZCC_ASSIGN_OR_RETURN(storage::s3::Credentials credentials,
                       storage::s3::LoadCredentials());
  ZCC_ASSIGN_OR_RETURN(source.s3, storage::s3::S3Location::Open(operand, endpoint,
                                                                    std::move(credentials)));
  source.path = source.s3->path();
  return source;
}

int VerifyCommand(const std::string& operand, bool json) {
  auto opened = OpenStepSource(operand);
  if (!opened.ok()) {
    std::fprintf(stderr, "zccctl: %s: %s\n", operand.c_str(),
                 std::string(opened.status().message()).c_str());
    return kExitError;
  }
  StepSource& source = *opened;
  const std::string dir_path = StepDirOf(source, "verifying");
  const std::string dir = source.Name(dir_path);
  auto report = checkpoint::VerifyStep(dir_path, ReadOptions(source));
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

// Offline: writes a committed step as a Hugging Face checkpoint. Progress on
// stderr (a line per shard), the summary on stdout.
int ExportCommand(const ExportRequest& o) {
  auto opened = OpenStepSource(o.step);
  if (!opened.ok()) {
    std::fprintf(stderr, "zccctl: export %s: %s\n", o.step.c_str(),
                 std::string(opened.status().message()).c_str());
    return kExitError;
  }
  StepSource& source = *opened;
  const std::string step_dir = StepDirOf(source, "exporting");
  const std::string& out_dir = o.out_dir;
  checkpoint::ExportOptions options;
  if (source.s3 != nullptr) {
    // From the store into a local folder.
    options.io = ReadOptions(source);
    options.out_storage = storage::DefaultStorage();
  }
  options.force = o.force;
  options.job_files = !o.no_job_files;
  for (const auto& [flag, value] : o.flags) {
    absl::Status st;
    if (flag == "--what") {
      auto what = checkpoint::ParseExportWhat(value);
      if (what.ok()) options.what = *what;
      st = what.status();
    } else if (flag == "--dtype") {
      auto dtype = checkpoint::ParseExportDType(value);
      if (dtype.ok()) options.dtype = *dtype;
      st = dtype.status();
    } else if (flag == "--max-shard-size") {
      auto size = checkpoint::ParseByteSize(value);
      if (size.ok()) options.max_shard_bytes = *size;
      st = size.status();
    } else {  // --extra-file
      options.extra_files.push_back(value);
    }
    if (!st.ok()) return ExportUsage(std::string(st.message()));
  }
  options.on_shard = [](const checkpoint::ExportedShard& s) {
    std::fprintf(stderr, "[%zu/%zu] %s: %llu tensors, %.1f MB, %.0f MB/s\n", s.index, s.count,
                 s.file.c_str(), static_cast<unsigned long long>(s.tensors), s.bytes / 1e6,
                 s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  };
  auto report = checkpoint::ExportStep(step_dir, out_dir, options);
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
  if (report->transposed > 0) {
    std::fprintf(stderr,
                 "note: %llu 2-D tensor(s) written transposed, as the job's zcc_export.json "
                 "asks (--no-job-files: as the trainer held them)\n",
                 static_cast<unsigned long long>(report->transposed));
  }
  if (o.json) {
    std::printf(
        "{\"ok\": true, \"kind\": \"%s\", \"tensors\": %llu, \"shards\": %zu, "
        "\"total_size\": %llu, \"bytes\": %llu, \"bytes_read\": %llu, \"seconds\": %.3f, "
        "\"gbps\": %.3f, \"indexed\": %s, \"peak_buffer_bytes\": %llu, "
        "\"params_without_ema\": %llu, \"transposed\": %llu}\n",
        report->kind.c_str(), static_cast<unsigned long long>(report->tensors),
        report->shards.size(), static_cast<unsigned long long>(report->tensor_bytes),
        static_cast<unsigned long long>(report->file_bytes),
        static_cast<unsigned long long>(report->bytes_read), report->seconds, gbps,
        report->indexed ? "true" : "false",
        static_cast<unsigned long long>(report->peak_buffer_bytes),
        static_cast<unsigned long long>(report->params_without_ema),
        static_cast<unsigned long long>(report->transposed));
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

int GcCommand(const std::string& operand, absl::Duration older_than, bool json) {
  auto fail = [&operand](const absl::Status& st) {
    std::fprintf(stderr, "zccctl: gc %s: %s\n", operand.c_str(), std::string(st.message()).c_str());
    return kExitError;
  };
  auto source = OpenStepSource(operand);
  if (!source.ok()) return fail(source.status());
  // Every committed step kept: only what no commit finished goes.
  checkpoint::RetentionPolicy keep_all;
  keep_all.keep_last = UINT32_MAX;
  auto removed = checkpoint::ApplyRetention(source->path, keep_all, std::set<int64_t>{},
                                            older_than, source->storage());
  if (!removed.ok()) return fail(removed.status());
  size_t aborted = 0;
  if (source->s3 != nullptr) {
    auto uploads = source->s3->storage().AbortUploads(source->path, absl::Now() - older_than);
    if (!uploads.ok()) return fail(uploads.status());
    aborted = *uploads;
  }
  if (json) {
    std::printf("{\"ok\": true, \"removed_partials\": %zu, \"aborted_uploads\": %zu}\n",
                removed->removed_partials.size(), aborted);
  } else {
    for (const std::string& p : removed->removed_partials) {
      std::printf("removed %s\n", source->Name(JoinPath(source->path, p)).c_str());
    }
    std::printf("%zu uncommitted director(ies) or temporary file(s) removed, %zu incomplete "
                "upload(s) aborted\n",
                removed->removed_partials.size(), aborted);
  }
  return kExitOk;
}

absl::StatusOr<v1::ListCheckpointsResponse> ListCommitted(StepSource& source) {
  v1::ListCheckpointsResponse resp;
  ZCC_ASSIGN_OR_RETURN(std::vector<checkpoint::CommittedStep> steps,
                       checkpoint::ListCheckpoints(source.path, source.storage()));
  for (const checkpoint::CommittedStep& s : steps) {
    proto::FillCheckpointInfo(s, source.Name(s.dir), resp.add_checkpoints());
  }
  return resp;
}

}  // namespace zcc::zccctl
