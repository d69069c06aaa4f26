#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <deque>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/default_paths.h"
#include "common/futex.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "common/validate.h"
#include "copy/host_copier.h"
#include "cuda/copier_select.h"
#include "proto/message_limits.h"
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"

namespace zcc {
namespace {

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::F32;
    case DType::kF16: return v1::F16;
    case DType::kBF16: return v1::BF16;
    case DType::kF64: return v1::F64;
    case DType::kI64: return v1::I64;
    case DType::kI32: return v1::I32;
    case DType::kI16: return v1::I16;
    case DType::kI8: return v1::I8;
    case DType::kU8: return v1::U8;
    case DType::kBool: return v1::BOOL;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::ReplicaGroup::Kind ToProto(ReplicaGroup::Kind kind) {
  switch (kind) {
    case ReplicaGroup::Kind::kNone: return v1::ReplicaGroup::NONE;
    case ReplicaGroup::Kind::kDataParallel: return v1::ReplicaGroup::DATA_PARALLEL;
    case ReplicaGroup::Kind::kExpertDataParallel: return v1::ReplicaGroup::EXPERT_DATA_PARALLEL;
  }
  return v1::ReplicaGroup::NONE;
}

v1::TensorKind ToProto(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParam: return v1::PARAM;
    case TensorKind::kOptim: return v1::OPTIM;
    case TensorKind::kExtra: return v1::EXTRA;
  }
  return v1::TENSOR_KIND_UNSPECIFIED;
}

bool IsTransient(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable ||
         st.code() == absl::StatusCode::kDeadlineExceeded ||
         st.code() == absl::StatusCode::kAlreadyExists;  // the daemon has not yet dropped our old registration
}

// One live registration with zccd: the mapped staging segment and the copy
// regions for every slot, computed once so that Snapshot does no per-tensor work
// beyond handing them to the copier.
struct Session {
  v1::RegisterResponse resp;
  shm::Segment segment;
  std::shared_ptr<DeviceCopier> copier;
  std::vector<std::vector<CopyRegion>> full_regions;  // per slot
  std::vector<std::vector<CopyRegion>> ema_regions;   // per slot
  std::atomic<bool> dead{false};

  Session(v1::RegisterResponse r, shm::Segment s, std::shared_ptr<DeviceCopier> c)
      : resp(std::move(r)), segment(std::move(s)), copier(std::move(c)) {}
  ~Session() {
    const absl::Status st = copier->UnregisterHostMemory(segment.base());
    if (!st.ok()) ZCC_LOG(WARNING) << "unregister staging memory: " << st;
  }
  shm::ControlBlock* cb() const { return segment.control(); }
  uint32_t num_slots() const { return resp.num_slots(); }
  uint8_t* slot(uint32_t i) const { return segment.slot(i, resp.slot_bytes()); }
};

struct PendingCopy {
  std::shared_ptr<Session> session;
  uint32_t slot = 0;
  int64_t step = 0;
  SnapshotKind kind = SnapshotKind::kFull;
  CopyTicket ticket = 0;
};

}  // namespace

// A channel to zccd and its stubs. Replaced as a whole when the client
// re-registers, so that a channel stuck in gRPC's reconnect backoff after a
// daemon restart is never reused.
struct Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Control::Stub> control;
  std::unique_ptr<v1::Status::Stub> status;

  explicit Stubs(const std::string& socket_path) {
    grpc::ChannelArguments args;
    // Retry a refused connection (zccd restarting) quickly ...
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // ... but give an accepted one time to finish its HTTP/2 handshake: gRPC
    // uses this value as the shortest connection attempt, and a zccd busy
    // with EMA and writes on a loaded node (or a sanitizer build) can take
    // longer than a backoff step to send its SETTINGS frame. At 100 ms such
    // attempts were cut off and the trainer ran unregistered.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
    args.SetMaxReceiveMessageSize(v1::kMaxMessageBytes);
    args.SetMaxSendMessageSize(v1::kMaxMessageBytes);
    channel = grpc::CreateCustomChannel("unix:" + socket_path, grpc::InsecureChannelCredentials(),
                                        args);
    control = v1::Control::NewStub(channel);
    status = v1::Status::NewStub(channel);
  }
};

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<DeviceCopier> copier;

  mutable zcc::Mutex mu;
  std::shared_ptr<const Stubs> stubs ABSL_GUARDED_BY(mu);
  std::vector<TensorRef> tensors ABSL_GUARDED_BY(mu);
  bool tensors_registered ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<Session> session ABSL_GUARDED_BY(mu);
  std::deque<PendingCopy> queue ABSL_GUARDED_BY(mu);
  uint64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::string last_error ABSL_GUARDED_BY(mu);

  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> published{0};
  std::atomic<uint64_t> skipped_no_slot{0};
  std::atomic<uint64_t> skipped_disconnected{0};
  std::atomic<uint64_t> registrations{0};
  std::atomic<uint64_t> replaced{0};
  // Checkpoint writes zccd reported failed (summed over registrations) and
  // the step of the newest; the monitor thread reads them from the segment.
  std::atomic<uint64_t> checkpoint_failures{0};
  std::atomic<int64_t> last_failed_checkpoint_step{-1};
  std::atomic<int64_t> last_published_step{-1};

  std::thread notifier;
  std::thread heartbeat;
  std::thread monitor;

  std::shared_ptr<const Stubs> GetStubs() const {
    zcc::MutexLock lock(&mu);
    return stubs;
  }

  std::shared_ptr<Session> CurrentSession() const {
    zcc::MutexLock lock(&mu);
    return session;
  }

  void SetError(const std::string& error) {
    zcc::MutexLock lock(&mu);
    last_error = error;
  }

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options.rpc_timeout));
    return ctx;
  }

  // Tells zccd the client is done with a restore or EMA buffer.
  absl::Status ReleaseBuffer(const Stubs& via, const Session& s, uint64_t id) const {
    v1::RestoreDoneRequest done;
    done.set_job_id(options.job_id);
    done.set_rank(options.rank);
    done.set_generation(s.resp.generation());
    done.set_restore_id(id);
    v1::RestoreDoneResponse done_resp;
    auto ctx = Context();
    return FromGrpcStatus(via.control->RestoreDone(ctx.get(), done, &done_resp));
  }

  absl::StatusOr<std::shared_ptr<Session>> RegisterOnce(const std::vector<TensorRef>& refs,
                                                       const Stubs& via);
  void DropSession(const std::shared_ptr<Session>& s, const std::string& why);
  void NotifierLoop();
  // Liveness in both directions and nothing else: writes this client's
  // heartbeat and checks zccd's. It never waits for zccd, an RPC or a copy
  // (mu is never held across one), so a busy client cannot look dead to zccd.
  void HeartbeatLoop();
  // Re-registration with backoff after zccd went away, and reports of failed
  // checkpoint writes (both make RPCs).
  void MonitorLoop();
  // Reports checkpoint writes zccd failed since the monitor last looked.
  void ReportCheckpointFailures(Session& s, uint64_t* seen);
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  ZCC_RETURN_IF_ERROR(ValidateJobId(options.job_id));
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank,
                                                   " must be below world_size ",
                                                   options.world_size));
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.daemon_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("daemon_timeout must exceed a positive heartbeat_interval");
  }
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  auto impl = std::make_unique<Impl>();
  if (options.copier == nullptr) {
    CopierSelection selection;
    selection.device = options.cuda_device;
    switch (options.copy_backend) {
      case ClientOptions::CopyBackend::kHost:
        selection.backend = CopierSelection::Backend::kHost;
        break;
      case ClientOptions::CopyBackend::kCuda:
        selection.backend = CopierSelection::Backend::kCuda;
        break;
      case ClientOptions::CopyBackend::kAuto:
        selection.backend = CopierSelection::Backend::kAuto;
        break;
    }
    ZCC_ASSIGN_OR_RETURN(options.copier, SelectDeviceCopier(selection));
  }
  impl->copier = options.copier;
  impl->options = std::move(options);

  {
    zcc::MutexLock lock(&impl->mu);
    impl->stubs = std::make_shared<const Stubs>(impl->options.socket_path);
  }

  Impl* raw = impl.get();
  impl->notifier = std::thread([raw] { raw->NotifierLoop(); });
  impl->heartbeat = std::thread([raw] { raw->HeartbeatLoop(); });
  impl->monitor = std::thread([raw] { raw->MonitorLoop(); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::~Client() {
  const absl::Status flushed = Flush(absl::Seconds(60));
  if (!flushed.ok()) ZCC_LOG(WARNING) << "zcc client: " << flushed;
  {
    zcc::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->notifier.join();
  impl_->heartbeat.join();
  impl_->monitor.join();
  std::shared_ptr<Session> s = impl_->CurrentSession();
  if (s != nullptr && !s->dead.load()) {
    v1::UnregisterRequest req;
    req.set_job_id(impl_->options.job_id);
    req.set_rank(impl_->options.rank);
    req.set_generation(s->resp.generation());
    v1::UnregisterResponse resp;
    auto ctx = impl_->Context();
    const grpc::Status st = impl_->GetStubs()->control->Unregister(ctx.get(), req, &resp);
    if (!st.ok()) ZCC_LOG(WARNING) << "zcc client: unregister: " << st.error_message();
  }
  zcc::MutexLock lock(&impl_->mu);
  impl_->session.reset();
}

absl::StatusOr<std::shared_ptr<Session>> Client::Impl::RegisterOnce(
    const std::vector<TensorRef>& refs, const Stubs& via) {
  v1::RegisterRequest req;
  req.set_job_id(options.job_id);
  req.set_rank(options.rank);
  req.set_world_size(options.world_size);
  req.set_num_slots(options.num_slots);
  req.set_save_every(options.save_every);
  req.set_keep_last(options.keep_last);
  req.set_checkpoint_root(options.checkpoint_root);
  req.set_pid(::getpid());
  req.set_ema_decay(options.ema_decay);
  req.set_ema_interval(options.ema_interval);
  req.set_persist_on_failure(options.persist_on_failure);
  for (const TensorRef& t : refs) {
    v1::TensorSpec* spec = req.add_tensors();
    spec->set_name(t.name);
    spec->set_dtype(ToProto(t.dtype));
    for (int64_t d : t.shape) spec->add_shape(d);
    spec->set_kind(ToProto(t.kind));
    spec->set_ema_eligible(t.ema_eligible);
    v1::ReplicaGroup* replica = spec->mutable_replica();
    replica->set_kind(ToProto(t.replica.kind));
    replica->set_group_size(t.replica.group_size);
    replica->set_rank_in_group(t.replica.rank_in_group);
    replica->set_expert_id(t.replica.expert_id);
  }
  v1::RegisterResponse resp;
  auto ctx = Context();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(via.control->Register(ctx.get(), req, &resp)));

  // The reply comes from another process: check it before trusting offsets.
  const uint32_t n = resp.num_slots();
  if (!shm::ValidateNumSlots(n).ok() || resp.slot_bytes() % shm::kPageBytes != 0 ||
      resp.slots_offset() != shm::ControlBlockBytes() ||
      resp.segment_bytes() != shm::SegmentBytes(n, resp.slot_bytes()) ||
      static_cast<size_t>(resp.placements_size()) != refs.size()) {
    return absl::DataLossError("zccd's registration reply has an inconsistent geometry");
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    const uint64_t nbytes = *format::TensorBytes(refs[i].dtype, refs[i].shape);
    if (p.name() != refs[i].name || p.nbytes() != nbytes ||
        (p.staged() && (p.offset() > resp.slot_bytes() || p.nbytes() > resp.slot_bytes() - p.offset()))) {
      return absl::DataLossError(
          absl::StrCat("zccd's placement of tensor '", refs[i].name, "' is inconsistent"));
    }
  }
  ZCC_ASSIGN_OR_RETURN(shm::Segment segment,
                       shm::Segment::Open(resp.shm_name(), resp.segment_bytes()));
  ZCC_RETURN_IF_ERROR(
      shm::ValidateGeometry(*segment.control(), n, resp.slot_bytes(), resp.generation()));
  ZCC_RETURN_IF_ERROR(copier->RegisterHostMemory(segment.base(), segment.size()));
  auto s = std::make_shared<Session>(std::move(resp), std::move(segment), copier);
  s->full_regions.resize(n);
  s->ema_regions.resize(n);
  for (uint32_t slot = 0; slot < n; ++slot) {
    for (size_t i = 0; i < refs.size(); ++i) {
      const v1::TensorPlacement& p = s->resp.placements(i);
      if (!p.staged()) continue;  // another replica writes it
      CopyRegion region{refs[i].data, s->slot(slot) + p.offset(), p.nbytes()};
      s->full_regions[slot].push_back(region);
      if (refs[i].ema_eligible) s->ema_regions[slot].push_back(region);
    }
  }
  return s;
}

absl::Status Client::RegisterTensors(std::vector<TensorRef> tensors) {
  std::set<std::string> names;
  for (const TensorRef& t : tensors) {
    ZCC_RETURN_IF_ERROR(ValidateTensorName(t.name));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' is registered twice"));
    }
    auto nbytes = format::TensorBytes(t.dtype, t.shape);
    if (!nbytes.ok()) return Annotate(nbytes.status(), absl::StrCat("tensor '", t.name, "'"));
    if (*nbytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has no data pointer"));
    }
  }
  {
    zcc::MutexLock lock(&impl_->mu);
    if (impl_->tensors_registered) {
      return absl::FailedPreconditionError("tensors are already registered with this client");
    }
  }
  auto session = impl_->RegisterOnce(tensors, *impl_->GetStubs());
  if (!session.ok() && !IsTransient(session.status())) return session.status();
  zcc::MutexLock lock(&impl_->mu);
  impl_->tensors = std::move(tensors);
  impl_->tensors_registered = true;
  if (session.ok()) {
    impl_->session = *session;
    impl_->registrations.fetch_add(1);
  } else {
    impl_->last_error = std::string(session.status().message());
    ZCC_LOG(WARNING) << "zcc client: zccd is not reachable (" << session.status().message()
                     << "); training continues without snapshots until it is";
  }
  return absl::OkStatus();
}

SnapshotResult Client::Snapshot(int64_t step, SnapshotKind kind, void* stream) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr || s->dead.load(std::memory_order_relaxed)) {
    im.skipped_disconnected.fetch_add(1, std::memory_order_relaxed);
    return SnapshotResult::kSkippedDisconnected;
  }
  shm::ControlBlock* cb = s->cb();
  // Any free slot; a step due for a checkpoint also takes over a slot whose
  // ordinary snapshot zccd has not ingested yet (shm/slot_ring.h), so no slot
  // idles in reserve and a due step is missed only when every other slot is
  // being written, ingested or filled.
  const uint32_t save_every = im.options.save_every;
  const bool due = save_every > 0 && step % save_every == 0;
  shm::SlotRing ring(cb, s->num_slots());
  int slot = -1;
  while (true) {
    if (auto claimed = ring.Claim(due, save_every); claimed.has_value()) {
      slot = static_cast<int>(claimed->index);
      if (claimed->replaced_step.has_value()) {
        // Published but never ingested: for the EMA, a skipped step.
        cb->snapshots_skipped.fetch_add(1, std::memory_order_relaxed);
        im.replaced.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    if (im.options.backpressure == Backpressure::kSkip) {
      cb->snapshots_skipped.fetch_add(1, std::memory_order_relaxed);
      im.skipped_no_slot.fetch_add(1, std::memory_order_relaxed);
      return SnapshotResult::kSkippedNoSlot;
    }
    // kBlock: sleep until zccd frees a slot; a daemon that went away is noticed
    // by the monitor within daemon_timeout, which ends the wait.
    const uint32_t bell = cb->free_bell.load(std::memory_order_acquire);
    if (ring.FreeCount() > 0) continue;
    if (s->dead.load() || cb->closed.load()) {
      im.skipped_disconnected.fetch_add(1, std::memory_order_relaxed);
      return SnapshotResult::kSkippedDisconnected;
    }
    FutexWait(&cb->free_bell, bell, im.options.heartbeat_interval);
  }
  const auto& regions = kind == SnapshotKind::kFull ? s->full_regions[slot] : s->ema_regions[slot];
  auto ticket = im.copier->Enqueue(regions, stream);
  if (!ticket.ok()) {
    ring.Abandon(static_cast<uint32_t>(slot));
    im.SetError(absl::StrCat("enqueue copy: ", ticket.status().message()));
    im.skipped_disconnected.fetch_add(1, std::memory_order_relaxed);
    return SnapshotResult::kSkippedDisconnected;
  }
  {
    zcc::MutexLock lock(&im.mu);
    im.queue.push_back(PendingCopy{std::move(s), static_cast<uint32_t>(slot), step, kind, *ticket});
  }
  im.enqueued.fetch_add(1, std::memory_order_relaxed);
  return SnapshotResult::kEnqueued;
}

absl::Status Client::FenceBeforeUpdate(void* stream) {
  return impl_->copier->FenceBeforeUpdate(stream);
}

void Client::Impl::NotifierLoop() {
  MakeThisThreadBackground();
  while (true) {
    PendingCopy p;
    {
      zcc::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](Impl* im) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !im->queue.empty() || im->stopping; },
          this));
      if (queue.empty()) return;
      p = std::move(queue.front());
      queue.pop_front();
      ++in_flight;
    }
    const absl::Status copied = copier->Wait(p.ticket);
    shm::ControlBlock* cb = p.session->cb();
    shm::SlotRing ring(cb, p.session->num_slots());
    if (!copied.ok()) {
      ring.Abandon(p.slot);
      SetError(absl::StrCat("snapshot copy of step ", p.step, " failed: ", copied.message()));
      ZCC_LOG(ERROR) << "zcc client: snapshot copy of step " << p.step << " failed: " << copied;
    } else {
      cb->snapshots_published.fetch_add(1, std::memory_order_relaxed);
      ring.Publish(p.slot, p.step,
                   p.kind == SnapshotKind::kFull ? shm::SnapshotKind::kFull
                                                 : shm::SnapshotKind::kEmaOnly);
      published.fetch_add(1, std::memory_order_relaxed);
      last_published_step.store(p.step, std::memory_order_relaxed);
    }
    p.session.reset();
    zcc::MutexLock lock(&mu);
    --in_flight;
  }
}

void Client::Impl::DropSession(const std::shared_ptr<Session>& s, const std::string& why) {
  s->dead.store(true);
  zcc::MutexLock lock(&mu);
  if (session == s) session.reset();
  last_error = why;
  ZCC_LOG(WARNING) << "zcc client: " << why << "; snapshots are skipped until zccd is back";
}

void Client::Impl::ReportCheckpointFailures(Session& s, uint64_t* seen) {
  shm::ControlBlock* cb = s.cb();
  const uint64_t failures = cb->persist_failures.load(std::memory_order_acquire);
  if (failures <= *seen) return;
  const int64_t step = cb->last_failed_step.load(std::memory_order_relaxed);
  checkpoint_failures.fetch_add(failures - *seen);
  last_failed_checkpoint_step.store(step);
  *seen = failures;
  // The reason is in zccd's status; a failure to ask still gets reported.
  std::string why = "see `zccctl status " + options.job_id + "`";
  v1::StatusRequest req;
  req.set_job_id(options.job_id);
  v1::StatusResponse resp;
  grpc::ClientContext ctx;  // a short wait: re-registration shares this thread
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (GetStubs()->status->GetStatus(&ctx, req, &resp).ok()) {
    for (const auto& job : resp.jobs()) {
      for (const auto& r : job.ranks()) {
        if (r.rank() == options.rank && !r.last_error().empty()) why = r.last_error();
      }
    }
  }
  const std::string error = absl::StrCat("zccd could not write the checkpoint of step ", step,
                                         " (", checkpoint_failures.load(),
                                         " failed so far): ", why);
  ZCC_LOG(ERROR) << "zcc client: " << error;
  SetError(error);
}

void Client::Impl::HeartbeatLoop() {
  MakeThisThreadBackground();
  while (true) {
    std::shared_ptr<Session> s;
    {
      zcc::MutexLock lock(&mu);
      if (stopping) return;
      s = session;
    }
    if (s != nullptr && !s->dead.load()) {
      shm::ControlBlock* cb = s->cb();
      const uint64_t now = shm::MonotonicNanos();
      cb->client_heartbeat_ns.store(now, std::memory_order_relaxed);
      const uint64_t daemon_beat = cb->daemon_heartbeat_ns.load(std::memory_order_relaxed);
      if (cb->closed.load() != 0) {
        DropSession(s, "zccd closed this registration");
      } else if (daemon_beat < now &&
                 absl::Nanoseconds(now - daemon_beat) > options.daemon_timeout) {
        DropSession(s, absl::StrCat("zccd has not answered for ",
                                    absl::FormatDuration(absl::Nanoseconds(now - daemon_beat))));
      }
    }
    zcc::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&stopping), options.heartbeat_interval);
  }
}

void Client::Impl::MonitorLoop() {
  MakeThisThreadBackground();
  absl::Duration backoff = absl::Milliseconds(100);
  const Session* watched = nullptr;  // the session whose failures `seen` counts
  uint64_t seen_failures = 0;
  while (true) {
    std::shared_ptr<Session> s;
    std::vector<TensorRef> refs;
    bool need_register = false;
    {
      zcc::MutexLock lock(&mu);
      if (stopping) return;
      s = session;
      need_register = tensors_registered && s == nullptr;
      if (need_register) refs = tensors;
    }
    absl::Duration wait = options.heartbeat_interval;
    if (need_register) {
      auto via = std::make_shared<const Stubs>(options.socket_path);
      auto fresh = RegisterOnce(refs, *via);
      if (fresh.ok()) {
        zcc::MutexLock lock(&mu);
        session = *fresh;
        stubs = std::move(via);
        registrations.fetch_add(1);
        backoff = absl::Milliseconds(100);
        ZCC_LOG(INFO) << "zcc client: registered with zccd again (job " << options.job_id
                      << " rank " << options.rank << ")";
        continue;
      }
      SetError(std::string(fresh.status().message()));
      wait = backoff;
      backoff = std::min(backoff * 2, options.reconnect_max_backoff);
    } else if (s != nullptr) {
      if (watched != s.get()) {
        watched = s.get();
        seen_failures = 0;
      }
      ReportCheckpointFailures(*s, &seen_failures);
    }
    zcc::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&stopping), wait);
  }
}

absl::StatusOr<int64_t> Client::Restore(int64_t step, void* stream) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) {
    zcc::MutexLock lock(&im.mu);
    return absl::UnavailableError(absl::StrCat("not registered with zccd: ",
                                               im.last_error.empty() ? "call RegisterTensors first"
                                                                     : im.last_error));
  }
  std::vector<TensorRef> refs;
  {
    zcc::MutexLock lock(&im.mu);
    refs = im.tensors;
  }
  v1::RestoreRequest req;
  req.set_job_id(im.options.job_id);
  req.set_rank(im.options.rank);
  req.set_generation(s->resp.generation());
  req.set_step(step);
  v1::RestoreResponse resp;
  auto ctx = im.Context();
  const std::shared_ptr<const Stubs> stubs = im.GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(stubs->control->Restore(ctx.get(), req, &resp)));
  for (const std::string& why : resp.skipped_steps()) {
    ZCC_LOG(WARNING) << "zcc client: restore skipped " << why;
  }
  // The restored bytes arrive in a buffer of their own, holding every
  // registered tensor (replicated ones too), validated before use.
  absl::Status copied;
  if (static_cast<size_t>(resp.placements_size()) != refs.size() ||
      resp.data_offset() > resp.segment_bytes()) {
    copied = absl::DataLossError("zccd's restore reply does not match the registration");
  }
  for (size_t i = 0; copied.ok() && i < refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    const uint64_t room = resp.segment_bytes() - resp.data_offset();
    if (p.name() != refs[i].name || p.nbytes() != *format::TensorBytes(refs[i].dtype, refs[i].shape) ||
        p.offset() > room || p.nbytes() > room - p.offset()) {
      copied = absl::DataLossError(
          absl::StrCat("zccd's restore placement of '", refs[i].name, "' is inconsistent"));
    }
  }
  if (copied.ok()) {
    auto buffer = shm::Segment::Open(resp.shm_name(), resp.segment_bytes());
    if (!buffer.ok()) {
      copied = buffer.status();
    } else {
      const uint8_t* base = buffer->base() + resp.data_offset();
      std::vector<CopyRegion> regions;
      for (size_t i = 0; i < refs.size(); ++i) {
        regions.push_back(
            CopyRegion{base + resp.placements(i).offset(), refs[i].data, resp.placements(i).nbytes()});
      }
      copied = im.copier->RegisterHostMemory(buffer->base(), buffer->size());
      if (copied.ok()) {
        copied = im.copier->CopyToDevice(regions, stream);
        const absl::Status unpinned = im.copier->UnregisterHostMemory(buffer->base());
        if (copied.ok()) copied = unpinned;
      }
    }
  }
  const absl::Status released = im.ReleaseBuffer(*stubs, *s, resp.restore_id());
  ZCC_RETURN_IF_ERROR(copied);
  ZCC_RETURN_IF_ERROR(released);
  return resp.step();
}

absl::StatusOr<int64_t> Client::ReadEma(const std::vector<EmaOutput>& outputs) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) return absl::UnavailableError("not registered with zccd");
  v1::ReadEmaRequest req;
  req.set_job_id(im.options.job_id);
  req.set_rank(im.options.rank);
  req.set_generation(s->resp.generation());
  v1::ReadEmaResponse resp;
  auto ctx = im.Context();
  const std::shared_ptr<const Stubs> stubs = im.GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(stubs->control->ReadEma(ctx.get(), req, &resp)));
  absl::Status copied;
  {
    auto buffer = shm::Segment::Open(resp.shm_name(), resp.segment_bytes());
    if (!buffer.ok()) {
      copied = buffer.status();
    } else if (resp.data_offset() > buffer->size()) {
      copied = absl::DataLossError("zccd's EMA buffer is inconsistent");
    } else {
      const uint64_t room = buffer->size() - resp.data_offset();
      const uint8_t* base = buffer->base() + resp.data_offset();
      // By name, once: a search of the placements per output is quadratic.
      absl::flat_hash_map<absl::string_view, const v1::TensorPlacement*> by_name;
      by_name.reserve(resp.placements_size());
      for (const v1::TensorPlacement& p : resp.placements()) by_name.emplace(p.name(), &p);
      for (const EmaOutput& out : outputs) {
        const auto found = by_name.find(out.name);
        const v1::TensorPlacement* it = found == by_name.end() ? nullptr : found->second;
        if (it == nullptr) {
          copied = absl::NotFoundError(absl::StrCat(
              "zccd keeps no EMA of '", out.name, "' for this rank (another replica writes it, or "
              "it is not an EMA-eligible parameter)"));
          break;
        }
        if (it->nbytes() != out.elements * sizeof(float) || it->offset() > room ||
            it->nbytes() > room - it->offset()) {
          copied = absl::InvalidArgumentError(absl::StrCat(
              "EMA of '", out.name, "' has ", it->nbytes() / 4, " elements; ", out.elements, " given"));
          break;
        }
        if (resp.step() >= 0) std::memcpy(out.data, base + it->offset(), it->nbytes());
      }
    }
  }
  const absl::Status released = im.ReleaseBuffer(*stubs, *s, resp.restore_id());
  ZCC_RETURN_IF_ERROR(copied);
  ZCC_RETURN_IF_ERROR(released);
  return resp.step();
}

absl::Status Client::SaveNow() {
  v1::SaveNowRequest req;
  req.set_job_id(impl_->options.job_id);
  v1::SaveNowResponse resp;
  auto ctx = impl_->Context();
  return FromGrpcStatus(impl_->GetStubs()->control->SaveNow(ctx.get(), req, &resp));
}

absl::Status Client::Flush(absl::Duration timeout) {
  zcc::MutexLock lock(&impl_->mu);
  auto idle = [](Impl* im) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return im->queue.empty() && im->in_flight == 0;
  };
  if (!impl_->mu.AwaitWithTimeout(absl::Condition(+idle, impl_.get()), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "snapshots still in flight after ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

ClientStats Client::Stats() const {
  const Impl& im = *impl_;
  ClientStats stats;
  stats.snapshots_enqueued = im.enqueued.load();
  stats.snapshots_published = im.published.load();
  stats.skipped_no_slot = im.skipped_no_slot.load();
  stats.skipped_disconnected = im.skipped_disconnected.load();
  stats.replaced_by_checkpoint = im.replaced.load();
  stats.registrations = im.registrations.load();
  stats.last_published_step = im.last_published_step.load();
  stats.checkpoint_failures = im.checkpoint_failures.load();
  stats.last_failed_checkpoint_step = im.last_failed_checkpoint_step.load();
  zcc::MutexLock lock(&im.mu);
  stats.connected = im.session != nullptr && !im.session->dead.load();
  stats.last_error = im.last_error;
  return stats;
}

}  // namespace zcc

namespace zcc {

absl::StatusOr<CheckpointStatus> Client::QueryCheckpointStatus() const {
  v1::StatusRequest req;
  req.set_job_id(impl_->options.job_id);
  v1::StatusResponse resp;
  auto ctx = impl_->Context();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(impl_->GetStubs()->status->GetStatus(ctx.get(), req, &resp)));
  if (resp.jobs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("zccd has no job '", impl_->options.job_id, "'"));
  }
  const v1::JobStatus& job = resp.jobs(0);
  CheckpointStatus out;
  out.last_committed_step = job.last_committed_step();
  out.last_checkpoint_bytes = job.last_checkpoint_bytes();
  out.last_checkpoint_seconds = job.last_checkpoint_seconds();
  out.last_checkpoint_gbps = job.last_checkpoint_gbps();
  out.pending_commits.assign(job.pending_commits().begin(), job.pending_commits().end());
  out.last_error = job.last_error();
  return out;
}

}  // namespace zcc
