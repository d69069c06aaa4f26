// Template part of reader.h.
#ifndef ZCC_CHECKPOINT_READER_INL_H_
#define ZCC_CHECKPOINT_READER_INL_H_

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"

namespace zcc::checkpoint {

template <typename VerifyFn>
absl::StatusOr<RestoreChoice> ChooseRestoreStep(const std::string& job_dir, int64_t requested,
                                                VerifyFn verify, int64_t at_most,
                                                storage::Storage* fs) {
  RestoreChoice choice;
  auto check = [&](int64_t step) -> bool {
    const absl::Status st = verify(JoinPath(job_dir, format::StepDirName(step)));
    if (st.ok()) return true;
    choice.rejected.push_back(absl::StrCat(format::StepDirName(step), ": ", st.message()));
    return false;
  };
  if (requested >= 0) {
    if (check(requested)) {
      choice.step = requested;
      return choice;
    }
    return absl::NotFoundError(absl::StrCat("step ", requested, " cannot be restored: ",
                                            choice.rejected.back()));
  }
  auto steps = ListCommittedSteps(job_dir, fs);
  if (!steps.ok()) return steps.status();
  std::vector<int64_t> candidates = *steps;
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](int64_t s) { return s > at_most; }),
                   candidates.end());
  std::sort(candidates.rbegin(), candidates.rend());
  std::string garbage;
  ZCC_ASSIGN_OR_RETURN(const std::optional<int64_t> latest, TimelineEnd(job_dir, fs, &garbage));
  if (latest.has_value()) {
    // Steps above `latest` belong to a timeline that was abandoned by resuming
    // from an older step; they are never chosen.
    candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                    [&](int64_t s) { return s > *latest; }),
                     candidates.end());
    if (*latest <= at_most && (candidates.empty() || candidates.front() != *latest)) {
      choice.rejected.push_back(
          absl::StrCat("latest names ", format::StepDirName(*latest), ", which is not committed"));
    }
  } else if (!garbage.empty()) {
    choice.rejected.push_back(absl::StrCat("latest: ", garbage));
  }
  for (int64_t step : candidates) {
    if (check(step)) {
      choice.step = step;
      return choice;
    }
  }
  std::string why = choice.rejected.empty() ? "no committed checkpoint" : choice.rejected.front();
  for (size_t i = 1; i < choice.rejected.size(); ++i) absl::StrAppend(&why, "; ", choice.rejected[i]);
  return absl::NotFoundError(absl::StrCat("nothing to restore in ", job_dir, ": ", why));
}

}  // namespace zcc::checkpoint

#endif  // ZCC_CHECKPOINT_READER_INL_H_
