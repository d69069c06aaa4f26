// EMA throughput against the machine's memory-bandwidth ceiling, and EMA
// memory per rank against the data-parallel degree.
//
// Throughput rows (ema_gbps_<dtype>_<n>thread[s]): one EmaUpdater::Update
// over a synthetic model with `kEmaBytes` of fp32 EMA state (far beyond any
// cache), counting the bytes an update must move: the source, plus the fp32
// EMA read and written. The reference is a plain fused in-place loop
// y[i] = a*y[i] + b*x[i] over the same elements, source dtype and thread
// count, vectorised for the best instruction set of this CPU: the same bytes
// in the pattern that streams fastest (in place, so no read-for-ownership).
// Both take the best of N repetitions, interleaved so that noise from other
// processes hits both alike. Informative rows (no target): the kCheckFirst
// guard (half the memory, a second read of the sources), and the EMA against
// the three-array loop out[i] = a*y[i] + b*x[i] (the same counted bytes, but
// its stores into a cold `out` each read the line first: a lower ceiling).
//
// Memory rows (ema_state_bytes_per_rank_dp<N>): the fp32 EMA state of the
// most-loaded rank for a 7B-parameter Llama-like model at DP = 1, 2, 4, 8,
// with the tensors divided by the shard assigner; the reference is DP = 1.
//
// ZCC_EMA_ISA=scalar|avx2|avx512 runs the EMA at a lower level (the
// reference keeps the best one). Flags: --quick (128 MiB, fewer
// repetitions), --only=PATTERN (an extended regex over "ema_bench:<row>").
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/report.h"
#include "ema/ema_isa.h"
#include "ema/ema_updater.h"
#include "format/dtype.h"
#include "sharding/shard_assigner.h"

namespace zcc::bench {
namespace {

using format::DType;

// ---------------------------------------------------------------- helpers

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Page-aligned, huge-page-advised memory, touched once so that page faults
// stay out of the timings (the EMA buffers get the same by the warm-up update).
struct Memory {
  void* data = nullptr;
  size_t bytes = 0;
  explicit Memory(size_t n) : bytes((n + (2u << 20) - 1) / (2u << 20) * (2u << 20)) {
    data = std::aligned_alloc(2u << 20, bytes);
    if (data == nullptr) {
      std::fprintf(stderr, "ema_bench: cannot allocate %zu bytes\n", bytes);
      std::exit(1);
    }
    (void)madvise(data, bytes, MADV_HUGEPAGE);
    std::memset(data, 0, bytes);
  }
  ~Memory() { std::free(data); }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
};

// Fills `n` source elements with finite values around 1 (mixed signs).
void FillSource(DType dtype, void* p, size_t n) {
  std::mt19937 rng(42);
  auto* u32 = static_cast<uint32_t*>(p);
  auto* u16 = static_cast<uint16_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = 0x3f000000u | (rng() & 0x807fffffu);  // +-[0.5, 1)
    if (dtype == DType::kF32) {
      u32[i] = bits;
    } else {
      u16[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

// ---------------------------------------------------------------- reference loop

// out[i] = a*y[i] + b*x[i], x converted from the source dtype; out == y
// (in place) for the ceiling, a third array for the three-array loop.
template <DType kDType>
void AxpbyScalar(const void* xv, const float* y, float* out, size_t n, float a, float b) {
  const auto* x = static_cast<const unsigned char*>(xv);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    if constexpr (kDType == DType::kF32) {
      std::memcpy(&bits, x + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, x + 2 * i, 2);
      bits = uint32_t{h} << 16;
    }
    float v;
    std::memcpy(&v, &bits, 4);
    out[i] = a * y[i] + b * v;
  }
}

template <DType kDType>
__attribute__((target("avx512f,avx512bw"))) void Axpby512(const void* xv, const float* y,
                                                          float* out, size_t n, float a, float b) {
  const auto* x = static_cast<const unsigned char*>(xv);
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 vx;
    if constexpr (kDType == DType::kF32) {
      vx = _mm512_loadu_ps(x + 4 * i);
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * i));
      // Zero-masked forms with a full mask: the plain ones trip GCC 12's
      // false -Wmaybe-uninitialized (GCC PR 105593).
      vx = _mm512_castsi512_ps(
          _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
    }
    _mm512_storeu_ps(
        out + i, _mm512_add_ps(_mm512_mul_ps(va, _mm512_loadu_ps(y + i)), _mm512_mul_ps(vb, vx)));
  }
  AxpbyScalar<kDType>(x + format::DTypeSize(kDType) * i, y + i, out + i, n - i, a, b);
}

template <DType kDType>
__attribute__((target("avx2,fma,f16c"))) void Axpby256(const void* xv, const float* y, float* out,
                                                       size_t n, float a, float b) {
  const auto* x = static_cast<const unsigned char*>(xv);
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 vx;
    if constexpr (kDType == DType::kF32) {
      vx = _mm256_loadu_ps(reinterpret_cast<const float*>(x + 4 * i));
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 2 * i));
      vx = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    _mm256_storeu_ps(
        out + i, _mm256_add_ps(_mm256_mul_ps(va, _mm256_loadu_ps(y + i)), _mm256_mul_ps(vb, vx)));
  }
  AxpbyScalar<kDType>(x + format::DTypeSize(kDType) * i, y + i, out + i, n - i, a, b);
}

using AxpbyFn = void (*)(const void*, const float*, float*, size_t, float, float);

AxpbyFn ReferenceLoop(DType dtype) {
  const bool f32 = dtype == DType::kF32;
  switch (ema::BestSupportedIsa()) {
    case ema::Isa::kAvx512:
      return f32 ? &Axpby512<DType::kF32> : &Axpby512<DType::kBF16>;
    case ema::Isa::kAvx2:
      return f32 ? &Axpby256<DType::kF32> : &Axpby256<DType::kBF16>;
    default:
      return f32 ? &AxpbyScalar<DType::kF32> : &AxpbyScalar<DType::kBF16>;
  }
}

// One pass of a loop over n elements on `threads` threads, each an equal
// contiguous range (cut at 16 elements).
double RunLoop(AxpbyFn fn, DType dtype, const void* x, const float* y, float* out, size_t n,
               int threads) {
  const size_t esize = format::DTypeSize(dtype);
  const auto start = std::chrono::steady_clock::now();
  auto part = [&](int t) {
    const size_t begin = n * t / threads / 16 * 16;
    const size_t end = t + 1 == threads ? n : n * (t + 1) / threads / 16 * 16;
    fn(static_cast<const unsigned char*>(x) + begin * esize, y + begin, out + begin, end - begin,
       0.999f, 0.001f);
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(part, t);
  part(0);
  for (std::thread& w : workers) w.join();
  return Seconds(start);
}

// ---------------------------------------------------------------- throughput

// A model-like mix of tensor sizes totalling about `elements`: mostly large
// matrices, some vectors (norms, biases) with odd sizes.
std::vector<ema::EmaTensorSpec> SyntheticTensors(DType dtype, uint64_t elements) {
  std::vector<ema::EmaTensorSpec> specs;
  std::mt19937_64 rng(7);
  uint64_t left = elements;
  for (int i = 0; left > 0; ++i) {
    uint64_t n =
        i % 5 == 4 ? 4096 + rng() % 1000 : (uint64_t{4} << 20) + rng() % (uint64_t{8} << 20);
    n = std::min(n, left);
    specs.push_back({absl::StrCat("layers.", i, ".weight"), dtype, n});
    left -= n;
  }
  return specs;
}

struct Throughput {
  double ema_gbps = 0;
  double reference_gbps = 0;    // in place: the ceiling
  double three_array_gbps = 0;  // out[i] = a*y[i] + b*x[i]
  std::string isa;
};

Throughput MeasureThroughput(DType dtype, int threads, ema::NonFiniteGuard guard, uint64_t elements,
                             int reps) {
  const std::vector<ema::EmaTensorSpec> specs = SyntheticTensors(dtype, elements);
  const size_t esize = format::DTypeSize(dtype);
  Memory source(elements * esize);
  FillSource(dtype, source.data, elements);
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (const auto& s : specs) {
    offsets.push_back(at);
    at += s.elements * esize;
  }

  ema::EmaOptions options;
  options.decay = 0.999;
  options.threads = threads;
  options.guard = guard;
  auto created = ema::EmaUpdater::Create(specs, options);
  if (!created.ok()) {
    std::fprintf(stderr, "ema_bench: %s\n", created.status().ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<ema::EmaUpdater> ema = std::move(created).value();
  Memory reference_state(elements * sizeof(float));
  Memory reference_out(elements * sizeof(float));
  auto* y = static_cast<float*>(reference_state.data);
  auto* out = static_cast<float*>(reference_out.data);
  const AxpbyFn reference = ReferenceLoop(dtype);

  int64_t step = 0;
  auto update = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto result = ema->Update(source.data, source.bytes, offsets, step++);
    const double s = Seconds(start);
    if (!result.ok() || !result->applied) {
      std::fprintf(stderr, "ema_bench: update failed: %s\n",
                   result.ok() ? "skipped" : result.status().ToString().c_str());
      std::exit(1);
    }
    return s;
  };
  // Warm-up: the initialising update and one more touch both EMA buffers.
  update();
  update();
  RunLoop(reference, dtype, source.data, y, y, elements, threads);
  RunLoop(reference, dtype, source.data, y, out, elements, threads);

  double best_ema = 1e30, best_reference = 1e30, best_three_array = 1e30;
  for (int r = 0; r < reps; ++r) {
    best_ema = std::min(best_ema, update());
    best_reference =
        std::min(best_reference, RunLoop(reference, dtype, source.data, y, y, elements, threads));
    best_three_array = std::min(best_three_array,
                                RunLoop(reference, dtype, source.data, y, out, elements, threads));
  }
  const double bytes = static_cast<double>(elements) * (esize + 2 * sizeof(float));
  return Throughput{bytes / best_ema / 1e9, bytes / best_reference / 1e9,
                    bytes / best_three_array / 1e9, std::string(ema::IsaName(ema->isa()))};
}

// ---------------------------------------------------------------- memory per rank

// Llama-2-7B shapes (6.74e9 parameters), bf16.
std::vector<sharding::ShardTensor> SevenBillionManifest(uint32_t dp, uint32_t rank) {
  const uint64_t hidden = 4096, ffn = 11008, vocab = 32000, layers = 32;
  std::vector<sharding::ShardTensor> m;
  const sharding::ReplicaGroup group{sharding::ReplicaKind::kDataParallel, dp, rank, 0};
  auto add = [&](std::string name, uint64_t params) {
    m.push_back({std::move(name), 2 * params, group});
  };
  add("model.embed_tokens.weight", vocab * hidden);
  for (uint64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      add(absl::StrCat(p, "self_attn.", proj, ".weight"), hidden * hidden);
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      add(absl::StrCat(p, "mlp.", proj, ".weight"), hidden * ffn);
    }
    add(p + "input_layernorm.weight", hidden);
    add(p + "post_attention_layernorm.weight", hidden);
  }
  add("model.norm.weight", hidden);
  add("lm_head.weight", vocab * hidden);
  return m;
}

// fp32 EMA bytes of the most-loaded rank at data-parallel degree `dp`.
uint64_t EmaBytesPerRank(uint32_t dp) {
  uint64_t most = 0;
  for (uint32_t rank = 0; rank < dp; ++rank) {
    auto plan = sharding::PlanRankWrites(SevenBillionManifest(dp, rank));
    if (!plan.ok()) {
      std::fprintf(stderr, "ema_bench: %s\n", plan.status().ToString().c_str());
      std::exit(1);
    }
    most = std::max(most, plan->bytes_written / 2 * 4);  // bf16 parameters, fp32 EMA
  }
  return most;
}

// ---------------------------------------------------------------- main

struct RowFilter {
  std::unique_ptr<std::regex> pattern;
  bool Wants(const std::string& row) const {
    return pattern == nullptr || std::regex_search("ema_bench:" + row, *pattern);
  }
};

RowFilter ParseOnly(int argc, char** argv) {
  RowFilter filter;
  for (int i = 1; i < argc; ++i) {
    const char* flag = "--only=";
    if (std::strncmp(argv[i], flag, std::strlen(flag)) != 0) continue;
    const std::string pattern = argv[i] + std::strlen(flag);
    if (pattern.empty()) continue;
    try {
      filter.pattern = std::make_unique<std::regex>(pattern, std::regex::extended);
    } catch (const std::regex_error&) {
      std::fprintf(stderr, "ema_bench: --only=%s is not a valid pattern; running every row\n",
                   pattern.c_str());
    }
  }
  return filter;
}

int Main(int argc, char** argv) {
  const bool quick = QuickMode(argc, argv);
  const RowFilter filter = ParseOnly(argc, argv);
  const uint64_t ema_bytes = quick ? uint64_t{128} << 20 : uint64_t{512} << 20;
  const uint64_t elements = ema_bytes / sizeof(float);
  const int reps = quick ? 3 : 7;

  struct Config {
    DType dtype;
    int threads;
    ema::NonFiniteGuard guard;
  };
  std::vector<Config> configs;
  for (ema::NonFiniteGuard guard :
       {ema::NonFiniteGuard::kDoubleBuffer, ema::NonFiniteGuard::kCheckFirst}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int threads : {1, 2}) configs.push_back({dtype, threads, guard});
    }
  }
  for (const Config& c : configs) {
    const bool default_guard = c.guard == ema::NonFiniteGuard::kDoubleBuffer;
    const std::string name =
        absl::StrCat("ema_gbps_", c.dtype == DType::kF32 ? "f32" : "bf16", "_", c.threads,
                     c.threads == 1 ? "thread" : "threads", default_guard ? "" : "_checkfirst");
    const std::string three_array_name = name + "_vs_3array_loop";
    const bool three_array = default_guard && filter.Wants(three_array_name);
    if (!filter.Wants(name) && !three_array) continue;
    const Throughput t = MeasureThroughput(c.dtype, c.threads, c.guard, elements, reps);
    std::fprintf(stderr,
                 "%s: EMA %.1f GB/s (%s), in-place loop %.1f GB/s, three-array loop %.1f GB/s, "
                 "%llu MiB of EMA\n",
                 name.c_str(), t.ema_gbps, t.isa.c_str(), t.reference_gbps, t.three_array_gbps,
                 static_cast<unsigned long long>(ema_bytes >> 20));
    // The default guard carries the target; the other rows only inform.
    if (filter.Wants(name)) {
      Emit(Row{name, t.ema_gbps, t.reference_gbps, 0, default_guard ? ">= 0.85" : "", "GB/s"});
    }
    if (three_array) Emit(Row{three_array_name, t.ema_gbps, t.three_array_gbps, 0, "", "GB/s"});
  }

  const uint64_t dp1 = EmaBytesPerRank(1);
  for (uint32_t dp : {1u, 2u, 4u, 8u}) {
    const std::string name = absl::StrCat("ema_state_bytes_per_rank_dp", dp);
    if (!filter.Wants(name)) continue;
    Emit(Row{name, static_cast<double>(EmaBytesPerRank(dp)), static_cast<double>(dp1), 0, "1/DP",
             "bytes"});
  }
  return 0;
}

}  // namespace
}  // namespace zcc::bench

int main(int argc, char** argv) { return zcc::bench::Main(argc, argv); }
