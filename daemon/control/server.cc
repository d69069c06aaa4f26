#include "daemon/control/server.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "common/file_util.h"
#include "common/grpc_status.h"
#include "common/instance_lock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "config/config_file.h"
#include "daemon/control/raw_calls.h"
#include "daemon/control/registry.h"
#include "daemon/control/request_limits.h"
#include "daemon/control/unix_listener.h"
#include "daemon/peer/peer_listener.h"
#include "metrics/http_exporter.h"
#include "metrics/textfile_writer.h"
#include "proto/message_limits.h"
#include "proto/registration_waits.h"
#include "proto/zcc.grpc.pb.h"
#include "systemd/notify.h"

namespace zcc::daemon {
namespace {

// The caller of an RPC, from the credentials zccd recorded when it accepted
// the connection. Unknown peers (which cannot happen on the unix socket) are
// refused rather than trusted. peers == nullptr: the read-only TCP status
// listener, whose callers act as root.
absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase* ctx, const PeerTable* peers) {
  if (peers == nullptr) return Caller{};
  auto creds = peers->Lookup(ctx->peer());
  if (!creds.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat("unknown peer ", ctx->peer()));
  }
  return Caller{creds->uid, creds->gid, creds->pid};
}

// How long the caller of `ctx` waits: until it cancels or its deadline
// passes, the answer due a little before that deadline (a quarter of the
// time left when the call began, at most 2 s) so that it arrives.
CallerWait WaitOf(grpc::CallbackServerContext* ctx) {
  CallerWait wait;
  wait.gone = [ctx] { return ctx->IsCancelled(); };
  const auto deadline = ctx->deadline();
  // (No deadline reads as the clock's end: the answer is never due early.)
  if (deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 366)) {
    const absl::Time end = absl::FromChrono(deadline);
    const absl::Duration left = std::max(absl::ZeroDuration(), end - absl::Now());
    wait.answer_by = end - std::min(absl::Seconds(2), left / 4);
  }
  return wait;
}

// A registry method's result as the call's reply.
template <typename T>
grpc::Status Reply(const absl::StatusOr<T>& result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = *result;
  return grpc::Status::OK;
}
template <typename T>
grpc::Status Reply(const absl::Status& result, T*) {
  return ToGrpcStatus(result);
}

// Counts refused control requests in zcc_errors_total{kind="rpc"}; a
// registration told to ask again (v1::kRegisterAgain: the rank's previous
// trainer retires) is not refused.
grpc::Status Counted(Registry* registry, grpc::Status status) {
  if (!status.ok() && !(status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                        absl::StrContains(status.error_message(), v1::kRegisterAgain))) {
    registry->metrics().errors(metrics::ErrorKind::kRpc).Increment();
  }
  return status;
}

// Every method of the Control service taken raw (raw_calls.h).
using RawControl = v1::Control::WithRawCallbackMethod_Register<
    v1::Control::WithRawCallbackMethod_Unregister<
    v1::Control::WithRawCallbackMethod_Restore<
    v1::Control::WithRawCallbackMethod_RestoreDone<
    v1::Control::WithRawCallbackMethod_RestoreCandidates<
    v1::Control::WithRawCallbackMethod_ReadEma<
    v1::Control::WithRawCallbackMethod_SaveNow<
    v1::Control::WithRawCallbackMethod_PutJobFile<
    v1::Control::WithRawCallbackMethod_SetJobPeers<
    v1::Control::WithRawCallbackMethod_CollectGarbage<v1::Control::Service>>>>>>>>>>;

// One raw method: its request and response types, its limit, and what it
// does with (caller, r, out), where `ctx` is the call's context.
#define ZCC_RAW_METHOD(Name, Request, Response, limit, ...)                                     \
  grpc::ServerUnaryReactor* Name(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,   \
                                 grpc::ByteBuffer* resp) override {                              \
    return calls_->Serve<v1::Request, v1::Response>(                                             \
        ctx, #Name, CallerOf(ctx, peers_), req, resp, limit,                                     \
        [this, ctx](const Caller& caller, const v1::Request& r, v1::Response* out) {             \
          (void)ctx;                                                                             \
          return __VA_ARGS__;                                                                    \
        });                                                                                      \
  }
// A control method that is the registry's method of the same name, its
// refusals counted.
#define ZCC_REGISTRY_METHOD(Name, Request, Response, limit) \
  ZCC_RAW_METHOD(Name, Request, Response, limit,            \
                 Counted(registry_, Reply(registry_->Name(r, caller), out)))

class ControlService final : public RawControl {
 public:
  ControlService(Registry* registry, const PeerTable* peers, RawCalls* calls)
      : registry_(registry),
        peers_(peers),
        calls_(calls),
        register_limit_(RegisterRequestLimit(registry->config().max_tensors_per_rank)) {}

  ZCC_RAW_METHOD(Register, RegisterRequest, RegisterResponse, register_limit_,
                 Counted(registry_,
                         Reply(registry_->Register(r, caller, WaitOf(ctx)),
                               out)))
  ZCC_REGISTRY_METHOD(Unregister, UnregisterRequest, UnregisterResponse, kSmallRequest)
  ZCC_RAW_METHOD(Restore, RestoreRequest, RestoreResponse, kSmallRequest,
                 Counted(registry_,
                         Reply(registry_->Restore(r, caller, WaitOf(ctx)),
                               out)))
  ZCC_REGISTRY_METHOD(RestoreDone, RestoreDoneRequest, RestoreDoneResponse, kSmallRequest)
  ZCC_REGISTRY_METHOD(RestoreCandidates, RestoreCandidatesRequest, RestoreCandidatesResponse,
                      kSmallRequest)
  ZCC_REGISTRY_METHOD(ReadEma, ReadEmaRequest, ReadEmaResponse, kSmallRequest)
  ZCC_REGISTRY_METHOD(SaveNow, SaveNowRequest, SaveNowResponse, kSmallRequest)
  ZCC_REGISTRY_METHOD(PutJobFile, PutJobFileRequest, PutJobFileResponse, kPutJobFileRequest)
  ZCC_REGISTRY_METHOD(SetJobPeers, SetJobPeersRequest, SetJobPeersResponse, kSetJobPeersRequest)
  ZCC_REGISTRY_METHOD(CollectGarbage, CollectGarbageRequest, CollectGarbageResponse,
                      kSmallRequest)

 private:
  Registry* registry_;
  const PeerTable* peers_;
  RawCalls* calls_;
  const RequestLimit register_limit_;
};

using RawStatus = v1::Status::WithRawCallbackMethod_GetStatus<
    v1::Status::WithRawCallbackMethod_ListCheckpoints<v1::Status::Service>>;

class StatusService final : public RawStatus {
 public:
  // peers == nullptr: the read-only TCP listener, whose callers act as root.
  StatusService(Registry* registry, const PeerTable* peers, RawCalls* calls)
      : registry_(registry), peers_(peers), calls_(calls) {}

  ZCC_RAW_METHOD(GetStatus, StatusRequest, StatusResponse, kSmallRequest,
                 (*out = registry_->GetStatus(r, caller), grpc::Status::OK))
  ZCC_RAW_METHOD(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse, kSmallRequest,
                 Reply(registry_->ListCheckpoints(r, caller), out))

 private:
  Registry* registry_;
  const PeerTable* peers_;
  RawCalls* calls_;
};

#undef ZCC_REGISTRY_METHOD
#undef ZCC_RAW_METHOD

// Streams (calls) one connection may have open at once; more wait at the
// client.
constexpr int kMaxStreamsPerConnection = 64;

// True when something accepts connections on the unix socket `path`.
bool SocketIsLive(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return ::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

struct Server::Impl {
  DaemonConfig config;
  // Held while this zccd owns the socket path (set first in Start).
  std::optional<InstanceLock> socket_lock;
  PeerTable peers;
  std::unique_ptr<UnixListener> listener;
  std::unique_ptr<Registry> registry;
  // The control and status methods' calls, on the unix socket and on the
  // TCP status listener.
  std::unique_ptr<RawCalls> calls;
  std::unique_ptr<RawCalls> tcp_calls;
  std::unique_ptr<ControlService> control;
  std::unique_ptr<StatusService> status;
  std::unique_ptr<StatusService> tcp_status;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<grpc::Server> tcp_server;
  int tcp_port = 0;
  std::unique_ptr<peer::PeerListener> peer_listener;
  std::optional<metrics::HttpExporter> http_exporter;
  std::optional<metrics::TextfileWriter> textfile_writer;
  std::optional<systemd::Watchdog> watchdog;

  zcc::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool stopped ABSL_GUARDED_BY(mu) = false;

  ~Impl() { Stop(); }

  // The steps of Server::Start, in order.
  absl::Status ClaimSocket();
  absl::Status ServeControl();
  absl::Status ServeStatusOverTcp(const std::string& listen);
  absl::Status ServePeers();
  absl::Status StartExporters(const ServerOptions& options);

  // Idempotent; a second caller waits until the first has finished.
  void Stop() {
    {
      zcc::MutexLock lock(&mu);
      if (stopping) {
        mu.Await(absl::Condition(&stopped));
        return;
      }
      stopping = true;
    }
    (void)systemd::NotifyStopping();
    if (watchdog.has_value()) watchdog->Stop();
    if (listener != nullptr) listener->Stop();  // no new connections
    if (tcp_server != nullptr) {
      tcp_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      tcp_server.reset();
    }
    if (peer_listener != nullptr) peer_listener->Stop();
    // Long requests (restores) give up at their next check instead of
    // holding the shutdown.
    if (registry != nullptr) registry->BeginShutdown();
    if (grpc_server != nullptr) {
      ZCC_LOG(INFO) << "shutting down: finishing in-flight requests and writes";
      grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc_server->Wait();
      grpc_server.reset();
    }
    if (calls != nullptr) calls->Drain();
    if (tcp_calls != nullptr) tcp_calls->Drain();
    if (registry != nullptr) registry->Shutdown();
    // Exporters last: the final rendering includes the shutdown's writes.
    if (http_exporter.has_value()) http_exporter->Stop();
    if (textfile_writer.has_value()) textfile_writer->Stop();
    if (socket_lock.has_value()) ::unlink(config.socket_path.c_str());
    zcc::MutexLock lock(&mu);
    stopped = true;
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::Server(Server&&) noexcept = default;
Server& Server::operator=(Server&&) noexcept = default;
Server::~Server() = default;

const DaemonConfig& Server::config() const { return impl_->config; }

int Server::status_tcp_port() const { return impl_->tcp_port; }
int Server::peer_port() const {
  return impl_->peer_listener != nullptr ? impl_->peer_listener->port() : 0;
}
int Server::metrics_http_port() const {
  return impl_->http_exporter.has_value() ? impl_->http_exporter->port() : 0;
}

absl::StatusOr<Server> Server::Start(DaemonConfig config, ServerOptions options) {
  config = WithDefaults(std::move(config));
  ZCC_RETURN_IF_ERROR(ValidateConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  ZCC_RETURN_IF_ERROR(impl->ClaimSocket());
  impl->registry =
      std::make_unique<Registry>(config, options.shard_storage, options.pull_engine,
                                 options.before_reserve);
  ZCC_RETURN_IF_ERROR(impl->registry->Start());
  // Before the control service: registrations are told the peer address.
  if (!config.peer.listen.empty()) ZCC_RETURN_IF_ERROR(impl->ServePeers());
  ZCC_RETURN_IF_ERROR(impl->ServeControl());
  if (!options.status_tcp_listen.empty()) {
    ZCC_RETURN_IF_ERROR(impl->ServeStatusOverTcp(options.status_tcp_listen));
  }
  ZCC_RETURN_IF_ERROR(impl->StartExporters(options));
  Registry* registry = impl->registry.get();
  ZCC_ASSIGN_OR_RETURN(auto watchdog,
                       systemd::Watchdog::Start([registry] { return registry->Healthy(); }));
  impl->watchdog.emplace(std::move(watchdog));
  (void)systemd::NotifyReady();
  ZCC_LOG(INFO) << "zccd serving on unix:" << config.socket_path << ", default root "
                << config.default_root;
  return Server(std::move(impl));
}

absl::Status Server::Impl::ClaimSocket() {
  ZCC_RETURN_IF_ERROR(Annotate(MakeDirs(ParentDir(config.socket_path)), "socket directory"));
  // The socket is this zccd's from here on; one that fails to claim it must
  // not remove it on the way out (the live one's trainers would lose it).
  ZCC_ASSIGN_OR_RETURN(InstanceLock lock,
                       InstanceLock::Acquire(config.socket_path + ".lock",
                                             absl::StrCat("socket ", config.socket_path)));
  socket_lock.emplace(std::move(lock));
  // A zccd from before these locks may still serve it.
  if (SocketIsLive(config.socket_path)) {
    socket_lock.reset();
    return absl::AlreadyExistsError(
        absl::StrCat("another zccd is serving ", config.socket_path));
  }
  if (::unlink(config.socket_path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove stale socket ", config.socket_path));
  }
  return absl::OkStatus();
}

absl::Status Server::Impl::ServeControl() {
  Registry* const r = registry.get();
  calls = std::make_unique<RawCalls>(RawCallsOptions{
      .on_refused = [r] { r->metrics().errors(metrics::ErrorKind::kRpc).Increment(); }});
  control = std::make_unique<ControlService>(r, &peers, calls.get());
  status = std::make_unique<StatusService>(r, &peers, calls.get());
  // The standard grpc.health.v1 service on every server built from here on.
  grpc::EnableDefaultHealthCheckService(true);
  // zccd accepts on the unix socket itself (UnixListener) to learn each
  // connection's credentials; gRPC serves the accepted connections.
  grpc::ServerBuilder builder;
  builder.RegisterService(control.get());
  builder.RegisterService(status.get());
  // gRPC reads a request whole before RawCalls checks it: nothing larger
  // than the largest method's limit is read.
  const uint64_t largest = std::max({RegisterRequestLimit(config.max_tensors_per_rank).max_bytes,
                                     kSetJobPeersRequest.max_bytes, kPutJobFileRequest.max_bytes});
  builder.SetMaxReceiveMessageSize(static_cast<int>(largest));
  builder.SetMaxSendMessageSize(v1::kMaxMessageBytes);
  // Calls at once on one connection (a trainer makes a few).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve on unix:", config.socket_path));
  }
  ZCC_ASSIGN_OR_RETURN(listener, UnixListener::Bind(config.socket_path, config.socket_mode));
  listener->Start(grpc_server.get(), &peers);
  return absl::OkStatus();
}

absl::Status Server::Impl::ServeStatusOverTcp(const std::string& listen) {
  Registry* const r = registry.get();
  tcp_calls = std::make_unique<RawCalls>(RawCallsOptions{
      .max_calls = 64,
      .max_calls_per_uid = 64,
      .on_refused = [r] { r->metrics().errors(metrics::ErrorKind::kRpc).Increment(); }});
  tcp_status = std::make_unique<StatusService>(r, nullptr, tcp_calls.get());
  grpc::ServerBuilder tcp;
  tcp.SetMaxReceiveMessageSize(static_cast<int>(kSmallRequest.max_bytes));
  tcp.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  tcp.AddListeningPort(listen, grpc::InsecureServerCredentials(), &tcp_port);
  tcp.RegisterService(tcp_status.get());
  tcp_server = tcp.BuildAndStart();
  if (tcp_server == nullptr || tcp_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve status on ", listen));
  }
  ZCC_LOG(INFO) << "read-only status and health on " << listen << " (port " << tcp_port << ")";
  return absl::OkStatus();
}

absl::Status Server::Impl::ServePeers() {
  Registry* const r = registry.get();
  ZCC_ASSIGN_OR_RETURN(
      peer_listener,
      peer::PeerListener::Start(config.peer, &r->replicas(),
                                [r](const std::string& job_id, uint32_t uid, int64_t step,
                                    bool everyone_answered) -> absl::StatusOr<int64_t> {
                                  return r->OnPeerPin(job_id, uid, step, everyone_answered);
                                },
                                [r](const std::string& job_id, uint32_t uid, int64_t restored,
                                    const std::set<uint32_t>& ranks,
                                    absl::Duration ago) -> absl::StatusOr<bool> {
                                  return r->OnPeerWentBack(job_id, uid, restored, ranks, ago);
                                }));
  // Where other zccds reach it: the listen address, or the node's name when
  // that is a wildcard.
  ZCC_ASSIGN_OR_RETURN(config::HostPort hp, config::ParseHostPort(config.peer.listen));
  std::string host = hp.ipv6 ? absl::StrCat("[", hp.host, "]") : hp.host;
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = peer_listener->node_name();
  v1::PeerStatus endpoint;
  endpoint.set_node(peer_listener->node_name());
  endpoint.set_failure_domain(peer_listener->failure_domain());
  endpoint.set_port(peer_listener->port());
  endpoint.set_tls(peer_listener->tls());
  registry->SetPeerEndpoint(std::move(endpoint), absl::StrCat(host, ":", peer_listener->port()),
                            peer_listener->channel_credentials());
  return absl::OkStatus();
}

absl::Status Server::Impl::StartExporters(const ServerOptions& options) {
  Registry* r = registry.get();
  auto render = [r] { return r->metrics().RenderPrometheusText(); };
  if (!options.metrics_http_listen.empty()) {
    ZCC_ASSIGN_OR_RETURN(config::HostPort hp, config::ParseHostPort(options.metrics_http_listen));
    metrics::HttpExporterOptions http;
    http.host = hp.host;
    http.port = hp.port;
    ZCC_ASSIGN_OR_RETURN(auto exporter, metrics::HttpExporter::Start(http, render));
    http_exporter.emplace(std::move(exporter));
    ZCC_LOG(INFO) << "metrics on http://" << hp.host << ":" << http_exporter->port()
                  << "/metrics";
  }
  if (!options.metrics_textfile_dir.empty()) {
    metrics::TextfileWriterOptions textfile;
    textfile.dir = options.metrics_textfile_dir;
    textfile.interval = options.metrics_textfile_interval;
    ZCC_ASSIGN_OR_RETURN(auto writer, metrics::TextfileWriter::Start(textfile, render));
    textfile_writer.emplace(std::move(writer));
  }
  return absl::OkStatus();
}

void Server::Wait() {
  zcc::MutexLock lock(&impl_->mu);
  impl_->mu.Await(absl::Condition(&impl_->stopped));
}

void Server::Shutdown() { impl_->Stop(); }

}  // namespace zcc::daemon
