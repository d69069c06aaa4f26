#include "daemon/control/raw_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/parse_cost.h"

namespace zcc::daemon {

RawCalls::RawCalls(RawCallsOptions options) : options_(std::move(options)) {}

RawCalls::~RawCalls() { Drain(); }

absl::StatusOr<uint64_t> RawCalls::Admit(const google::protobuf::Descriptor& type,
                                         absl::string_view method, const grpc::ByteBuffer& raw,
                                         RequestLimit limit) {
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
  // A call alone is always admitted, whatever its cost (its method's limit
  // holds it already), so that the largest registration is never refused
  // for want of room it can never have.
  if (cost_in_flight_ > 0 && cost_in_flight_ + *cost > options_.max_cost_in_flight) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "zccd holds ", cost_in_flight_, " bytes of other requests being served; this one needs ",
        *cost, " more (at most ", options_.max_cost_in_flight, " together); try again"));
  }
  cost_in_flight_ += *cost;
  return *cost;
}

void RawCalls::Release(uint64_t cost) {
  zcc::MutexLock lock(&mu_);
  cost_in_flight_ -= std::min(cost, cost_in_flight_);
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

bool RawCalls::Start(absl::AnyInvocable<void() &&> work) {
  std::vector<std::thread> ended;
  bool started = false;
  {
    zcc::MutexLock lock(&mu_);
    for (uint64_t id : ended_) {
      auto it = threads_.find(id);
      ended.push_back(std::move(it->second));
      threads_.erase(it);
    }
    ended_.clear();
    if (!draining_ && static_cast<int>(threads_.size()) < options_.max_calls) {
      const uint64_t id = next_id_++;
      threads_.emplace(id, std::thread([this, id, work = std::move(work)]() mutable {
                         std::move(work)();
                         zcc::MutexLock lock(&mu_);
                         ended_.push_back(id);
                       }));
      started = true;
    }
  }
  // Ended threads are joined outside the lock: the last thing each did was
  // to give it back.
  for (std::thread& t : ended) t.join();
  return started;
}

void RawCalls::Drain() {
  std::map<uint64_t, std::thread> threads;
  {
    zcc::MutexLock lock(&mu_);
    draining_ = true;
    threads.swap(threads_);
    ended_.clear();
  }
  for (auto& [id, t] : threads) t.join();
}

}  // namespace zcc::daemon
