// RawCalls: how zccd serves its control and status methods. Each request
// arrives as gRPC's raw bytes; its size and what parsing it would allocate
// are checked against the method's limit (request_limits.h) before it is
// parsed, and the method runs on a thread of zccd's own, one per call, so
// that a long call (a restore) holds none of gRPC's.
//
// Why: the control socket is open to every user of the node, and gRPC's
// limit on a message is one for the whole server, sized for the largest
// registration (1 GiB). Parsed without a check, such a message can take tens
// of times its size (proto/parse_cost.h): one caller could take zccd, and
// every job's snapshots in its memory, down.
//
// Thread-safety: Serve may be called from any of gRPC's threads. Drain
// must be called once the servers that use it have shut down, before it is
// destroyed. Ownership: owns the threads it starts.
#ifndef ZCC_DAEMON_CONTROL_RAW_CALLS_H_
#define ZCC_DAEMON_CONTROL_RAW_CALLS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "common/mutex.h"
#include "daemon/control/request_limits.h"

namespace zcc::daemon {

struct RawCallsOptions {
  int max_calls = 256;  // calls served at once; more are refused
  // Parse memory the calls served at once may hold together. A single call
  // may always hold its own method's max_cost.
  uint64_t max_cost_in_flight = uint64_t{4} << 30;
  std::function<void()> on_refused;  // counts a request refused here
};

class RawCalls {
 public:
  explicit RawCalls(RawCallsOptions options);
  ~RawCalls();  // Drain()
  RawCalls(const RawCalls&) = delete;
  RawCalls& operator=(const RawCalls&) = delete;

  // Serves one call of `method`: checks `raw` against `limit`, parses it as
  // a Request, runs `handler` on a thread of its own and replies with its
  // Response (or its error). Returns the reactor gRPC waits on.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply,
                                  RequestLimit limit,
                                  std::function<grpc::Status(const Request&, Response*)> handler);

  // Refuses calls from now on and waits until every call begun has replied
  // and its thread ended.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  // The parse memory admitted to the calls being served (for tests).
  uint64_t cost_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The request's size, then its parse cost, then room among the calls in
  // flight: the cost admitted (to give back with Release), or why not.
  absl::StatusOr<uint64_t> Admit(const google::protobuf::Descriptor& type, absl::string_view method,
                                 const grpc::ByteBuffer& raw, RequestLimit limit)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uint64_t cost) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `work` on a new thread; false when max_calls run or when draining.
  bool Start(absl::AnyInvocable<void() &&> work) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Refused(const absl::Status& why, absl::string_view method);

  const RawCallsOptions options_;
  mutable zcc::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ended_ ABSL_GUARDED_BY(mu_);  // threads that ended, to join
  uint64_t cost_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

template <typename Request, typename Response>
grpc::ServerUnaryReactor* RawCalls::Serve(
    grpc::CallbackServerContext* ctx, absl::string_view method, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* reply, RequestLimit limit,
    std::function<grpc::Status(const Request&, Response*)> handler) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::string name(method);
  auto work = [this, reactor, name, raw, reply, limit, handler = std::move(handler)]() {
    absl::StatusOr<uint64_t> cost = Admit(*Request::descriptor(), name, *raw, limit);
    if (!cost.ok()) {
      reactor->Finish(Refused(cost.status(), name));
      return;
    }
    grpc::Status status;
    {
      Request request;
      Response response;
      grpc::ByteBuffer bytes(*raw);  // shares the slices
      grpc::ProtoBufferReader reader(&bytes);
      if (!request.ParseFromZeroCopyStream(&reader)) {
        status = Refused(absl::InvalidArgumentError("not a valid encoding"), name);
      } else {
        status = handler(request, &response);
        bool own_buffer = false;
        if (status.ok()) {
          status = grpc::SerializationTraits<Response>::Serialize(response, reply, &own_buffer);
        }
      }
    }
    Release(*cost);
    reactor->Finish(status);
  };
  if (!Start(std::move(work))) {
    reactor->Finish(
        Refused(absl::ResourceExhaustedError(absl::StrCat(
                    "zccd is serving ", options_.max_calls, " requests or is shutting down")),
                name));
  }
  return reactor;
}

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_RAW_CALLS_H_
