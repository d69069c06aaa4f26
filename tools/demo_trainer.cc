// The demo trainer: a synthetic model of a realistic shape (bf16 parameters,
// fp32 master weights and Adam moments, small extra blobs) trained for N steps
// with a snapshot after every optimizer step and a checkpoint every K steps,
// through the real client and a running zccd. It prints the trainer-side cost
// of every snapshot and each checkpoint as zccd commits it, then restores the
// newest checkpoint into fresh buffers with a second client and checks it bit
// for bit against the state the trainer had at that step (recomputed: the
// state is a pure function of the step). A zccd that is killed and restarted
// during the run is reported and survived: the client re-registers, and the
// check restores whatever step the job's newest checkpoint holds.
//
// Exit status: 0 when the restore matches, 1 on any mismatch or error.
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <memory>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/disk_io.h"
#include "client/client.h"
#include "common/file_util.h"
#include "copy/host_copier.h"

ABSL_FLAG(std::string, socket, "", "zccd socket (default: zccd's default for this user)");
ABSL_FLAG(std::string, job, "demo", "job id");
ABSL_FLAG(std::string, root, "", "checkpoint root (default: zccd's default root)");
ABSL_FLAG(int, steps, 30, "training steps");
ABSL_FLAG(int, save_every, 10, "checkpoint every N steps");
ABSL_FLAG(int, size_mb, 1024, "model + optimizer state in MiB");
ABSL_FLAG(int, tensors, 150, "number of tensors (about 4 per parameter)");
ABSL_FLAG(double, ema_decay, 0.999, "EMA decay kept by zccd (0 = no EMA)");
ABSL_FLAG(int, step_ms, 100, "simulated forward/backward time per step on the accelerator");

namespace {

struct Tensor {
  std::string name;
  zcc::DType dtype;
  std::vector<int64_t> shape;
  zcc::TensorKind kind;
  std::vector<uint8_t> bytes;
};

// ~4 tensors per parameter: the bf16 weight and its fp32 master copy and Adam
// moments (14 bytes per element), plus RNG and trainer-state blobs.
std::vector<Tensor> BuildModel(uint64_t total_bytes, int num_tensors) {
  const int params = std::max(1, (num_tensors - 2) / 4);
  const uint64_t elems_per_param = std::max<uint64_t>(1, total_bytes / 14 / params);
  std::vector<Tensor> model;
  for (int p = 0; p < params; ++p) {
    // Matrix-like shapes: rows of 256 elements, ragged last dimension allowed.
    const int64_t cols = 256;
    const int64_t rows = std::max<int64_t>(1, elems_per_param / cols);
    const std::string base = absl::StrCat("model.layers.", p / 4, ".", p % 4 == 0 ? "attn.qkv"
                                          : p % 4 == 1 ? "attn.out" : p % 4 == 2 ? "mlp.up" : "mlp.down",
                                          ".weight");
    auto add = [&](std::string name, zcc::DType dt, zcc::TensorKind kind, size_t elem) {
      model.push_back({std::move(name), dt, {rows, cols}, kind,
                       std::vector<uint8_t>(rows * cols * elem)});
    };
    add(base, zcc::DType::kBF16, zcc::TensorKind::kParam, 2);
    add("optimizer." + base + ".master", zcc::DType::kF32, zcc::TensorKind::kOptim, 4);
    add("optimizer." + base + ".exp_avg", zcc::DType::kF32, zcc::TensorKind::kOptim, 4);
    add("optimizer." + base + ".exp_avg_sq", zcc::DType::kF32, zcc::TensorKind::kOptim, 4);
  }
  model.push_back({"rng_state", zcc::DType::kU8, {5056}, zcc::TensorKind::kExtra,
                   std::vector<uint8_t>(5056)});
  model.push_back({"trainer_state", zcc::DType::kI64, {4}, zcc::TensorKind::kExtra,
                   std::vector<uint8_t>(32)});
  // Weights and optimizer state are finite floats in [-1, 1), as in a real
  // model; the blobs are arbitrary bytes.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (Tensor& t : model) {
    if (t.dtype == zcc::DType::kF32) {
      for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
        const float v = uniform(rng);
        std::memcpy(&t.bytes[i], &v, 4);
      }
    } else if (t.dtype == zcc::DType::kBF16) {
      for (size_t i = 0; i + 2 <= t.bytes.size(); i += 2) {
        const float v = uniform(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&t.bytes[i], &bf16, 2);
      }
    } else {
      for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
    }
  }
  return model;
}

float LoadFloat(const Tensor& t, size_t element) {
  if (t.dtype == zcc::DType::kF32) {
    float v;
    std::memcpy(&v, &t.bytes[element * 4], 4);
    return v;
  }
  uint16_t bf16;
  std::memcpy(&bf16, &t.bytes[element * 2], 2);
  const uint32_t bits = uint32_t{bf16} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

void StoreFloat(Tensor& t, size_t element, float v) {
  if (t.dtype == zcc::DType::kF32) {
    std::memcpy(&t.bytes[element * 4], &v, 4);
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);
  std::memcpy(&t.bytes[element * 2], &bf16, 2);
}

// The "optimizer step": touches every tensor (a strided update of the
// weights, which stay finite, and a step stamp in the blobs), so each step's
// state differs everywhere it matters.
void OptimizerStep(std::vector<Tensor>& model, int64_t step) {
  for (Tensor& t : model) {
    if (t.dtype == zcc::DType::kF32 || t.dtype == zcc::DType::kBF16) {
      const size_t elem = t.dtype == zcc::DType::kF32 ? 4 : 2;
      const size_t n = t.bytes.size() / elem;
      for (size_t i = (step * 1024) % 16384; i < n; i += 16384) {
        StoreFloat(t, i, 0.5f * LoadFloat(t, i) + 0.25f * static_cast<float>(step % 3));
      }
      continue;
    }
    const size_t n = std::min<size_t>(8, t.bytes.size());
    std::memcpy(t.bytes.data(), &step, n);
  }
}

std::vector<zcc::TensorRef> Refs(std::vector<Tensor>& model) {
  std::vector<zcc::TensorRef> refs;
  for (Tensor& t : model) {
    refs.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.kind,
                    t.kind == zcc::TensorKind::kParam});
  }
  return refs;
}

zcc::ClientOptions Options() {
  zcc::ClientOptions o;
  o.socket_path = absl::GetFlag(FLAGS_socket);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.checkpoint_root = absl::GetFlag(FLAGS_root);
  o.save_every = static_cast<uint32_t>(absl::GetFlag(FLAGS_save_every));
  o.ema_decay = static_cast<float>(absl::GetFlag(FLAGS_ema_decay));
  return o;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

int Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "demo: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// The files of a step directory (shards, manifests, index); none when it
// cannot be listed.
std::vector<std::string> StepFiles(const std::string& step_dir) {
  std::vector<std::string> files;
  auto names = zcc::ListDir(step_dir);
  if (!names.ok()) return files;
  for (const std::string& name : *names) files.push_back(zcc::JoinPath(step_dir, name));
  return files;
}

// The bytes of `files` (0 for one that cannot be read).
uint64_t FileBytes(const std::vector<std::string>& files) {
  uint64_t bytes = 0;
  for (const std::string& f : files) {
    struct stat st;
    if (::stat(f.c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
  }
  return bytes;
}

// The disk's own speed on `files`, the step the restore read whole (the
// state and, with an EMA, the EMA's tensors): each read whole with O_DIRECT
// (8 MiB blocks, 8 in flight), from a cold page cache. Prints it beside the
// restore's time for the same files and returns nothing: a reference, not a
// check.
void CompareWithRawRead(const std::vector<std::string>& files, double restore_seconds) {
  zcc::bench::DropCaches(files);
  const size_t ring = zcc::bench::kRawBlock * zcc::bench::kRawDepth;
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer(
      static_cast<uint8_t*>(std::aligned_alloc(4096, ring)), &std::free);
  double seconds = 0;
  uint64_t bytes = 0;
  for (const std::string& f : files) {
    uint64_t read = 0;
    seconds += zcc::bench::RawRead(f, buffer.get(), &read);
    bytes += read;
  }
  std::printf("raw O_DIRECT read of the same step's %zu files, cold: %.2f GB in %.2f s (%.2f GB/s); "
              "the restore from disk ran at %.2fx of it\n",
              files.size(), bytes / 1e9, seconds, seconds > 0 ? bytes / seconds / 1e9 : 0.0,
              restore_seconds > 0 ? seconds / restore_seconds : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("demo_trainer: a synthetic training loop checkpointing with zcc");
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen, also in a file
  const int steps = absl::GetFlag(FLAGS_steps);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  if (steps < 1 || save_every < 1 || absl::GetFlag(FLAGS_size_mb) < 1) {
    std::fprintf(stderr, "demo: --steps, --save_every and --size_mb must be positive\n");
    return 1;
  }
  const int64_t last_save = steps / save_every * save_every;
  if (last_save == 0) {
    std::fprintf(stderr, "demo: --steps must reach at least one checkpoint (--save_every %d)\n",
                 save_every);
    return 1;
  }

  std::vector<Tensor> model =
      BuildModel(uint64_t(absl::GetFlag(FLAGS_size_mb)) << 20, absl::GetFlag(FLAGS_tensors));
  uint64_t total = 0;
  for (const Tensor& t : model) total += t.bytes.size();
  std::printf("demo: model of %zu tensors, %.2f GiB (bf16 params + fp32 master/Adam + blobs)\n",
              model.size(), total / double(1 << 30));

  auto client = zcc::Client::Connect(Options());
  if (!client.ok()) return Die("connect", client.status());
  if (absl::Status st = (*client)->RegisterTensors(Refs(model)); !st.ok()) {
    return Die("register", st);
  }
  if (!(*client)->Stats().connected) {
    return Die("register", absl::UnavailableError("zccd is not reachable: " +
                                                  (*client)->Stats().last_error));
  }

  std::vector<double> costs_us;
  // The newest checkpoint step whose snapshot zccd took, and the client's
  // registration count then (a later registration means a new zccd, which
  // never saw that snapshot).
  int64_t last_enqueued_save = -1;
  uint64_t registrations_then = 0;
  uint64_t registrations_seen = (*client)->Stats().registrations;
  int64_t reported = -1;
  const absl::Duration compute = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));
  std::printf("demo: %d steps, snapshot every step, checkpoint every %d\n", steps, save_every);
  for (int64_t step = 1; step <= steps; ++step) {
    absl::SleepFor(compute);  // forward/backward on the accelerator
    if (absl::Status st = (*client)->FenceBeforeUpdate(); !st.ok()) return Die("fence", st);
    OptimizerStep(model, step);

    const absl::Time t0 = absl::Now();
    const zcc::SnapshotResult result = (*client)->Snapshot(step);
    const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    costs_us.push_back(us);
    const zcc::ClientStats now = (*client)->Stats();
    if (now.registrations != registrations_seen) {
      std::printf("demo: zccd restarted; the client registered again (registration %" PRIu64
                  ")\n", now.registrations);
      registrations_seen = now.registrations;
    }
    if (result == zcc::SnapshotResult::kEnqueued && step % save_every == 0) {
      last_enqueued_save = step;
      registrations_then = now.registrations;
    }

    std::string line = absl::StrCat("step ", step, "  snapshot ", absl::StrFormat("%7.1f", us),
                                    " us");
    if (result != zcc::SnapshotResult::kEnqueued) {
      absl::StrAppend(&line, result == zcc::SnapshotResult::kSkippedNoSlot ? "  (skipped: no free slot)"
                             : result == zcc::SnapshotResult::kSkippedCopyFailed
                                 ? "  (skipped: the copy could not be enqueued)"
                                 : "  (skipped: daemon unavailable)");
    }
    auto status = (*client)->QueryCheckpointStatus();
    // Bytes > 0: committed by this zccd in this run (a job directory that
    // already held checkpoints reports its `latest` step with no bytes).
    if (status.ok() && status->last_committed_step != reported &&
        status->last_committed_step > 0 && status->last_checkpoint_bytes > 0) {
      reported = status->last_committed_step;
      absl::StrAppend(&line, absl::StrFormat("  | committed step %d: %.2f GB written in %.2f s, %.2f GB/s",
                                             reported, status->last_checkpoint_bytes / 1e9,
                                             status->last_checkpoint_seconds,
                                             status->last_checkpoint_gbps));
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (absl::Status st = (*client)->Flush(); !st.ok()) return Die("flush", st);

  // Wait for the last checkpoint zccd took to commit. A zccd that is down or
  // restarting is waited for; one restarted after it took the snapshot lost
  // it, and the newest committed step is checked instead.
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  zcc::CheckpointStatus status;
  bool said_unreachable = false;
  // A new zccd reads the job's `latest` in the background, after the
  // registration: until then it reports no commit. The steps this run saw
  // committed are there to be read (at most a few seconds' wait).
  absl::Time new_zccd_seen = absl::InfiniteFuture();
  while (true) {
    auto s = (*client)->QueryCheckpointStatus();
    if (s.ok()) {
      status = *s;
      if (status.last_committed_step >= last_enqueued_save &&
          (status.last_checkpoint_bytes > 0 || last_enqueued_save < 0)) {
        break;
      }
      if ((*client)->Stats().registrations != registrations_then) {
        // A new zccd: it never saw that snapshot, and reports what is on disk
        // once it has read it.
        new_zccd_seen = std::min(new_zccd_seen, absl::Now());
        if (status.last_committed_step < reported &&
            absl::Now() - new_zccd_seen < absl::Seconds(10)) {
          absl::SleepFor(absl::Milliseconds(50));
          continue;
        }
        if (status.last_committed_step < last_enqueued_save) {
          std::printf("demo: step %" PRId64 " was never written: zccd restarted after taking "
                      "its snapshot (the newest committed step is %" PRId64 ")\n",
                      last_enqueued_save, status.last_committed_step);
        }
        break;
      }
    } else if (!said_unreachable) {
      std::printf("demo: zccd is not answering (%s); waiting for it\n",
                  std::string(s.status().message()).c_str());
      said_unreachable = true;
    }
    if (absl::Now() > deadline) {
      return Die("wait for commit",
                 absl::DeadlineExceededError(absl::StrCat(
                     "step ", last_enqueued_save, " not committed: ",
                     s.ok() ? status.last_error : std::string(s.status().message()))));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (reported != status.last_committed_step) {
    std::printf("committed step %" PRId64 ": %.2f GB written in %.2f s, %.2f GB/s\n",
                status.last_committed_step, status.last_checkpoint_bytes / 1e9,
                status.last_checkpoint_seconds, status.last_checkpoint_gbps);
  }
  const zcc::ClientStats stats = (*client)->Stats();
  std::printf("\ntrainer-side snapshot cost: p50 %.1f us, p99 %.1f us, max %.1f us over %zu steps\n",
              Percentile(costs_us, 0.5), Percentile(costs_us, 0.99), Percentile(costs_us, 1.0),
              costs_us.size());
  std::printf("snapshots: %" PRIu64 " published, %" PRIu64 " skipped (no free slot), %" PRIu64
              " skipped (daemon unavailable), %" PRIu64 " skipped (copy not enqueued), %" PRIu64
              " replaced before ingest by a checkpoint step\n",
              stats.snapshots_published, stats.skipped_no_slot, stats.skipped_disconnected,
              stats.skipped_copy_failed, stats.replaced_by_checkpoint);
  if (stats.registrations > 1) {
    std::printf("zccd restarts survived: %" PRIu64 " (the client registered %" PRIu64
                " times)\n",
                stats.registrations - 1, stats.registrations);
  }
  if (stats.checkpoint_failures > 0) {
    std::printf("checkpoint writes that failed: %" PRIu64 " (newest: step %" PRId64 ")\n",
                stats.checkpoint_failures, stats.last_failed_checkpoint_step);
  }
  std::printf("last checkpoint: step %" PRId64 ", %.2f GB at %.2f GB/s\n",
              status.last_committed_step, status.last_checkpoint_bytes / 1e9,
              status.last_checkpoint_gbps);
  // The trainer stops, expecting to be restarted: zccd keeps its newest
  // snapshots for the restore from memory below.
  if (absl::Status st = (*client)->Close(/*keep_snapshots=*/true); !st.ok()) {
    return Die("close", st);
  }
  client->reset();

  // Restore into fresh, zeroed buffers through a new client, as a restarted
  // trainer would.
  std::vector<Tensor> fresh = model;
  for (Tensor& t : fresh) std::fill(t.bytes.begin(), t.bytes.end(), 0);
  auto restorer = zcc::Client::Connect(Options());
  if (!restorer.ok()) return Die("connect", restorer.status());
  if (absl::Status st = (*restorer)->RegisterTensors(Refs(fresh)); !st.ok()) {
    return Die("register for restore", st);
  }
  // The state the trainer had at `step`, compared with what was restored.
  auto check = [&](int64_t step) {
    std::vector<Tensor> expected =
        BuildModel(uint64_t(absl::GetFlag(FLAGS_size_mb)) << 20, absl::GetFlag(FLAGS_tensors));
    for (int64_t s = 1; s <= step; ++s) OptimizerStep(expected, s);
    size_t mismatches = 0;
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (fresh[i].bytes != expected[i].bytes) {
        std::fprintf(stderr, "demo: tensor %s differs after restore\n", fresh[i].name.c_str());
        ++mismatches;
      }
    }
    if (mismatches > 0) {
      std::fprintf(stderr, "demo: FAILED: %zu of %zu tensors differ\n", mismatches, fresh.size());
      return false;
    }
    std::printf("restore check: all %zu tensors bit-identical to the state at step %" PRId64 "\n",
                fresh.size(), step);
    for (Tensor& t : fresh) std::fill(t.bytes.begin(), t.bytes.end(), 0);
    return true;
  };
  // First the newest step: zccd still holds the snapshots of the trainer
  // above (it has gone), unless zccd restarted since. Then, after a restore
  // from memory, the newest commit from disk, as after a node restart.
  bool restored_once = false;
  for (bool from_disk = false; !from_disk;) {
    zcc::RestoreOptions options;
    // From disk as after a node restart: nothing of the step in the page cache.
    std::vector<std::string> step_files;
    if (restored_once && !absl::GetFlag(FLAGS_root).empty()) {
      step_files = StepFiles(absl::StrFormat("%s/%s/step-%08d", absl::GetFlag(FLAGS_root),
                                             absl::GetFlag(FLAGS_job), status.last_committed_step));
      zcc::bench::DropCaches(step_files);
    }
    if (restored_once) options.step = status.last_committed_step;
    const absl::Time r0 = absl::Now();
    auto restored = (*restorer)->Restore(options);
    if (!restored.ok()) return Die("restore", restored.status());
    const double restore_s = absl::ToDoubleSeconds(absl::Now() - r0);
    if (restored->from_memory) {
      std::printf("restored step %" PRId64 " from zccd's memory in %.2f s (%.2f GB/s)\n",
                  restored->step, restore_s, total / restore_s / 1e9);
    } else {
      // All of the step's files are read: the state, and the EMA for zccd.
      if (step_files.empty() && !absl::GetFlag(FLAGS_root).empty()) {
        step_files = StepFiles(absl::StrFormat("%s/%s/step-%08d", absl::GetFlag(FLAGS_root),
                                               absl::GetFlag(FLAGS_job), restored->step));
      }
      const uint64_t read = step_files.empty() ? total : FileBytes(step_files);
      std::printf("restored step %" PRId64 " from disk in %.2f s (%.2f GB of the %s%s, "
                  "%.2f GB/s, checksums verified)\n",
                  restored->step, restore_s, read / 1e9,
                  step_files.empty() ? "state" : "step's files",
                  !step_files.empty() && absl::GetFlag(FLAGS_ema_decay) > 0
                      ? ": the state and its EMA" : "",
                  read / restore_s / 1e9);
    }
    from_disk = !restored->from_memory;
    restored_once = true;
    if (from_disk && restored->step != status.last_committed_step) {
      std::fprintf(stderr, "demo: restored step %" PRId64 ", but the newest commit is step %" PRId64
                   "\n", restored->step, status.last_committed_step);
      return 1;
    }
    if (!check(restored->step)) return 1;
    if (from_disk && !step_files.empty()) CompareWithRawRead(step_files, restore_s);
  }
  return 0;
}
