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
// A caller (a uid) that fills its share of calls or parse memory waits (the
// client retries UNAVAILABLE); it cannot take the others' share.
//
// Thread-safety: Serve may be called from any of gRPC's threads. Drain
// must be called once the servers that use it have shut down, before it is
// destroyed. Ownership: owns the threads it starts; a thread that ended is
// joined by the next one to end, or by Drain.
#ifndef ZCC_DAEMON_CONTROL_RAW_CALLS_H_
#define ZCC_DAEMON_CONTROL_RAW_CALLS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <sys/types.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "common/mutex.h"
#include "daemon/control/caller.h"
#include "daemon/control/request_limits.h"

namespace zcc::daemon {

struct RawCallsOptions {
  // Calls served at once, in all and per caller uid; more wait at the
  // client (UNAVAILABLE, which the client retries).
  int max_calls = 4096;
  int max_calls_per_uid = 256;
  // Parse memory the calls served at once may hold, in all and per caller
  // uid. A call is always admitted where nothing else is held (its method's
  // max_cost bounds it), so that the largest registration is never refused
  // for want of room it can never have.
  uint64_t max_cost_in_flight = uint64_t{8} << 30;
  uint64_t max_cost_per_uid = uint64_t{4} << 30;
  std::function<void()> on_refused;  // counts a request refused here
};

class RawCalls {
 public:
  // What a method does with its parsed request: its reply, or an error.
  template <typename Request, typename Response>
  using Handler = std::function<grpc::Status(const Caller&, const Request&, Response*)>;

  explicit RawCalls(RawCallsOptions options);
  ~RawCalls();  // Drain()
  RawCalls(const RawCalls&) = delete;
  RawCalls& operator=(const RawCalls&) = delete;

  // Serves one call of `method` from `caller` (or refuses it with the error
  // `caller` holds): checks `raw` against `limit`, parses it as a Request,
  // runs `handler` on a thread of its own and replies with its Response (or
  // its error). Returns the reactor gRPC waits on.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  const absl::StatusOr<Caller>& caller,
                                  const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply,
                                  RequestLimit limit, Handler<Request, Response> handler);

  // Refuses calls from now on and waits until every call begun has replied
  // and its thread ended.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  // The parse memory admitted to the calls being served (for tests).
  uint64_t cost_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  // The threads not joined yet: those serving calls, and at most one that
  // ended (for tests).
  size_t threads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct PerUid {
    int calls = 0;
    uint64_t cost = 0;
  };

  // The request's size, then its parse cost, then room among the calls in
  // flight: the cost admitted (to give back with Release), or why not.
  absl::StatusOr<uint64_t> Admit(const google::protobuf::Descriptor& type, absl::string_view method,
                                 uid_t uid, const grpc::ByteBuffer& raw, RequestLimit limit)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uid_t uid, uint64_t cost) ABSL_LOCKS_EXCLUDED(mu_);
  // A call's thread is done with `work` (its last step): joins the thread
  // that ended before it.
  void Ended(uint64_t id, uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `work` on a new thread for `uid`: OK, or why not (too many calls,
  // draining, no thread to be had).
  absl::Status Start(uid_t uid, absl::AnyInvocable<void() &&> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Parses `raw` and runs `handler`: its status, with `reply` filled on OK.
  template <typename Request, typename Response>
  grpc::Status Run(absl::string_view method, const Caller& caller, const grpc::ByteBuffer& raw,
                   grpc::ByteBuffer* reply, const Handler<Request, Response>& handler);
  grpc::Status Refused(const absl::Status& why, absl::string_view method);

  const RawCallsOptions options_;
  mutable zcc::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  // The thread that ended last, not joined yet: the next to end joins it
  // (so at most one ended thread is left unjoined, until Drain).
  uint64_t last_ended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cost_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uid_t, PerUid> per_uid_ ABSL_GUARDED_BY(mu_);  // uids with calls being served
};

template <typename Request, typename Response>
grpc::Status RawCalls::Run(absl::string_view method, const Caller& caller,
                           const grpc::ByteBuffer& raw, grpc::ByteBuffer* reply,
                           const Handler<Request, Response>& handler) {
  Request request;
  grpc::ByteBuffer bytes(raw);  // shares the slices
  grpc::ProtoBufferReader reader(&bytes);
  if (!request.ParseFromZeroCopyStream(&reader)) {
    return Refused(absl::InvalidArgumentError("not a valid encoding"), method);
  }
  Response response;
  grpc::Status status = handler(caller, request, &response);
  if (!status.ok()) return status;
  bool own_buffer = false;
  return grpc::SerializationTraits<Response>::Serialize(response, reply, &own_buffer);
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* RawCalls::Serve(grpc::CallbackServerContext* ctx,
                                          absl::string_view method,
                                          const absl::StatusOr<Caller>& caller,
                                          const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply,
                                          RequestLimit limit, Handler<Request, Response> handler) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!caller.ok()) {
    reactor->Finish(Refused(caller.status(), method));
    return reactor;
  }
  std::string name(method);
  const Caller who = *caller;
  auto work = [this, reactor, name, who, raw, reply, limit, handler = std::move(handler)]() {
    absl::StatusOr<uint64_t> cost = Admit(*Request::descriptor(), name, who.uid, *raw, limit);
    if (!cost.ok()) {
      reactor->Finish(Refused(cost.status(), name));
      return;
    }
    grpc::Status status;
    try {
      status = Run<Request, Response>(name, who, *raw, reply, handler);
    } catch (const std::exception& e) {
      // What gRPC's own handlers do with an exception, rather than end zccd.
      status = grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(name, ": ", e.what()));
    }
    Release(who.uid, *cost);
    reactor->Finish(status);
  };
  const absl::Status started = Start(who.uid, std::move(work));
  if (!started.ok()) reactor->Finish(Refused(started, name));
  return reactor;
}

}  // namespace zcc::daemon

#endif  // ZCC_DAEMON_CONTROL_RAW_CALLS_H_
