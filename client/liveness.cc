// The client's liveness and recovery: its heartbeat thread (heartbeats both
// ways, nothing else), and the monitor thread (re-registration with backoff
// after zccd went away, reports of checkpoint writes zccd failed).
#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "shm/control_block.h"

namespace zcc {

using client_internal::IsTransient;

bool Client::WaitConnected(absl::Duration timeout) {
  Impl* im = impl_.get();
  zcc::MutexLock lock(&im->mu);
  // A session that died stays in place (dead set without mu) until the
  // monitor drops or replaces it, both under mu, which wakes this wait.
  return im->mu.AwaitWithTimeout(
      absl::Condition(
          +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) {
            return i->stopping || i->taken_over ||
                   (i->session != nullptr && !i->session->dead.load());
          },
          im),
      timeout) &&
         im->session != nullptr && !im->session->dead.load();
}

bool Client::Impl::TakenOver(Session& s) {
  // (A word zccd writes once per registration of the rank: read whole.)
  return !s.being_replaced.load() &&
         __atomic_load_n(&s.cb()->generation, __ATOMIC_ACQUIRE) != s.resp.generation();
}

void Client::Impl::DropSession(const std::shared_ptr<Session>& s, const std::string& why) {
  s->dead.store(true);
  zcc::MutexLock lock(&mu);
  // (An earlier session, found dead after its successor registered, says
  // nothing of the current one.)
  if (session != s) return;
  session.reset();
  last_error = why;
  ZCC_LOG(WARNING) << "zcc client: " << why << "; snapshots are skipped until zccd is back";
}

void Client::Impl::DropTakenOver(const std::shared_ptr<Session>& s) {
  s->dead.store(true);
  zcc::MutexLock lock(&mu);
  // An earlier session of this client's is taken over by this client's own
  // later registration: nothing more to do.
  if (session != s) return;
  session.reset();
  taken_over = true;
  last_error = absl::StrCat(kTakenOver, "; this trainer takes no more snapshots and does not "
                                        "register again");
  ZCC_LOG(ERROR) << "zcc client: " << last_error;
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
    if (s != nullptr && !s->dead.load() && TakenOver(*s)) {
      // Not even its heartbeat goes there any more: it would keep the
      // successor's registration looking alive after the successor died.
      DropTakenOver(s);
    } else if (s != nullptr && !s->dead.load()) {
      shm::ControlBlock* cb = s->cb();
      const uint64_t now = shm::MonotonicNanos();
      cb->client_heartbeat_ns.store(now, std::memory_order_relaxed);
      const uint64_t daemon_beat = cb->daemon_heartbeat_ns.load(std::memory_order_relaxed);
      if (cb->closed.load() != 0 && !s->being_replaced.load()) {
        DropSession(s, "zccd closed this registration");
      } else if (daemon_beat < now &&
                 absl::Nanoseconds(now - daemon_beat) > s->DaemonTimeout(options.daemon_timeout)) {
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
  // The session whose failures `seen` counts (weak: another session made
  // later at the same address is not mistaken for it).
  std::weak_ptr<Session> watched;
  uint64_t seen_failures = 0;
  while (true) {
    std::shared_ptr<Session> s;
    std::vector<TensorRef> refs;
    bool need_register = false;
    {
      zcc::MutexLock lock(&mu);
      if (stopping) return;
      s = session;
      need_register = tensors_registered && s == nullptr && !replacing && !taken_over;
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
      if (client_internal::RegisterAgain(fresh.status())) {
        // zccd held the request as long as it could: again at once.
        backoff = absl::Milliseconds(100);
        continue;
      }
      wait = backoff;
      backoff = std::min(backoff * 2, options.reconnect_max_backoff);
    } else if (s != nullptr) {
      if (watched.owner_before(s) || s.owner_before(watched)) {
        watched = s;
        seen_failures = 0;
      }
      ReportCheckpointFailures(*s, &seen_failures);
    }
    zcc::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&stopping), wait);
  }
}

}  // namespace zcc
