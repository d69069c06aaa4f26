// Restore and EMA reads: zccd fills a buffer segment, the client copies it
// into the trainer's tensors and releases the buffer.
#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/early_copy.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "shm/control_block.h"
#include "shm/restore_progress.h"

namespace zcc {

using client_internal::IsTransient;

absl::StatusOr<int64_t> Client::Restore(int64_t step, void* stream) {
  RestoreOptions options;
  options.step = step;
  ZCC_ASSIGN_OR_RETURN(RestoreResult result, Restore(options, stream));
  return result.step;
}

absl::StatusOr<RestoreCandidates> Client::ListRestoreCandidates(bool owned_only) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) return absl::UnavailableError("not registered with zccd");
  auto req = im.AddressedTo<v1::RestoreCandidatesRequest>(*s);
  req.set_owned_only(owned_only);
  v1::RestoreCandidatesResponse resp;
  // A restore's deadline: zccd may first bring the newest step in from the
  // peer tier or from the memory of the job's previous layout.
  auto ctx = im.Context(im.options.restore_timeout);
  const std::shared_ptr<const Stubs> stubs = im.GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(stubs->control->RestoreCandidates(ctx.get(), req, &resp)));
  RestoreCandidates out;
  out.memory_steps.assign(resp.memory_steps().begin(), resp.memory_steps().end());
  out.disk_steps.assign(resp.disk_steps().begin(), resp.disk_steps().end());
  return out;
}

namespace {

// Checks zccd's reply against the registration before any byte is copied:
// every restored placement must lie inside the buffer.
absl::Status CheckRestorePlacements(const v1::RestoreResponse& resp,
                                    const std::vector<TensorRef>& refs, bool owned_only) {
  if (static_cast<size_t>(resp.placements_size()) != refs.size() ||
      resp.data_offset() > resp.segment_bytes()) {
    return absl::DataLossError("zccd's restore reply does not match the registration");
  }
  const uint64_t room = resp.segment_bytes() - resp.data_offset();
  for (size_t i = 0; i < refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    if (!p.staged()) {
      if (!owned_only) {
        return absl::DataLossError(
            absl::StrCat("zccd's restore reply leaves out tensor '", refs[i].name, "'"));
      }
      continue;
    }
    if (p.name() != refs[i].name || p.nbytes() != *format::TensorBytes(refs[i].dtype, refs[i].shape) ||
        p.offset() > room || p.nbytes() > room - p.offset()) {
      return absl::DataLossError(
          absl::StrCat("zccd's restore placement of '", refs[i].name, "' is inconsistent"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoreResult> Client::Restore(const RestoreOptions& options, void* stream) {
  if (options.collective != nullptr) return RestoreTogether(options, stream);
  ZCC_ASSIGN_OR_RETURN(std::unique_ptr<PendingRestore> pending,
                       impl_->FetchRestoreCopyingEarly(options, stream));
  return impl_->CopyOut(*pending, stream);
}

absl::StatusOr<std::unique_ptr<PendingRestore>> Client::Impl::FetchRestoreCopyingEarly(
    const RestoreOptions& options, void* stream) {
  std::shared_ptr<Session> s = CurrentSession();
  // Whatever this restore had read, and however it ends, none of those reads
  // is a later restore's to copy from early.
  absl::Cleanup raise_floor = [&s] {
    if (s != nullptr) s->RaiseEarlyCopyFloor();
  };
  if (std::find(options.early_copy.begin(), options.early_copy.end(), true) ==
      options.early_copy.end()) {
    return FetchRestore(options);
  }
  std::vector<TensorRef> refs;  // the tensors the early copy writes (outlives it)
  {
    zcc::MutexLock lock(&mu);
    refs = tensors;
  }
  if (options.early_copy.size() != refs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RestoreOptions::early_copy has ", options.early_copy.size(), " entries for ",
        refs.size(), " registered tensors"));
  }
  if (s == nullptr) return FetchRestore(options);  // fails: not registered
  // The snapshots in flight read the tensors the early copy writes: they
  // finish first (FetchRestore waits for them too, for another reason).
  {
    zcc::MutexLock lock(&mu);
    ZCC_RETURN_IF_ERROR(AwaitSnapshotsPublishedLocked());
  }
  // Copies out what zccd has checked while it reads the rest.
  client_internal::EarlyCopy early(*s, refs, options.early_copy, stream);
  absl::StatusOr<std::unique_ptr<PendingRestore>> pending = FetchRestore(options);
  client_internal::EarlyCopy::Copied copied = early.Stop();
  if (!copied.status.ok()) {
    ZCC_LOG(WARNING) << "zcc client: copying as zccd checked failed (" << copied.status
                     << "); copying after the whole step instead";
  }
  if (!pending.ok()) return pending.status();
  // Served from the read copied from: those tensors are in place already.
  PendingRestore& p = **pending;
  if (copied.attempt != 0 && copied.status.ok() && !p.buffer.has_value() &&
      p.resp.restore_attempt() == copied.attempt && p.session == s) {
    p.copied_early = std::move(copied.tensors);
  }
  return pending;
}

absl::Status Client::Impl::AwaitSnapshotsPublishedLocked() {
  auto idle = [](Impl* im) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return im->queue.empty() && im->in_flight == 0;
  };
  if (!mu.AwaitWithTimeout(absl::Condition(+idle, this), options.restore_timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("snapshots taken before the restore still in flight after ",
                     absl::FormatDuration(options.restore_timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PendingRestore>> Client::Impl::FetchRestore(
    const RestoreOptions& restore) {
  auto pending = std::make_unique<PendingRestore>();
  pending->session = CurrentSession();
  if (pending->session == nullptr) {
    zcc::MutexLock lock(&mu);
    return absl::UnavailableError(absl::StrCat("not registered with zccd: ",
                                               last_error.empty() ? "call RegisterTensors first"
                                                                  : last_error));
  }
  const Session& s = *pending->session;
  {
    zcc::MutexLock lock(&mu);
    // The snapshots taken before are published first: zccd tells them from
    // the restored state by their order (a write of a step the trainer went
    // back from is given up).
    ZCC_RETURN_IF_ERROR(AwaitSnapshotsPublishedLocked());
    pending->refs = tensors;
  }
  auto req = AddressedTo<v1::RestoreRequest>(s);
  req.set_step(restore.step);
  req.set_owned_only(restore.owned_only);
  req.set_allow_older(restore.allow_older);
  v1::RestoreResponse& resp = pending->resp;
  // Its own deadline: reading a large checkpoint takes longer than an RPC.
  auto ctx = Context(options.restore_timeout);
  pending->stubs = GetStubs();
  ZCC_RETURN_IF_ERROR(FromGrpcStatus(pending->stubs->control->Restore(ctx.get(), req, &resp)));
  // (The pending restore owns the call: its adopt_timeline is read then.)
  pending->release = [this, p = pending.get(), id = resp.restore_id()] {
    return ReleaseBuffer(*p->stubs, *p->session, id, p->adopt_timeline);
  };
  for (const std::string& why : resp.skipped_steps()) {
    ZCC_LOG(WARNING) << "zcc client: restore skipped " << why;
  }
  {
    // (zccd noted the restore: the rank's next snapshots are of this one.)
    zcc::MutexLock lock(&mu);
    timeline = resp.timeline();
  }
  RestoreResult& result = pending->result;
  result.step = resp.step();
  result.from_memory = resp.source() == v1::RESTORE_SOURCE_MEMORY;
  result.ema_step = resp.has_ema_step() ? resp.ema_step() : -1;
  result.skipped_steps.assign(resp.skipped_steps().begin(), resp.skipped_steps().end());
  result.missing.assign(resp.missing().begin(), resp.missing().end());
  for (const v1::TensorPlacement& p : resp.placements()) result.restored.push_back(p.staged());
  ZCC_RETURN_IF_ERROR(CheckRestorePlacements(resp, pending->refs, restore.owned_only));
  // From memory, the bytes are in this client's own staging segment, already
  // mapped (and registered with the copier); otherwise in a buffer of their own.
  if (resp.shm_name() == s.resp.shm_name()) {
    if (resp.segment_bytes() != s.segment.size()) {
      return absl::DataLossError("zccd's restore reply has the wrong size for the staging segment");
    }
  } else {
    ZCC_ASSIGN_OR_RETURN(shm::Segment opened, shm::Segment::Open(resp.shm_name(), resp.segment_bytes()));
    pending->buffer.emplace(std::move(opened));
  }
  return pending;
}

absl::StatusOr<RestoreResult> Client::Impl::CopyOut(PendingRestore& pending, void* stream,
                                                    bool release) {
  const Session& s = *pending.session;
  const v1::RestoreResponse& resp = pending.resp;
  const bool own_segment = !pending.buffer.has_value();
  const shm::Segment& from = own_segment ? s.segment : *pending.buffer;
  const uint8_t* base = from.base() + resp.data_offset();
  std::vector<CopyRegion> regions;
  for (size_t i = 0; i < pending.refs.size(); ++i) {
    const v1::TensorPlacement& p = resp.placements(i);
    if (i < pending.copied_early.size() && pending.copied_early[i]) continue;  // same read
    if (p.staged()) regions.push_back(CopyRegion{base + p.offset(), pending.refs[i].data, p.nbytes()});
  }
  // From the session's segment: the pieces holding the step pinned first.
  size_t extent = 0;
  for (const CopyRegion& r : regions) {
    extent = std::max<size_t>(extent, static_cast<const uint8_t*>(r.src) + r.nbytes - base);
  }
  absl::Status copied = own_segment ? s.pins->Await(base, extent)
                                    : s.copier->RegisterHostMemory(from.base(), from.size());
  if (copied.ok()) {
    copied = s.copier->CopyToDevice(regions, stream);
    if (!own_segment) {
      const absl::Status unpinned = s.copier->UnregisterHostMemory(from.base());
      if (copied.ok()) copied = unpinned;
    }
  }
  const absl::Status released = release ? pending.Release() : absl::OkStatus();
  ZCC_RETURN_IF_ERROR(copied);
  ZCC_RETURN_IF_ERROR(released);
  return std::move(pending.result);
}

absl::StatusOr<int64_t> Client::ReadEma(const std::vector<EmaOutput>& outputs, int64_t min_step,
                                         absl::Duration wait) {
  Impl& im = *impl_;
  std::shared_ptr<Session> s = im.CurrentSession();
  if (s == nullptr) return absl::UnavailableError("not registered with zccd");
  auto req = im.AddressedTo<v1::ReadEmaRequest>(*s);
  wait = std::max(wait, absl::ZeroDuration());
  if (min_step >= 0) {
    req.set_min_step(min_step);
    req.set_wait_s(absl::ToDoubleSeconds(wait));
  }
  v1::ReadEmaResponse resp;
  auto ctx = im.Context(im.options.rpc_timeout + (min_step >= 0 ? wait : absl::ZeroDuration()));
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

}  // namespace zcc
