// RankSession's ingest and writer stages, driven through a real staging
// segment the way a trainer drives it (claim a free slot, fill it, publish it,
// ring the doorbell), with a disk the test can stall.
#include "daemon/rank/rank_session.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/file_util.h"
#include "common/futex.h"
#include "common/mutex.h"
#include "common/testing/eventually.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "config/daemon_config.h"
#include "daemon/control/registration.h"
#include "daemon/rank/rank_ema.h"
#include "ema/ema_updater.h"
#include "format/manifest.h"
#include "metrics/metrics.h"
#include "shm/control_block.h"
#include "shm/segment.h"
#include "shm/slot_ring.h"
#include "storage/posix_storage.h"
#include "storage/storage_wrapper.h"

namespace zcc::daemon {
namespace {

using shm::SlotState;

constexpr uint32_t S(SlotState s) { return static_cast<uint32_t>(s); }
constexpr int kTensors = 2;
constexpr int kElements = 4096;
constexpr float kDecay = 0.5f;

// A disk that stalls while the test holds its gate closed: opening a file for
// writing waits until the gate opens.
class GatedStorage final : public storage::StorageWrapper {
 public:
  GatedStorage() : StorageWrapper(storage::DefaultStorage()) {}
  void SetOpen(bool open) {
    MutexLock lock(&mu_);
    open_ = open;
  }
  // Whether a writer is waiting at the closed gate, within `timeout`.
  bool AwaitBlockedWriter(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&blocked_), timeout);
  }

  absl::StatusOr<std::unique_ptr<storage::File>> OpenForWrite(
      const std::string& path, const storage::OpenOptions& options) override {
    {
      MutexLock lock(&mu_);
      blocked_ = !open_;
      mu_.Await(absl::Condition(&open_));
      blocked_ = false;
    }
    return base()->OpenForWrite(path, options);
  }

 private:
  Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
};

// What a trainer writes into tensor `t` at `step`.
float Value(int t, int64_t step, int i) { return static_cast<float>(step * 10 + t) + i * 1e-3f; }

// One rank of a one-rank job with kTensors EMA-eligible f32 parameters, its
// session started on a fresh segment, persisting every `save_every` steps.
class TestRank {
 public:
  // `reserve_later`: slot 1's memory is reserved by the session in the
  // background, as the registry does for large segments.
  // `on_replicate`, `replicate_every`: the peer tier's (RankSessionOptions).
  // `after_slot_read`: RankSessionOptions' (on the ingest thread).
  TestRank(const std::string& root, uint32_t save_every, storage::Storage* storage,
           bool reserve_later = false,
           std::function<void(checkpoint::RankStepBytes)> on_replicate = nullptr,
           uint32_t replicate_every = 0, uint32_t num_slots = 2,
           std::function<void(int64_t, int64_t, bool)> on_trained_on = nullptr,
           std::function<void(uint32_t)> after_slot_read = nullptr)
      : num_slots_(num_slots) {
    v1::RegisterRequest req;
    req.set_job_id("job");
    req.set_rank(0);
    req.set_world_size(1);
    req.set_num_slots(num_slots_);
    req.set_save_every(save_every);
    req.set_ema_decay(kDecay);
    for (int t = 0; t < kTensors; ++t) {
      v1::TensorSpec* spec = req.add_tensors();
      spec->set_name(absl::StrCat("w", t));
      spec->set_dtype(v1::F32);
      spec->add_shape(kElements);
      spec->set_kind(v1::PARAM);
      spec->set_ema_eligible(true);
    }
    DaemonConfig config;
    config.default_root = root;
    uint64_t hash = 0;
    auto registered = ParseTensors(req, config, &hash);
    REQUIRE_OK(registered);
    REQUIRE_OK(AssignStaged(req, &*registered));
    auto shards = ShardsFor(req, &*registered, hash, config);
    REQUIRE_OK(shards);
    offsets_.clear();
    std::vector<ema::EmaTensorSpec> specs;
    std::vector<size_t> ema_index;
    for (size_t i = 0; i < registered->size(); ++i) {
      offsets_.push_back((*registered)[i].slot_offset);
      specs.push_back({(*registered)[i].name, format::DType::kF32, kElements});
      ema_index.push_back(i);
    }
    std::vector<ema::EmaTensorSpec> specs_for_restart = specs;
    ema::EmaOptions ema_options;
    ema_options.decay = kDecay;
    auto ema = ema::EmaUpdater::Create(std::move(specs), ema_options);
    REQUIRE_OK(ema);
    slot_bytes_ = shards->layout.slot_bytes;
    // Tests run in pid namespaces: the pid alone may repeat between runs.
    const std::string name =
        absl::StrCat("zcc_rs_test.", ::getpid(), ".", absl::GetCurrentTimeNanos(), ".", ++count_);
    name_ = name;
    auto segment = shm::Segment::Create(
        name, shm::SegmentBytes(num_slots_, slot_bytes_), static_cast<uid_t>(-1),
        reserve_later ? shm::ControlBlockBytes() + slot_bytes_ : ~uint64_t{0});
    REQUIRE_OK(segment);
    shm::InitControlBlock(segment->control(), num_slots_, slot_bytes_, 1,
                          shards->manifest_hash);
    cb_ = segment->control();
    if (reserve_later) shm::SlotRing(cb_, 2).HoldBack(1);
    RankSessionOptions options;
    options.job_dir = JoinPath(root, "job");
    options.num_slots = num_slots_;
    options.save_every = save_every;
    options.io.storage = storage;
    options.io.direct_io = false;
    options.on_replicate = std::move(on_replicate);
    options.replicate_every = replicate_every;
    options.on_trained_on = std::move(on_trained_on);
    options.after_slot_read = std::move(after_slot_read);
    REQUIRE_OK(MakeDirs(options.job_dir));
    shards_ = *shards;
    registered_ = *registered;
    options_ = options;
    ema_index_ = ema_index;
    specs_ = std::move(specs_for_restart);
    session_ = std::make_shared<RankSession>(
        *shards, *registered, std::move(*segment), options,
        [this](const PersistEvent& e) {
          MutexLock lock(&mu_);
          persisted_.push_back(e.status.ok() ? e.step : -1);
        },
        std::move(*ema), ema_index);
    if (reserve_later) session_->ReserveInBackground({1});
    session_->Start();
  }
  ~TestRank() { session_->Stop(); }

  const std::string& segment_name() const { return name_; }
  shm::ControlBlock* cb() const { return cb_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

  // The trainer dies and another registers the same tensors: the session
  // stops, and a new one adopts its segment holding its intact snapshots
  // (at most `hold` of them, newest first), as the registry does. Returns
  // the steps held.
  // `ema_interval`: the new trainer's (RankSessionOptions::ema_interval).
  std::vector<int64_t> RestartAdopting(size_t hold, uint32_t ema_interval = 1) {
    session_->Stop();
    std::shared_ptr<RankSession> old = session_;
    std::vector<SlotSnapshot> intact = old->IntactSnapshots();
    shm::Segment segment = old->TakeSegment();
    shm::InitControlBlock(segment.control(), num_slots_, slot_bytes_, 2, shards_.manifest_hash);
    cb_ = segment.control();
    Inheritance inherited;
    inherited.predecessor = old;
    shm::SlotRing ring(cb_, num_slots_);
    for (const SlotSnapshot& s : intact) {
      if (inherited.held.size() == hold) break;
      ring.Hold(s.slot, s.step);
      inherited.held.push_back(s);
    }
    std::vector<int64_t> steps;
    for (const SlotSnapshot& s : inherited.held) steps.push_back(s.step);
    ema::EmaOptions ema_options;
    ema_options.decay = kDecay;
    ema_options.interval = ema_interval;
    options_.ema_interval = ema_interval;
    auto ema = ema::EmaUpdater::Create(specs_, ema_options);
    REQUIRE_OK(ema);
    session_ = std::make_shared<RankSession>(shards_, registered_, std::move(segment), options_,
                                             [](const PersistEvent&) {}, std::move(*ema),
                                             ema_index_, std::move(inherited));
    session_->Start();
    return steps;
  }

  // As the client: claim a free slot (waiting up to `timeout` for one), fill
  // it with step's values, publish it. False when no slot came free.
  bool Snapshot(int64_t step, absl::Duration timeout = absl::Seconds(10), float salt = 0,
                shm::SnapshotKind kind = shm::SnapshotKind::kFull) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const uint32_t bell = cb_->free_bell.load(std::memory_order_acquire);
      for (uint32_t i = 0; i < num_slots_; ++i) {
        uint32_t expected = S(SlotState::kFree);
        if (!cb_->slots[i].state.compare_exchange_strong(expected, S(SlotState::kFilling))) {
          continue;
        }
        uint8_t* slot = session_->slots().data(i);
        for (int t = 0; t < kTensors; ++t) {
          float* f = reinterpret_cast<float*>(slot + offsets_[t]);
          for (int k = 0; k < kElements; ++k) f[k] = Value(t, step, k) + salt;
        }
        cb_->slots[i].step.store(step, std::memory_order_relaxed);
        cb_->slots[i].kind.store(static_cast<uint32_t>(kind));
        cb_->slots[i].seq.store(cb_->next_seq.fetch_add(1));
        cb_->slots[i].state.store(S(SlotState::kReady), std::memory_order_release);
        cb_->doorbell.fetch_add(1, std::memory_order_release);
        FutexWakeAll(&cb_->doorbell);
        return true;
      }
      if (absl::Now() > deadline) return false;
      FutexWait(&cb_->free_bell, bell, absl::Milliseconds(50));
    }
  }

  // As a trainer with kSkip whose due step finds no free slot: takes over
  // ready slot `index` (published, not yet taken in) and publishes `step`
  // in it. False when the slot was not ready.
  bool TakeOver(uint32_t index, int64_t step) {
    uint32_t expected = S(SlotState::kReady);
    if (!cb_->slots[index].state.compare_exchange_strong(expected, S(SlotState::kFilling))) {
      return false;
    }
    uint8_t* slot = session_->slots().data(index);
    for (int t = 0; t < kTensors; ++t) {
      float* f = reinterpret_cast<float*>(slot + offsets_[t]);
      for (int k = 0; k < kElements; ++k) f[k] = Value(t, step, k);
    }
    cb_->slots[index].step.store(step, std::memory_order_relaxed);
    cb_->slots[index].kind.store(static_cast<uint32_t>(shm::SnapshotKind::kFull));
    cb_->slots[index].seq.store(cb_->next_seq.fetch_add(1));
    cb_->slots[index].state.store(S(SlotState::kReady), std::memory_order_release);
    cb_->doorbell.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&cb_->doorbell);
    return true;
  }

  bool AwaitEmaStep(int64_t step, absl::Duration timeout) {
    return testing::Eventually([&] { return session_->counters().last_ema_step >= step; },
                               timeout, absl::Milliseconds(2));
  }
  bool AwaitPersisted(size_t n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return persisted_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<int64_t> persisted() {
    MutexLock lock(&mu_);
    return persisted_;
  }
  RankSession& session() { return *session_; }
  std::weak_ptr<RankSession> weak_session() const { return session_; }

 private:
  static inline int count_ = 0;
  const uint32_t num_slots_;
  shm::ControlBlock* cb_ = nullptr;
  uint64_t slot_bytes_ = 0;
  std::string name_;
  std::vector<uint64_t> offsets_;
  checkpoint::RankShards shards_;
  std::vector<RegisteredTensor> registered_;
  RankSessionOptions options_;
  std::vector<size_t> ema_index_;
  std::vector<ema::EmaTensorSpec> specs_;
  std::shared_ptr<RankSession> session_;
  Mutex mu_;
  std::vector<int64_t> persisted_ ABSL_GUARDED_BY(mu_);
};

// The EMA after steps 1..n of Value(), starting from step 1's values.
std::vector<float> ReferenceEma(int t, int64_t n) {
  std::vector<float> ema(kElements);
  for (int k = 0; k < kElements; ++k) ema[k] = Value(t, 1, k);
  for (int64_t s = 2; s <= n; ++s) {
    for (int k = 0; k < kElements; ++k) ema[k] = kDecay * ema[k] + (1 - kDecay) * Value(t, s, k);
  }
  return ema;
}

TEST_CASE("a slot whose memory is reserved in the background reaches the client when it is") {
  const std::string root = testing::TempDir();
  TestRank rank(root, 0, nullptr, /*reserve_later=*/true);
  shm::SlotRing ring(rank.cb(), 2);
  // Slot 0 at once; slot 1 once the session has reserved it.
  REQUIRE(testing::Eventually([&] { return ring.FreeCount() == 2; }, absl::Seconds(10)));
  struct stat st;
  REQUIRE(stat(("/dev/shm/" + rank.segment_name()).c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 == shm::SegmentBytes(2, rank.slot_bytes()));
  for (int64_t step = 1; step <= 4; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(testing::Eventually([&] { return rank.session().counters().snapshots_ingested == 4; },
                              absl::Seconds(10)));
}

// Element `i` of tensor `t`'s EMA as `session` keeps it now (CopyEma).
float EmaAt(RankSession& session, int t, int i) {
  const std::string name =
      absl::StrCat("zcc_rs_test_ema.", ::getpid(), ".", absl::GetCurrentTimeNanos());
  auto copied = session.CopyEma(name);
  REQUIRE_OK(copied);
  auto segment = shm::Segment::Open(copied->shm_name(), copied->segment_bytes());
  REQUIRE_OK(segment);
  return reinterpret_cast<const float*>(segment->base() + copied->data_offset() +
                                        copied->placements(t).offset())[i];
}

// Element 7 of tensor 0's EMA over `steps` in order, each folded in after a
// gap of k steps decaying by d^k (ema_interval 1).
double ReferenceEma(std::initializer_list<int64_t> steps) {
  double ema = 0;
  int64_t previous = -1;
  for (int64_t step : steps) {
    const double d = std::pow(kDecay, step - previous);
    ema = previous < 0 ? Value(0, step, 7) : d * ema + (1 - d) * Value(0, step, 7);
    previous = step;
  }
  return ema;
}

// Waits until every slot is back with the trainer.
void AwaitSlotsFree(TestRank& rank) {
  REQUIRE(testing::Eventually([&] { return rank.session().counters().slots_in_use == 0; },
                              absl::Seconds(10), absl::Milliseconds(2)));
}

// Snapshots steps 1 to `last`, each folded into the EMA before the next.
void SnapshotThrough(TestRank& rank, int64_t last) {
  for (int64_t step = 1; step <= last; ++step) {
    REQUIRE(rank.Snapshot(step));
    REQUIRE(rank.AwaitEmaStep(step, absl::Seconds(10)));
  }
}

TEST_CASE("a successor adopts the dead trainer's intact snapshots and its EMA, once") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  SnapshotThrough(rank, 5);
  // Two slots, reused oldest first: steps 4 and 5 are intact; one is held
  // (the registry leaves the trainer a free slot).
  CHECK(rank.RestartAdopting(/*hold=*/1) == std::vector<int64_t>{5});
  RankSession& session = rank.session();
  CHECK(session.MemorySteps() == std::vector<int64_t>{5});
  REQUIRE(session.Held(5).has_value());
  CHECK_FALSE(session.Held(4).has_value());
  const uint8_t* slot = session.slots().data(session.Held(5)->slot);
  for (int t = 0; t < kTensors; ++t) {
    INFO("tensor " << t);
    const float* f = reinterpret_cast<const float*>(slot + session.registered()[t].slot_offset);
    CHECK(f[7] == Value(t, 5, 7));
  }
  CHECK(session.counters().last_ema_step == -1);  // a fresh EMA until a restore takes the old one
  REQUIRE_OK(session.TakePredecessorEma(5));
  CHECK(session.counters().last_ema_step == 5);
  // A second restore from memory keeps it (the take is a swap).
  REQUIRE_OK(session.TakePredecessorEma(5));
  CHECK(session.counters().last_ema_step == 5);
  // Restored: the held slot goes back to the trainer; the memory is gone.
  session.ReleaseHeld(/*restored=*/5);
  CHECK(session.MemorySteps().empty());
  CHECK(session.counters().slots_in_use == 0);
  // The successor dies before snapshotting: step 5 is still in the freed
  // slot, and the next successor holds it again, with the EMA taken over.
  CHECK(rank.RestartAdopting(1) == std::vector<int64_t>{5});
  REQUIRE_OK(rank.session().TakePredecessorEma(5));
  CHECK(rank.session().counters().last_ema_step == 5);
  // Once the trainer snapshots, what it inherited is released.
  REQUIRE(rank.Snapshot(6));
  REQUIRE(rank.AwaitEmaStep(6, absl::Seconds(10)));
  CHECK(rank.session().MemorySteps().empty());
}

TEST_CASE("a successor that ends before it snapshots or restores passes on the first trainer's "
          "EMA with its snapshots") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  SnapshotThrough(rank, 5);
  // Twice a trainer registers and dies before its first step or restore.
  CHECK(rank.RestartAdopting(/*hold=*/1) == std::vector<int64_t>{5});
  const std::weak_ptr<RankSession> first_successor = rank.weak_session();
  CHECK(rank.RestartAdopting(1) == std::vector<int64_t>{5});
  // Its successor inherits from the first trainer's session directly: no
  // chain of empty sessions (each with its EMA's memory) is kept.
  CHECK(first_successor.expired());
  CHECK(rank.RestartAdopting(1) == std::vector<int64_t>{5});
  RankSession& session = rank.session();
  CHECK(session.counters().last_ema_step == -1);
  // The third restores step 5 from memory, with the EMA that folded it in.
  REQUIRE_OK(session.TakePredecessorEma(5));
  CHECK(session.counters().last_ema_step == 5);
  session.ReleaseHeld(/*restored=*/5);
  REQUIRE(rank.Snapshot(6));
  REQUIRE(rank.AwaitEmaStep(6, absl::Seconds(10)));
}

TEST_CASE("a successor that restored an older step from disk and died before copying it out "
          "passes on the snapshots it held with their own EMA, not the one it read") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  SnapshotThrough(rank, 5);
  CHECK(rank.RestartAdopting(/*hold=*/1) == std::vector<int64_t>{5});
  // Its restore of step 3 installed that step's EMA; its trainer died before
  // RestoreDone, so step 5 is still held.
  RankEma::Saved saved;
  saved.present = true;
  saved.data.assign(kTensors, std::vector<float>(kElements, 1.0f));
  REQUIRE_OK(rank.session().InstallEma(std::move(saved), 3));
  CHECK(rank.session().counters().last_ema_step == 3);
  CHECK(rank.RestartAdopting(1) == std::vector<int64_t>{5});
  REQUIRE_OK(rank.session().TakePredecessorEma(5));
  CHECK(rank.session().counters().last_ema_step == 5);
}

TEST_CASE("a restore buffer zccd fills and the rank holds counts in its staging budget until the "
          "client releases it") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  const uint64_t own = rank.session().segment_bytes() + rank.session().ema_bytes();
  CHECK(rank.session().budget_bytes() == own);
  RestoreBuffers& buffers = rank.session().restore_buffers();
  std::optional<RestoreBuffers::Filling> filling = buffers.BeingFilled(1 << 20);
  CHECK(rank.session().budget_bytes() == own + (1 << 20));
  auto segment =
      shm::Segment::Create(absl::StrCat("/zcc-test-budget-restore-", getpid()), 1 << 20);
  REQUIRE_OK(segment.status());
  const uint64_t id = buffers.Add(*std::move(segment), 3);
  filling.reset();
  CHECK(rank.session().budget_bytes() == own + (1 << 20));
  REQUIRE_OK(buffers.Remove(id).status());
  CHECK(rank.session().budget_bytes() == own);
}

TEST_CASE("an EMA taken over by a trainer with another interval decays its next gap in the "
          "new interval") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  SnapshotThrough(rank, 4);  // every step
  CHECK(rank.RestartAdopting(/*hold=*/1, /*ema_interval=*/2) == std::vector<int64_t>{4});
  REQUIRE_OK(rank.session().TakePredecessorEma(4));
  rank.session().ReleaseHeld(/*restored=*/4);
  REQUIRE(rank.Snapshot(5));  // not an EMA step any more
  REQUIRE(rank.Snapshot(6));
  REQUIRE(rank.AwaitEmaStep(6, absl::Seconds(10)));
  CHECK(rank.session().counters().last_ema_step == 6);
  // Steps 4 to 6 are one interval of the new trainer's: decayed by d, not d^2.
  const double want = kDecay * ReferenceEma({1, 2, 3, 4}) + (1 - kDecay) * Value(0, 6, 7);
  const float got = EmaAt(rank.session(), 0, 7);
  INFO("EMA " << got << ", want " << want);
  CHECK(std::abs(got - want) < 1e-3 * std::abs(want));
}

TEST_CASE("two snapshots published while ingest scans the slots are taken in oldest first: the "
          "EMA folds every step, in order") {
  const std::string root = testing::TempDir();
  // Set once steps 1-3 are in: the next scan, as it has read slot 0 (free
  // then), finds steps 4 and 5 published into slots 0 and 1, and reads slot
  // 1 next: the newer alone.
  std::atomic<TestRank*> publisher{nullptr};
  std::atomic<int> published{0};
  auto after_read = [&](uint32_t slot) {
    TestRank* r = publisher.load();
    if (r == nullptr || slot != 0 || published.load() != 0) return;
    published.store(r->Snapshot(4) && r->Snapshot(5) ? 2 : -1);
  };
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage(), false, nullptr, 0,
                /*num_slots=*/3, nullptr, after_read);
  SnapshotThrough(rank, 3);
  AwaitSlotsFree(rank);
  publisher.store(&rank);
  REQUIRE(rank.AwaitEmaStep(5, absl::Seconds(10)));
  REQUIRE(published.load() == 2);
  CHECK(rank.session().counters().ema_out_of_order == 0);
  // The EMA of steps 1 to 5, each folded in once, in order.
  const double want = ReferenceEma({1, 2, 3, 4, 5});
  const float got = EmaAt(rank.session(), 0, 7);
  INFO("EMA " << got << ", want " << want);
  CHECK(std::abs(got - want) < 1e-5 * std::abs(want));
}

TEST_CASE("a slot a due step took over between the scan and its take is taken in after the "
          "older snapshots of its round") {
  const std::string root = testing::TempDir();
  // Once armed, in one round: as the first scan has read slot 0 (free),
  // steps 5, 6 and 7 are published into slots 0, 1 and 2 (the scan sees 6
  // and 7); as the second scan has read slot 2, a due step 8 takes slot 1
  // (step 6, not yet taken in) over. Taken in: 5, then 7, then 8.
  std::atomic<TestRank*> trainer{nullptr};
  std::atomic<int> reads{0};
  std::atomic<int> done{0};
  auto after_read = [&](uint32_t) {
    TestRank* r = trainer.load();
    if (r == nullptr) return;
    const int n = reads.fetch_add(1);
    if (n == 0) done.fetch_add(r->Snapshot(5) && r->Snapshot(6) && r->Snapshot(7) ? 1 : 100);
    if (n == 5) done.fetch_add(r->TakeOver(1, 8) ? 1 : 100);
  };
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage(), false, nullptr, 0,
                /*num_slots=*/3, nullptr, after_read);
  SnapshotThrough(rank, 4);
  AwaitSlotsFree(rank);
  trainer.store(&rank);
  REQUIRE(rank.AwaitEmaStep(8, absl::Seconds(10)));
  REQUIRE(done.load() == 2);
  CHECK(rank.session().counters().ema_out_of_order == 0);
  // Steps 1-5, then 7 (a gap: d^2), then 8; step 6 was the take-over's.
  const double want = ReferenceEma({1, 2, 3, 4, 5, 7, 8});
  const float got = EmaAt(rank.session(), 0, 7);
  INFO("EMA " << got << ", want " << want);
  CHECK(std::abs(got - want) < 1e-5 * std::abs(want));
}

TEST_CASE("a step replayed after a restart is served from the new snapshot, never the old one") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/0, storage::DefaultStorage());
  REQUIRE(rank.Snapshot(4));
  REQUIRE(rank.Snapshot(5));
  REQUIRE(rank.AwaitEmaStep(5, absl::Seconds(10)));
  CHECK(rank.RestartAdopting(/*hold=*/1) == std::vector<int64_t>{5});
  // The new trainer does not restore step 5 from memory: it went back to an
  // older step (say from disk) and replays step 5 with other values; its
  // snapshot releases what it inherited.
  REQUIRE(rank.Snapshot(5, absl::Seconds(10), /*salt=*/1000));
  REQUIRE(testing::Eventually([&] { return rank.session().MemorySteps().empty(); },
                              absl::Seconds(10), absl::Milliseconds(2)));
  REQUIRE(testing::Eventually(
      [&] { return rank.session().counters().snapshots_ingested >= 1; }, absl::Seconds(10),
      absl::Milliseconds(2)));
  // It dies: the successor holds step 5 once, with the replayed values.
  CHECK(rank.RestartAdopting(1) == std::vector<int64_t>{5});
  const RankSession& next = rank.session();
  const uint8_t* slot = next.slots().data(next.Held(5)->slot);
  const float* f = reinterpret_cast<const float*>(slot + next.registered()[0].slot_offset);
  CHECK(f[3] == Value(0, 5, 3) + 1000);
}

// Opens the gate when it goes out of scope (before the rank it is declared
// after stops, which waits for the write in progress).
struct OpenAtEnd {
  GatedStorage* disk;
  ~OpenAtEnd() { disk->SetOpen(true); }
};

// The steps a rank hands to the peer tier; the first waits at a gate until
// Open(), as a slow serialization would.
class GatedReplication {
 public:
  std::function<void(checkpoint::RankStepBytes)> callback() {
    return [this](checkpoint::RankStepBytes step) {
      MutexLock lock(&mu_);
      replicated_.push_back(step.step);
      if (replicated_.size() == 1) mu_.Await(absl::Condition(&open_));
    };
  }
  void Open() {
    MutexLock lock(&mu_);
    open_ = true;
  }
  std::vector<int64_t> replicated() {
    MutexLock lock(&mu_);
    return replicated_;
  }
  size_t count() { return replicated().size(); }

 private:
  Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int64_t> replicated_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("a replication step left out while the previous one serializes goes as soon as the "
          "writer is free, though the trainer snapshots no more") {
  const std::string root = testing::TempDir();
  GatedReplication gate;
  TestRank rank(root, 0, nullptr, false, gate.callback(), /*replicate_every=*/1000);
  REQUIRE(rank.Snapshot(1000));
  REQUIRE(testing::Eventually([&] { return gate.count() == 1; }, absl::Seconds(10)));
  // Step 2000 falls due while step 1000 still serializes: left out, counted.
  REQUIRE(rank.Snapshot(1001));
  REQUIRE(rank.Snapshot(2000));
  REQUIRE(rank.AwaitEmaStep(2000, absl::Seconds(10)));
  CHECK(rank.session().counters().replications_skipped == 1);
  // The trainer pauses (a long evaluation, a stall): once step 1000 is
  // through, step 2000 goes from its slot, without another snapshot.
  gate.Open();
  REQUIRE(testing::Eventually([&] { return gate.count() == 2; }, absl::Seconds(10)));
  CHECK(gate.replicated() == std::vector<int64_t>{1000, 2000});
  // Paid: nothing is owed when the trainer goes.
  CHECK_FALSE(rank.session().ReplicateOwed().has_value());
  CHECK(gate.count() == 2);
}

TEST_CASE("a replication step left out goes with its own EMA or not at all") {
  const std::string root = testing::TempDir();
  GatedReplication gate;
  TestRank rank(root, 0, nullptr, false, gate.callback(), /*replicate_every=*/1000,
                /*num_slots=*/3);
  REQUIRE(rank.Snapshot(1000));
  REQUIRE(testing::Eventually([&] { return gate.count() == 1; }, absl::Seconds(10)));
  REQUIRE(rank.Snapshot(2000));
  // An EMA-only snapshot moves the EMA past step 2000, whose slot stays
  // intact: step 2000 with step 2001's EMA would restore an EMA a step ahead
  // of its model.
  REQUIRE(rank.Snapshot(2001, absl::Seconds(10), 0, shm::SnapshotKind::kEmaOnly));
  REQUIRE(rank.AwaitEmaStep(2001, absl::Seconds(10)));
  CHECK(rank.session().counters().replications_skipped == 1);
  gate.Open();
  // Step 1000 through, the owed step is not sent, even by a trainer going.
  CHECK_FALSE(rank.session().ReplicateOwed().has_value());
  CHECK(gate.replicated() == std::vector<int64_t>{1000});
  // The next FULL snapshot goes in its place.
  REQUIRE(rank.Snapshot(2002));
  REQUIRE(testing::Eventually([&] { return gate.count() == 2; }, absl::Seconds(10)));
  CHECK(gate.replicated() == std::vector<int64_t>{1000, 2002});
}

TEST_CASE("a due replication step left out is in the peer tier before a departing trainer's "
          "session stops") {
  const std::string root = testing::TempDir();
  GatedReplication gate;
  TestRank rank(root, 0, nullptr, false, gate.callback(), /*replicate_every=*/10);
  REQUIRE(rank.Snapshot(10));
  REQUIRE(testing::Eventually([&] { return gate.count() == 1; }, absl::Seconds(10)));
  // Step 20 falls due while step 10 still serializes: left out. Then the
  // trainer stops at step 23, before any snapshot could go in its place.
  for (int64_t step = 11; step <= 23; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitEmaStep(23, absl::Seconds(10)));
  CHECK(rank.session().counters().replications_skipped == 1);
  // The trainer is gone: once step 10 is through, its newest snapshot goes,
  // sent by the call or by ingest as the writer came free, and handed over
  // before the session stops.
  std::optional<int64_t> sent;
  std::thread gone([&] { sent = rank.session().ReplicateOwed(); });
  gate.Open();
  gone.join();
  CHECK((!sent.has_value() || *sent == 23));
  rank.session().Stop();
  CHECK(gate.replicated() == std::vector<int64_t>{10, 23});
  // Paid: a second call hands over nothing.
  CHECK_FALSE(rank.session().ReplicateOwed().has_value());
}

TEST_CASE("a trainer that goes on from a restored step tells it once; that first step is "
          "replicated at once, telling the buddies to drop the rank's newer steps") {
  const std::string root = testing::TempDir();
  Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> replicated;  // step, went_on_from
  std::vector<int64_t> told;
  auto on_replicate = [&](checkpoint::RankStepBytes step) {
    MutexLock lock(&mu);
    replicated.push_back({step.step, step.went_on_from});
  };
  auto on_trained_on = [&](int64_t restored, int64_t step, bool /*from_disk*/) {
    MutexLock lock(&mu);
    told.push_back(restored);
    told.push_back(step);
  };
  TestRank rank(root, 0, nullptr, false, on_replicate, /*replicate_every=*/1000, 2,
                on_trained_on);
  auto count = [&] {
    MutexLock lock(&mu);
    return replicated.size();
  };
  // A restore served step 100 (the run went back to it); a snapshot of it
  // or an older step is no going on yet.
  rank.session().NoteRestored(100);
  REQUIRE(rank.Snapshot(100));
  REQUIRE(rank.AwaitEmaStep(100, absl::Seconds(10)));
  {
    MutexLock lock(&mu);
    CHECK(told.empty());
  }
  REQUIRE(rank.Snapshot(101));
  REQUIRE(testing::Eventually([&] { return count() == 1; }, absl::Seconds(10)));
  for (int64_t step = 102; step <= 104; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitEmaStep(104, absl::Seconds(10)));
  rank.session().Stop();
  MutexLock lock(&mu);
  CHECK(told == std::vector<int64_t>{100, 101});
  // Step 101, not due (every 1000th), went at once, flagged; nothing else.
  CHECK(replicated == std::vector<std::pair<int64_t, int64_t>>{{101, 100}});
}

TEST_CASE("a write of a step the trainer went back from is given up: no manifest stays, no "
          "failure is counted; the same step written again goes through") {
  const std::string root = testing::TempDir();
  GatedStorage disk;
  TestRank rank(root, /*save_every=*/10, &disk);
  disk.SetOpen(false);
  REQUIRE(rank.Snapshot(10));
  REQUIRE(disk.AwaitBlockedWriter(absl::Seconds(10)));
  // The trainer restores step 5 while step 10 is being written.
  rank.session().NoteRestored(5);
  disk.SetOpen(true);
  REQUIRE(rank.AwaitPersisted(1, absl::Seconds(10)));
  CHECK(rank.persisted() == std::vector<int64_t>{-1});
  CHECK(rank.cb()->persist_failures.load() == 0);
  CHECK(rank.session().counters().persist_failures == 0);
  const std::string job_dir = JoinPath(root, "job");
  CHECK_FALSE(PathExists(JoinPath(JoinPath(job_dir, "step-00000010.partial"), "r00000.manifest.json")));
  CHECK_FALSE(PathExists(JoinPath(JoinPath(job_dir, "step-00000010"), "r00000.manifest.json")));
  // On from step 5: its own step 10 is written.
  for (int64_t step = 6; step <= 10; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(2, absl::Seconds(10)));
  CHECK(rank.persisted() == std::vector<int64_t>{-1, 10});
  CHECK(PathExists(JoinPath(JoinPath(job_dir, "step-00000010.partial"), "r00000.manifest.json")));
}

TEST_CASE("the steps a trainer writes after a restore together with the other ranks name the "
          "timeline they adopted; one restoring alone goes on in its step's") {
  const std::string root = testing::TempDir();
  const std::string job_dir = JoinPath(root, "job");
  TestRank rank(root, /*save_every=*/5, storage::DefaultStorage());
  auto timeline_of = [&](int64_t step) {
    const std::string path =
        JoinPath(JoinPath(job_dir, absl::StrCat("step-", absl::Dec(step, absl::kZeroPad8),
                                                ".partial")),
                 "r00000.manifest.json");
    auto text = ReadFileToString(path, 1 << 20);
    REQUIRE_OK(text.status());
    auto manifest = format::DecodeRankManifest(*text);
    REQUIRE_OK(manifest.status());
    return manifest->timeline;
  };
  for (int64_t step = 1; step <= 5; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(1, absl::Seconds(10)));
  CHECK(timeline_of(5).empty());
  // Back to step 3 (read from disk, of no timeline) together with the
  // other ranks, who all have it: from step 4 on, timeline "b" (step 5,
  // written again, too).
  rank.session().NoteRestored(3, /*from_disk=*/true, std::string());
  CHECK(rank.session().Timeline(4).empty());
  rank.session().AdoptTimeline("b");
  CHECK(rank.session().Timeline(3).empty());
  CHECK(rank.session().Timeline(4) == "b");
  for (int64_t step = 4; step <= 10; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(3, absl::Seconds(10)));
  CHECK(rank.persisted() == std::vector<int64_t>{5, 5, 10});
  CHECK(timeline_of(5) == "b");
  CHECK(timeline_of(10) == "b");
  // Restored alone from memory: still "b".
  rank.session().NoteRestored(8);
  for (int64_t step = 9; step <= 15; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(5, absl::Seconds(10)));
  CHECK(timeline_of(15) == "b");
  // Restored alone from disk, a step of timeline "x": on in "x".
  rank.session().NoteRestored(12, /*from_disk=*/true, std::string("x"));
  CHECK(rank.session().Timeline(12) == "b");
  CHECK(rank.session().Timeline(13) == "x");
  for (int64_t step = 13; step <= 15; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(6, absl::Seconds(10)));
  CHECK(timeline_of(15) == "x");
  // Two restores together, the first not trained on: the snapshots before
  // them stay of "x", those after are of the last one's "d".
  rank.session().NoteRestored(14);
  rank.session().AdoptTimeline("c");
  rank.session().NoteRestored(13);
  CHECK(rank.session().Timeline(14) == "c");
  rank.session().AdoptTimeline("d");
  CHECK(rank.session().Timeline(13) == "x");
  CHECK(rank.session().Timeline(14) == "d");
  for (int64_t step = 14; step <= 20; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(8, absl::Seconds(10)));
  CHECK(timeline_of(15) == "d");
  CHECK(timeline_of(20) == "d");
}

TEST_CASE("persist-on-failure after the trainer went back writes its newest step, older than "
          "the one persisted before the restore") {
  const std::string root = testing::TempDir();
  TestRank rank(root, /*save_every=*/10, storage::DefaultStorage());
  for (int64_t step = 1; step <= 10; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitPersisted(1, absl::Seconds(10)));
  REQUIRE(rank.persisted() == std::vector<int64_t>{10});
  // Back to step 5, on to step 8, and the trainer dies.
  rank.session().NoteRestored(5);
  for (int64_t step = 6; step <= 8; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitEmaStep(8, absl::Seconds(10)));
  CHECK(rank.session().PersistNewestOnFailure() == std::optional<int64_t>(8));
  CHECK(rank.persisted() == std::vector<int64_t>{10, 8});
}

TEST_CASE("a trainer that goes with no replication owed hands nothing over") {
  const std::string root = testing::TempDir();
  GatedReplication gate;
  gate.Open();
  TestRank rank(root, 0, nullptr, false, gate.callback(), /*replicate_every=*/10);
  for (int64_t step = 1; step <= 13; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitEmaStep(13, absl::Seconds(10)));
  CHECK_FALSE(rank.session().ReplicateOwed().has_value());
  CHECK(gate.replicated() == std::vector<int64_t>{10});
}

TEST_CASE("a checkpoint being written stalls neither the trainer nor the EMA") {
  const std::string root = testing::TempDir();
  GatedStorage disk;
  TestRank rank(root, /*save_every=*/10, &disk);
  OpenAtEnd open_at_end{&disk};

  REQUIRE(rank.Snapshot(1));
  REQUIRE(rank.AwaitEmaStep(1, absl::Seconds(10)));
  disk.SetOpen(false);
  rank.session().RequestSave();
  REQUIRE(rank.Snapshot(2));  // goes to the writer, which blocks on the disk
  REQUIRE(disk.AwaitBlockedWriter(absl::Seconds(10)));

  // With step 2's slot held by the stalled write, the other slot keeps
  // cycling: every snapshot is taken and folded into the EMA.
  for (int64_t step = 3; step <= 9; ++step) {
    INFO("step " << step);
    REQUIRE(rank.Snapshot(step, absl::Seconds(10)));
    REQUIRE(rank.AwaitEmaStep(step, absl::Seconds(10)));
  }
  CHECK(rank.persisted().empty());
  CHECK(rank.session().counters().last_persisted_step == -1);

  disk.SetOpen(true);
  REQUIRE(rank.AwaitPersisted(1, absl::Seconds(30)));
  CHECK(rank.persisted() == std::vector<int64_t>{2});
  REQUIRE(rank.Snapshot(10));  // due
  REQUIRE(rank.AwaitPersisted(2, absl::Seconds(30)));
  CHECK(rank.persisted() == std::vector<int64_t>{2, 10});

  // Step 2's EMA shard holds the EMA as of step 2, not of the steps ingested
  // while it waited for the disk.
  const std::string step_dir = JoinPath(root, "job/step-00000002.partial");
  for (int t = 0; t < kTensors; ++t) {
    std::vector<float> ema(kElements);
    REQUIRE_OK(checkpoint::ReadRankTensors(
        step_dir, 0,
        {{absl::StrCat("w", t), "ema", format::DType::kF32, {kElements},
          reinterpret_cast<uint8_t*>(ema.data()), ema.size() * sizeof(float)}}));
    const std::vector<float> want = ReferenceEma(t, 2);
    float worst = 0;
    for (int k = 0; k < kElements; ++k) worst = std::max(worst, std::abs(ema[k] - want[k]));
    CHECK(worst < 1e-3f);  // the EMA of step 9 is about 60 away
  }
}

TEST_CASE("persist-on-failure waits for a write in progress, then writes the newest snapshot") {
  const std::string root = testing::TempDir();
  GatedStorage disk;
  TestRank rank(root, /*save_every=*/4, &disk);
  OpenAtEnd open_at_end{&disk};
  for (int64_t step = 1; step <= 3; ++step) REQUIRE(rank.Snapshot(step));
  REQUIRE(rank.AwaitEmaStep(3, absl::Seconds(10)));
  disk.SetOpen(false);
  REQUIRE(rank.Snapshot(4));  // due
  REQUIRE(disk.AwaitBlockedWriter(absl::Seconds(10)));
  REQUIRE(rank.Snapshot(5));
  REQUIRE(rank.AwaitEmaStep(5, absl::Seconds(10)));

  // The trainer dies now; the daemon persists its newest snapshot (5) once
  // the write of 4 is through.
  std::optional<int64_t> saved;
  std::thread failure([&] { saved = rank.session().PersistNewestOnFailure(); });
  absl::SleepFor(absl::Milliseconds(50));
  disk.SetOpen(true);
  failure.join();
  CHECK(saved == std::optional<int64_t>(5));
  CHECK(rank.persisted() == std::vector<int64_t>{4, 5});
  CHECK(rank.session().counters().last_persisted_step == 5);
}

TEST_CASE("a snapshot taken in after a later one is counted as left out of the EMA, in the "
          "rank's counter and in zcc_ema_snapshots_left_out_total; a step replayed after a "
          "restore is not") {
  metrics::ZccMetrics exported;
  ema::EmaOptions options;
  options.decay = 0.5;
  auto updater = ema::EmaUpdater::Create({{"w", format::DType::kF32, 4}}, options);
  REQUIRE(updater.ok());
  RegisteredTensor w;
  w.name = "w";
  w.dtype = format::DType::kF32;
  w.shape = {4};
  w.nbytes = 16;
  w.ema_eligible = true;
  RankEma rank_ema(std::move(*updater), {w}, "job", 0, /*interval=*/1, &exported);
  const std::vector<float> slot = {1, 2, 3, 4};
  const auto* bytes = reinterpret_cast<const uint8_t*>(slot.data());
  auto left_out = [&exported](metrics::EmaLeftOut reason) {
    return exported.ema_left_out(reason).value();
  };
  CHECK_FALSE(rank_ema.Update(bytes, 16, /*step=*/2, /*seq=*/2).has_value());
  CHECK(rank_ema.last_step() == 2);
  // Step 1, published before step 2, taken in after it.
  CHECK_FALSE(rank_ema.Update(bytes, 16, 1, 1).has_value());
  CHECK(rank_ema.out_of_order() == 1);
  CHECK(left_out(metrics::EmaLeftOut::kOutOfOrder) == 1);
  // Step 2 again, published after (a trainer that went back to step 1 and
  // trained on, behind an EMA kept newer): not folded in, not out of order.
  CHECK_FALSE(rank_ema.Update(bytes, 16, 2, 3).has_value());
  CHECK(rank_ema.out_of_order() == 1);
  CHECK(left_out(metrics::EmaLeftOut::kOutOfOrder) == 1);
  // A non-finite parameter: skipped and counted under its own reason.
  const std::vector<float> bad = {1, NAN, 3, 4};
  auto skipped = rank_ema.Update(reinterpret_cast<const uint8_t*>(bad.data()), 16, 4, 4);
  REQUIRE(skipped.has_value());
  CHECK(absl::StrContains(skipped->message, "NaN or Inf"));
  CHECK(left_out(metrics::EmaLeftOut::kNonFinite) == 1);
  CHECK(left_out(metrics::EmaLeftOut::kOutOfOrder) == 1);
}

}  // namespace
}  // namespace zcc::daemon
