// Internal to client/: the client's state shared by its source files
// (client.cc: connection, registration, snapshots; liveness.cc: heartbeats,
// re-registration and failure reports; restore.cc: restore and EMA reads).
// Not part of the trainer API.
#ifndef ZCC_CLIENT_CLIENT_IMPL_H_
#define ZCC_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "client/staging_pins.h"
#include "copy/device_copier.h"
#include "proto/message_limits.h"
#include "proto/registration_waits.h"
#include "proto/zcc.grpc.pb.h"
#include "shm/control_block.h"
#include "shm/restore_progress.h"
#include "shm/segment.h"

namespace zcc {
namespace client_internal {

inline bool IsTransient(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable ||
         st.code() == absl::StatusCode::kDeadlineExceeded ||
         st.code() == absl::StatusCode::kAlreadyExists;  // the daemon has not yet dropped our old registration
}

// zccd answered a registration v1::kRegisterAgain: the rank's previous
// trainer is still retiring (zccd writes and commits its last checkpoint), or
// retired too close to the deadline. Registering again at once waits on, and
// the registration then adopts that trainer's snapshots.
inline bool RegisterAgain(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable &&
         absl::StartsWith(st.message(), v1::kRegisterAgain);
}

// A client's RegisterRequest.client_instance: random, never 0.
inline uint64_t RandomInstance() {
  uint64_t id = 0;
  try {
    std::random_device device;
    id = (uint64_t{device()} << 32) ^ device();
  } catch (const std::exception&) {
    // (No entropy source here: the clock and the pid tell clients apart.)
    id = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) * 0x9e3779b97f4a7c15ull ^
         static_cast<uint64_t>(::getpid());
  }
  return id == 0 ? 1 : id;
}

// One live registration with zccd: the mapped staging segment and the copy
// regions for every slot, computed once so that Snapshot does no per-tensor work
// beyond handing them to the copier.
// How long zccd may go without a heartbeat before a session takes it for
// gone: the trainer's daemon_timeout, or four of zccd's own beat intervals
// (as its registration reply gave it, at most a minute) where zccd beats more
// slowly than that allows.
inline absl::Duration EffectiveDaemonTimeout(absl::Duration configured,
                                             const v1::RegisterResponse& resp) {
  const uint32_t beat_ms = std::min<uint32_t>(resp.daemon_heartbeat_interval_ms(), 60'000);
  return std::max(configured, 4 * absl::Milliseconds(beat_ms));
}

struct Session {
  v1::RegisterResponse resp;
  shm::Segment segment;
  std::shared_ptr<DeviceCopier> copier;
  std::vector<std::vector<CopyRegion>> full_regions;  // per slot
  std::vector<std::vector<CopyRegion>> ema_regions;   // per slot
  std::atomic<bool> dead{false};
  // Set while Client::ReplaceTensors has zccd replace this registration:
  // zccd closing it then is no reason to drop it (the call swaps it).
  std::atomic<bool> being_replaced{false};
  // Restore-read attempts up to this one are not for a restore still to
  // come: an adopted segment's, or one a finished restore was served from
  // (EarlyCopy copies from later ones only).
  std::atomic<uint64_t> early_copy_floor{0};
  // The segment pinned for the copier in the background, slot by slot;
  // copies out of or into a slot wait for its piece. Declared after the
  // segment: unregistered before it is unmapped.
  std::unique_ptr<StagingPins> pins;

  // Starts pinning the segment: the control block with slot 0 (where zccd
  // puts a restore), then each further slot.
  Session(v1::RegisterResponse r, shm::Segment s, std::shared_ptr<DeviceCopier> c)
      : resp(std::move(r)), segment(std::move(s)), copier(std::move(c)) {
    early_copy_floor.store(resp.restore_attempts_before());
    std::vector<size_t> cuts;
    for (uint32_t i = 1; i < num_slots(); ++i) {
      cuts.push_back(static_cast<size_t>(slot(i) - segment.base()));
    }
    pins = std::make_unique<StagingPins>(copier, segment.base(), segment.size(), std::move(cuts));
  }
  shm::ControlBlock* cb() const { return segment.control(); }
  absl::Duration DaemonTimeout(absl::Duration configured) const {
    return EffectiveDaemonTimeout(configured, resp);
  }
  uint32_t num_slots() const { return resp.num_slots(); }
  // Raises early_copy_floor to the newest read published in the segment.
  void RaiseEarlyCopyFloor() {
    const uint64_t read = shm::ReadRestoreProgress(*cb()).attempt;
    for (uint64_t floor = early_copy_floor.load();
         floor < read && !early_copy_floor.compare_exchange_weak(floor, read);) {
    }
  }
  uint8_t* slot(uint32_t i) const { return segment.slot(i, resp.slot_bytes()); }
};

struct PendingCopy {
  std::shared_ptr<Session> session;
  uint32_t slot = 0;
  int64_t step = 0;
  SnapshotKind kind = SnapshotKind::kFull;
  CopyTicket ticket = 0;
};


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

// A restore zccd has read and checked that the client has not copied into
// the trainer's tensors yet (Client::Impl::FetchRestore): the ranks of a job
// restoring together copy only once every rank has its step. The buffer is
// zccd's until CopyOut, or the destructor, says the client is done with it.
struct PendingRestore {
  std::shared_ptr<Session> session;
  std::shared_ptr<const Stubs> stubs;
  std::vector<TensorRef> refs;
  v1::RestoreResponse resp;
  std::optional<shm::Segment> buffer;  // a restore buffer; empty: the session's segment
  RestoreResult result;
  std::function<absl::Status()> release;  // RestoreDone; run once
  // The timeline the rank adopts with RestoreDone (RestoreDoneRequest's:
  // the ranks restored this step together and every one has it; empty:
  // none).
  std::string adopt_timeline;
  // Per registered tensor: copied from this very read while it went on
  // (RestoreOptions::early_copy); CopyOut leaves them out.
  std::vector<bool> copied_early;

  PendingRestore() = default;
  PendingRestore(const PendingRestore&) = delete;
  PendingRestore& operator=(const PendingRestore&) = delete;
  // A restore dropped unread (the ranks chose another step, or failed):
  // zccd is told, and if it cannot be, it frees the buffer when the client
  // goes away; worth a line in the log either way.
  ~PendingRestore() {
    const absl::Status released = Release();
    if (!released.ok()) {
      ZCC_LOG(WARNING) << "zcc client: could not release an unused restore buffer: " << released;
    }
  }
  absl::Status Release() {
    if (!release) return absl::OkStatus();
    auto once = std::move(release);
    release = nullptr;
    return once();
  }
};

}  // namespace client_internal

// Client::Impl belongs to zcc::Client; its parts live in client_internal.
using client_internal::PendingCopy;
using client_internal::PendingRestore;
using client_internal::Session;
using client_internal::Stubs;

struct Client::Impl {
  ClientOptions options;
  // This client among all (RegisterRequest.client_instance): random, not 0.
  const uint64_t instance = client_internal::RandomInstance();
  // The client's copier: ClientOptions::copier (then user_copier), or the
  // one copy_backend chose; null for kCudaIpc, where every registration
  // makes its daemon-pull copier (Session::copier).
  std::shared_ptr<DeviceCopier> copier;
  bool user_copier = false;

  mutable zcc::Mutex mu;
  std::shared_ptr<const Stubs> stubs ABSL_GUARDED_BY(mu);
  std::vector<TensorRef> tensors ABSL_GUARDED_BY(mu);
  bool tensors_registered ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<Session> session ABSL_GUARDED_BY(mu);
  std::deque<PendingCopy> queue ABSL_GUARDED_BY(mu);
  uint64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  // The session of the copy the notifier is waiting for (taken off the
  // queue; null between copies): FenceBeforeUpdate fences its copier too.
  std::shared_ptr<Session> waited_session ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;  // Close() ran (or is running)
  std::string last_error ABSL_GUARDED_BY(mu);
  // The timeline this rank's snapshots belong to (the last registration's
  // or restore's answer, or what a restore together adopted): named again
  // when it registers again.
  std::string timeline ABSL_GUARDED_BY(mu);
  // ReplaceTensors is registering the new tensors: the monitor registers
  // nothing meanwhile (it would register the old ones beside them).
  bool replacing ABSL_GUARDED_BY(mu) = false;
  // zccd gave the rank to a trainer that registered after this one
  // (kTakenOver): this client never registers again.
  bool taken_over ABSL_GUARDED_BY(mu) = false;

  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> published{0};
  std::atomic<uint64_t> skipped_no_slot{0};
  std::atomic<uint64_t> skipped_disconnected{0};
  std::atomic<uint64_t> skipped_copy_failed{0};
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

  std::unique_ptr<grpc::ClientContext> Context() const { return Context(options.rpc_timeout); }
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    return ctx;
  }

  // A request about this client's registration `s`: job, rank, generation.
  template <typename Request>
  Request AddressedTo(const Session& s) const {
    Request req;
    req.set_job_id(options.job_id);
    req.set_rank(options.rank);
    req.set_generation(s.resp.generation());
    return req;
  }

  // Tells zccd the client is done with a restore or EMA buffer.
  // Asks zccd for the step `options` name (collective aside) and checks its
  // reply against the registration; nothing is copied yet.
  absl::StatusOr<std::unique_ptr<PendingRestore>> FetchRestore(const RestoreOptions& options);
  // Waits until the snapshots taken so far are published (their copies out
  // of the trainer's tensors done); DeadlineExceeded after restore_timeout.
  absl::Status AwaitSnapshotsPublishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Copies a fetched restore into the tensors (on `stream`) and releases its
  // buffer (unless `release` is false: the caller does, with
  // pending.Release()); returns what was restored.
  // Leaves out the tensors pending.copied_early names.
  absl::StatusOr<RestoreResult> CopyOut(PendingRestore& pending, void* stream,
                                        bool release = true);
  // FetchRestore, with the tensors options.early_copy marks copied out as
  // zccd checks them (early_copy.h); those that need no copy from the reply
  // are named in the result's copied_early.
  absl::StatusOr<std::unique_ptr<PendingRestore>> FetchRestoreCopyingEarly(
      const RestoreOptions& options, void* stream);

  absl::Status ReleaseBuffer(const Stubs& via, const Session& s, uint64_t id,
                             const std::string& adopt_timeline = "") const {
    auto done = AddressedTo<v1::RestoreDoneRequest>(s);
    done.set_restore_id(id);
    done.set_timeline(adopt_timeline);
    v1::RestoreDoneResponse done_resp;
    auto ctx = Context();
    return FromGrpcStatus(via.control->RestoreDone(ctx.get(), done, &done_resp));
  }

  // `prefetch_restore`: RegisterRequest's (the first registration only);
  // `replaces_generation`: its also (Client::ReplaceTensors).
  absl::StatusOr<std::shared_ptr<Session>> RegisterOnce(const std::vector<TensorRef>& refs,
                                                       const Stubs& via,
                                                       bool prefetch_restore = false,
                                                       uint64_t replaces_generation = 0);
  // Marks `s` dead and, when it is the current session, drops it (`why`
  // logged and kept as the last error): the monitor registers again.
  void DropSession(const std::shared_ptr<Session>& s, const std::string& why);
  // DropSession for a session taken over (TakenOver): the current one's
  // rank belongs to its successor now, so the monitor does not register it
  // again (the two trainers would take it from each other, or this one's
  // registrations be refused forever).
  void DropTakenOver(const std::shared_ptr<Session>& s);
  // zccd gave the rank's shared memory to a trainer that registered after
  // this one (it took this one for dead: stalled past the heartbeat
  // timeout, where it cannot see the process): nothing of this one may go
  // there any more, snapshots nor heartbeats.
  bool TakenOver(Session& s);
  static constexpr char kTakenOver[] =
      "zccd gave this rank's shared memory to a trainer of the rank that registered after this "
      "one (this one was stalled past its heartbeat timeout and taken for dead)";
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

}  // namespace zcc

#endif  // ZCC_CLIENT_CLIENT_IMPL_H_
