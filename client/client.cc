#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <vector>
#include <cstring>
#include <atomic>
#include <deque>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client_impl.h"
#include "client/proto_convert.h"
#include "common/default_paths.h"
#include "common/futex.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "common/validate.h"
#include "copy/host_copier.h"
#include "client/default_copier.h"
#include "proto/message_limits.h"
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"

namespace zcc {

using client_internal::IsTransient;
using client_internal::ToProto;

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
  impl->user_copier = options.copier != nullptr;
  if (options.copier == nullptr) {
    ZCC_ASSIGN_OR_RETURN(options.copier, client_internal::DefaultCopier(options));
  }
  if (options.copier == nullptr && options.copy_backend != ClientOptions::CopyBackend::kCudaIpc) {
    return absl::InternalError("no copier");
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
  // Not closed: the trainer is going away without saying it is done (an
  // exception unwinding, a process ending); zccd keeps its snapshots for the
  // trainer that comes next, as for one that died.
  const absl::Status closed = Close(/*keep_snapshots=*/true);
  if (!closed.ok()) ZCC_LOG(WARNING) << "zcc client: " << closed;
}

absl::Status Client::Close(bool keep_snapshots) {
  {
    zcc::MutexLock lock(&impl_->mu);
    if (impl_->closed) return absl::OkStatus();
    impl_->closed = true;
  }
  const absl::Status flushed = Flush(absl::Seconds(60));
  if (!flushed.ok()) ZCC_LOG(WARNING) << "zcc client: " << flushed;
  {
    zcc::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->notifier.join();
  impl_->heartbeat.join();
  impl_->monitor.join();
  absl::Status unregistered;
  std::shared_ptr<Session> s = impl_->CurrentSession();
  if (s != nullptr && !s->dead.load()) {
    auto req = impl_->AddressedTo<v1::UnregisterRequest>(*s);
    req.set_keep_snapshots(keep_snapshots);
    v1::UnregisterResponse resp;
    auto ctx = impl_->Context();
    unregistered = Annotate(FromGrpcStatus(impl_->GetStubs()->control->Unregister(ctx.get(), req, &resp)),
                            "unregister");
  }
  zcc::MutexLock lock(&impl_->mu);
  impl_->session.reset();
  return unregistered;
}

namespace {

absl::Status CheckTensorRefs(const std::vector<TensorRef>& tensors) {
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
    if (t.optional && t.kind != TensorKind::kExtra) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': only EXTRA tensors may be optional"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Client::RegisterTensors(std::vector<TensorRef> tensors) {
  ZCC_RETURN_IF_ERROR(CheckTensorRefs(tensors));
  {
    zcc::MutexLock lock(&impl_->mu);
    if (impl_->tensors_registered) {
      return absl::FailedPreconditionError("tensors are already registered with this client");
    }
  }
  // Only the first registration reads ahead: a re-registration (zccd came
  // back) happens while the trainer trains.
  auto session = impl_->RegisterOnce(tensors, *impl_->GetStubs(), impl_->options.prefetch_restore);
  // zccd is still writing the last checkpoint of the rank's previous trainer
  // (it died with a step due): registered only after that, this trainer
  // adopts its snapshots and restores the newest from memory, so the wait
  // goes on here, told every 30 s. (zccd stops waiting itself after
  // Housekeeper::kMaxRetireWait.)
  const absl::Time waiting_since = absl::Now();
  absl::Time told = absl::InfinitePast();
  auto closing = [im = impl_.get()] {
    zcc::MutexLock lock(&im->mu);
    return im->stopping;
  };
  while (!session.ok() && client_internal::RegisterAgain(session.status()) && !closing()) {
    if (absl::Now() - told >= absl::Seconds(30)) {
      told = absl::Now();
      ZCC_LOG(INFO) << "zcc client: waiting to register ("
                    << absl::FormatDuration(absl::Trunc(told - waiting_since, absl::Seconds(1)))
                    << " so far): " << session.status().message();
    }
    session = impl_->RegisterOnce(tensors, *impl_->GetStubs(), impl_->options.prefetch_restore);
  }
  if (!session.ok() && !IsTransient(session.status())) return session.status();
  zcc::MutexLock lock(&impl_->mu);
  impl_->tensors = std::move(tensors);
  impl_->tensors_registered = true;
  if (session.ok()) {
    impl_->session = *session;
    impl_->registrations.fetch_add(1);
  } else {
    impl_->last_error = std::string(session.status().message());
    ZCC_LOG(WARNING) << "zcc client: cannot register with zccd now ("
                     << session.status().message()
                     << "); training continues without snapshots and registers again with backoff";
  }
  return absl::OkStatus();
}

absl::Status Client::ReplaceTensors(std::vector<TensorRef> tensors) {
  ZCC_RETURN_IF_ERROR(CheckTensorRefs(tensors));
  std::shared_ptr<Session> s;
  {
    zcc::MutexLock lock(&impl_->mu);
    if (!impl_->tensors_registered) {
      return absl::FailedPreconditionError("no tensors are registered with this client yet");
    }
    s = impl_->session;
  }
  if (s == nullptr || s->dead.load()) {
    // Not registered now: the background registration takes these.
    zcc::MutexLock lock(&impl_->mu);
    impl_->tensors = std::move(tensors);
    return absl::OkStatus();
  }
  // The monitor registers nothing meanwhile: should this session die, the
  // new tensors are registered after this call, not the old ones during it.
  {
    zcc::MutexLock lock(&impl_->mu);
    impl_->replacing = true;
  }
  absl::Cleanup replaced = [this] {
    zcc::MutexLock lock(&impl_->mu);
    impl_->replacing = false;
  };
  // Nothing of the old registration's is left to publish once zccd stops it.
  ZCC_RETURN_IF_ERROR(Flush());
  s->being_replaced.store(true);
  auto fresh = impl_->RegisterOnce(tensors, *impl_->GetStubs(), /*prefetch_restore=*/false,
                                   s->resp.generation());
  // Refused, the old registration stays: or, when zccd had stopped it
  // before the refusal, the heartbeat now drops it and the background
  // registration takes over.
  s->being_replaced.store(false);
  if (!fresh.ok() && !IsTransient(fresh.status())) return fresh.status();
  if (!fresh.ok()) {
    impl_->DropSession(s, absl::StrCat("cannot replace the registration now (",
                                       fresh.status().message(), ")"));
  }
  zcc::MutexLock lock(&impl_->mu);
  impl_->tensors = std::move(tensors);
  if (fresh.ok()) {
    s->dead.store(true);  // zccd stopped it; the session object goes below
    impl_->session = *std::move(fresh);
    impl_->registrations.fetch_add(1);
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
  if (im.TakenOver(*s)) {
    im.DropTakenOver(s);
    im.skipped_disconnected.fetch_add(1, std::memory_order_relaxed);
    return SnapshotResult::kSkippedDisconnected;
  }
  shm::ControlBlock* cb = s->cb();
  // Any free slot; with kSkip, a step due for a checkpoint also takes over a
  // slot whose ordinary snapshot zccd has not ingested yet (shm/slot_ring.h),
  // so no slot idles in reserve and a due step is missed only when every
  // other slot is being written, ingested or filled. With kBlock nothing is
  // dropped, a not yet ingested snapshot included (its EMA update would be
  // lost): the due step waits for a free slot like any other.
  const uint32_t save_every = im.options.save_every;
  const bool due = save_every > 0 && step % save_every == 0 &&
                   im.options.backpressure == Backpressure::kSkip;
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
  // At once unless this slot is still being pinned (a snapshot right after
  // the registration).
  const absl::Status pinned = s->pins->Await(s->slot(static_cast<uint32_t>(slot)), s->resp.slot_bytes());
  auto ticket = pinned.ok() ? s->copier->Enqueue(regions, stream) : absl::StatusOr<CopyTicket>(pinned);
  if (!ticket.ok()) {
    ring.Abandon(static_cast<uint32_t>(slot));
    im.SetError(absl::StrCat("snapshot of step ", step, " skipped: its copy could not be enqueued: ",
                             ticket.status().message()));
    im.skipped_copy_failed.fetch_add(1, std::memory_order_relaxed);
    return SnapshotResult::kSkippedCopyFailed;
  }
  {
    zcc::MutexLock lock(&im.mu);
    im.queue.push_back(PendingCopy{std::move(s), static_cast<uint32_t>(slot), step, kind, *ticket});
  }
  im.enqueued.fetch_add(1, std::memory_order_relaxed);
  return SnapshotResult::kEnqueued;
}

absl::Status Client::FenceBeforeUpdate(void* stream) {
  // The client's copier (whose copies of an earlier registration may still
  // run), and each session's own (daemon-pull) with copies not yet waited
  // for: the current one's, and those of sessions dropped since their
  // snapshots were enqueued (zccd may still be pulling them).
  std::vector<std::shared_ptr<DeviceCopier>> copiers;
  if (impl_->copier != nullptr) copiers.push_back(impl_->copier);
  auto add = [&copiers](const std::shared_ptr<Session>& s) {
    if (s == nullptr || s->copier == nullptr) return;
    if (std::find(copiers.begin(), copiers.end(), s->copier) == copiers.end()) {
      copiers.push_back(s->copier);
    }
  };
  {
    zcc::MutexLock lock(&impl_->mu);
    add(impl_->session);
    for (const PendingCopy& p : impl_->queue) add(p.session);
    add(impl_->waited_session);
  }
  for (const std::shared_ptr<DeviceCopier>& copier : copiers) {
    ZCC_RETURN_IF_ERROR(copier->FenceBeforeUpdate(stream));
  }
  return absl::OkStatus();
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
      waited_session = p.session;
    }
    const absl::Status copied = p.session->copier->Wait(p.ticket);
    shm::ControlBlock* cb = p.session->cb();
    shm::SlotRing ring(cb, p.session->num_slots());
    if (TakenOver(*p.session)) {
      // The slot is the successor's now: neither published nor given back.
      DropTakenOver(p.session);
    } else if (!copied.ok()) {
      ring.Abandon(p.slot);
      SetError(absl::StrCat("snapshot copy of step ", p.step, " failed: ", copied.message()));
      ZCC_LOG(ERROR) << "zcc client: snapshot copy of step " << p.step << " failed: " << copied;
    } else {
      cb->snapshots_published.fetch_add(1, std::memory_order_relaxed);
      // The trainer went on without a restore: zccd drops the read it began
      // at registration, and its slot takes snapshots.
      p.session->RaiseEarlyCopyFloor();
      ring.Publish(p.slot, p.step,
                   p.kind == SnapshotKind::kFull ? shm::SnapshotKind::kFull
                                                 : shm::SnapshotKind::kEmaOnly);
      published.fetch_add(1, std::memory_order_relaxed);
      last_published_step.store(p.step, std::memory_order_relaxed);
    }
    std::shared_ptr<Session> waited;
    {
      zcc::MutexLock lock(&mu);
      waited = std::move(waited_session);
    }
    // The last reference to a dropped session goes here, outside mu (its
    // segment is unpinned and unmapped).
    waited.reset();
    p.session.reset();
    zcc::MutexLock lock(&mu);
    --in_flight;
  }
}

absl::Status Client::PutJobFile(const std::string& name, const std::string& content) {
  v1::PutJobFileRequest req;
  req.set_job_id(impl_->options.job_id);
  req.set_name(name);
  req.set_content(content);
  auto ctx = impl_->Context();
  v1::PutJobFileResponse resp;
  return FromGrpcStatus(impl_->GetStubs()->control->PutJobFile(ctx.get(), req, &resp));
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
  stats.skipped_copy_failed = im.skipped_copy_failed.load();
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
