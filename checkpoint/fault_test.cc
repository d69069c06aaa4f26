// Storage faults while a rank persists a step: the write fails cleanly with a
// clear status, leaves no manifest for the rank (so the step can never
// commit), gives the space back and leaves earlier committed steps untouched.
// Faults are injected with storage::FaultInjectingStorage, and once for real
// by filling a small file system.
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/committer.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/testing/synthetic_rank.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "storage/fault_storage.h"
#include "storage/posix_storage.h"

namespace zcc::checkpoint {
namespace {

using format::DType;
using format::TensorKind;
using testing::SyntheticRank;
using testing::TensorSpec;
using ::zcc::testing::TempDir;

std::vector<TensorSpec> Specs() {
  return {
      {"embed", DType::kBF16, {1000, 257}, format::TensorKind::kParam},
      {"norm", DType::kF32, {257}, format::TensorKind::kParam},
      {"embed.exp_avg", DType::kF32, {1000, 257}, format::TensorKind::kOptim},
      {"embed.exp_avg_sq", DType::kF32, {1000, 257}, format::TensorKind::kOptim},
      {"rng", DType::kU8, {33}, format::TensorKind::kExtra},
  };
}

// Name -> checksum of every file under a step directory.
std::map<std::string, uint64_t> HashFiles(const std::string& dir) {
  std::map<std::string, uint64_t> out;
  auto names = ListDir(dir);
  REQUIRE_OK(names);
  for (const std::string& name : *names) {
    auto bytes = ReadFileToString(JoinPath(dir, name), 1 << 30);
    REQUIRE_OK(bytes);
    out[name] = format::Xxh3(bytes->data(), bytes->size());
  }
  return out;
}

bool Contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

auto Verify = [](const std::string& dir) { return VerifyStep(dir).status(); };

void WriteStep(const std::string& root, std::vector<SyntheticRank>& ranks, int64_t step) {
  for (SyntheticRank& r : ranks) {
    r.Fill(step);
    REQUIRE_OK(WriteRankShards(root, step, r.shards(), r.slot()));
  }
  auto commit = TryCommit(root, "job", step, ranks.size());
  REQUIRE_OK(commit);
  REQUIRE(commit->outcome == CommitOutcome::kCommitted);
}

// Two ranks of a job, step 10 committed under a fresh root (its files'
// checksums kept), their tensors filled for step 20.
struct TwoRanksPastStep10 {
  std::string root = TempDir();
  std::vector<SyntheticRank> ranks;
  std::map<std::string, uint64_t> step10_before;
  TwoRanksPastStep10() {
    ranks.emplace_back(0, 2, Specs());
    ranks.emplace_back(1, 2, Specs());
    WriteStep(root, ranks, 10);
    step10_before = HashFiles(JoinPath(root, format::StepDirName(10)));
    for (SyntheticRank& r : ranks) r.Fill(20);
  }
};

// After rank 1 failed to persist `step` in `root`: nothing of rank 1 is left
// in the partial directory, the step does not commit, and step 10 is as it was.
void CheckFailedCleanly(const std::string& root, int64_t step,
                        const std::map<std::string, uint64_t>& step10_before) {
  const std::string partial = JoinPath(root, format::PartialStepDirName(step));
  auto names = ListDir(partial);
  REQUIRE_OK(names);
  for (const std::string& name : *names) {
    INFO(name);
    CHECK_FALSE(Contains(name, "r00001"));
  }
  CHECK_FALSE(PathExists(JoinPath(partial, format::ManifestFileName(1))));
  auto commit = TryCommit(root, "job", step, 2);
  REQUIRE_OK(commit);
  CHECK(commit->outcome == CommitOutcome::kWaiting);
  CHECK(commit->manifests_present == 1);

  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{10});
  CHECK(*ReadLatest(root) == 10);
  const std::string step10 = JoinPath(root, format::StepDirName(10));
  CHECK_OK(VerifyStep(step10));
  CHECK(HashFiles(step10) == step10_before);
  auto choice = ChooseRestoreStep(root, -1, Verify);
  REQUIRE_OK(choice);
  CHECK(choice->step == 10);
}

struct FaultCase {
  const char* what;
  storage::FaultPlan plan;
  absl::StatusCode code;
  const char* message;  // in the status
};

std::vector<FaultCase> FaultCases() {
  std::vector<FaultCase> cases;
  storage::FaultPlan p;
  p.enospc_after_bytes = 300 << 10;
  cases.push_back({"no space left in the middle of a file", p, absl::StatusCode::kResourceExhausted,
                   "No space left on device"});
  p = {};
  p.enospc_after_bytes = 0;
  cases.push_back({"no space left at the first byte", p, absl::StatusCode::kResourceExhausted,
                   "No space left on device"});
  p = {};
  p.eio_on_write = 3;
  cases.push_back({"EIO on the third write", p, absl::StatusCode::kInternal, "Input/output error"});
  p = {};
  p.path_filter = "optim-";
  p.eio_on_write = 1;
  cases.push_back({"EIO on the optimizer file's first write", p, absl::StatusCode::kInternal,
                   "optim-r00001.safetensors at offset 0"});
  p = {};
  p.fail_sync = true;
  cases.push_back({"fdatasync fails", p, absl::StatusCode::kInternal, "fdatasync"});
  p = {};
  p.path_filter = ".manifest.json";
  p.enospc_after_bytes = 0;
  cases.push_back(
      {"no space left for the manifest", p, absl::StatusCode::kResourceExhausted, "manifest.json"});
  p = {};
  p.path_filter = ".manifest.json";
  p.fail_sync = true;
  cases.push_back({"the manifest's fsync fails", p, absl::StatusCode::kInternal, "fdatasync"});
  return cases;
}

TEST_CASE("a storage fault fails the rank's write cleanly and never touches a committed step") {
  for (const FaultCase& fc : FaultCases()) {
    INFO(fc.what);
    TwoRanksPastStep10 job;
    const std::string& root = job.root;
    std::vector<SyntheticRank>& ranks = job.ranks;
    const auto& step10_before = job.step10_before;
    REQUIRE_OK(WriteRankShards(root, 20, ranks[0].shards(), ranks[0].slot()));
    storage::PosixStorage posix;
    storage::FaultInjectingStorage faulty(&posix, fc.plan);
    IoOptions options;
    options.storage = &faulty;
    options.chunk_bytes = 64 << 10;
    auto failed = WriteRankShards(root, 20, ranks[1].shards(), ranks[1].slot(), options);
    REQUIRE_FALSE(failed.ok());
    INFO(failed.status().ToString());
    CHECK(failed.status().code() == fc.code);
    CHECK(Contains(failed.status().message(), fc.message));
    CHECK(Contains(failed.status().message(), "writing step 20 of rank 1"));
    CHECK(Contains(failed.status().message(), "step-00000020.partial/"));
    CHECK(faulty.faults_injected() >= 1);
    CheckFailedCleanly(root, 20, step10_before);

    // The same write without the fault commits the step.
    REQUIRE_OK(WriteRankShards(root, 20, ranks[1].shards(), ranks[1].slot()));
    auto commit = TryCommit(root, "job", 20, 2);
    REQUIRE_OK(commit);
    CHECK(commit->outcome == CommitOutcome::kCommitted);
    CHECK_OK(VerifyStep(JoinPath(root, format::StepDirName(20))));
  }
}

TEST_CASE("a failed rewrite withdraws the rank's earlier manifest for the step") {
  TwoRanksPastStep10 job;
  const std::string& root = job.root;
  std::vector<SyntheticRank>& ranks = job.ranks;
  const auto& step10_before = job.step10_before;
  // Rank 1 persists step 20, then persists it again (a retry) and fails: its
  // first manifest must not vouch for the half-overwritten files.
  REQUIRE_OK(WriteRankShards(root, 20, ranks[1].shards(), ranks[1].slot()));
  storage::PosixStorage posix;
  storage::FaultPlan plan;
  plan.eio_on_write = 2;
  storage::FaultInjectingStorage faulty(&posix, plan);
  IoOptions options;
  options.storage = &faulty;
  CHECK(WriteRankShards(root, 20, ranks[1].shards(), ranks[1].slot(), options).status().code() ==
        absl::StatusCode::kInternal);
  REQUIRE_OK(WriteRankShards(root, 20, ranks[0].shards(), ranks[0].slot()));
  CheckFailedCleanly(root, 20, step10_before);
}

TEST_CASE("a write given up midway stops within a queue of chunks and leaves nothing of the rank") {
  TwoRanksPastStep10 job;
  const std::string& root = job.root;
  std::vector<SyntheticRank>& ranks = job.ranks;
  const auto& step10_before = job.step10_before;
  REQUIRE_OK(WriteRankShards(root, 20, ranks[0].shards(), ranks[0].slot()));
  storage::PosixStorage posix;
  storage::FaultInjectingStorage counted(&posix);
  // The trainer went back once 256 KiB of rank 1's 2.5 MB had been queued.
  constexpr uint64_t kGiveUpAt = 256 << 10;
  const std::function<bool()> cancelled = [&] { return counted.bytes_written() >= kGiveUpAt; };
  IoOptions options;
  options.storage = &counted;
  options.chunk_bytes = 16 << 10;
  options.queue_depth = 4;
  options.cancelled = &cancelled;
  auto given_up = WriteRankShards(root, 20, ranks[1].shards(), ranks[1].slot(), options);
  REQUIRE_FALSE(given_up.ok());
  INFO(given_up.status().ToString());
  CHECK(given_up.status().code() == absl::StatusCode::kCancelled);
  CHECK(Contains(given_up.status().message(), "given up"));
  // At most a chunk past the point it was given up at (a header of a few
  // KiB each file besides), not the rest of the data.
  CHECK(counted.bytes_written() < kGiveUpAt + (16 << 10) + (64 << 10));
  CheckFailedCleanly(root, 20, step10_before);
}

TEST_CASE("short writes and a slow disk still give a correct checkpoint") {
  const std::string root = TempDir();
  std::vector<SyntheticRank> ranks;
  ranks.emplace_back(0, 1, Specs());
  ranks[0].Fill(1);
  storage::PosixStorage posix;
  storage::FaultPlan plan;
  plan.max_write_bytes = 10000;
  plan.max_read_bytes = 20000;
  plan.op_delay = absl::Microseconds(200);
  storage::FaultInjectingStorage faulty(&posix, plan);
  IoOptions options;
  options.storage = &faulty;
  options.chunk_bytes = 64 << 10;
  REQUIRE_OK(WriteRankShards(root, 1, ranks[0].shards(), ranks[0].slot(), options));
  REQUIRE_OK(TryCommit(root, "job", 1, 1));
  const std::string step_dir = JoinPath(root, format::StepDirName(1));
  REQUIRE_OK(VerifyStep(step_dir, options));
  storage::AlignedBuffer back(ranks[0].slot_bytes());
  REQUIRE_OK(ReadRankTensors(step_dir, 0, ranks[0].Targets(back.data()), options));
  CHECK(ranks[0].SameTensors(back.data()));
  CHECK(faulty.write_requests() > 3 * 64);  // ~3 MiB in <= 8 KiB pieces
}

// A small real file system mounted for one test, unmounted on destruction.
class SmallFileSystem {
 public:
  // Mounts an 8 MiB tmpfs at `dir`; the error says why not.
  static absl::Status MountTmpfs(const std::string& dir) {
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=8m") != 0) {
      return absl::UnavailableError(
          absl::StrCat("mount -t tmpfs -o size=8m: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  // Makes a 32 MiB ext4 image in `scratch` and loop-mounts it at `dir`.
  static absl::Status MountExt4(const std::string& dir, const std::string& scratch) {
    const char* mkfs = nullptr;
    for (const char* p : {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}) {
      if (::access(p, X_OK) == 0) mkfs = p;
    }
    const char* mount = nullptr;
    for (const char* p : {"/usr/bin/mount", "/bin/mount"}) {
      if (::access(p, X_OK) == 0) mount = p;
    }
    if (mkfs == nullptr || mount == nullptr) return absl::UnavailableError("no mkfs.ext4 or mount");
    const std::string image = JoinPath(scratch, "ext4.img");
    const std::string make = absl::StrCat("/usr/bin/truncate -s 32M '", image, "' && ", mkfs,
                                          " -q -F '", image, "' >/dev/null 2>&1");
    if (std::system(make.c_str()) != 0) return absl::UnavailableError("mkfs.ext4 failed");
    const std::string cmd =
        absl::StrCat(mount, " -o loop '", image, "' '", dir, "' >/dev/null 2>&1");
    if (std::system(cmd.c_str()) != 0) {
      return absl::UnavailableError("mount -o loop of an ext4 image failed");
    }
    return absl::OkStatus();
  }

  explicit SmallFileSystem(std::string dir) : dir_(std::move(dir)) {}
  ~SmallFileSystem() { ::umount2(dir_.c_str(), MNT_DETACH); }
  SmallFileSystem(const SmallFileSystem&) = delete;
  SmallFileSystem& operator=(const SmallFileSystem&) = delete;

  uint64_t FreeBytes() const {
    ::sync();  // ext4 frees the blocks of unlinked files at its next commit
    struct statvfs st;
    REQUIRE(::statvfs(dir_.c_str(), &st) == 0);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  std::string dir_;
};

// Commits a small step on the file system at `mnt`, then persists a step that
// cannot fit, then a small one again.
void FillAndRecover(const std::string& mnt, SmallFileSystem& fs) {
  const std::string root = JoinPath(mnt, "job");
  std::vector<SyntheticRank> small;
  small.emplace_back(0, 1,
                     std::vector<TensorSpec>{{"w", DType::kF32, {256, 1024}, format::TensorKind::kParam},
                                             {"rng", DType::kU8, {5}, format::TensorKind::kExtra}});
  WriteStep(root, small, 1);
  const auto step1_before = HashFiles(JoinPath(root, format::StepDirName(1)));
  const uint64_t free_before = fs.FreeBytes();

  // More than the free space, split over two files.
  const int64_t half = static_cast<int64_t>(free_before / 2 / 4 + (1 << 20));
  SyntheticRank big(0, 1,
                    {{"w", DType::kF32, {half}, format::TensorKind::kParam},
                     {"w.exp_avg", DType::kF32, {half}, format::TensorKind::kOptim}});
  big.Fill(2);
  auto failed = WriteRankShards(root, 2, big.shards(), big.slot());
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status().ToString());
  CHECK(failed.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(failed.status().message(), "No space left on device"));
  CHECK(Contains(failed.status().message(), "writing step 2 of rank 0"));
  const std::string partial = JoinPath(root, format::PartialStepDirName(2));
  CHECK_FALSE(PathExists(JoinPath(partial, format::ManifestFileName(0))));
  CHECK(ListDir(partial)->empty());
  CHECK(fs.FreeBytes() + (256 << 10) >= free_before);  // the space came back
  auto waiting = TryCommit(root, "job", 2, 1);
  REQUIRE_OK(waiting);
  CHECK(waiting->outcome == CommitOutcome::kWaiting);
  CHECK(*ListCommittedSteps(root) == std::vector<int64_t>{1});
  CHECK_OK(VerifyStep(JoinPath(root, format::StepDirName(1))));
  CHECK(HashFiles(JoinPath(root, format::StepDirName(1))) == step1_before);

  // The disk is usable again: the next small step commits.
  WriteStep(root, small, 3);
  CHECK(*ReadLatest(root) == 3);
}

TEST_CASE("filling a real small file system fails the write cleanly") {
  std::vector<std::string> skipped;
  int ran = 0;
  {
    const std::string mnt = TempDir();
    const absl::Status mounted = SmallFileSystem::MountTmpfs(mnt);
    if (mounted.ok()) {
      SmallFileSystem fs(mnt);
      INFO("8 MiB tmpfs at " << mnt);
      FillAndRecover(mnt, fs);
      ++ran;
    } else {
      skipped.push_back(std::string(mounted.message()));
    }
  }
  {
    const std::string mnt = TempDir();
    const absl::Status mounted = SmallFileSystem::MountExt4(mnt, TempDir());
    if (mounted.ok()) {
      SmallFileSystem fs(mnt);
      INFO("32 MiB ext4 image at " << mnt);
      FillAndRecover(mnt, fs);
      ++ran;
    } else {
      skipped.push_back(std::string(mounted.message()));
    }
  }
  for (const std::string& why : skipped) WARN("real disk-full variant not run: " << why);
  if (ran == 0) {
    WARN(
        "SKIPPED: neither a tmpfs nor a loop-mounted ext4 image could be mounted here (mounting "
        "needs root and may be refused in a sandbox); run the test binary directly as root");
  }
}

}  // namespace
}  // namespace zcc::checkpoint
