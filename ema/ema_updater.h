// EmaUpdater: the exponential moving average of a rank's parameters,
//   ema = decay * ema + (1 - decay) * param,
// kept in fp32 for a fixed set of tensors whose sources are fp32, bf16 or
// fp16 (DESIGN.md section 4). The first applied update initialises the EMA
// to the parameters converted to fp32 (exact for all three dtypes).
//
// Arithmetic. The decay is rounded to fp32 once (d) and 1 - d is computed
// exactly from it; every element is then updated as
//   ema' = fl(fl(d * ema) + fl((1 - d) * param))
// on every instruction-set level (scalar, AVX2, AVX-512, chosen at run time,
// see ema_isa.h) and every thread count, so results are bit-identical across
// machines and configurations. Relative to exact arithmetic each step adds at
// most (2u + u^2) * (d|ema| + (1-d)|param|) with u = 2^-24.
//
// Gaps. Updates are expected every `interval` steps. When steps were missed
// (the snapshot was skipped), the next update folds its parameters in as if
// they had held through the gap: with k = (step - last_step) / interval,
//   ema' = d^k * ema + (1 - d^k) * param,
// so the average's horizon in steps does not depend on how many snapshots
// were taken. Steps whose update was skipped for non-finite sources count as
// missed too. d^k is computed once per update in double and rounded to fp32
// (then 1 - d^k from it), so a gap-free run is bit-identical to one without
// this rule, and every ISA and thread count still agrees bit for bit.
//
// Non-finite parameters. An update whose sources contain any NaN or Inf is
// skipped as a whole: every tensor's EMA stays bit-for-bit as it was, the
// result names the first such tensor and counters().skipped_nonfinite grows.
// An in-place pass cannot be undone (rounding loses the old value), so a
// skip needs either the old values kept or every source known finite before
// the first write. The NonFiniteGuard option picks which:
//  * kDoubleBuffer (default): two fp32 buffers. One fused pass reads the
//    source and the current buffer, writes the other with non-temporal stores
//    and notes non-finite sources on the way; only when no thread saw one does
//    the other buffer become current. Memory traffic is exactly one read of
//    the source, one read and one write of the EMA; the cost is twice the EMA
//    memory.
//  * kCheckFirst: one buffer. A read-only pass checks every source, then the
//    update runs in place. Half the memory, but the sources are read twice
//    (about 20% more traffic for bf16 sources, 33% for fp32).
// bench/ema measures both against a plain in-place loop over the same bytes.
//
// Work is split across `threads` persistent threads (the calling thread is
// one of them) by bytes moved, not by tensors: thread boundaries fall inside
// tensors where needed, on 64-byte boundaries of the EMA buffers.
//
// Thread-safety: Update, Load and ema() must not run concurrently with each
// other (the daemon's EMA stage serialises them per rank); initialized(),
// last_step() and counters() may be called from any thread at any time.
// Ownership: the updater owns its EMA buffers (64-byte aligned, freed with
// it) and its worker threads (joined by the destructor). The caller owns the
// sources; they need to stay valid only during Update.
#ifndef ZCC_EMA_EMA_UPDATER_H_
#define ZCC_EMA_EMA_UPDATER_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ema/ema_isa.h"
#include "format/dtype.h"

namespace zcc::ema {

class WorkerGroup;  // worker_group.h

struct EmaTensorSpec {
  std::string name;                           // unique, not empty
  format::DType dtype = format::DType::kF32;  // of the source: F32, BF16 or F16
  uint64_t elements = 0;                      // may be 0
};

enum class NonFiniteGuard : uint8_t { kDoubleBuffer, kCheckFirst };

struct EmaOptions {
  double decay = 0.999;  // in (0, 1), also after rounding to fp32
  int threads = 1;       // 1..256, including the calling thread
  NonFiniteGuard guard = NonFiniteGuard::kDoubleBuffer;
  Isa isa = Isa::kAuto;  // see ResolveIsa()
  uint32_t interval = 1;  // steps between updates (>= 1); longer gaps decay more (see above)
  // A group to run on, shared with other EMAs (its size replaces `threads`);
  // null: the updater starts a group of `threads` of its own.
  std::shared_ptr<WorkerGroup> workers;
};

struct EmaUpdateResult {
  bool applied = false;          // false: skipped because a source was non-finite
  bool initialized = false;      // this update initialised the EMA
  std::string nonfinite_tensor;  // when skipped: the first tensor holding NaN/Inf
};

struct EmaCounters {
  uint64_t updates_applied = 0;  // including the initialising one
  uint64_t skipped_nonfinite = 0;
  uint64_t loads = 0;
  int64_t last_update_ns = 0;  // wall time of the last Update, applied or not
};

class EmaUpdater {
 public:
  // Validates the specs and options, resolves the instruction-set level,
  // allocates the EMA buffers and starts threads - 1 worker threads.
  // InvalidArgument for a bad spec or option; ResourceExhausted when memory
  // runs out.
  static absl::StatusOr<std::unique_ptr<EmaUpdater>> Create(std::vector<EmaTensorSpec> tensors,
                                                            const EmaOptions& options);

  ~EmaUpdater();
  EmaUpdater(const EmaUpdater&) = delete;
  EmaUpdater& operator=(const EmaUpdater&) = delete;

  // Applies one EMA step from `sources` (one pointer per tensor, in spec
  // order, any alignment; null allowed for empty tensors) or initialises the
  // EMA from them when !initialized(). `step` must be >= 0 and greater than
  // last_step(). A non-finite source is not an error: the result says the
  // update was skipped. InvalidArgument and FailedPrecondition leave the EMA
  // untouched. DataLoss (kCheckFirst only) means the sources changed between
  // the check and the update, which only a caller writing them during Update
  // causes: the EMA is dropped and the next update initialises it afresh.
  absl::StatusOr<EmaUpdateResult> Update(absl::Span<const void* const> sources, int64_t step);

  // As above, with tensor i at `base + offsets[i]`; every tensor must lie
  // within the `base_bytes` bytes at `base` (a staging slot).
  absl::StatusOr<EmaUpdateResult> Update(const void* base, uint64_t base_bytes,
                                         absl::Span<const uint64_t> offsets, int64_t step);

  // Sets the EMA from restored fp32 data (one span per tensor, in spec order,
  // sizes matching) and makes `step` (>= 0) the last step. All-or-nothing:
  // InvalidArgument for a wrong count or size, or a non-finite value.
  absl::Status Load(absl::Span<const absl::Span<const float>> data, int64_t step);

  // The fp32 EMA of tensor `i` (for writing checkpoints); empty until
  // initialized(). Valid until the next Update or Load.
  absl::Span<const float> ema(size_t i) const;

  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  // Step of the last applied update or Load; -1 before either.
  int64_t last_step() const { return last_step_.load(std::memory_order_acquire); }
  EmaCounters counters() const;

  size_t num_tensors() const { return tensors_.size(); }
  const EmaTensorSpec& tensor(size_t i) const { return tensors_[i]; }
  std::optional<size_t> FindTensor(absl::string_view name) const;

  Isa isa() const { return isa_; }
  float decay() const { return decay_; }
  uint32_t interval() const { return interval_; }
  // Updates are expected every `interval` steps (>= 1) from now on: an EMA
  // taken over by a trainer that asks for another interval, whose next gap
  // decays by the new one.
  void set_interval(uint32_t interval) { interval_ = std::max<uint32_t>(1, interval); }
  int threads() const;
  NonFiniteGuard guard() const { return guard_; }
  // Bytes of fp32 EMA state (what a checkpoint holds) and bytes allocated for
  // it (twice that, rounded, with kDoubleBuffer).
  uint64_t state_bytes() const { return state_bytes_; }
  uint64_t allocated_bytes() const;

 private:
  // A contiguous element range of one tensor that one thread updates.
  struct Segment {
    uint32_t tensor;
    uint64_t begin;
    uint64_t end;
  };
  struct Buffer;
  enum class Pass : uint8_t { kCheck, kInit, kUpdate };

  EmaUpdater() = default;
  // Splits the work into per-thread segment lists (plan_).
  void PlanThreads(int threads);
  // Runs `pass` over every segment on all threads, reading `sources`, the EMA
  // buffer `in` and writing `out` (in may equal out). Returns the index of the
  // first tensor with a non-finite source, or num_tensors() when none.
  size_t RunPass(Pass pass, const void* const* sources, int in, int out, float decay,
                 float one_minus_decay);
  absl::StatusOr<EmaUpdateResult> UpdateChecked(const void* const* sources, int64_t step);
  float* BufferData(int buffer) const;

  std::vector<EmaTensorSpec> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<uint64_t> offsets_;  // element offset of each tensor in a buffer
  uint64_t state_bytes_ = 0;
  Isa isa_ = Isa::kScalar;
  float decay_ = 0;
  float one_minus_decay_ = 0;
  uint32_t interval_ = 1;
  NonFiniteGuard guard_ = NonFiniteGuard::kDoubleBuffer;

  std::unique_ptr<Buffer> buffers_[2];      // [1] only with kDoubleBuffer
  int current_ = 0;                         // the buffer holding the EMA
  std::vector<std::vector<Segment>> plan_;  // per thread
  std::shared_ptr<WorkerGroup> workers_;

  std::atomic<bool> initialized_{false};
  std::atomic<int64_t> last_step_{-1};
  std::atomic<uint64_t> updates_applied_{0};
  std::atomic<uint64_t> skipped_nonfinite_{0};
  std::atomic<uint64_t> loads_{0};
  std::atomic<int64_t> last_update_ns_{0};
};

}  // namespace zcc::ema

#endif  // ZCC_EMA_EMA_UPDATER_H_
