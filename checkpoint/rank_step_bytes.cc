#include "checkpoint/rank_step_bytes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/step_dirs.h"
#include "common/file_util.h"
#include "common/status.h"
#include "format/manifest.h"
#include "storage/memory_storage.h"
#include "storage/whole_file.h"

namespace zcc::checkpoint {

absl::StatusOr<RankStepBytes> SerializeRankStep(int64_t step, const RankShards& shards,
                                                const uint8_t* slot,
                                                const std::vector<ExtraShard>& extra,
                                                const std::string& timeline) {
  // The writer itself, into memory: the files are what a disk write makes.
  storage::MemoryStorage memory(/*keep_synced=*/false);
  IoOptions io;
  io.storage = &memory;
  io.direct_io = false;
  const std::string job_dir = "/job";
  ZCC_RETURN_IF_ERROR(WriteRankShards(job_dir, step, shards, slot, io, extra, timeline).status());
  const std::string dir = WritingStepDir(memory, job_dir, step);
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> names, memory.List(dir));
  const std::string manifest = format::ManifestFileName(shards.rank);
  // The manifest last.
  std::stable_partition(names.begin(), names.end(),
                        [&](const std::string& n) { return n != manifest; });
  RankStepBytes out;
  out.rank = shards.rank;
  out.step = step;
  for (const std::string& name : names) {
    // Moved out, not copied.
    ZCC_ASSIGN_OR_RETURN(std::string bytes, memory.Take(JoinPath(dir, name)));
    out.files.push_back({name, std::move(bytes)});
  }
  if (out.files.empty() || out.files.back().name != manifest) {
    return absl::InternalError(absl::StrCat("serializing step ", step, " of rank ", shards.rank,
                                            ": no manifest was written"));
  }
  return out;
}

}  // namespace zcc::checkpoint
