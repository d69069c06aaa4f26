// Client::Restore with RestoreOptions::collective: the ranks of a job agree
// on a step, each restores what it writes, and the rest moves through the
// collective (common/collective.h).
//
// Every rank runs the same sequence of collective calls whatever happens on
// it: a failure is not returned at once but gathered, so that all ranks see
// it in the same call and return together (no rank is left waiting in a
// collective the others have abandoned).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "format/dtype.h"

namespace zcc {
namespace {

// "E<code> <message>" of this rank's error, to gather; empty when ok.
std::string ErrorMessage(const absl::Status& st) {
  return st.ok() ? "" : absl::StrCat("E", static_cast<int>(st.code()), " ", st.message());
}

// The first error among the gathered messages: this rank's own, else the
// lowest failing rank's, with its code (a layout problem on one rank is
// FailedPrecondition on every rank, not a connection error), naming every
// rank that failed. OK when none failed.
absl::Status FirstError(const std::vector<std::string>& all, const absl::Status& mine,
                        absl::string_view what) {
  if (!mine.ok()) return mine;
  std::vector<size_t> failed;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == 'E') failed.push_back(r);
  }
  if (failed.empty()) return absl::OkStatus();
  absl::string_view theirs = absl::string_view(all[failed[0]]).substr(1);
  const size_t space = theirs.find(' ');
  int code = 0;
  absl::StatusCode status_code = absl::StatusCode::kUnavailable;
  if (space != absl::string_view::npos && absl::SimpleAtoi(theirs.substr(0, space), &code) &&
      code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    status_code = static_cast<absl::StatusCode>(code);
    theirs.remove_prefix(space + 1);
  }
  std::string text = absl::StrCat("rank ", failed[0], " failed ", what, ": ", theirs);
  if (failed.size() > 1) {
    text = absl::StrCat("ranks ", absl::StrJoin(failed, ", "), " failed; ", text);
  }
  return absl::Status(status_code, text);
}

// A piece: its tensor's name, where it lies in it, its dtype and shape (two
// ranks' pieces of one key hold the same bytes).
std::string PieceKey(const TensorRef& t) {
  return absl::StrCat(t.name, "@", absl::StrJoin(t.box_offset, ","), ":",
                      format::DTypeName(t.dtype), "[", absl::StrJoin(t.shape, ","), "]");
}

uint64_t PieceBytes(const TensorRef& t) {
  uint64_t n = format::DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Step 1 of RestoreTogether: the newest step every rank can restore, from
// each rank's candidates (`mine` is this rank's).
absl::StatusOr<int64_t> NewestCommonStep(Collective& c,
                                         const absl::StatusOr<RestoreCandidates>& mine) {
  std::string message = ErrorMessage(mine.status());
  if (mine.ok()) {
    std::vector<int64_t> steps = mine->memory_steps;
    steps.insert(steps.end(), mine->disk_steps.begin(), mine->disk_steps.end());
    message = absl::StrCat("S", absl::StrJoin(steps, ","));
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> all, c.AllGather(message));
  ZCC_RETURN_IF_ERROR(FirstError(all, mine.status(), "to list its restorable steps"));
  std::set<int64_t> common;
  bool any = false;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || all[r][0] != 'S') {
      return absl::DataLossError(absl::StrCat("collective: rank ", r, " sent no step list"));
    }
    std::set<int64_t> steps;
    for (absl::string_view v : absl::StrSplit(absl::string_view(all[r]).substr(1), ',',
                                              absl::SkipEmpty())) {
      int64_t step = 0;
      if (!absl::SimpleAtoi(v, &step)) return absl::DataLossError("collective: bad step list");
      steps.insert(step);
    }
    any = any || !steps.empty();
    if (r == 0) {
      common = std::move(steps);
    } else {
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), steps.begin(), steps.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (common.empty()) {
    if (!any) return absl::NotFoundError("no rank of the job has a checkpoint to restore");
    return absl::FailedPreconditionError("no step can be restored by every rank of the job");
  }
  return *common.rbegin();
}

// What the ranks restored in one round of step 2: the lowest and the highest
// step, and how many ranks found nothing.
struct RoundOutcome {
  int64_t low = INT64_MAX;
  int64_t high = -1;
  std::vector<uint32_t> missing;  // ranks that found nothing
  std::string why;                // the first of them's reason
};

absl::StatusOr<RoundOutcome> ParseRoundOutcome(const std::vector<std::string>& all) {
  RoundOutcome o;
  for (uint32_t r = 0; r < all.size(); ++r) {
    const std::string& m = all[r];
    int64_t step = -1;
    if (!m.empty() && m[0] == 'N') {  // "N<why>"
      if (o.missing.empty()) o.why = m.substr(1);
      o.missing.push_back(r);
      continue;
    }
    if (m.empty() || m[0] != 'S' || !absl::SimpleAtoi(m.substr(1), &step)) {
      return absl::DataLossError("collective: bad restore outcome");
    }
    o.low = std::min(o.low, step);
    o.high = std::max(o.high, step);
  }
  return o;
}

// Which rank sends each piece a rank did not restore (step 3 of
// RestoreTogether), decided from every rank's gathered list, so every rank
// decides alike.
struct SharingPlan {
  std::map<std::string, size_t> index;  // piece -> registered tensor
  // ((sending rank, piece), bytes), in order.
  std::vector<std::pair<std::pair<uint32_t, std::string>, uint64_t>> sends;
};

// The plan, from `restored` (per registered tensor: this rank restored it).
// Made before any rank copies into its tensors: a piece no rank restored,
// or one of different sizes, fails every rank alike with nothing copied.
absl::StatusOr<SharingPlan> PlanSharing(Collective& c, const std::vector<TensorRef>& refs,
                                        const std::vector<bool>& restored) {
  SharingPlan plan;
  std::string message;
  for (size_t i = 0; i < refs.size(); ++i) {
    // Per-rank state is restored by its rank alone.
    if (refs[i].kind == TensorKind::kExtra && refs[i].replica.group_size <= 1) continue;
    const std::string key = PieceKey(refs[i]);
    plan.index[key] = i;
    absl::StrAppend(&message, i < restored.size() && restored[i] ? "H " : "W ",
                    PieceBytes(refs[i]), " ", key, "\n");
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> all, c.AllGather(message));
  std::map<std::string, std::pair<uint32_t, uint64_t>> owner;  // piece -> (rank, bytes)
  std::map<std::string, uint64_t> wanted;                      // piece -> bytes
  for (uint32_t r = 0; r < all.size(); ++r) {
    for (absl::string_view line : absl::StrSplit(all[r], '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
      uint64_t bytes = 0;
      if (f.size() != 3 || !absl::SimpleAtoi(f[1], &bytes)) {
        return absl::DataLossError("collective: bad piece list");
      }
      const std::string key(f[2]);
      if (f[0] == "H") {
        owner.emplace(key, std::make_pair(r, bytes));  // keeps the lowest rank
      } else if (auto [it, added] = wanted.emplace(key, bytes); !added && it->second != bytes) {
        // Each rank receives into its own tensor: one size for all of them.
        return absl::FailedPreconditionError(absl::StrCat(
            "piece ", key, " is ", it->second, " bytes on one rank and ", bytes,
            " bytes on rank ", r));
      }
    }
  }
  // Decided from the gathered lists alone, so every rank decides alike.
  std::vector<std::pair<std::pair<uint32_t, std::string>, uint64_t>>& sends = plan.sends;
  for (const auto& [key, bytes] : wanted) {
    auto it = owner.find(key);
    if (it == owner.end()) {
      return absl::DataLossError(absl::StrCat(
          "no rank restored piece ", key, "; the checkpoint cannot fill it"));
    }
    if (it->second.second != bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "piece ", key, " is ", it->second.second, " bytes on rank ", it->second.first,
          " and ", bytes, " bytes on another rank"));
    }
    sends.push_back({{it->second.first, key}, bytes});
  }
  std::sort(sends.begin(), sends.end());
  return plan;
}

// Step 3 of RestoreTogether: every piece a rank did not restore, broadcast
// from the lowest rank that did (`plan`).
absl::Status ShareMissingPieces(Collective& c, const SharingPlan& plan,
                                const std::vector<TensorRef>& refs, RestoreResult* result,
                                void* stream) {
  const uint32_t me = c.rank();
  const auto& sends = plan.sends;
  const auto& index = plan.index;
  result->received.assign(refs.size(), false);
  absl::Status failed;  // the first broadcast that failed here
  // One BroadcastMany per root, its pieces in key order.
  for (size_t first = 0; first < sends.size();) {
    const uint32_t root = sends[first].first.first;
    std::vector<Collective::Region> regions;
    std::vector<size_t> filled;  // registered tensors this rank receives
    size_t next = first;
    for (; next < sends.size() && sends[next].first.first == root; ++next) {
      const auto& [who, bytes] = sends[next];
      void* data = nullptr;
      auto it = index.find(who.second);
      if (it != index.end() && (root == me || !result->restored[it->second])) {
        data = refs[it->second].data;
        if (root != me) filled.push_back(it->second);
      }
      regions.push_back({data, bytes});
    }
    // A broadcast that fails here may not fail on the others (a member that
    // raises alone): this rank takes part in the rest all the same, so that
    // the ranks' calls stay matched, and says it in the gather after.
    const absl::Status sent = c.BroadcastMany(regions, root, stream);
    if (sent.ok()) {
      for (size_t i : filled) {
        result->restored[i] = true;
        result->received[i] = true;
      }
    } else if (failed.ok()) {
      failed = sent;
    }
    first = next;
  }
  return failed;
}

}  // namespace

absl::StatusOr<RestoreResult> Client::RestoreTogether(const RestoreOptions& options, void* stream) {
  Collective& c = *options.collective;
  RestoreOptions alone = options;
  alone.collective = nullptr;
  alone.owned_only = true;

  // 0. The timeline the run goes on in from this restore, adopted once
  // every rank has the step (RestoreDoneRequest.timeline): rank 0's draw,
  // the same on every rank; none where a rank's zccd writes no timelines
  // (an older one).
  std::shared_ptr<client_internal::Session> s = impl_->CurrentSession();
  const bool mine = s == nullptr || s->resp.timelines();  // (unregistered: fails below)
  // With it, the step each rank asks for: the ranks make the same
  // collective calls only when they ask for the same one.
  std::string message = absl::StrCat(mine ? "T" : "-", options.step, ":");
  if (c.rank() == 0) {
    absl::StrAppend(&message, absl::Hex(client_internal::RandomInstance(), absl::kZeroPad16));
  }
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> drawn, c.AllGather(message));
  std::vector<std::string> asked;  // by rank: "<step>", or "?" where unreadable
  bool all_write = !drawn.empty();
  for (const std::string& m : drawn) {
    const size_t colon = m.find(':');
    asked.push_back(m.size() > 1 && colon != std::string::npos ? m.substr(1, colon - 1) : "?");
    all_write = all_write && !m.empty() && m[0] == 'T';
  }
  if (std::any_of(asked.begin(), asked.end(),
                  [&asked](const std::string& a) { return a != asked[0]; })) {
    std::vector<std::string> each;
    for (size_t r = 0; r < asked.size(); ++r) {
      each.push_back(absl::StrCat("rank ", r, ": ",
                                  asked[r] == absl::StrCat(kLatestStep) ? "the newest" : asked[r]));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks restoring together asked for different steps (", absl::StrJoin(each, "; "),
        ")"));
  }
  std::string timeline;
  if (all_write && drawn[0].find(':') != std::string::npos) {
    timeline = drawn[0].substr(drawn[0].find(':') + 1);
  }

  // 1. The step: the newest every rank can restore.
  int64_t target = options.step;
  if (options.step == kLatestStep) {
    ZCC_ASSIGN_OR_RETURN(target,
                         NewestCommonStep(c, ListRestoreCandidates(/*owned_only=*/true)));
    alone.allow_older = true;
  }

  // 2. Have zccd read and check it; ranks that got different steps (a
  // damaged one fell back) agree on the oldest and ask again. Nothing but
  // the early-copy tensors (RestoreOptions::early_copy, checked bytes only)
  // is copied into the tensors until every rank holds the same step, so a
  // restore that fails on any rank leaves every other tensor untouched.
  std::unique_ptr<PendingRestore> pending;
  for (int round = 0;; ++round) {
    alone.step = target;
    absl::StatusOr<std::unique_ptr<PendingRestore>> fetched =
        impl_->FetchRestoreCopyingEarly(alone, stream);
    const bool none = absl::IsNotFound(fetched.status());
    std::string message =
        none ? absl::StrCat("N", fetched.status().message()) : ErrorMessage(fetched.status());
    if (fetched.ok()) message = absl::StrCat("S", (*fetched)->result.step);
    ZCC_ASSIGN_OR_RETURN(std::vector<std::string> all, c.AllGather(message));
    ZCC_RETURN_IF_ERROR(FirstError(all, none ? absl::OkStatus() : fetched.status(),
                                   absl::StrCat("to restore step ", target)));
    ZCC_ASSIGN_OR_RETURN(const RoundOutcome o, ParseRoundOutcome(all));
    if (o.missing.size() == all.size()) return fetched.status();
    if (!o.missing.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          o.missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(o.missing, ", "),
          " found nothing to restore (", o.why, ") where the others restored step ", o.high));
    }
    if (o.low == o.high) {
      pending = *std::move(fetched);
      break;
    }
    if (round >= 16) {
      return absl::AbortedError("the ranks did not agree on a step to restore");
    }
    // The oldest step a rank got (the newer ones were damaged there); a
    // rank that finds it damaged too falls back further, as in the first
    // round, unless a step was asked for.
    target = o.low;
  }

  // 3. Which rank sends each piece another did not restore, agreed before
  // any rank copies into its tensors; then into the tensors, and every such
  // piece from the lowest rank that restored it.
  const std::vector<TensorRef> refs = pending->refs;
  const bool matches = pending->result.restored.size() == refs.size();
  ZCC_ASSIGN_OR_RETURN(const SharingPlan plan,
                       PlanSharing(c, refs, matches ? pending->result.restored
                                                    : std::vector<bool>(refs.size(), false)));
  // (The buffer is released below, once every rank holds the whole step.)
  absl::StatusOr<RestoreResult> result =
      matches ? impl_->CopyOut(*pending, stream, /*release=*/false)
              : absl::InternalError("restore result does not match the registration");
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> copied,
                       c.AllGather(ErrorMessage(result.status())));
  ZCC_RETURN_IF_ERROR(FirstError(copied, result.status(),
                                 absl::StrCat("to copy step ", target, " into its tensors")));
  const absl::Status shared = ShareMissingPieces(c, plan, refs, &*result, stream);
  // (A broadcast fails only where a rank can tell: every rank learns it.)
  ZCC_ASSIGN_OR_RETURN(std::vector<std::string> all_shared, c.AllGather(ErrorMessage(shared)));
  ZCC_RETURN_IF_ERROR(FirstError(all_shared, shared,
                                 absl::StrCat("to share the pieces of step ", target)));
  // 4. Every rank holds the step: the run goes on in the timeline drawn
  // (RestoreDoneRequest.timeline). A rank whose zccd could not be told (it
  // went away) still names it when it registers again, as its client
  // records it here, so the ranks stay on one timeline.
  pending->adopt_timeline = timeline;
  if (absl::Status released = pending->Release(); !released.ok()) {
    ZCC_LOG(WARNING) << "zcc client: the restore of step " << target << " is done on every rank, "
                     << "but zccd could not be told (" << released << "); its buffer is freed "
                     << "when this client goes";
  }
  if (!timeline.empty()) {
    zcc::MutexLock lock(&impl_->mu);
    impl_->timeline = timeline;
  }
  return result;
}

}  // namespace zcc
