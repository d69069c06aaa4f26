// A trainer process for integration tests: registers one of the synthetic
// models of tests/test_model.h, whose bytes are a pure function of (tensor
// name, step), so any process can check a restore without having seen the run.
//
//   test_trainer --mode=train   --steps=N [--start=S] ...  snapshot after every step
//   test_trainer --mode=restore [--expect_step=S]          restore and verify bytes
//
// Prints "key=value" result lines on stdout for the test to parse.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/tcp_collective.h"
#include "tests/test_model.h"

#ifdef ZCC_FAKE_DEVICE_TENSORS
#include "cuda/fake_cudart/fake_cudart.h"
#endif

ABSL_FLAG(std::string, mode, "train", "train, restore, or resume (restore, then train from the next step)");
ABSL_FLAG(std::string, socket, "", "zccd socket");
ABSL_FLAG(std::string, job, "itest", "job id");
ABSL_FLAG(std::string, root, "", "checkpoint root");
ABSL_FLAG(std::string, upload_root, "", "the tiered mode's object-store root (s3://...)");
ABSL_FLAG(int, upload_keep_last, 0, "steps kept in the store (0: zccd's keep_last)");
ABSL_FLAG(std::string, run_id, "", "the job's run (the same on every rank of a run)");
ABSL_FLAG(bool, node_local_root, false,
          "the tiered mode on node-local disks: each zccd uploads its own ranks' files");
ABSL_FLAG(std::string, store_key_id, "", "the job's own access key id for an s3:// root");
ABSL_FLAG(std::string, store_secret, "", "the job's own secret key for an s3:// root");
ABSL_FLAG(int, rank, 0, "global rank");
ABSL_FLAG(int, world, 1, "world size");
ABSL_FLAG(int, steps, 10, "steps to train");
ABSL_FLAG(int, start, 1, "first step");
ABSL_FLAG(int, save_every, 5, "checkpoint every N steps");
ABSL_FLAG(int, tensors, 6, "parameters (each also gets an optimizer tensor)");
ABSL_FLAG(int, kib, 256, "KiB per parameter tensor");
ABSL_FLAG(int, step_ms, 20, "time per step");
ABSL_FLAG(bool, block, false, "Backpressure::kBlock instead of kSkip");
ABSL_FLAG(int, slots, 0, "staging slots (0 = daemon default)");
ABSL_FLAG(double, daemon_timeout_s, 3, "client's daemon liveness timeout");
ABSL_FLAG(double, rpc_timeout_s, 30, "deadline of the client's RPCs (a registration's included)");
ABSL_FLAG(int, expect_step, -1, "restore: the step that must come back (-1: any)");
ABSL_FLAG(int, restore_step, -1, "restore, resume: the step to ask for (-1: the newest)");
ABSL_FLAG(std::string, expect_from, "", "restore: where the step must come from (memory or disk; "
                                        "empty: either)");
ABSL_FLAG(bool, wait_commit, true, "train: wait until the last due step is committed");
ABSL_FLAG(int, pause_at, -1, "train: print 'paused' and wait for SIGUSR1 after this step");
ABSL_FLAG(int, go_back_at, -1,
          "train: after this step, restore --go_back_to in the same process and train on from "
          "the step after it (once)");
ABSL_FLAG(int, go_back_to, -1, "train: the step --go_back_at restores");
ABSL_FLAG(bool, snapshot_restored, false,
          "train: after --go_back_at's restore, snapshot the restored step again (a trainer "
          "that saves what it went on from)");
ABSL_FLAG(std::string, topology, "plain", "plain or moe (see tests/test_model.h)");
ABSL_FLAG(double, ema_decay, 0, "EMA decay (0 = no EMA)");
ABSL_FLAG(uint32_t, ema_interval, 1, "update the EMA every N-th step");
ABSL_FLAG(bool, persist_on_failure, false, "ask zccd to persist the newest snapshot if this process dies");
ABSL_FLAG(bool, early_copy, false,
          "restore: the optimizer tensors are copied as zccd checks them "
          "(RestoreOptions::early_copy); a failed restore prints how many others changed");
ABSL_FLAG(bool, prefetch_restore, false,
          "ask zccd to begin reading the newest checkpoint as this trainer registers");
ABSL_FLAG(bool, check_ema, false, "train: read zccd's live EMA after the last step and compare it "
                                   "with the reference EMA (needs --ema_decay)");
ABSL_FLAG(bool, await_checkpoint_failure, false,
          "train: wait (30 s at most) until the client reports a failed checkpoint write");
ABSL_FLAG(std::string, collective, "",
          "restore: restore together with the other ranks through a TcpCollective whose rank 0 "
          "listens on this host:port");
ABSL_FLAG(int, linger_ms, 0, "train: stay registered this long after the last step");
ABSL_FLAG(bool, share_peers, false,
          "after registering: exchange the zccds' peer addresses over the --collective and "
          "report them (Client::ShareJobPeers); prints peer_address= and buddies=");
ABSL_FLAG(std::string, close, "",
          "train: at the end, Client::Close with keep_snapshots 'keep' or 'release' ('': no "
          "Close; the destructor keeps them) and print close=<status>");
ABSL_FLAG(std::string, copy_backend, "host", "host, cuda, cuda_ipc (daemon-pull) or auto");
ABSL_FLAG(bool, device_tensors, false,
          "keep the tensors in (fake) CUDA device memory, written in stream order "
          "(test_trainer_on_fake_cudart only)");
ABSL_FLAG(int, stall_at_step, -1, "train: occupy the stream for --stall_ms before this step's "
          "snapshot (a long kernel), print 'stalled' (device tensors only)");
ABSL_FLAG(int, stall_ms, 0, "see --stall_at_step");
ABSL_FLAG(int, nonfinite_at_step, -1,
          "train: the first EMA-eligible tensor holds NaN at this step (every byte 0xff)");
ABSL_FLAG(bool, pause_before_train, false,
          "train: print 'ready' after registering and wait for SIGUSR1 before the first step");

namespace {

using zcc::testing::ModelTensor;

struct Tensor {
  ModelTensor spec;
  std::vector<uint8_t> bytes;  // the values; a mirror of `device` when set
  uint8_t* device = nullptr;   // (fake) device memory holding the tensor
};

#ifdef ZCC_FAKE_DEVICE_TENSORS
// Device tensors live in the fake CUDA runtime's device memory (shareable
// with zccd through IPC), written by "kernels" in stream order.
void ToDevice(std::vector<Tensor>& model) {
  for (Tensor& t : model) {
    if (t.spec.nbytes == 0) continue;
    if (t.device == nullptr) t.device = static_cast<uint8_t*>(zcc::fake_cudart::DeviceAlloc(t.spec.nbytes));
    uint8_t* dst = t.device;
    std::vector<uint8_t> values = t.bytes;
    zcc::fake_cudart::LaunchHostWork(nullptr, [dst, values = std::move(values)] {
      std::memcpy(dst, values.data(), values.size());
    });
  }
}
void FromDevice(std::vector<Tensor>& model) {
  zcc::fake_cudart::SynchronizeStream(nullptr);
  for (Tensor& t : model) {
    if (t.device != nullptr) std::memcpy(t.bytes.data(), t.device, t.spec.nbytes);
  }
}
void StallStream(int ms) { zcc::fake_cudart::Stall(nullptr, std::chrono::milliseconds(ms)); }
#else
void ToDevice(std::vector<Tensor>&) {}
void FromDevice(std::vector<Tensor>&) {}
void StallStream(int) {}
#endif

std::vector<Tensor> Model(int rank) {
  std::vector<Tensor> model;
  for (ModelTensor& t : zcc::testing::BuildModel(absl::GetFlag(FLAGS_topology), rank,
                                                 absl::GetFlag(FLAGS_world),
                                                 absl::GetFlag(FLAGS_tensors),
                                                 absl::GetFlag(FLAGS_kib))) {
    const uint64_t n = t.nbytes;
    model.push_back({std::move(t), std::vector<uint8_t>(n)});
  }
  return model;
}

void SetStep(std::vector<Tensor>& model, int64_t step) {
  for (Tensor& t : model) zcc::testing::FillTensor(t.spec, step, t.bytes.data());
}

std::vector<zcc::TensorRef> Refs(std::vector<Tensor>& model) {
  std::vector<zcc::TensorRef> refs;
  for (Tensor& t : model) {
    refs.push_back({t.spec.name, t.spec.dtype, t.spec.shape,
                    t.device != nullptr ? static_cast<void*>(t.device) : t.bytes.data(), t.spec.kind,
                    t.spec.ema_eligible, t.spec.replica, t.spec.global_shape,
                    t.spec.box_offset});
  }
  return refs;
}

// SIGUSR1 resumes a paused trainer. It is blocked in every thread from the
// start of main (the client's threads inherit the mask) and taken with
// sigwait: a signal sent before the wait stays pending, and one the kernel
// would have delivered to another thread (whose handler would not wake a
// pause() here) is not lost.
sigset_t Usr1() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  return set;
}

void WaitForUsr1() {
  const sigset_t set = Usr1();
  int sig = 0;
  sigwait(&set, &sig);
}

int Fail(const char* what, const absl::Status& st) {
  std::printf("error=%s: %s\n", what, st.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  {
    const sigset_t usr1 = Usr1();
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);  // before any thread starts
  }
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int rank = absl::GetFlag(FLAGS_rank);
  zcc::ClientOptions o;
  o.socket_path = absl::GetFlag(FLAGS_socket);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.checkpoint_root = absl::GetFlag(FLAGS_root);
  o.upload_root = absl::GetFlag(FLAGS_upload_root);
  o.upload_keep_last = static_cast<uint32_t>(absl::GetFlag(FLAGS_upload_keep_last));
  o.node_local_root = absl::GetFlag(FLAGS_node_local_root);
  o.run_id = absl::GetFlag(FLAGS_run_id);
  o.store_credentials.access_key_id = absl::GetFlag(FLAGS_store_key_id);
  o.store_credentials.secret_access_key = absl::GetFlag(FLAGS_store_secret);
  o.rank = rank;
  o.world_size = absl::GetFlag(FLAGS_world);
  o.save_every = absl::GetFlag(FLAGS_save_every);
  o.num_slots = absl::GetFlag(FLAGS_slots);
  o.backpressure = absl::GetFlag(FLAGS_block) ? zcc::Backpressure::kBlock : zcc::Backpressure::kSkip;
  o.daemon_timeout = absl::Seconds(absl::GetFlag(FLAGS_daemon_timeout_s));
  o.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  o.ema_decay = static_cast<float>(absl::GetFlag(FLAGS_ema_decay));
  o.ema_interval = absl::GetFlag(FLAGS_ema_interval);
  o.persist_on_failure = absl::GetFlag(FLAGS_persist_on_failure);
  o.prefetch_restore = absl::GetFlag(FLAGS_prefetch_restore);
  o.heartbeat_interval = absl::Milliseconds(100);
  o.reconnect_max_backoff = absl::Milliseconds(500);
  const std::string backend = absl::GetFlag(FLAGS_copy_backend);
  if (backend == "cuda") {
    o.copy_backend = zcc::ClientOptions::CopyBackend::kCuda;
  } else if (backend == "cuda_ipc") {
    o.copy_backend = zcc::ClientOptions::CopyBackend::kCudaIpc;
  } else if (backend == "auto") {
    o.copy_backend = zcc::ClientOptions::CopyBackend::kAuto;
  } else if (backend != "host") {
    return Fail("flags", absl::InvalidArgumentError("--copy_backend: host, cuda, cuda_ipc or auto"));
  }
  const bool device = absl::GetFlag(FLAGS_device_tensors);
#ifndef ZCC_FAKE_DEVICE_TENSORS
  if (device) return Fail("flags", absl::InvalidArgumentError("--device_tensors needs test_trainer_on_fake_cudart"));
#endif
  auto client = zcc::Client::Connect(o);
  if (!client.ok()) return Fail("connect", client.status());
  std::vector<Tensor> model = Model(rank);
  if (device) ToDevice(model);
  if (absl::Status st = (*client)->RegisterTensors(Refs(model)); !st.ok()) return Fail("register", st);
  std::printf("registered=%d\n", (*client)->Stats().connected ? 1 : 0);

  // The job's TcpCollective (--collective), made once for whatever needs it.
  std::unique_ptr<zcc::TcpCollective> collective;
  if (!absl::GetFlag(FLAGS_collective).empty()) {
    zcc::TcpCollectiveOptions co;
    co.rank = static_cast<uint32_t>(rank);
    co.size = static_cast<uint32_t>(absl::GetFlag(FLAGS_world));
    co.address = absl::GetFlag(FLAGS_collective);
    co.timeout = absl::Seconds(60);
    auto made = zcc::TcpCollective::Create(co);
    if (!made.ok()) return Fail("collective", made.status());
    collective = std::move(*made);
  }
  if (absl::GetFlag(FLAGS_share_peers)) {
    if (collective == nullptr) return Fail("share_peers", absl::InvalidArgumentError("needs --collective"));
    auto buddies = (*client)->ShareJobPeers(*collective);
    if (!buddies.ok()) return Fail("share_peers", buddies.status());
    std::printf("peer_address=%s buddies=%s\n", (*client)->PeerAddress().c_str(),
                absl::StrJoin(*buddies, ",").c_str());
    std::fflush(stdout);
  }

  if (absl::GetFlag(FLAGS_mode) == "restore") {
    zcc::RestoreOptions restore;
    restore.step = absl::GetFlag(FLAGS_restore_step);
    restore.collective = collective.get();
    std::vector<Tensor> before;
    if (absl::GetFlag(FLAGS_early_copy)) {
      before = model;
      for (const Tensor& t : model) restore.early_copy.push_back(t.spec.kind == zcc::TensorKind::kOptim);
    }
    auto result = (*client)->Restore(restore);
    if (!result.ok() && !before.empty()) {
      // Only the early-copy tensors may have been written.
      int changed = 0;
      for (size_t i = 0; i < model.size(); ++i) {
        changed += !restore.early_copy[i] && model[i].bytes != before[i].bytes;
      }
      std::printf("changed_tensors_not_early=%d\n", changed);
    }
    if (!result.ok()) return Fail("restore", result.status());
    if (device) FromDevice(model);
    if (collective != nullptr) {
      // Pieces read from zccd and pieces received from other ranks (the
      // per-rank EXTRA tensors aside).
      int read = 0, received = 0;
      for (size_t i = 0; i < model.size(); ++i) {
        if (model[i].spec.kind == zcc::TensorKind::kExtra) continue;
        received += result->received[i] ? 1 : 0;
        read += result->restored[i] && !result->received[i] ? 1 : 0;
      }
      std::printf("read_pieces=%d received_pieces=%d\n", read, received);
    }
    const int64_t* step = &result->step;
    const char* from = result->from_memory ? "memory" : "disk";
    std::printf("restored_step=%" PRId64 " restored_from=%s restored_ema_step=%" PRId64 "\n", *step,
                from, result->ema_step);
    std::vector<Tensor> expected = Model(rank);
    SetStep(expected, *step);
    int bad = 0;
    for (size_t i = 0; i < model.size(); ++i) bad += model[i].bytes != expected[i].bytes;
    std::printf("mismatched_tensors=%d\n", bad);
    if (absl::GetFlag(FLAGS_check_ema)) {
      // The EMA zccd restored for the pieces this rank keeps (the ones it
      // writes; NotFound for the rest) equals the reference at the step.
      int checked = 0, ema_bad = 0;
      for (Tensor& t : model) {
        if (!t.spec.ema_eligible || t.spec.nbytes == 0) continue;
        std::vector<float> got(t.spec.nbytes / 4);
        auto read = (*client)->ReadEma({{t.spec.name, got.data(), got.size()}});
        if (absl::IsNotFound(read.status())) continue;
        if (!read.ok()) return Fail("read_ema", read.status());
        const std::vector<float> want_ema = zcc::testing::ReferenceEma(
            t.spec, *step, static_cast<float>(absl::GetFlag(FLAGS_ema_decay)));
        ++checked;
        ema_bad += *read != *step || std::memcmp(want_ema.data(), got.data(), t.spec.nbytes) != 0;
      }
      std::printf("ema_checked=%d ema_mismatches=%d\n", checked, ema_bad);
      bad += ema_bad;
    }
    const int want = absl::GetFlag(FLAGS_expect_step);
    const std::string want_from = absl::GetFlag(FLAGS_expect_from);
    return bad == 0 && (want < 0 || want == *step) && (want_from.empty() || want_from == from) ? 0
                                                                                                : 1;
  }

  int start = absl::GetFlag(FLAGS_start);
  if (absl::GetFlag(FLAGS_mode) == "resume") {
    // Together with the other ranks where there is a --collective.
    zcc::RestoreOptions restore;
    restore.step = absl::GetFlag(FLAGS_restore_step);
    restore.collective = collective.get();
    auto restored = (*client)->Restore(restore);
    if (!restored.ok()) return Fail("restore", restored.status());
    const int64_t* step = &restored->step;
    if (device) FromDevice(model);
    std::printf("restored_step=%" PRId64 " restored_from=%s\n", *step,
                restored->from_memory ? "memory" : "disk");
    start = static_cast<int>(*step) + 1;
  }
  if (absl::GetFlag(FLAGS_pause_before_train)) {
    std::printf("ready\n");
    WaitForUsr1();
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  bool went_back = false;
  for (int64_t step = start; step < start + steps; ++step) {
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_step_ms)));
    if (absl::Status st = (*client)->FenceBeforeUpdate(); !st.ok()) return Fail("fence", st);
    SetStep(model, step);
    if (step == absl::GetFlag(FLAGS_nonfinite_at_step)) {
      for (Tensor& t : model) {
        if (!t.spec.ema_eligible) continue;
        std::fill(t.bytes.begin(), t.bytes.end(), uint8_t{0xff});  // NaN in f32, bf16, f16
        break;
      }
    }
    if (device) ToDevice(model);
    if (step == absl::GetFlag(FLAGS_stall_at_step)) {
      StallStream(absl::GetFlag(FLAGS_stall_ms));
      std::printf("stalled\n");
    }
    const zcc::SnapshotResult r = (*client)->Snapshot(step);
    std::printf("step=%" PRId64 " result=%d\n", step, static_cast<int>(r));
    if (step == absl::GetFlag(FLAGS_pause_at)) {
      std::printf("paused\n");
      WaitForUsr1();
    }
    if (step == absl::GetFlag(FLAGS_go_back_at) && !went_back) {
      went_back = true;
      // The step gone back to is a committed one: a rank ahead of the others
      // waits for its commit (up to a minute), as a trainer that picks a
      // checkpoint from the job's list would find it there.
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (absl::Now() < deadline) {
        auto st = (*client)->QueryCheckpointStatus();
        if (st.ok() && st->last_committed_step >= absl::GetFlag(FLAGS_go_back_to)) break;
        absl::SleepFor(absl::Milliseconds(20));
      }
      auto back = (*client)->Restore(absl::GetFlag(FLAGS_go_back_to));
      if (!back.ok()) return Fail("go_back", back.status());
      if (device) FromDevice(model);
      std::printf("went_back_to=%" PRId64 "\n", *back);
      if (absl::GetFlag(FLAGS_snapshot_restored)) {
        const zcc::SnapshotResult again = (*client)->Snapshot(*back);
        std::printf("step=%" PRId64 " result=%d\n", *back, static_cast<int>(again));
      }
      step = *back;  // on from the step after it
    }
  }
  if (absl::Status st = (*client)->Flush(); !st.ok()) return Fail("flush", st);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  const int64_t last_due = save_every > 0 ? (start + steps - 1) / save_every * save_every : -1;
  if (absl::GetFlag(FLAGS_wait_commit) && rank == 0 && last_due >= start) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (true) {
      auto st = (*client)->QueryCheckpointStatus();
      if (st.ok() && st->last_committed_step >= last_due) break;
      if (absl::Now() > deadline) {
        return Fail("wait_commit", absl::DeadlineExceededError(
                                       st.ok() ? st->last_error : std::string(st.status().message())));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::printf("committed=%" PRId64 "\n", last_due);
  }
  if (absl::GetFlag(FLAGS_check_ema)) {
    const int64_t last = start + steps - 1;
    std::vector<std::vector<float>> got;
    std::vector<zcc::Client::EmaOutput> outputs;
    std::vector<const ModelTensor*> specs;
    for (Tensor& t : model) {
      if (!t.spec.ema_eligible) continue;
      got.emplace_back(t.spec.nbytes / 4);
      specs.push_back(&t.spec);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      outputs.push_back({specs[i]->name, got[i].data(), got[i].size()});
    }
    // zccd ingests asynchronously: it answers once the EMA includes `last`.
    auto read = (*client)->ReadEma(outputs, last, absl::Seconds(30));
    if (!read.ok()) return Fail("read_ema", read.status());
    const int64_t ema_step = *read;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<float> want = zcc::testing::ReferenceEma(
          *specs[i], ema_step, static_cast<float>(absl::GetFlag(FLAGS_ema_decay)));
      bad += std::memcmp(want.data(), got[i].data(), specs[i]->nbytes) != 0;
    }
    std::printf("ema_step=%" PRId64 " ema_mismatches=%d\n", ema_step, bad);
  }
  if (absl::GetFlag(FLAGS_await_checkpoint_failure)) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while ((*client)->Stats().checkpoint_failures == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  const zcc::ClientStats s = (*client)->Stats();
  std::printf("checkpoint_failures=%" PRIu64 " last_failed_step=%" PRId64 " last_error=%s\n",
              s.checkpoint_failures, s.last_failed_checkpoint_step, s.last_error.c_str());
  std::printf("replaced=%" PRIu64 "\n", s.replaced_by_checkpoint);
  std::printf("published=%" PRIu64 " skipped_no_slot=%" PRIu64 " skipped_disconnected=%" PRIu64
              " registrations=%" PRIu64 " connected=%d\n",
              s.snapshots_published, s.skipped_no_slot, s.skipped_disconnected, s.registrations,
              s.connected ? 1 : 0);
  absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_linger_ms)));
  if (const std::string close = absl::GetFlag(FLAGS_close); !close.empty()) {
    const absl::Status closed = (*client)->Close(/*keep_snapshots=*/close == "keep");
    std::printf("close=%s\n", closed.ok() ? "ok" : std::string(closed.message()).c_str());
  }
  return 0;
}
