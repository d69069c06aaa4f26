#include "daemon/restore/restore_service.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/committer.h"
#include "checkpoint/io_options.h"
#include "checkpoint/reader.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "common/fs_identity.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/restore/restore_tiers.h"
#include "daemon/restore/restorer.h"
#include "daemon/restore/slot_read_publisher.h"
#include "format/manifest.h"
#include "shm/control_block.h"
#include "shm/restore_progress.h"
#include "storage/posix_storage.h"

namespace zcc::daemon {

namespace {

checkpoint::IoOptions ReadingThrough(storage::Storage* storage) {
  checkpoint::IoOptions io;
  io.storage = storage;
  return io;
}

}  // namespace

RestoreService::RestoreService(std::string shm_prefix, uint64_t max_slot_bytes,
                               metrics::ZccMetrics* metrics, storage::Storage* storage,
                               StagingPool* pool)
    : shm_prefix_(std::move(shm_prefix)),
      max_slot_bytes_(max_slot_bytes),
      metrics_(metrics),
      pool_(pool),
      kept_(&storage::StorageOrDefault(storage)),
      read_io_(ReadingThrough(&kept_)),
      // The checks read the step's own files (the store's), headers only.
      checks_(metrics, ReadingThrough(storage)) {}

std::string RestoreService::BufferName(const char* what, const std::string& job_id, uint32_t rank,
                                       uint64_t generation) {
  return absl::StrCat(shm_prefix_, ".", job_id, ".r", rank, ".", what, ".g", generation, ".",
                      next_buffer_seq_.fetch_add(1));
}

namespace {

// Held snapshots serve a restore only when it wants just what the rank
// stages, or the rank stages everything.
std::vector<int64_t> ServableMemorySteps(const RankSession& session, bool owned_only) {
  if (!owned_only && !session.AllStaged()) return {};
  return session.MemorySteps();
}

}  // namespace

void RestoreService::StartPrefetch(Job& job, RankSession& session, uint32_t rank) {
  // The trainer snapshots into the other slots meanwhile; a restore from
  // memory needs no read.
  if (session.options().num_slots < 2 || !session.MemorySteps().empty()) return;
  // Nothing committed (a new job): no slot is held even for a moment, so a
  // first snapshot right after the registration finds it free.
  const std::string job_dir = job.options().job_dir;
  {
    ScopedFsIdentity as_owner(job.options().owner);
    auto committed = checkpoint::ListCommittedSteps(job_dir, read_io_.storage);
    if (!committed.ok() || committed->empty()) return;
  }
  std::optional<uint32_t> slot = session.slots().TakeForRestore();
  if (!slot.has_value()) return;
  // From now until the read ends (or nothing is to be read): the background
  // reservation of the trainer's other slots waits for it.
  auto reading = std::make_shared<std::unique_ptr<StagingSlots::RestoreRead>>(
      std::make_unique<StagingSlots::RestoreRead>(session.slots()));
  auto choose = [this, &job, job_dir, rank]()
      -> absl::StatusOr<std::optional<RestorePrefetch::Chosen>> {
    ScopedFsIdentity as_owner(job.options().owner);
    auto choice = checkpoint::ChooseRestoreStep(
        job_dir, -1, [this](const std::string& dir) { return checks_.Check(dir); }, INT64_MAX,
        read_io_.storage);
    if (choice.status().code() == absl::StatusCode::kNotFound) return std::nullopt;
    if (!choice.ok()) return choice.status();
    RestorePrefetch::Chosen chosen;
    chosen.step = choice->step;
    chosen.step_dir = JoinPath(job_dir, format::StepDirName(choice->step));
    // Kept from retention while read, like a restore's step; none is read
    // ahead when retention is taking it.
    if (!job.BeginRestore(rank, chosen.step)) return std::nullopt;
    auto index = checks_.Index(chosen.step_dir);
    if (!index.ok()) {
      job.EndRestore(rank, chosen.step);
      return index.status();
    }
    chosen.index = *std::move(index);
    return chosen;
  };
  auto read = [this, &job, &session, slot = *slot, reading](
                  const RestorePrefetch::Chosen& chosen, const std::function<bool()>& cancelled) {
    ScopedFsIdentity as_owner(job.options().owner);
    // The client may copy out what is checked while the rest is read.
    SlotReadPublisher progress(session.slots().control(), slot, session.registered());
    auto read = ReadIntoSlot(chosen.step_dir, *chosen.index, session.registered(),
                             session.slots().data(slot), read_io_, cancelled,
                             [&progress](size_t i) { progress.Checked(i); });
    reading->reset();
    return read;
  };
  auto finish = [this, &job, &session, rank, slot = *slot, reading](
                    const std::optional<RestorePrefetch::Chosen>& chosen, bool slot_taken) {
    reading->reset();
    if (chosen.has_value()) job.EndRestore(rank, chosen->step);
    if (slot_taken) return;
    if (chosen.has_value()) {
      metrics_->restore_prefetches(metrics::PrefetchOutcome::kDiscarded).Increment();
    }
    session.slots().ReleaseRestore(slot);
  };
  session.SetPrefetch(std::make_unique<RestorePrefetch>(*slot, std::move(choose), std::move(read),
                                                        std::move(finish)));
}

absl::StatusOr<v1::RestoreCandidatesResponse> RestoreService::Candidates(Job& job,
                                                                         RankSession& session,
                                                                         bool owned_only) {
  v1::RestoreCandidatesResponse resp;
  for (int64_t step : ServableMemorySteps(session, owned_only)) resp.add_memory_steps(step);
  ScopedFsIdentity as_owner(job.options().owner);
  ZCC_ASSIGN_OR_RETURN(const std::set<int64_t> steps,
                       RestoreTiers::AllSteps(job.options().job_dir, job.options().upload_dir,
                                              read_io_.storage));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) resp.add_disk_steps(*it);
  return resp;
}

v1::RestoreResponse RestoreService::RestoreFromMemory(RankSession& session,
                                                      const v1::RestoreRequest& req,
                                                      const SlotSnapshot& held) {
  const uint32_t slot = held.slot;
  const int64_t step = held.step;
  // The EMA goes with the snapshot: the previous trainer's, as of its death.
  if (absl::Status st = session.TakePredecessorEma(step); !st.ok()) {
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << st.message();
  }
  const uint64_t slot_bytes = session.shards().layout.slot_bytes;
  v1::RestoreResponse resp;
  resp.set_step(step);
  resp.set_source(v1::RESTORE_SOURCE_MEMORY);
  // (A rank restoring it alone goes on in the timeline it belongs to.)
  resp.set_timeline(held.timeline);
  if (const std::optional<int64_t> ema = session.ema_step(); ema.has_value()) {
    resp.set_ema_step(*ema);
  }
  resp.set_shm_name(session.slots().name());
  resp.set_segment_bytes(session.segment_bytes());
  resp.set_data_offset(shm::ControlBlockBytes() + uint64_t{slot} * slot_bytes);
  for (const RegisteredTensor& t : session.registered()) {
    v1::TensorPlacement* p = resp.add_placements();
    p->set_name(t.name);
    p->set_offset(t.staged ? t.slot_offset : 0);
    p->set_nbytes(t.nbytes);
    p->set_staged(t.staged);
  }
  // Done once the client has copied it out: the held slots go back to it.
  resp.set_restore_id(session.restore_buffers().Add(
      std::nullopt, step, [&session, step] { session.ReleaseHeld(step); }));
  metrics_->restores(metrics::RestoreSource::kMemory).Increment();
  ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": restoring step " << step
                << " from memory (the previous trainer's snapshot)";
  return resp;
}

std::optional<SlotSnapshot> RestoreService::ServedFromMemory(Job& job, RankSession& session,
                                                             const v1::RestoreRequest& req) {
  // From memory when the step asked for is held, or, asked for the newest,
  // when the newest held snapshot is at least as new as the newest commit
  // (of the job's current run: not one above `latest`, left behind by a
  // run that went back to an older step).
  const std::vector<int64_t> in_memory = ServableMemorySteps(session, req.owned_only());
  if (in_memory.empty()) return std::nullopt;
  int64_t want = req.step();
  if (want < 0) {
    auto on_disk = checkpoint::NewestOnTimeline(job.options().job_dir, read_io_.storage);
    const int64_t newest_disk = on_disk.ok() ? *on_disk : -1;
    if (in_memory.front() >= newest_disk) want = in_memory.front();
  }
  if (want < 0) return std::nullopt;
  return session.Held(want);
}

absl::StatusOr<v1::RestoreResponse> RestoreService::Restore(
    Job& job, RankSession& session, const v1::RestoreRequest& req,
    const std::function<bool()>& cancelled) {
  const std::string& job_dir = job.options().job_dir;
  // Read with the job owner's identity: nothing planted in the directory can
  // make zccd read what that user could not.
  ScopedFsIdentity as_owner(job.options().owner);
  // A read begun at registration serves this restore when it is of the step
  // chosen below (and of what this restore wants); otherwise it is dropped,
  // its slot freed, before anything else is read.
  std::unique_ptr<RestorePrefetch> prefetch = session.TakePrefetch();
  if (std::optional<SlotSnapshot> held = ServedFromMemory(job, session, req)) {
    return RestoreFromMemory(session, req, *held);
  }
  // Each rejected step once, in the order found (a step rejected in one
  // round is rejected again, from the cache, in the next).
  std::vector<std::string> skipped;
  auto skip = [&](const std::string& why) {
    if (std::find(skipped.begin(), skipped.end(), why) != skipped.end()) return;
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank()
                     << ": restore skipped " << why;
    skipped.push_back(why);
  };
  // The choice checks metadata only; a piece that does not match its
  // checksum shows while it is read. Such a step is marked bad and the choice
  // made again, so a restore of the newest step falls back to the next older
  // one that reads back intact. Each round rejects one more step, so this
  // ends.
  int64_t requested = req.step() < 0 ? -1 : req.step();
  int64_t at_most = INT64_MAX;
  // Steps read again, all from the store, after a read that took files from
  // this node's kept copy failed (once each).
  std::set<std::string> read_again;
  // The local root, and a tiered job's store (restore_tiers.h).
  RestoreTiers tiers(job_dir, job.options().upload_dir, requested, read_io_.storage);
  if (job.options().node_local_root && !job.options().upload_dir.empty()) {
    kept_.Watch(job.options().upload_dir, job_dir);
  }
  if (!tiers.why_store_first().empty()) {
    ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": "
                  << tiers.why_store_first() << "; restoring from " << tiers.current();
  }
  const std::function<absl::Status(const std::string&)> check = [this](const std::string& dir) {
    return checks_.Check(dir);
  };
  for (;;) {
    if (cancelled()) return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
    absl::StatusOr<checkpoint::RestoreChoice> chosen =
        checkpoint::ChooseRestoreStep(tiers.current(), requested, check, at_most, read_io_.storage);
    // A newer step whose copy here is damaged is read from the other tier's
    // copy of it rather than falling back past it (a tiered job's local disk
    // and store each hold one).
    std::optional<RestoreTiers::Elsewhere> elsewhere;
    if (chosen.ok() ? !chosen->rejected.empty() : absl::IsNotFound(chosen.status())) {
      elsewhere = tiers.IntactElsewhere(chosen.ok() ? chosen->step : -1, requested, at_most,
                                        check, read_io_.storage);
    }
    if (elsewhere.has_value()) {
      const std::string name = format::StepDirName(elsewhere->step);
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": the copy of "
                       << name << " in " << tiers.current()
                       << " cannot be restored; reading the same step from "
                       << elsewhere->step_dir;
      checkpoint::RestoreChoice same;
      same.step = elsewhere->step;
      if (chosen.ok()) {
        // The steps passed over here, but the one read from there.
        for (std::string& why : chosen->rejected) {
          if (!absl::StartsWith(why, name + ":")) same.rejected.push_back(std::move(why));
        }
      }
      chosen = std::move(same);
    } else if (absl::IsNotFound(chosen.status()) && tiers.Next()) {
      ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": "
                    << chosen.status().message() << "; restoring from " << tiers.current();
      continue;
    }
    // An explicit step that may fall back, found unrestorable before any
    // read (another rank's read marked it damaged, say, as ranks restoring
    // together ask for one step each): the next older one, as if this
    // restore had found the damage itself.
    if (absl::IsNotFound(chosen.status()) && requested >= 0 && req.allow_older()) {
      const std::string why(chosen.status().message());
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << why
                       << "; falling back to an older step";
      skipped.push_back(why);
      at_most = std::min(at_most, requested - 1);
      requested = -1;
      continue;
    }
    ZCC_ASSIGN_OR_RETURN(checkpoint::RestoreChoice choice, std::move(chosen));
    for (const std::string& why : choice.rejected) skip(why);
    const std::string step_name = format::StepDirName(choice.step);
    const std::string step_dir =
        elsewhere.has_value() ? elsewhere->step_dir : JoinPath(tiers.current(), step_name);
    // Kept from retention while read. Retention may have taken the step
    // since the choice: then it is gone, not damaged, and nothing marks it.
    const bool pinned = job.BeginRestore(req.rank(), choice.step);
    absl::Cleanup unpin = [&job, &req, &choice, pinned] {
      if (pinned) job.EndRestore(req.rank(), choice.step);
    };
    absl::StatusOr<format::CommitRecord> record =
        pinned ? checkpoint::ReadCommitRecord(step_dir, read_io_.storage)
               : absl::NotFoundError("retention is removing it");
    // (One whose COMMITTED record became unreadable since the choice is
    // passed over the same way, as the choice would now.)
    if (!record.ok() &&
        (absl::IsNotFound(record.status()) || absl::IsDataLoss(record.status()))) {
      const std::string why = absl::StrCat(
          step_name,
          absl::IsNotFound(record.status())
              ? ": no longer committed (removed since this restore chose it: "
              : ": its commit record cannot be read (",
          record.status().message(), ")");
      if (req.step() >= 0 && !req.allow_older()) return absl::NotFoundError(why);
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << why
                       << "; choosing again among older steps";
      skipped.push_back(why);
      requested = -1;
      at_most = std::min(at_most, choice.step - 1);
      continue;
    }
    if (!record.ok()) return Annotate(record.status(), absl::StrCat("restore of ", step_name));
    std::unique_ptr<RestorePrefetch> ahead;
    if (prefetch != nullptr && (req.owned_only() || session.AllStaged())) {
      std::optional<RestorePrefetch::Chosen> read_ahead = prefetch->AwaitChoice(cancelled);
      if (read_ahead.has_value() && read_ahead->step_dir == step_dir) ahead = std::move(prefetch);
    }
    prefetch.reset();
    auto resp = RestoreStep(session, req, step_dir, choice.step, cancelled, ahead.get());
    ahead.reset();  // its slot is the restore's now, or freed
    if (resp.ok()) metrics_->restores(metrics::RestoreSource::kDisk).Increment();
    if (resp.ok()) {
      for (const std::string& why : skipped) resp->add_skipped_steps(why);
      return resp;
    }
    const bool damaged = resp.status().code() == absl::StatusCode::kDataLoss ||
                         resp.status().code() == absl::StatusCode::kNotFound;
    if (!damaged) return Annotate(resp.status(), absl::StrCat("restore of ", step_name));
    if (kept_.Served(step_dir) && read_again.insert(step_dir).second) {
      // Perhaps only this node's copy of the step is damaged: read it again,
      // all from the store, before calling the step damaged.
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << step_name
                       << " read partly from this node's kept copy failed ("
                       << resp.status().message()
                       << "); the copy is dropped and the step read again from " << step_dir;
      kept_.Forget(step_dir);
      continue;
    }
    // Remembered whether or not this request falls back, so that no later
    // restore reads the step again.
    const absl::Status why(resp.status().code(),
                           absl::StrCat("damaged, found while reading it: ", resp.status().message()));
    checks_.MarkDamaged(step_dir, record->manifest_hash, why);
    if (!elsewhere.has_value() &&
        tiers.IntactElsewhere(choice.step - 1, choice.step, choice.step, check,
                              read_io_.storage)) {
      // The other tier's copy of this step, read next round (the copy here
      // is rejected from now on). Not a step skipped: the same one comes.
      ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << step_dir
                       << " is " << why.message();
      continue;
    }
    if (req.step() >= 0 && !req.allow_older()) {
      return Annotate(why, absl::StrCat("restore of ", step_name));
    }
    // Only older steps from here on (an explicit step's fallback never
    // lands on a newer one).
    requested = -1;
    at_most = choice.step - 1;
    // (The next round's choice rejects it with these same words: skip() then
    // leaves them out.)
    skipped.push_back(absl::StrCat(step_name, ": ", why.message()));
    ZCC_LOG(WARNING) << "job " << req.job_id() << " rank " << req.rank() << ": " << step_name
                     << " is " << why.message() << "; falling back to an older step";
  }
}

void RestoreService::PlaceInSlot(RankSession& session, uint32_t slot,
                                 v1::RestoreResponse* resp) const {
  // The read that filled the slot was the last one published (reads of a
  // rank's slots come one at a time): a client that copied from that attempt
  // as it went need not copy those tensors again.
  const shm::RestoreProgress progress = shm::ReadRestoreProgress(*session.slots().control());
  if (progress.attempt > 0 && progress.slot == slot) resp->set_restore_attempt(progress.attempt);
  resp->set_shm_name(session.slots().name());
  resp->set_segment_bytes(session.segment_bytes());
  resp->set_data_offset(session.slots().Offset(slot));
  for (const RegisteredTensor& t : session.registered()) {
    v1::TensorPlacement* p = resp->add_placements();
    p->set_name(t.name);
    p->set_offset(t.staged ? t.slot_offset : 0);
    p->set_nbytes(t.nbytes);
    p->set_staged(t.staged);
  }
}

absl::StatusOr<uint64_t> RestoreService::ReadIntoStaging(
    RankSession& session, const v1::RestoreRequest& req, const std::string& step_dir,
    const checkpoint::GroupedIndex& index, const std::function<bool()>& cancelled,
    RestorePrefetch* ahead, std::optional<uint32_t>* slot) {
  absl::StatusOr<uint64_t> read = uint64_t{0};
  if (ahead != nullptr) {
    // Read since registration: wait for what is left of it.
    std::optional<absl::StatusOr<uint64_t>> taken = ahead->TakeRead(cancelled);
    if (!taken.has_value()) {
      return absl::CancelledError("restore cancelled (zccd stopping or client gone)");
    }
    *slot = ahead->slot();
    read = *std::move(taken);
    metrics_->restore_prefetches(metrics::PrefetchOutcome::kUsed).Increment();
  } else if (req.owned_only() || session.AllStaged()) {
    *slot = session.slots().TakeForRestore();
    if (slot->has_value()) {
      StagingSlots::RestoreRead reading(session.slots());
      SlotReadPublisher progress(session.slots().control(), **slot, session.registered());
      read = ReadIntoSlot(step_dir, index, session.registered(), session.slots().data(**slot),
                          read_io_, cancelled, [&progress](size_t i) { progress.Checked(i); });
    }
  }
  if (!read.ok() && slot->has_value()) {
    session.slots().ReleaseRestore(**slot);
    slot->reset();
  }
  return read;
}

absl::StatusOr<uint64_t> RestoreService::ReadIntoBuffer(
    RankSession& session, const v1::RestoreRequest& req, const std::string& step_dir,
    const checkpoint::GroupedIndex& index, const std::string& shm_name,
    const std::function<bool()>& cancelled, v1::RestoreResponse* resp,
    std::optional<shm::Segment>* segment, std::optional<RestoreBuffers::Filling>* filling) {
  const std::vector<RegisteredTensor>& registered = session.registered();
  const MakeSegment make_segment = [this, &session, filling](const std::string& name,
                                                              uint64_t bytes, uid_t owner) {
    filling->emplace(session.restore_buffers().BeingFilled(bytes));
    return pool_ == nullptr ? shm::Segment::Create(name, bytes, owner)
                            : pool_->MakeSegment(name, bytes, owner);
  };
  ZCC_ASSIGN_OR_RETURN(
      RestoreBuffer buffer,
      ReadRestoreBuffer(step_dir, index, registered, shm_name, max_slot_bytes_,
                        session.options().segment_owner, read_io_, cancelled, req.owned_only(),
                        &shared_reads_, make_segment));
  resp->set_shm_name(shm_name);
  resp->set_segment_bytes(buffer.segment.size());
  resp->set_data_offset(buffer.data_offset);
  for (size_t i = 0; i < registered.size(); ++i) {
    v1::TensorPlacement* p = resp->add_placements();
    p->set_name(registered[i].name);
    p->set_offset(buffer.offsets[i]);
    p->set_nbytes(registered[i].nbytes);
    p->set_staged(buffer.restored[i]);
  }
  segment->emplace(std::move(buffer.segment));
  return buffer.bytes_read;
}

absl::StatusOr<v1::RestoreResponse> RestoreService::RestoreStep(
    RankSession& session, const v1::RestoreRequest& req, const std::string& step_dir,
    int64_t step, const std::function<bool()>& cancelled, RestorePrefetch* ahead) {
  // Any world size and layout: the step describes global tensors. (Kept
  // from retention by the caller while it is read.)
  const std::string shm_name = BufferName("restore", req.job_id(), req.rank(), req.generation());
  const absl::Time read_start = absl::Now();
  auto failed = [this](absl::Status st) {
    metrics_->errors(metrics::ErrorKind::kRestore).Increment();
    return st;
  };
  auto index = checks_.Index(step_dir);
  if (!index.ok()) return failed(index.status());
  // Outside every lock: the only read of the tensor data, each piece checked
  // as it arrives. Straight into a free staging slot when it holds all that
  // is asked for (the client has it mapped and, on a GPU, registered); into
  // a buffer of its own otherwise. On failure nothing is handed out: the
  // slot is freed, the buffer's segment removed (its handle did it).
  // The EMA's own tensors (as many bytes as the parameters in fp32) are read
  // beside the others, not after them, and installed only once the whole
  // step has been read and checked: a failed restore leaves the EMA as it was.
  std::atomic<bool> abandon_ema{false};
  const std::function<bool()> ema_cancelled = [&abandon_ema, &cancelled] {
    return abandon_ema.load(std::memory_order_relaxed) || (cancelled && cancelled());
  };
  absl::StatusOr<RankEma::Saved> saved_ema = RankEma::Saved{};
  // (The thread starts with this one's file identity, ScopedFsIdentity's
  // where the caller set one: it reads as the job's owner.)
  std::thread ema_reader([&] {
    saved_ema = session.ReadEma(step_dir, **index, read_io_.storage, &ema_cancelled);
  });
  absl::Cleanup join_ema_reader = [&] {
    if (!ema_reader.joinable()) return;
    abandon_ema.store(true, std::memory_order_relaxed);
    ema_reader.join();
  };
  v1::RestoreResponse resp;
  std::optional<uint32_t> slot;
  std::optional<RestoreBuffers::Filling> buffer_filling;  // (declared first: goes last)
  std::optional<shm::Segment> buffer_segment;
  absl::StatusOr<uint64_t> read =
      ReadIntoStaging(session, req, step_dir, **index, cancelled, ahead, &slot);
  if (read.ok() && slot.has_value()) {
    PlaceInSlot(session, *slot, &resp);
  } else if (read.ok()) {
    read = ReadIntoBuffer(session, req, step_dir, **index, shm_name, cancelled, &resp,
                          &buffer_segment, &buffer_filling);
  }
  if (read.ok()) ema_reader.join();
  std::move(join_ema_reader).Invoke();
  const absl::Duration read_time = absl::Now() - read_start;
  metrics_->restore_seconds().ObserveDuration(read_time);
  if (!read.ok()) {
    // A prefetch the cancellation cut short is not a restore error.
    if (absl::IsCancelled(read.status()) && ahead != nullptr) return read.status();
    return failed(read.status());
  }
  // The EMA's bytes were read from the step too.
  const uint64_t bytes_read = *read + (saved_ema.ok() ? saved_ema->bytes() : 0);
  metrics_->restore_bytes_read().Increment(bytes_read);
  // (At the step it was last updated at, which the step records where it
  // is not the step's own: a step between EMA updates holds an older one.)
  const int64_t ema_step = (*index)->index.ema_step >= 0 ? (*index)->index.ema_step : step;
  const absl::Status ema_installed =
      saved_ema.ok() ? session.InstallEma(*std::move(saved_ema), ema_step) : saved_ema.status();
  if (!ema_installed.ok()) {
    if (slot.has_value()) session.slots().ReleaseRestore(*slot);
    // (As for the read: a prefetch the cancellation cut short is no error.)
    if (absl::IsCancelled(ema_installed) && ahead != nullptr) return ema_installed;
    return failed(Annotate(ema_installed, "the EMA"));
  }
  resp.set_step(step);
  resp.set_source(v1::RESTORE_SOURCE_DISK);
  // The timeline the step belongs to, from the index it was read by: a
  // rank restoring it alone goes on in it (Registry::Restore).
  resp.set_timeline((*index)->index.timeline);
  const std::vector<std::string> missing = MissingOptional(**index, session.registered());
  for (const std::string& name : missing) resp.add_missing(name);
  if (const std::optional<int64_t> ema = session.ema_step(); ema.has_value()) {
    resp.set_ema_step(*ema);
  }
  // Once the client has copied it out: the slot goes back, and snapshots
  // held in memory are of no more use (the trainer restored from disk).
  resp.set_restore_id(session.restore_buffers().Add(
      std::move(buffer_segment), step, [&session, slot] {
        if (slot.has_value()) session.slots().ReleaseRestore(*slot);
        session.ReleaseHeld();
      }));
  // Read ahead: the read's own time, and how much of it this restore waited.
  const double seconds = absl::ToDoubleSeconds(ahead != nullptr ? ahead->ReadTime() : read_time);
  ZCC_LOG(INFO) << "job " << req.job_id() << " rank " << req.rank() << ": restored "
                << format::StepDirName(step) << " into "
                << (slot.has_value() ? absl::StrCat("staging slot ", *slot) : shm_name)
                << absl::StrFormat(" (%.3f GB read in %.2f s, %.2f GB/s", bytes_read / 1e9, seconds,
                                   seconds > 0 ? bytes_read / seconds / 1e9 : 0.0)
                << (ahead != nullptr
                        ? absl::StrFormat("; read ahead from the registration on, %.2f s of it "
                                          "waited for by the restore)",
                                          absl::ToDoubleSeconds(read_time))
                        : std::string(")"))
                << (missing.empty() ? ""
                                    : absl::StrCat("; ", missing.size(),
                                                   " optional tensor(s) not in the step, "
                                                   "restored as zeros: ",
                                                   absl::StrJoin(missing, ", ")));
  return resp;
}

}  // namespace zcc::daemon
