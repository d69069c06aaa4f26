// The replicator's sending: a rank's step pushed to its buddies, several
// files at a time on connections of their own, the manifest last, within
// the bandwidth cap (replicator.h).
#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <system_error>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "daemon/peer/replicator.h"

namespace zcc::daemon::peer {

absl::Status Replicator::Push(const std::string& job_id, uint32_t uid, uint32_t rank,
                              int64_t step, const std::vector<std::string>& files,
                              const std::vector<std::string>& last_buddies,
                              const std::vector<std::string>& only_to, int64_t went_on_from,
                              const std::set<std::string>& skip, std::set<std::string>* took,
                              uint64_t* sent, bool* own_missing) {
  // The job's buddies now; the last known once the job has left this zccd.
  const std::vector<std::string> buddies =
      !only_to.empty() ? only_to : buddies_(job_id).value_or(last_buddies);
  if (buddies.empty()) {
    return absl::FailedPreconditionError(
        "no buddy: the job's ranks have not reported its nodes, or it has no other node");
  }
  // Every buddy in turn: one that is down does not keep the step from the
  // others (the step's invariant wants it in another failure domain, any).
  absl::Status first;
  for (const std::string& buddy : buddies) {
    if (skip.count(buddy) > 0) continue;
    const absl::Status pushed =
        PushTo(buddy, job_id, uid, rank, step, files, went_on_from, sent, own_missing);
    if (pushed.ok()) {
      took->insert(buddy);
      continue;
    }
    if (first.ok()) first = pushed;
    // Stopping, of the run left behind, or nothing to push from: no other either.
    if (absl::IsCancelled(pushed) || *own_missing) break;
  }
  return first;
}

absl::Status Replicator::PushTo(const std::string& buddy, const std::string& job_id,
                                uint32_t uid, uint32_t rank, int64_t step,
                                const std::vector<std::string>& files, int64_t went_on_from,
                                uint64_t* sent, bool* own_missing) {
  // The files but the last (the rank's manifest, which makes the step whole
  // at the buddy) go side by side, each call on a connection of its own
  // (TakeLane: shared with the other ranks' pushes to the buddy, within
  // options_.push_bytes_in_flight, as the buddy holds what arrives before
  // its replica memory makes room), a large one in parts of part_bytes
  // where the buddy takes parts; the last once they all arrived. The first
  // failure ends the calls in flight: the step is tried again.
  CallCancel push_cancel;
  {
    zcc::MutexLock lock(&mu_);
    push_cancels_.insert(&push_cancel);
    if (stop_) push_cancel.CancelAll();
  }
  absl::Cleanup forget_cancel = [this, &push_cancel] {
    zcc::MutexLock lock(&mu_);
    push_cancels_.erase(&push_cancel);
  };
  zcc::Mutex result_mu;
  absl::Status result;       // the first failure
  absl::Status own_missing_status;
  // What goes side by side: the files but the last, each whole or in parts.
  struct Send {
    size_t file;
    uint64_t offset = 0;
    uint64_t length = 0;  // 0: the whole file
  };
  std::vector<Send> sends;
  const std::vector<std::string> before_manifest(
      files.begin(), files.empty() ? files.begin() : files.end() - 1);
  const std::optional<PeerState> state = directory_->State(buddy);
  const uint64_t part = state.has_value() && state->takes_parts ? options_.part_bytes : 0;
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    uint64_t size = 0;
    if (part > 0) {
      auto piece = store_->Get(ReplicaKey{job_id, uid, rank, step, files[i]});
      if (piece.ok()) size = (*piece)->bytes.size();  // (a missing one fails as it is sent)
    }
    if (part == 0 || size <= part) {
      sends.push_back({i});
      continue;
    }
    for (uint64_t at = 0; at < size; at += part) {
      sends.push_back({i, at, std::min(part, size - at)});
    }
  }
  // The buddy's turn for files in parts (held to the end of the push).
  const bool in_parts =
      std::any_of(sends.begin(), sends.end(), [](const Send& s) { return s.length > 0; });
  if (in_parts && !TakeAssembly(buddy)) return absl::CancelledError("zccd is stopping");
  absl::Cleanup assembled = [&] {
    if (in_parts) LeaveAssembly(buddy);
  };
  size_t next = 0;           // the next of `sends`
  std::map<size_t, bool> kept_whole;  // of the files sent in parts: whether the buddy kept it
  // Set with the first failure: the sends waiting for a lane give up.
  std::atomic<bool> failed{false};
  // Stopping, or the push is of the run the rank left (it went on from an
  // older step: Enqueue says so before it keeps the new run's files).
  auto ended = [&]() -> absl::Status {
    zcc::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("zccd is stopping");
    auto job = jobs_.find(job_id);
    if (job != jobs_.end()) {
      auto r = job->second.ranks.find(rank);
      if (r != job->second.ranks.end() && r->second.push_left_behind) {
        return absl::CancelledError("of the run left behind");
      }
    }
    return absl::OkStatus();
  };
  auto send_one = [&](size_t file, uint64_t offset, uint64_t length) -> absl::Status {
    const std::string& name = files[file];
    ZCC_RETURN_IF_ERROR(ended());
    const ReplicaKey key{job_id, uid, rank, step, name};
    auto missing = [&]() {
      zcc::MutexLock lock(&result_mu);
      own_missing_status = absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of rank ", rank, " was dropped from this zccd's replica memory "
          "before it reached ", buddy, " (raise peer.replica_budget_bytes, or "
          "staging_budget_bytes where set: a trainer's registration takes replicas' room)"));
      return own_missing_status;
    };
    uint64_t size;
    {
      auto piece = store_->Get(key);
      if (!piece.ok()) return missing();
      size = (*piece)->bytes.size();
    }
    // (A part past the piece: it is not the piece the parts were cut from.)
    if (length > 0 && (offset > size || length > size - offset)) return missing();
    const uint64_t bytes_sent = length > 0 ? length : size;
    // A connection of its own, shared with every other push to the buddy;
    // the piece is held again only then (not while waiting for it, which
    // may be long: the store may drop it meanwhile, and count it freed).
    const int lane = TakeLane(buddy, bytes_sent, failed);
    if (lane < 0) {
      return absl::CancelledError(failed ? "another piece of the step failed"
                                         : "zccd is stopping");
    }
    absl::Cleanup leave = [&] { LeaveLane(buddy, lane, bytes_sent); };
    auto piece = store_->Get(key);
    // (The new run's file of the same step number may have replaced it
    // meanwhile: not sent after the old run's others.)
    ZCC_RETURN_IF_ERROR(ended());
    if (!piece.ok() || (*piece)->bytes.size() != size) return missing();
    const std::string& bytes = (*piece)->bytes;
    // Its checksum from when it was kept: the bytes are not summed again.
    // The manifest names the files sent before it, which the buddy must
    // hold still to take the step for whole.
    bool kept = false;
    const absl::Status pushed = directory_->Client(buddy, lane)->Push(
        key, bytes.data(), bytes.size(), (*piece)->info.xxh3, options_.push_timeout, &push_cancel,
        went_on_from, offset, length, &kept,
        file + 1 == files.size() ? &before_manifest : nullptr);
    std::move(leave).Invoke();
    ZCC_RETURN_IF_ERROR(pushed);
    {
      zcc::MutexLock lock(&result_mu);
      *sent += bytes_sent;
      if (length > 0) kept_whole[file] = kept_whole[file] || kept;
    }
    Pace(bytes_sent);
    return absl::OkStatus();
  };
  const size_t side_by_side = sends.size();
  auto sender = [&]() {
    for (;;) {
      size_t i;
      {
        zcc::MutexLock lock(&result_mu);
        if (!result.ok() || next >= side_by_side) return;
        i = next++;
      }
      absl::Status st = send_one(sends[i].file, sends[i].offset, sends[i].length);
      if (!st.ok()) {
        {
          zcc::MutexLock lock(&result_mu);
          if (result.ok()) result = std::move(st);
        }
        failed = true;
        { zcc::MutexLock wake(&lanes_mu_); }  // (TakeLane's waits look again)
        push_cancel.CancelAll();
        return;
      }
    }
  };
  const int threads = static_cast<int>(
      std::clamp<size_t>(side_by_side, 1, std::max(1, options_.push_connections)));
  std::vector<std::thread> senders;
  senders.reserve(threads);  // (so that only a thread's start can throw below)
  for (int t = 1; t < threads; ++t) {
    // (It starts at the push thread's priority: idle, or normal once a
    // stop raised it.)
    try {
      senders.emplace_back(sender);
    } catch (const std::system_error& e) {
      ZCC_LOG(WARNING) << "replication: pushing " << t << " file(s) at a time, not " << threads
                       << ": " << e.what();
      break;
    }
    zcc::MutexLock lock(&mu_);
    senders_.insert(senders.back().native_handle());
    if (stop_) LeaveIdlePriority(senders.back().native_handle());
  }
  sender();
  for (std::thread& t : senders) {
    {
      zcc::MutexLock lock(&mu_);
      senders_.erase(t.native_handle());
    }
    t.join();
  }
  // Every part of a file arrived, but the buddy may have dropped the first
  // ones meanwhile (left too long waiting for the last: PieceAssembly's
  // idle): then the manifest must not follow.
  for (const auto& [file, kept] : kept_whole) {
    if (result.ok() && !kept) {
      result = absl::UnavailableError(absl::StrCat(
          buddy, " did not keep ", files[file], " of step ", step, " of rank ", rank,
          " whole (its parts arrived, the first ones too long before the last)"));
    }
  }
  if (result.ok() && !files.empty()) result = send_one(files.size() - 1, 0, 0);
  // What made the step fail where the owner's copy is gone: nothing could
  // send it (Finish drops it for the rank's next step).
  if (!own_missing_status.ok()) {
    *own_missing = true;
    return own_missing_status;
  }
  return result;
}

int Replicator::TakeLane(const std::string& buddy, uint64_t bytes,
                         const std::atomic<bool>& give_up) {
  const size_t lanes = static_cast<size_t>(std::max(1, options_.push_connections));
  zcc::MutexLock lock(&lanes_mu_);
  Lanes& l = lanes_[buddy];
  if (l.taken.size() != lanes) l.taken.assign(lanes, false);  // (its first file)
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lanes_mu_) {
    if (lanes_closed_ || give_up) return true;
    // A piece goes once the others under way leave room for it (alone when
    // it is larger than the whole allowance).
    if (l.bytes != 0 && l.bytes + bytes > options_.push_bytes_in_flight) return false;
    return std::find(l.taken.begin(), l.taken.end(), false) != l.taken.end();
  };
  lanes_mu_.Await(absl::Condition(&ready));
  if (lanes_closed_ || give_up) return -1;
  const auto lane = std::find(l.taken.begin(), l.taken.end(), false);
  *lane = true;
  l.bytes += bytes;
  // Connections 1..push_connections: the default one (0) carries the
  // replicator's own calls (a buddy's listing, the pins), never behind a piece.
  return static_cast<int>(lane - l.taken.begin()) + 1;
}

bool Replicator::TakeAssembly(const std::string& buddy) {
  zcc::MutexLock lock(&lanes_mu_);
  Lanes& l = lanes_[buddy];
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lanes_mu_) {
    return lanes_closed_ || !l.assembling;
  };
  lanes_mu_.Await(absl::Condition(&ready));
  if (lanes_closed_) return false;
  l.assembling = true;
  return true;
}

void Replicator::LeaveAssembly(const std::string& buddy) {
  zcc::MutexLock lock(&lanes_mu_);
  lanes_[buddy].assembling = false;
}

void Replicator::LeaveLane(const std::string& buddy, int lane, uint64_t bytes) {
  zcc::MutexLock lock(&lanes_mu_);
  Lanes& l = lanes_[buddy];
  l.taken[lane - 1] = false;
  l.bytes -= bytes;
}

void Replicator::Pace(uint64_t bytes) {
  if (options_.bytes_per_s == 0) return;
  const double rate = static_cast<double>(options_.bytes_per_s);
  const absl::Time now = absl::Now();
  absl::Time due;
  {
    zcc::MutexLock lock(&pace_mu_);
    // The accounting starts over after the sender was idle for over a second.
    if (pace_start_ == absl::InfinitePast() ||
        pace_start_ + absl::Seconds(pace_bytes_ / rate) < now - absl::Seconds(1)) {
      pace_start_ = now;
      pace_bytes_ = 0;
    }
    pace_bytes_ += bytes;
    due = pace_start_ + absl::Seconds(pace_bytes_ / rate);
  }
  if (due <= now) return;
  zcc::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopping), due - now);
}

}  // namespace zcc::daemon::peer
