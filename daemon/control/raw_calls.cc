#include "daemon/control/raw_calls.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/parse_cost.h"

namespace zcc::daemon {

RawCalls::RawCalls(RawCallsOptions options) : options_(std::move(options)) {}

RawCalls::~RawCalls() { Drain(); }

absl::StatusOr<uint64_t> RawCalls::Admit(const google::protobuf::Descriptor& type,
                                         absl::string_view method, uid_t uid,
                                         const grpc::ByteBuffer& raw, RequestLimit limit) {
  const uint64_t size = raw.Length();
  if (size > limit.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request is ", size, " bytes; ", method, " takes at most ",
                     limit.max_bytes));
  }
  grpc::ByteBuffer bytes(raw);  // shares the slices
  grpc::ProtoBufferReader reader(&bytes);
  absl::StatusOr<uint64_t> cost =
      proto::ParseCost(type, &reader, size, proto::ParseCostLimits{limit.max_cost, 32});
  if (!cost.ok()) return cost.status();
  zcc::MutexLock lock(&mu_);
  PerUid& mine = per_uid_[uid];
  if (mine.cost > 0 && mine.cost + *cost > options_.max_cost_per_uid) {
    return absl::UnavailableError(absl::StrCat(
        "this user's other requests being served hold ", mine.cost, " bytes; this one needs ",
        *cost, " more (at most ", options_.max_cost_per_uid, " per user); try again"));
  }
  if (cost_in_flight_ > 0 && cost_in_flight_ + *cost > options_.max_cost_in_flight) {
    return absl::UnavailableError(absl::StrCat(
        "zccd holds ", cost_in_flight_, " bytes of other requests being served; this one needs ",
        *cost, " more (at most ", options_.max_cost_in_flight, " together); try again"));
  }
  mine.cost += *cost;
  cost_in_flight_ += *cost;
  return *cost;
}

void RawCalls::Release(uid_t uid, uint64_t cost) {
  zcc::MutexLock lock(&mu_);
  cost_in_flight_ -= std::min(cost, cost_in_flight_);
  auto it = per_uid_.find(uid);
  if (it != per_uid_.end()) it->second.cost -= std::min(cost, it->second.cost);
}

uint64_t RawCalls::cost_in_flight() const {
  zcc::MutexLock lock(&mu_);
  return cost_in_flight_;
}

grpc::Status RawCalls::Refused(const absl::Status& why, absl::string_view method) {
  if (options_.on_refused) options_.on_refused();
  return ToGrpcStatus(
      absl::Status(why.code(), absl::StrCat("refused ", method, " request: ", why.message())));
}

size_t RawCalls::threads() const {
  zcc::MutexLock lock(&mu_);
  return threads_.size();
}

void RawCalls::Ended(uint64_t id, uid_t uid) {
  std::thread previous;
  {
    zcc::MutexLock lock(&mu_);
    auto it = threads_.find(last_ended_);
    if (last_ended_ != 0 && it != threads_.end()) {
      previous = std::move(it->second);
      threads_.erase(it);
    }
    last_ended_ = id;
    auto mine = per_uid_.find(uid);
    if (mine != per_uid_.end() && --mine->second.calls == 0 && mine->second.cost == 0) {
      per_uid_.erase(mine);
    }
  }
  // Outside the lock: the last thing that thread did was to give it back.
  if (previous.joinable()) previous.join();
}

absl::Status RawCalls::Start(uid_t uid, absl::AnyInvocable<void() &&> work) {
  absl::Status started;
  {
    zcc::MutexLock lock(&mu_);
    PerUid& mine = per_uid_[uid];
    if (draining_) {
      started = absl::UnavailableError("zccd is shutting down");
    } else if (static_cast<int>(threads_.size()) >= options_.max_calls) {
      started = absl::UnavailableError(
          absl::StrCat("zccd is serving ", threads_.size(), " requests; try again"));
    } else if (mine.calls >= options_.max_calls_per_uid) {
      started = absl::UnavailableError(absl::StrCat(
          "zccd is serving ", mine.calls, " requests of this user; try again"));
    } else {
      const uint64_t id = ++next_id_;  // from 1: 0 is none in last_ended_
      // The map's entry before the thread: once the thread runs, nothing
      // here may throw (a joinable std::thread destroyed ends the process).
      auto entry = threads_.end();
      try {
        entry = threads_.emplace(id, std::thread()).first;
        entry->second = std::thread([this, id, uid, work = std::move(work)]() mutable {
          std::move(work)();
          Ended(id, uid);
        });
        ++mine.calls;
      } catch (const std::exception& e) {  // no thread, or no memory for the entry
        if (entry != threads_.end()) threads_.erase(entry);
        started = absl::UnavailableError(absl::StrCat("no thread for the request: ", e.what()));
      }
    }
    if (mine.calls == 0 && mine.cost == 0) per_uid_.erase(uid);
  }
  return started;
}

void RawCalls::Drain() {
  std::map<uint64_t, std::thread> threads;
  {
    zcc::MutexLock lock(&mu_);
    draining_ = true;
    threads.swap(threads_);
    last_ended_ = 0;
  }
  for (auto& [id, t] : threads) t.join();
}

}  // namespace zcc::daemon
