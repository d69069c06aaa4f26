// Persist and restore throughput of the checkpoint writer and reader against
// what the disk itself does, on the same directory and the same bytes, in one
// run:
//   (a) zcc persist: WriteRankShards of 4 ranks from page-aligned (mmap'ed)
//       slots holding a transformer-like tensor mix, plus the commit;
//   (b) raw: one file, sized first, written sequentially with O_DIRECT, 8 MiB
//       blocks, queue depth 8 (io_uring), fdatasync: the device's own limit;
//   (c) buffered write + fsync of the same bytes (what safetensors.save_file
//       or torch.save followed by fsync do);
//   (d) zcc restore: ReadRankTensors of every rank into a page-aligned buffer;
//   (e) raw O_DIRECT sequential reads, queue depth 8;
//   (f) zcc's restore path as zccd runs it, from a cold page cache:
//       CheckStepMetadata of the step once (zccd caches the verdict for the
//       job's ranks), then daemon::ReadRestoreBuffer of every rank into a
//       fresh shared-memory segment, each piece read once and checked.
//       The same with VerifyStep in place of the metadata check (the path
//       before restores read a step once) is measured for comparison;
//   (g) raw O_DIRECT reads of the same shard files, one after the other,
//       into a reused 64 MiB ring (the row's reference), and, to tell the
//       cost of filling fresh memory from zcc's own, into fresh shared-memory
//       segments created like zccd's restore buffers (an informing row);
//   (h) (f) with every rank's restore buffer taken from a staging pool
//       (daemon/memory/staging_pool.h) made ready before the round, as zccd
//       does with staging_pool_mb: restore_cold_pool_vs_odirect.
// (a)/(b), (d)/(e) and (f)/(g) alternate over several rounds (medians
// reported), since a virtual disk's speed drifts; the page cache is dropped
// between phases (every file fsynced and evicted with
// posix_fadvise(DONTNEED), and /proc/sys/vm/drop_caches written where
// allowed).
//
// Environment: ZCC_BENCH_DIR, a directory on the disk to measure (default
// /tmp). 4 GiB in all (--quick: ~1 GiB). --keep leaves the last checkpoint.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/disk_io.h"
#include "bench/report.h"
#include "checkpoint/committer.h"
#include "checkpoint/global_index.h"
#include "checkpoint/io_options.h"
#include "checkpoint/rank_shards.h"
#include "checkpoint/reader.h"
#include "checkpoint/shard_writer.h"
#include "checkpoint/step_check.h"
#include "common/file_util.h"
#include "daemon/memory/staging_pool.h"
#include "daemon/rank/registered_tensor.h"
#include "daemon/restore/restorer.h"
#include "daemon/testing/registered.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "shm/segment.h"
#include "shm/slot_layout.h"

namespace zcc::bench {
namespace {

using checkpoint::RankShards;
using checkpoint::RankTensor;
using format::DType;
using format::TensorKind;

constexpr size_t kBlock = kRawBlock;
constexpr unsigned kDepth = kRawDepth;
constexpr uint32_t kRanks = 4;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "persist_bench: %s\n", what.c_str());
  std::exit(1);
}

// Anonymous memory on 2 MiB boundaries with transparent huge pages asked for
// and populated up front, as a daemon would map its staging slots. (Physical
// contiguity matters on a virtio disk: requests are limited to 254 segments,
// so 4 KiB pages scattered in memory cut 8 MiB transfers into small ones,
// for the raw and the zcc runs alike.)
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes + kHuge) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die(absl::StrCat("mmap of ", bytes, " bytes failed"));
    base_ = static_cast<uint8_t*>(p);
    data_ = base_ + (kHuge - reinterpret_cast<uintptr_t>(base_) % kHuge) % kHuge;
    ::madvise(data_, bytes, MADV_HUGEPAGE);
    std::memset(data_, 0, bytes);
  }
  ~Mapping() { ::munmap(base_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return data_; }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// One data-parallel rank of a small LLaMA-like model trained with mixed
// precision Adam: bf16 parameters (model file), fp32 master weights and both
// moments (optim file), RNG and scheduler blobs (extra file). Layers are
// added until the rank holds about `budget` bytes.
RankShards MakeRank(uint32_t rank, uint64_t budget) {
  const int64_t h = 1024, ffn = 2752, vocab = 8000;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"model.embed_tokens.weight", {vocab, h}},
      {"lm_head.weight", {vocab, h}},
      {"model.norm.weight", {h}}};
  auto bytes_of = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return static_cast<uint64_t>(n) * (2 + 3 * 4);
  };
  uint64_t total = 0;
  for (const auto& p : params) total += bytes_of(p.second);
  for (int layer = 0;; ++layer) {
    const std::string pre = absl::StrCat("model.layers.", layer, ".");
    std::vector<std::pair<std::string, std::vector<int64_t>>> layer_params = {
        {pre + "self_attn.q_proj.weight", {h, h}},     {pre + "self_attn.k_proj.weight", {h, h}},
        {pre + "self_attn.v_proj.weight", {h, h}},     {pre + "self_attn.o_proj.weight", {h, h}},
        {pre + "mlp.gate_proj.weight", {ffn, h}},      {pre + "mlp.up_proj.weight", {ffn, h}},
        {pre + "mlp.down_proj.weight", {h, ffn}},      {pre + "input_layernorm.weight", {h}},
        {pre + "post_attention_layernorm.weight", {h}}};
    uint64_t add = 0;
    for (const auto& p : layer_params) add += bytes_of(p.second);
    if (total + add > budget) break;
    total += add;
    params.insert(params.end() - 2, layer_params.begin(), layer_params.end());
  }
  RankShards shards;
  shards.job_id = "bench";
  shards.rank = rank;
  shards.world_size = kRanks;
  shards.manifest_hash = 42;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, format::TensorKind group) {
    RankTensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.kind = group;
    t.nbytes = *format::TensorBytes(t.dtype, t.shape);
    shards.tensors.push_back(std::move(t));
  };
  const std::string r = absl::StrCat("rank", rank, ".");
  for (const auto& [name, shape] : params) add(r + name, DType::kBF16, shape, format::TensorKind::kParam);
  for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
    for (const auto& [name, shape] : params) {
      add(absl::StrCat(r, name, ".", state), DType::kF32, shape, format::TensorKind::kOptim);
    }
  }
  add(r + "rng.cpu", DType::kU8, {5056}, format::TensorKind::kExtra);
  add(r + "rng.cuda", DType::kU8, {16}, format::TensorKind::kExtra);
  add(r + "scheduler", DType::kU8, {321}, format::TensorKind::kExtra);
  std::vector<shm::LayoutInput> in;
  for (const RankTensor& t : shards.tensors) in.push_back({t.name, t.nbytes, t.kind});
  auto layout = shm::ComputeSlotLayout(in, uint64_t{1} << 40);
  if (!layout.ok()) Die(std::string(layout.status().message()));
  shards.layout = *layout;
  for (size_t i = 0; i < shards.tensors.size(); ++i) {
    shards.tensors[i].slot_offset = shards.layout.placements[i].offset;
  }
  return shards;
}

void FillRandom(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w[i] = x;
  }
}

// A rank's tensors as its trainer would have registered them with zccd
// (whole tensors, all written by this rank).
struct Span {
  const uint8_t* data;
  uint64_t bytes;
};

// The device's own sequential speed: the bytes of `sources` (in order, 8 MiB
// at a time) written to one O_DIRECT file with 8 requests in flight, then
// fdatasync. Returns seconds.
double RawWrite(const std::string& path, const std::vector<Span>& sources) {
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) Die(absl::StrCat("open ", path, " with O_DIRECT: ", std::strerror(errno)));
  // Sized first: ext4 runs O_DIRECT writes that extend a file one at a time,
  // so only writes inside the file keep the queue full.
  uint64_t total = 0;
  for (const Span& s : sources) total += s.bytes;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) Die("ftruncate");
  io_uring ring;
  if (io_uring_queue_init(kDepth, &ring, 0) != 0) Die("io_uring_queue_init");
  unsigned in_flight = 0;
  uint64_t offset = 0;
  auto reap = [&] {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe->res <= 0) Die("raw write failed");
    if (static_cast<size_t>(cqe->res) != io_uring_cqe_get_data64(cqe)) Die("raw write was short");
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  };
  for (const Span& s : sources) {
    for (uint64_t pos = 0; pos < s.bytes; pos += kBlock) {
      const size_t len = std::min<uint64_t>(kBlock, s.bytes - pos);
      if (len % 4096 != 0) break;  // slots are page multiples; never happens
      if (in_flight == kDepth) reap();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_write(sqe, fd, s.data + pos, len, offset);
      io_uring_sqe_set_data64(sqe, len);
      io_uring_submit(&ring);
      ++in_flight;
      offset += len;
    }
  }
  while (in_flight > 0) reap();
  if (::fdatasync(fd) != 0) Die("fdatasync");
  ::close(fd);
  io_uring_queue_exit(&ring);
  return absl::ToDoubleSeconds(absl::Now() - start);
}


// Buffered write(2) of the same bytes in 8 MiB pieces, then fsync.
double BufferedWrite(const std::string& path, const std::vector<Span>& sources) {
  const absl::Time start = absl::Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  for (const Span& s : sources) {
    for (uint64_t pos = 0; pos < s.bytes;) {
      const size_t len = std::min<uint64_t>(kBlock, s.bytes - pos);
      const ssize_t w = ::write(fd, s.data + pos, len);
      if (w <= 0) Die("buffered write failed");
      pos += static_cast<uint64_t>(w);
    }
  }
  if (::fsync(fd) != 0) Die("fsync");
  ::close(fd);
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) {
  using namespace zcc::bench;
  namespace ckpt = zcc::checkpoint;
  const bool quick = QuickMode(argc, argv);
  const uint64_t per_rank = quick ? uint64_t{256} << 20 : uint64_t{1} << 30;
  // Even, so that zcc and raw go first equally often (the first write of a
  // round pays for the discards of the files deleted before it).
  const int rounds = quick ? 2 : 4;
  const char* env_dir = std::getenv("ZCC_BENCH_DIR");
  const std::string dir =
      absl::StrCat(env_dir != nullptr ? env_dir : "/tmp", "/persist-bench-", ::getpid());
  if (!zcc::MakeDirs(dir).ok()) Die("cannot create " + dir);
  const std::string job_dir = zcc::JoinPath(dir, "job");
  const std::string raw_path = zcc::JoinPath(dir, "raw.bin");

  // The ranks' slots, filled with incompressible bytes.
  std::vector<RankShards> ranks;
  uint64_t slot_total = 0;
  for (uint32_t r = 0; r < kRanks; ++r) {
    ranks.push_back(MakeRank(r, per_rank));
    slot_total += ranks.back().layout.slot_bytes;
  }
  // Slot r starts where slot r-1 ends (each a page multiple).
  Mapping slots(slot_total);
  std::vector<uint8_t*> slot_ptr;
  std::vector<Span> spans;
  uint64_t data_bytes = 0;
  size_t tensors = 0;
  uint64_t off = 0;
  for (uint32_t r = 0; r < kRanks; ++r) {
    slot_ptr.push_back(slots.data() + off);
    spans.push_back({slot_ptr[r], ranks[r].layout.slot_bytes});
    FillRandom(slot_ptr[r], ranks[r].layout.slot_bytes, r + 1);
    off += ranks[r].layout.slot_bytes;
    for (const RankTensor& t : ranks[r].tensors) data_bytes += t.nbytes;
    tensors += ranks[r].tensors.size();
  }
  uint64_t max_slot = 0;
  for (const RankShards& r : ranks) max_slot = std::max(max_slot, r.layout.slot_bytes);
  Mapping restore(std::max<uint64_t>(max_slot, kDepth * kBlock));
  std::fprintf(
      stderr,
      "persist_bench: %u ranks, %zu tensors, %.2f GiB of tensors (%.2f GiB of slots) in %s\n",
      kRanks, tensors, data_bytes / double(1 << 30), slot_total / double(1 << 30), dir.c_str());

  // (c) Buffered write + fsync, once (it is the slow one).
  DropCaches({});
  const double buffered_s = BufferedWrite(raw_path, spans);
  const double buffered = slot_total / buffered_s / 1e9;
  std::fprintf(stderr, "buffered write + fsync: %.2f GB/s (%.2f s)\n", buffered, buffered_s);
  ::unlink(raw_path.c_str());

  std::vector<double> zcc_w, raw_w, zcc_r, raw_r, cold_zcc, cold_raw, cold_raw_shm, cold_two_pass,
      cold_pool;
  std::vector<std::vector<zcc::daemon::RegisteredTensor>> registered;
  for (const RankShards& r : ranks) registered.push_back(zcc::daemon::testing::RegisteredFor(r));
  std::fprintf(stderr, "page cache: fsync + posix_fadvise(DONTNEED) per file%s\n",
               DropCaches({}) ? " + /proc/sys/vm/drop_caches"
                              : " (/proc/sys/vm/drop_caches not writable here)");
  int64_t step = 0;
  for (int round = 0; round < rounds; ++round) {
    // Start each round from the same state: no old step, no raw file.
    if (step > 0) {
      (void)zcc::RemoveTree(zcc::JoinPath(job_dir, zcc::format::StepDirName(step)));
    }
    ::unlink(raw_path.c_str());
    DropCaches({});
    absl::SleepFor(absl::Seconds(1));
    ++step;
    auto persist = [&] {
      const absl::Time start = absl::Now();
      uint64_t bytes = 0;
      for (uint32_t r = 0; r < kRanks; ++r) {
        auto stats = ckpt::WriteRankShards(job_dir, step, ranks[r], slot_ptr[r]);
        if (!stats.ok()) Die(std::string(stats.status().message()));
        if (!stats->direct_io) Die("the bench directory's file system refuses O_DIRECT");
        bytes += stats->bytes;
      }
      const absl::Time written = absl::Now();
      auto commit = ckpt::TryCommit(job_dir, "bench", step, kRanks);
      if (!commit.ok() || commit->outcome != ckpt::CommitOutcome::kCommitted) Die("commit failed");
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      zcc_w.push_back(bytes / s / 1e9);
      // Where the time goes: the ranks' files (shards, manifests, their
      // syncs) and the commit (index files, COMMITTED, renames, syncs).
      std::fprintf(stderr,
                   "round %d zcc persist: %.2f GB/s (%.3f s, %.2f GB in %u x 3 files: ranks' "
                   "writes %.3f s, commit %.3f s)\n",
                   round, zcc_w.back(), s, bytes / 1e9, kRanks,
                   absl::ToDoubleSeconds(written - start), absl::ToDoubleSeconds(absl::Now() - written));
    };
    auto raw = [&] {
      const double s = RawWrite(raw_path, spans);
      raw_w.push_back(slot_total / s / 1e9);
      std::fprintf(stderr, "round %d raw O_DIRECT write: %.2f GB/s (%.2f s)\n", round, raw_w.back(),
                   s);
    };
    // Alternate the order so that drift in the disk's speed hits both alike.
    if (round % 2 == 0) {
      raw();
      DropCaches({});
      persist();
    } else {
      persist();
      DropCaches({});
      raw();
    }

    const std::string step_dir = zcc::JoinPath(job_dir, zcc::format::StepDirName(step));
    std::vector<std::string> files;
    auto names = zcc::ListDir(step_dir);
    if (!names.ok()) Die(std::string(names.status().message()));
    for (const std::string& name : *names) files.push_back(zcc::JoinPath(step_dir, name));
    files.push_back(raw_path);
    auto restore_zcc = [&] {
      DropCaches(files);
      const absl::Time start = absl::Now();
      for (uint32_t r = 0; r < kRanks; ++r) {
        std::vector<ckpt::ReadTarget> targets;
        for (const RankTensor& t : ranks[r].tensors) {
          targets.push_back({t.name, std::string(zcc::format::TensorKindName(t.kind)), t.dtype, t.shape,
                             restore.data() + t.slot_offset, t.nbytes});
        }
        const absl::Status st = ckpt::ReadRankTensors(step_dir, r, targets);
        if (!st.ok()) Die(std::string(st.message()));
      }
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      zcc_r.push_back(data_bytes / s / 1e9);
      std::fprintf(stderr, "round %d zcc restore: %.2f GB/s (%.2f s)\n", round, zcc_r.back(), s);
      // The last rank read back must equal its slot.
      const RankShards& last = ranks[kRanks - 1];
      for (const RankTensor& t : last.tensors) {
        if (std::memcmp(restore.data() + t.slot_offset, slot_ptr[kRanks - 1] + t.slot_offset,
                        t.nbytes) != 0) {
          Die("restored bytes differ from the slot");
        }
      }
    };
    auto restore_raw = [&] {
      DropCaches(files);
      uint64_t got = 0;
      const double s = RawRead(raw_path, restore.data(), &got);
      raw_r.push_back(got / s / 1e9);
      std::fprintf(stderr, "round %d raw O_DIRECT read: %.2f GB/s (%.2f s)\n", round, raw_r.back(),
                   s);
    };
    if (round % 2 == 0) {
      restore_raw();
      restore_zcc();
    } else {
      restore_zcc();
      restore_raw();
    }
    // (f)/(g): the restore path against raw reads of the very same files.
    std::vector<std::string> shard_files;
    std::vector<uint64_t> shard_bytes;
    {
      auto index = ckpt::LoadStepIndex(step_dir);
      if (!index.ok()) Die(std::string(index.status().message()));
      for (const auto& f : index->files) {
        shard_files.push_back(zcc::JoinPath(step_dir, f.name));
        shard_bytes.push_back(f.bytes);
      }
    }
    // `full_verify`: the restore path before it read the step once, with
    // VerifyStep (every shard of every rank hashed) instead of the metadata
    // check; an informing row.
    // (h): the pool holds a piece per rank, each the rank's buffer; made
    // ready (outside the clock) before the round's pool variant.
    uint64_t piece = 0;
    for (uint32_t r = 0; r < kRanks; ++r) {
      uint64_t bytes = 0;
      for (const auto& t : registered[r]) bytes += (t.nbytes + 4095) / 4096 * 4096;
      piece = std::max(piece, zcc::shm::SegmentBytes(1, bytes));
    }
    zcc::daemon::StagingPool::Options pool_options;
    pool_options.name_prefix = absl::StrCat("zcc-persist-bench.", ::getpid(), ".pool");
    pool_options.target_bytes = piece * kRanks;
    pool_options.entry_bytes = piece;
    pool_options.room = [](uint64_t) { return ~uint64_t{0}; };
    pool_options.refill_after = absl::ZeroDuration();
    zcc::daemon::StagingPool pool(pool_options);
    pool.Start();
    auto pool_ready = [&] {
      pool.Recheck();
      while (pool.bytes() < pool_options.target_bytes) absl::SleepFor(absl::Milliseconds(10));
    };
    const zcc::daemon::MakeSegment from_pool = [&pool](const std::string& name, uint64_t bytes,
                                                       uid_t owner) {
      return pool.MakeSegment(name, bytes, owner);
    };
    auto restore_cold_path = [&](bool full_verify, bool pooled = false) {
      if (pooled) pool_ready();
      DropCaches(files);
      const absl::Time start = absl::Now();
      std::shared_ptr<const ckpt::GroupedIndex> grouped;
      const absl::Status checked =
          full_verify ? ckpt::VerifyStep(step_dir, ckpt::IoOptions(), &grouped).status()
                      : ckpt::CheckStepMetadata(step_dir, ckpt::IoOptions(), &grouped);
      if (!checked.ok()) Die(std::string(checked.message()));
      uint64_t bytes = 0;
      // All kept until the clock stops, as zccd keeps each until its trainer
      // has copied it (freeing them is not part of the read).
      std::vector<zcc::daemon::RestoreBuffer> buffers;
      for (uint32_t r = 0; r < kRanks; ++r) {
        auto buffer = zcc::daemon::ReadRestoreBuffer(
            step_dir, *grouped, registered[r], absl::StrCat("zcc-persist-bench.", ::getpid(), ".r", r),
            uint64_t{1} << 40, static_cast<uid_t>(-1), ckpt::IoOptions(), nullptr, false, nullptr,
            pooled ? from_pool : nullptr);
        if (!buffer.ok()) Die(std::string(buffer.status().message()));
        bytes += buffer->bytes_read;
        buffers.push_back(*std::move(buffer));
      }
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      const zcc::daemon::RestoreBuffer* last = &buffers.back();
      if (bytes != data_bytes) Die("the restore path read another byte count than the tensors");
      (pooled ? cold_pool : full_verify ? cold_two_pass : cold_zcc).push_back(bytes / s / 1e9);
      std::fprintf(stderr, "round %d zcc restore path, cold (%s + ReadRestoreBuffer%s): "
                   "%.2f GB/s (%.2f s)\n", round,
                   full_verify ? "VerifyStep" : "metadata check",
                   pooled ? ", buffers from a staging pool" : "", bytes / s / 1e9, s);
      const RankShards& lr = ranks[kRanks - 1];
      const uint8_t* base = last->segment.base() + last->data_offset;
      for (size_t i = 0; i < lr.tensors.size(); ++i) {
        if (std::memcmp(base + last->offsets[i], slot_ptr[kRanks - 1] + lr.tensors[i].slot_offset,
                        lr.tensors[i].nbytes) != 0) {
          Die("bytes restored through the restore path differ from the slot");
        }
      }
    };
    auto restore_cold_raw = [&] {
      DropCaches(files);
      const absl::Time start = absl::Now();
      uint64_t bytes = 0;
      for (const std::string& f : shard_files) {
        uint64_t got = 0;
        RawRead(f, restore.data(), &got);
        bytes += got;
      }
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      cold_raw.push_back(bytes / s / 1e9);
      std::fprintf(stderr, "round %d raw O_DIRECT read of the %zu shard files, cold: %.2f GB/s "
                   "(%.2f s)\n", round, shard_files.size(), cold_raw.back(), s);
    };
    auto restore_cold_raw_shm = [&] {
      DropCaches(files);
      const absl::Time start = absl::Now();
      uint64_t bytes = 0;
      std::vector<zcc::shm::Segment> segments;  // freed after the clock stops
      for (size_t i = 0; i < shard_files.size(); ++i) {
        const uint64_t room = (shard_bytes[i] + kBlock - 1) / kBlock * kBlock;
        auto segment = zcc::shm::Segment::Create(
            absl::StrCat("zcc-persist-bench.", ::getpid(), ".raw", i), room);
        if (!segment.ok()) Die(std::string(segment.status().message()));
        uint64_t got = 0;
        RawRead(shard_files[i], segment->base(), &got, /*whole=*/true);
        bytes += got;
        segments.push_back(*std::move(segment));
      }
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      cold_raw_shm.push_back(bytes / s / 1e9);
      std::fprintf(stderr, "round %d raw O_DIRECT read of the %zu shard files into fresh shared "
                   "memory, cold: %.2f GB/s (%.2f s)\n", round, shard_files.size(),
                   cold_raw_shm.back(), s);
    };
    if (round % 2 == 0) {
      restore_cold_raw();
      restore_cold_raw_shm();
      restore_cold_path(false);
      restore_cold_path(false, /*pooled=*/true);
      restore_cold_path(true);
    } else {
      restore_cold_path(true);
      restore_cold_path(false, /*pooled=*/true);
      restore_cold_path(false);
      restore_cold_raw_shm();
      restore_cold_raw();
    }
    if (round == rounds - 1) {
      DropCaches(files);
      const absl::Time start = absl::Now();
      auto report = ckpt::VerifyStep(step_dir);
      if (!report.ok()) Die(std::string(report.status().message()));
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      std::fprintf(stderr, "zcc VerifyStep (all ranks, every checksum): %.2f GB/s (%.2f s)\n",
                   report->bytes_checked / s / 1e9, s);
    }
  }
  bool keep = false;
  for (int i = 1; i < argc; ++i) keep = keep || std::strcmp(argv[i], "--keep") == 0;
  if (keep) {
    std::fprintf(stderr, "kept the last checkpoint in %s\n", job_dir.c_str());
    ::unlink(raw_path.c_str());
  } else {
    (void)zcc::RemoveTree(dir);
  }

  const double zw = Median(zcc_w), rw = Median(raw_w), zr = Median(zcc_r), rr = Median(raw_r);
  Emit({"persist_vs_raw_odirect", zw, rw, 0, ">= 0.9", "GB/s"});
  Emit({"persist_vs_buffered_fsync", zw, buffered, 0, "", "GB/s"});
  Emit({"restore_vs_raw_read", zr, rr, 0, ">= 0.8", "GB/s"});
  Emit({"restore_cold_vs_odirect", Median(cold_zcc), Median(cold_raw), 0, ">= 0.8", "GB/s"});
  Emit({"restore_cold_pool_vs_odirect", Median(cold_pool), Median(cold_raw), 0, ">= 0.8", "GB/s"});
  Emit({"restore_cold_vs_odirect_into_fresh_shm", Median(cold_zcc), Median(cold_raw_shm), 0, "",
        "GB/s"});
  Emit({"restore_cold_vs_verify_then_read", Median(cold_zcc), Median(cold_two_pass), 0, "",
        "GB/s"});
  return 0;
}
