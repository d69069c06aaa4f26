// zccctl's offline commands on steps (verify, export, and the listing of a
// job directory or an s3:// URL): they read the files, local or in an
// S3-compatible store, and need no daemon.
#ifndef ZCC_TOOLS_ZCCCTL_STEPS_H_
#define ZCC_TOOLS_ZCCCTL_STEPS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/io_options.h"
#include "proto/zcc.pb.h"
#include "storage/s3/s3_location.h"
#include "storage/storage.h"

namespace zcc::zccctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // the daemon or the check reported an error
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;  // zccd not reachable

// Where a step operand lives: a local path, or an s3:// URL (then `s3`
// holds the store, and `path` the URL's key as a path of its storage).
struct StepSource {
  std::unique_ptr<storage::s3::S3Location> s3;
  std::string path;
  storage::Storage* storage() { return s3 != nullptr ? &s3->storage() : nullptr; }
  std::string Name(const std::string& p) const { return s3 != nullptr ? s3->Url(p) : p; }
};

absl::StatusOr<StepSource> OpenStepSource(const std::string& operand);

// verify STEP: every manifest and checksum; the report on stdout.
int VerifyCommand(const std::string& operand, bool json);

struct ExportRequest {
  std::string step;
  std::string out_dir;
  bool json = false;
  bool force = false;
  bool no_job_files = false;
  std::vector<std::pair<std::string, std::string>> flags;  // as given
};
// export STEP OUT_DIR: progress on stderr (a line per shard), the summary on
// stdout.
int ExportCommand(const ExportRequest& request);

// gc DIR|URL: removes what interrupted writes left in a job directory, older
// than `older_than`: uncommitted step directories (step-N.partial, a step-N/
// without COMMITTED), temporary files of atomic writes, and in a store the
// incomplete multipart uploads. Committed steps are all kept (retention is
// zccd's, with the job's policy). Offline: run it when no job writes there,
// or with an age longer than a commit can take.
int GcCommand(const std::string& operand, absl::Duration older_than, bool json);

// The committed steps of the job directory `source` names, as zccd's
// ListCheckpoints answers them.
absl::StatusOr<v1::ListCheckpointsResponse> ListCommitted(StepSource& source);

}  // namespace zcc::zccctl

#endif  // ZCC_TOOLS_ZCCCTL_STEPS_H_
