#include "ema/ema_updater.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "ema/ema_kernels.h"
#include "ema/worker_group.h"

namespace zcc::ema {
namespace {

constexpr int kMaxThreads = 256;
// Elements per tensor and in all (2^48 fp32 = 1 PiB): keeps every byte count
// below 2^53 so that no sum or product overflows.
constexpr uint64_t kMaxElements = uint64_t{1} << 48;
// Tensors start, and thread boundaries fall, on multiples of this many
// elements (64 bytes of fp32): every thread's first store is cache-line
// aligned and no two threads write the same cache line.
constexpr uint64_t kAlignElements = 16;
constexpr size_t kHugePageBytes = size_t{2} << 20;

uint64_t RoundUp(uint64_t x, uint64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace

// An fp32 array, 64-byte aligned (2 MiB aligned and backed by transparent
// huge pages where the kernel allows, once it is that large: fewer TLB misses
// while streaming). Move-only owner of the allocation.
struct EmaUpdater::Buffer {
  float* data = nullptr;
  size_t bytes = 0;

  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data); }

  static absl::StatusOr<std::unique_ptr<Buffer>> Allocate(uint64_t elements) {
    auto buffer = std::make_unique<Buffer>();
    if (elements == 0) return buffer;
    const uint64_t bytes = elements * sizeof(float);
    const size_t alignment = bytes >= kHugePageBytes ? kHugePageBytes : 64;
    buffer->bytes = RoundUp(bytes, alignment);
    buffer->data = static_cast<float*>(std::aligned_alloc(alignment, buffer->bytes));
    if (buffer->data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("EMA: cannot allocate ", buffer->bytes, " bytes of fp32 state"));
    }
    // Only a hint: without huge pages the buffer works the same, a bit slower.
    if (alignment == kHugePageBytes) (void)madvise(buffer->data, buffer->bytes, MADV_HUGEPAGE);
    return buffer;
  }
};

absl::StatusOr<std::unique_ptr<EmaUpdater>> EmaUpdater::Create(std::vector<EmaTensorSpec> tensors,
                                                               const EmaOptions& options) {
  if (!(options.decay > 0.0 && options.decay < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EMA decay must be in (0, 1), got ", options.decay));
  }
  const float decay = static_cast<float>(options.decay);
  if (!(decay > 0.0f && decay < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("EMA decay ", options.decay, " rounds to ",
                                                   decay, " in fp32, outside (0, 1)"));
  }
  if (options.interval < 1) {
    return absl::InvalidArgumentError("EMA interval must be at least 1 step");
  }
  if (options.workers == nullptr && (options.threads < 1 || options.threads > kMaxThreads)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EMA threads must be in [1, ", kMaxThreads, "], got ", options.threads));
  }
  if (options.guard != NonFiniteGuard::kDoubleBuffer &&
      options.guard != NonFiniteGuard::kCheckFirst) {
    return absl::InvalidArgumentError("EMA: unknown non-finite guard");
  }
  if (tensors.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("EMA: too many tensors (", tensors.size(), ")"));
  }
  ZCC_ASSIGN_OR_RETURN(const Isa isa, ResolveIsa(options.isa));

  std::unique_ptr<EmaUpdater> updater(new EmaUpdater());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const EmaTensorSpec& t = tensors[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("EMA tensor ", i, " has an empty name"));
    }
    if (!internal::IsSupportedSourceDType(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("EMA tensor \"", t.name, "\" has dtype ",
                                                     format::DTypeName(t.dtype),
                                                     "; sources must be F32, BF16 or F16"));
    }
    if (t.elements > kMaxElements || offset + t.elements > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat("EMA tensor \"", t.name, "\": ", t.elements,
                                                     " elements exceed the limit of ", kMaxElements,
                                                     " in all"));
    }
    if (!updater->index_.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("EMA tensor name \"", t.name, "\" appears twice"));
    }
    updater->offsets_.push_back(offset);
    updater->state_bytes_ += t.elements * sizeof(float);
    offset = RoundUp(offset + t.elements, kAlignElements);
  }
  updater->tensors_ = std::move(tensors);
  updater->isa_ = isa;
  updater->decay_ = decay;
  updater->one_minus_decay_ = 1.0f - decay;  // exact for decay >= 0.5
  updater->interval_ = options.interval;
  updater->guard_ = options.guard;

  const int buffers = options.guard == NonFiniteGuard::kDoubleBuffer ? 2 : 1;
  for (int b = 0; b < buffers; ++b) {
    ZCC_ASSIGN_OR_RETURN(updater->buffers_[b], Buffer::Allocate(offset));
  }
  if (options.workers != nullptr) {
    updater->workers_ = options.workers;
  } else {
    ZCC_ASSIGN_OR_RETURN(updater->workers_, WorkerGroup::Create(options.threads));
  }
  updater->PlanThreads(updater->workers_->size());
  return updater;
}

EmaUpdater::~EmaUpdater() = default;

void EmaUpdater::PlanThreads(int threads) {
  // Bytes each element moves: its source, plus the EMA read and written.
  auto weight = [this](size_t i) {
    return format::DTypeSize(tensors_[i].dtype) + 2 * sizeof(float);
  };
  uint64_t total = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) total += tensors_[i].elements * weight(i);

  // cuts[t] is where thread t starts: (tensor, element), cut at kAlignElements.
  struct Position {
    size_t tensor;
    uint64_t element;
  };
  std::vector<Position> cuts(threads + 1, Position{tensors_.size(), 0});
  cuts[0] = Position{0, 0};
  size_t k = 0;
  uint64_t before_k = 0;  // weight of the tensors before k
  for (int t = 1; t < threads; ++t) {
    const uint64_t target = total / threads * t + total % threads * t / threads;
    while (k < tensors_.size() && before_k + tensors_[k].elements * weight(k) <= target) {
      before_k += tensors_[k].elements * weight(k);
      ++k;
    }
    if (k == tensors_.size()) break;
    const uint64_t element = (target - before_k) / weight(k) / kAlignElements * kAlignElements;
    cuts[t] = Position{k, element};
  }

  plan_.assign(threads, {});
  for (int t = 0; t < threads; ++t) {
    const Position from = cuts[t];
    const Position to = cuts[t + 1];
    for (size_t j = from.tensor; j < tensors_.size(); ++j) {
      if (j > to.tensor || (j == to.tensor && to.element == 0)) break;
      const uint64_t begin = j == from.tensor ? from.element : 0;
      const uint64_t end = j == to.tensor ? to.element : tensors_[j].elements;
      if (begin < end) plan_[t].push_back(Segment{static_cast<uint32_t>(j), begin, end});
    }
  }
}

float* EmaUpdater::BufferData(int buffer) const { return buffers_[buffer]->data; }

size_t EmaUpdater::RunPass(Pass pass, const void* const* sources, int in, int out, float decay,
                           float one_minus_decay) {
  const size_t none = tensors_.size();
  // Each thread reports the first tensor of its range with a non-finite
  // source. Thread ranges follow tensor order and a thread stops at its first
  // find, so the minimum is the first such tensor overall, whatever the
  // thread count.
  std::vector<size_t> first_nonfinite(plan_.size(), none);
  const float* in_data = BufferData(in);
  float* out_data = BufferData(out);
  const bool stream = in != out;
  workers_->RunOnAll([&](int t) {
    for (const Segment& s : plan_[t]) {
      const EmaTensorSpec& spec = tensors_[s.tensor];
      const internal::Kernels kernels = internal::GetKernels(isa_, spec.dtype);
      const void* src = static_cast<const unsigned char*>(sources[s.tensor]) +
                        s.begin * format::DTypeSize(spec.dtype);
      const uint64_t at = offsets_[s.tensor] + s.begin;
      const size_t n = s.end - s.begin;
      bool nonfinite = false;
      switch (pass) {
        case Pass::kCheck:
          nonfinite = kernels.check(src, n);
          break;
        case Pass::kInit:
          nonfinite = kernels.init(src, out_data + at, n, stream);
          break;
        case Pass::kUpdate:
          nonfinite =
              kernels.update(src, in_data + at, out_data + at, n, decay, one_minus_decay, stream);
          break;
      }
      if (nonfinite) {
        first_nonfinite[t] = s.tensor;
        return;
      }
    }
  });
  return *std::min_element(first_nonfinite.begin(), first_nonfinite.end());
}

absl::StatusOr<EmaUpdateResult> EmaUpdater::Update(absl::Span<const void* const> sources,
                                                   int64_t step) {
  if (sources.size() != tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EMA update: ", sources.size(), " sources for ", tensors_.size(), " tensors"));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] == nullptr && tensors_[i].elements != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EMA update: null source for tensor \"", tensors_[i].name, "\""));
    }
  }
  return UpdateChecked(sources.data(), step);
}

absl::StatusOr<EmaUpdateResult> EmaUpdater::Update(const void* base, uint64_t base_bytes,
                                                   absl::Span<const uint64_t> offsets,
                                                   int64_t step) {
  if (offsets.size() != tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EMA update: ", offsets.size(), " offsets for ", tensors_.size(), " tensors"));
  }
  if (base == nullptr && base_bytes != 0) {
    return absl::InvalidArgumentError("EMA update: null base with a non-zero size");
  }
  std::vector<const void*> sources(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    const uint64_t nbytes = tensors_[i].elements * format::DTypeSize(tensors_[i].dtype);
    if (offsets[i] > base_bytes || nbytes > base_bytes - offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EMA update: tensor \"", tensors_[i].name, "\" at offset ", offsets[i], " (", nbytes,
          " bytes) does not lie within the ", base_bytes, "-byte source region"));
    }
    sources[i] = static_cast<const unsigned char*>(base) + offsets[i];
  }
  return UpdateChecked(sources.data(), step);
}

absl::StatusOr<EmaUpdateResult> EmaUpdater::UpdateChecked(const void* const* sources,
                                                          int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("EMA update: negative step ", step));
  }
  if (step <= last_step()) {
    return absl::FailedPreconditionError(absl::StrCat("EMA update for step ", step, " after step ",
                                                      last_step(), "; steps must increase"));
  }
  const absl::Time start = absl::Now();
  const bool init = !initialized();
  const Pass pass = init ? Pass::kInit : Pass::kUpdate;
  // The decay of this update: d, or d^k after a gap of k intervals.
  float decay = decay_;
  float one_minus_decay = one_minus_decay_;
  if (!init && step - last_step() != int64_t{interval_}) {
    const double k = static_cast<double>(step - last_step()) / interval_;
    decay = static_cast<float>(std::pow(static_cast<double>(decay_), k));
    one_minus_decay = 1.0f - decay;
  }
  const size_t none = tensors_.size();
  size_t nonfinite = none;
  if (guard_ == NonFiniteGuard::kDoubleBuffer) {
    const int next = 1 - current_;
    nonfinite = RunPass(pass, sources, current_, next, decay, one_minus_decay);
    if (nonfinite == none) current_ = next;
  } else {
    nonfinite = RunPass(Pass::kCheck, sources, 0, 0, decay, one_minus_decay);
    if (nonfinite == none && RunPass(pass, sources, 0, 0, decay, one_minus_decay) != none) {
      // Only a caller writing the sources during the update gets here; the
      // EMA now holds a mix and is dropped (the next update starts afresh).
      initialized_.store(false, std::memory_order_release);
      last_update_ns_.store(absl::ToInt64Nanoseconds(absl::Now() - start));
      return absl::DataLossError(absl::StrCat(
          "EMA update for step ", step, ": sources changed during the update; EMA discarded"));
    }
  }
  EmaUpdateResult result;
  if (nonfinite != none) {
    result.nonfinite_tensor = tensors_[nonfinite].name;
    skipped_nonfinite_.fetch_add(1, std::memory_order_relaxed);
  } else {
    result.applied = true;
    result.initialized = init;
    initialized_.store(true, std::memory_order_release);
    last_step_.store(step, std::memory_order_release);
    updates_applied_.fetch_add(1, std::memory_order_relaxed);
  }
  last_update_ns_.store(absl::ToInt64Nanoseconds(absl::Now() - start), std::memory_order_relaxed);
  return result;
}

absl::Status EmaUpdater::Load(absl::Span<const absl::Span<const float>> data, int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("EMA load: negative step ", step));
  if (data.size() != tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EMA load: ", data.size(), " tensors for ", tensors_.size()));
  }
  const internal::CheckKernel check = internal::GetKernels(isa_, format::DType::kF32).check;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i].size() != tensors_[i].elements) {
      return absl::InvalidArgumentError(absl::StrCat("EMA load: tensor \"", tensors_[i].name,
                                                     "\" has ", data[i].size(),
                                                     " elements, expected ", tensors_[i].elements));
    }
    if (check(data[i].data(), data[i].size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("EMA load: tensor \"", tensors_[i].name, "\" holds NaN or Inf"));
    }
  }
  float* out = BufferData(current_);
  for (size_t i = 0; i < data.size(); ++i) {
    if (!data[i].empty())
      std::memcpy(out + offsets_[i], data[i].data(), data[i].size() * sizeof(float));
  }
  initialized_.store(true, std::memory_order_release);
  last_step_.store(step, std::memory_order_release);
  loads_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Span<const float> EmaUpdater::ema(size_t i) const {
  if (!initialized() || tensors_[i].elements == 0) return {};
  return absl::Span<const float>(BufferData(current_) + offsets_[i], tensors_[i].elements);
}

EmaCounters EmaUpdater::counters() const {
  EmaCounters c;
  c.updates_applied = updates_applied_.load(std::memory_order_relaxed);
  c.skipped_nonfinite = skipped_nonfinite_.load(std::memory_order_relaxed);
  c.loads = loads_.load(std::memory_order_relaxed);
  c.last_update_ns = last_update_ns_.load(std::memory_order_relaxed);
  return c;
}

std::optional<size_t> EmaUpdater::FindTensor(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

int EmaUpdater::threads() const { return workers_->size(); }

uint64_t EmaUpdater::allocated_bytes() const {
  uint64_t bytes = 0;
  for (const auto& b : buffers_) {
    if (b != nullptr) bytes += b->bytes;
  }
  return bytes;
}

}  // namespace zcc::ema
