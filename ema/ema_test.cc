#include <stdlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "ema/ema_isa.h"
#include "ema/ema_kernels.h"
#include "ema/ema_updater.h"
#include "ema/worker_group.h"
#include "format/dtype.h"

namespace zcc::ema {
namespace {

using format::DType;
using internal::BitsToFloat;
using internal::FloatToBits;

// The levels this CPU can run; the scalar one always.
std::vector<Isa> Levels() {
  std::vector<Isa> levels;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) {
      levels.push_back(isa);
    } else {
      WARN("this CPU cannot run the " << IsaName(isa) << " kernels; they are not tested here");
    }
  }
  return levels;
}

constexpr DType kSourceTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr NonFiniteGuard kGuards[] = {NonFiniteGuard::kDoubleBuffer, NonFiniteGuard::kCheckFirst};

const char* GuardName(NonFiniteGuard g) {
  return g == NonFiniteGuard::kDoubleBuffer ? "double-buffer" : "check-first";
}

// binary16 -> double written from the definition, independently of the
// library's bit manipulation: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double ReferenceHalf(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0x1f) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(static_cast<double>(1024 + m), e - 25);
}

// Source element i of a tensor stored as raw bytes, as the exact double value.
double ReferenceSource(DType dtype, const unsigned char* bytes, size_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  if (dtype == DType::kBF16) {
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return ReferenceHalf(h);
}

// A random finite source value's bit pattern: mixed signs, magnitudes over
// about 2^-30 .. 2^30 (fp32, bf16) or every finite fp16 pattern, with some
// zeros and fp32 subnormals.
uint32_t RandomFiniteBits(DType dtype, std::mt19937_64& rng) {
  const uint32_t r = static_cast<uint32_t>(rng());
  if (dtype == DType::kF16) {
    uint16_t h;
    do {
      h = static_cast<uint16_t>(rng());
    } while (((h >> 10) & 0x1f) == 0x1f);
    return h;
  }
  uint32_t bits;
  switch (r % 16) {
    case 0:
      bits = (r & 0x80000000u);  // +-0
      break;
    case 1:
      bits = (r & 0x80000000u) | (static_cast<uint32_t>(rng()) & 0x007fffffu);  // subnormal
      break;
    default:
      bits = (r & 0x80000000u) | ((127u - 30u + static_cast<uint32_t>(rng() % 61)) << 23) |
             (static_cast<uint32_t>(rng()) & 0x007fffffu);
  }
  return dtype == DType::kF32 ? bits : bits >> 16;
}

// Writes element i of a raw source.
void StoreBits(DType dtype, unsigned char* bytes, size_t i, uint32_t bits) {
  if (dtype == DType::kF32) {
    std::memcpy(bytes + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

// One step of sources for a set of tensors, each at a chosen byte misalignment.
struct Sources {
  std::vector<std::vector<unsigned char>> storage;
  std::vector<const void*> pointers;
  std::vector<unsigned char*> tensor;  // == pointers, writable
};

Sources RandomSources(const std::vector<EmaTensorSpec>& specs, std::mt19937_64& rng,
                      bool misalign = true) {
  Sources s;
  s.storage.resize(specs.size());
  for (size_t t = 0; t < specs.size(); ++t) {
    const size_t shift = misalign ? rng() % 8 : 0;
    const size_t esize = format::DTypeSize(specs[t].dtype);
    // Vectors of unsigned char are at least 16-byte aligned by the allocator:
    // `shift` makes the source start at any byte offset.
    s.storage[t].resize(specs[t].elements * esize + 8);
    unsigned char* p = s.storage[t].data() + shift;
    for (uint64_t i = 0; i < specs[t].elements; ++i) {
      StoreBits(specs[t].dtype, p, i, RandomFiniteBits(specs[t].dtype, rng));
    }
    s.tensor.push_back(p);
    s.pointers.push_back(p);
  }
  return s;
}

// A float64 model of the EMA with a sound running bound on how far the fp32
// engine may be from it. One step of the engine is
//   e' = fl(fl(d e) + fl(r x)),  r = 1 - d,
// so |e' - (d e + r x)| <= (2u + u^2)(d|e| + r|x|) + 3 * 2^-150 (u = 2^-24;
// the last term covers products rounded into fp32's subnormal range). With
// E = e - ref, the exact recurrence gives
//   |E'| <= d|E| + (2u + u^2)(d(|ref| + |E|) + r|x|) + 3 * 2^-150,
// and the bound B below follows it step by step. 2^-50 more per step covers
// the double-precision model's own rounding. Initialisation is exact (B = 0).
struct Reference {
  std::vector<std::vector<double>> value;
  std::vector<std::vector<double>> bound;
  bool initialized = false;

  void Step(const std::vector<EmaTensorSpec>& specs, const std::vector<unsigned char*>& src,
            float decay) {
    const double d = decay;
    const double r = 1.0f - decay;
    const double c = 2.0 * std::ldexp(1.0, -24) + std::ldexp(1.0, -48) + std::ldexp(1.0, -50);
    const double tiny = 3.0 * std::ldexp(1.0, -150);
    value.resize(specs.size());
    bound.resize(specs.size());
    for (size_t t = 0; t < specs.size(); ++t) {
      value[t].resize(specs[t].elements);
      bound[t].resize(specs[t].elements);
      for (uint64_t i = 0; i < specs[t].elements; ++i) {
        const double x = ReferenceSource(specs[t].dtype, src[t], i);
        if (!initialized) {
          value[t][i] = x;
          bound[t][i] = 0;
          continue;
        }
        const double e = value[t][i];
        const double b = bound[t][i];
        value[t][i] = d * e + r * x;
        bound[t][i] = d * b + c * (d * (std::fabs(e) + b) + r * std::fabs(x)) + tiny;
      }
    }
    initialized = true;
  }
};

// Empty when every element is within the bound; else the first failure.
std::string CompareWithReference(const EmaUpdater& ema, const Reference& ref) {
  for (size_t t = 0; t < ema.num_tensors(); ++t) {
    absl::Span<const float> got = ema.ema(t);
    if (got.size() != ref.value[t].size()) {
      return absl::StrCat("tensor ", t, ": ", got.size(), " elements, want ", ref.value[t].size());
    }
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - ref.value[t][i]);
      if (!(err <= ref.bound[t][i] * 1.0001)) {
        return absl::StrCat("tensor ", t, " element ", i, ": got ", got[i], " want ",
                            ref.value[t][i], " error ", err, " > bound ", ref.bound[t][i]);
      }
    }
  }
  return "";
}

std::vector<std::vector<uint32_t>> Snapshot(const EmaUpdater& ema) {
  std::vector<std::vector<uint32_t>> bits(ema.num_tensors());
  for (size_t t = 0; t < ema.num_tensors(); ++t) {
    for (float f : ema.ema(t)) bits[t].push_back(FloatToBits(f));
  }
  return bits;
}

std::vector<EmaTensorSpec> RandomSpecs(std::mt19937_64& rng, size_t count, uint64_t max_elements,
                                       std::vector<DType> dtypes) {
  std::vector<EmaTensorSpec> specs;
  for (size_t t = 0; t < count; ++t) {
    uint64_t n = rng() % (max_elements + 1);
    if (rng() % 8 == 0) n = rng() % 20;  // small ones, including empty tensors
    specs.push_back(
        EmaTensorSpec{absl::StrCat("layer", t, ".weight"), dtypes[rng() % dtypes.size()], n});
  }
  return specs;
}

std::unique_ptr<EmaUpdater> MustCreate(std::vector<EmaTensorSpec> specs,
                                       const EmaOptions& options) {
  auto ema = EmaUpdater::Create(std::move(specs), options);
  REQUIRE_OK(ema);
  return std::move(ema).value();
}

// ---------------------------------------------------------------- conversions

TEST_CASE("fp16 converts to fp32 exactly for all 65536 bit patterns") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t bits = internal::HalfToFloatBits(static_cast<uint16_t>(h));
    const double want = ReferenceHalf(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      // NaN: sign and payload kept, quiet bit set (as vcvtph2ps does).
      const uint32_t expect = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
      INFO("half " << h);
      REQUIRE(bits == expect);
      continue;
    }
    const float got = BitsToFloat(bits);
    if (!(static_cast<double>(got) == want) || std::signbit(got) != ((h & 0x8000u) != 0)) {
      INFO("half " << h << " -> " << got << " want " << want);
      REQUIRE(false);
    }
  }
}

TEST_CASE("every level converts all 65536 fp16 and bf16 patterns like the scalar converters") {
  // Element 0 is padding: the patterns start at a 2-byte offset, misaligned
  // for every vector width.
  std::vector<uint16_t> all(65536 + 1);
  for (uint32_t h = 0; h < 65536; ++h) all[h + 1] = static_cast<uint16_t>(h);
  std::vector<float> out(65536 + 64);
  for (Isa isa : Levels()) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (bool stream : {false, true}) {
        // Output offset 0 (aligned) and 3 (a scalar head first).
        for (size_t out_shift : {size_t{0}, size_t{3}}) {
          INFO(IsaName(isa) << " " << format::DTypeName(dtype) << " stream=" << stream
                            << " shift=" << out_shift);
          const internal::Kernels k = internal::GetKernels(isa, dtype);
          float* dst =
              reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(out.data()) + 63) / 64 * 64) +
              out_shift;
          CHECK(k.init(all.data() + 1, dst, 65536, stream));  // holds Inf and NaN
          size_t mismatches = 0;
          for (uint32_t i = 0; i < 65536; ++i) {
            const uint16_t h = static_cast<uint16_t>(i);
            const uint32_t want = dtype == DType::kF16 ? internal::HalfToFloatBits(h)
                                                       : internal::BFloat16ToFloatBits(h);
            if (FloatToBits(dst[i]) != want && mismatches++ == 0) {
              INFO("pattern " << h << " got " << FloatToBits(dst[i]) << " want " << want);
              CHECK(false);
            }
          }
          CHECK(mismatches == 0);
        }
      }
    }
  }
}

TEST_CASE("the non-finite test finds Inf and NaN in every position, and only them") {
  std::mt19937_64 rng(7);
  for (Isa isa : Levels()) {
    for (DType dtype : kSourceTypes) {
      const internal::Kernels k = internal::GetKernels(isa, dtype);
      const size_t esize = format::DTypeSize(dtype);
      const uint32_t specials[] = {dtype == DType::kF32    ? 0x7f800000u
                                   : dtype == DType::kBF16 ? 0x7f80u
                                                           : 0x7c00u,  // +Inf
                                   dtype == DType::kF32    ? 0xff800000u
                                   : dtype == DType::kBF16 ? 0xff80u
                                                           : 0xfc00u,  // -Inf
                                   dtype == DType::kF32    ? 0x7fc00000u
                                   : dtype == DType::kBF16 ? 0x7fc0u
                                                           : 0x7e00u,  // qNaN
                                   dtype == DType::kF32    ? 0xff800001u
                                   : dtype == DType::kBF16 ? 0xff81u
                                                           : 0xfc01u};  // sNaN
      for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{33}, size_t{100}, size_t{2100}}) {
        std::vector<unsigned char> src(n * esize + 8);
        std::vector<float> in(n + 32), out(n + 32);
        for (size_t i = 0; i < n; ++i)
          StoreBits(dtype, src.data() + 1, i, RandomFiniteBits(dtype, rng));
        INFO(IsaName(isa) << " " << format::DTypeName(dtype) << " n=" << n);
        CHECK_FALSE(k.check(src.data() + 1, n));
        CHECK_FALSE(k.init(src.data() + 1, out.data(), n, false));
        CHECK_FALSE(k.update(src.data() + 1, in.data(), out.data(), n, 0.9f, 0.1f, false));
        // The largest finite values are not flagged.
        std::vector<unsigned char> big(n * esize);
        const uint32_t max_bits = dtype == DType::kF32    ? 0xff7fffffu
                                  : dtype == DType::kBF16 ? 0xff7fu
                                                          : 0xfbffu;
        for (size_t i = 0; i < n; ++i) StoreBits(dtype, big.data(), i, max_bits);
        CHECK_FALSE(k.check(big.data(), n));
        const size_t positions[] = {0, n / 2, n - 1, static_cast<size_t>(rng() % n)};
        for (size_t pos : positions) {
          for (uint32_t special : specials) {
            std::vector<unsigned char> bad = src;
            StoreBits(dtype, bad.data() + 1, pos, special);
            INFO("position " << pos << " bits " << special);
            CHECK(k.check(bad.data() + 1, n));
            CHECK(k.init(bad.data() + 1, out.data() + 1, n, true));
            CHECK(k.update(bad.data() + 1, in.data(), out.data(), n, 0.9f, 0.1f, true));
          }
        }
      }
    }
  }
}

TEST_CASE("every level's update kernel is bit-identical to the scalar level") {
  std::mt19937_64 rng(11);
  for (Isa isa : Levels()) {
    for (DType dtype : kSourceTypes) {
      const internal::Kernels k = internal::GetKernels(isa, dtype);
      const internal::Kernels scalar = internal::GetKernels(Isa::kScalar, dtype);
      for (int round = 0; round < 60; ++round) {
        const size_t n = rng() % 300;
        const size_t esize = format::DTypeSize(dtype);
        std::vector<unsigned char> src(n * esize + 8);
        const size_t shift = rng() % 8;
        for (size_t i = 0; i < n; ++i) {
          StoreBits(dtype, src.data() + shift, i, RandomFiniteBits(dtype, rng));
        }
        std::vector<float> in(n + 32), want(n + 32), got(n + 32);
        for (float& f : in) f = BitsToFloat(RandomFiniteBits(DType::kF32, rng));
        const size_t out_shift = rng() % 16;
        const float decay = round % 2 ? 0.999f : 0.75f;
        const bool stream = rng() % 2;
        const bool in_place = rng() % 4 == 0;
        INFO(IsaName(isa) << " " << format::DTypeName(dtype) << " n=" << n << " stream=" << stream
                          << " in_place=" << in_place);
        scalar.update(src.data() + shift, in.data() + out_shift, want.data() + out_shift, n, decay,
                      1.0f - decay, false);
        const float* in_ptr = in.data() + out_shift;
        if (in_place) {
          got = in;
          in_ptr = got.data() + out_shift;
        }
        k.update(src.data() + shift, in_ptr, got.data() + out_shift, n, decay, 1.0f - decay,
                 stream && !in_place);
        CHECK(std::memcmp(want.data() + out_shift, got.data() + out_shift, n * sizeof(float)) == 0);
      }
    }
  }
}

// ---------------------------------------------------------------- EmaUpdater

TEST_CASE("the EMA follows a float64 reference within the derived error bound") {
  std::mt19937_64 rng(2024);
  for (Isa isa : Levels()) {
    for (DType dtype : kSourceTypes) {
      for (NonFiniteGuard guard : kGuards) {
        for (double decay : {0.5, 0.9, 0.999}) {
          const int threads = 1 + static_cast<int>(rng() % 4);
          INFO(IsaName(isa) << " " << format::DTypeName(dtype) << " " << GuardName(guard)
                            << " decay " << decay << " threads " << threads);
          std::vector<EmaTensorSpec> specs = RandomSpecs(rng, 10, 2500, {dtype});
          // An update every 10 steps, as configured: no gap.
          auto ema = MustCreate(specs, EmaOptions{decay, threads, guard, isa, /*interval=*/10});
          CHECK(ema->isa() == isa);
          Reference ref;
          for (int step = 0; step < 30; ++step) {
            Sources src = RandomSources(specs, rng);
            auto result = ema->Update(src.pointers, step * 10);
            REQUIRE_OK(result);
            REQUIRE(result->applied);
            CHECK(result->initialized == (step == 0));
            ref.Step(specs, src.tensor, ema->decay());
            const std::string failure = CompareWithReference(*ema, ref);
            INFO("step " << step << ": " << failure);
            REQUIRE(failure.empty());
          }
          CHECK(ema->counters().updates_applied == 30);
          CHECK(ema->last_step() == 290);
        }
      }
    }
  }
}

TEST_CASE("after missed steps the next update decays by d^k, k the intervals that passed") {
  std::mt19937_64 rng(7);
  for (Isa isa : Levels()) {
    for (uint32_t interval : {1u, 3u}) {
      INFO(IsaName(isa) << " interval " << interval);
      std::vector<EmaTensorSpec> specs =
          RandomSpecs(rng, 8, 3000, {DType::kF32, DType::kBF16, DType::kF16});
      auto ema = MustCreate(specs, EmaOptions{0.9, 2, NonFiniteGuard::kDoubleBuffer, isa, interval});
      Reference ref;
      int64_t previous = -1;
      // In intervals: consecutive updates, gaps of 3, 1, 4 and 20 intervals.
      for (int64_t at : {0, 1, 2, 5, 6, 10, 11, 31, 32}) {
        const int64_t step = at * interval;
        Sources src = RandomSources(specs, rng);
        auto result = ema->Update(src.pointers, step);
        REQUIRE_OK(result);
        REQUIRE(result->applied);
        const double k = previous < 0 ? 1 : static_cast<double>(step - previous) / interval;
        const float dk =
            k == 1 ? ema->decay() : static_cast<float>(std::pow(double{ema->decay()}, k));
        ref.Step(specs, src.tensor, dk);
        previous = step;
        const std::string failure = CompareWithReference(*ema, ref);
        INFO("step " << step << ": " << failure);
        REQUIRE(failure.empty());
      }
    }
  }
}

TEST_CASE("an EMA given another interval counts the next gaps in it") {
  std::mt19937_64 rng(9);
  std::vector<EmaTensorSpec> specs = RandomSpecs(rng, 4, 1000, {DType::kF32, DType::kBF16});
  auto ema = MustCreate(specs, EmaOptions{0.9, 2, NonFiniteGuard::kDoubleBuffer, Isa::kAuto, 1});
  Reference ref;
  // Kept every step up to 4, then every 2nd step: steps 6 and 8 are one
  // interval on (d), step 14 three (d^3).
  int64_t previous = -1;
  for (int64_t step : {1, 2, 3, 4, 6, 8, 14}) {
    if (step == 6) ema->set_interval(2);
    const uint32_t interval = step >= 6 ? 2 : 1;
    Sources src = RandomSources(specs, rng);
    auto result = ema->Update(src.pointers, step);
    REQUIRE_OK(result);
    REQUIRE(result->applied);
    const double k = previous < 0 ? 1 : static_cast<double>(step - previous) / interval;
    ref.Step(specs, src.tensor,
             k == 1 ? ema->decay() : static_cast<float>(std::pow(double{ema->decay()}, k)));
    previous = step;
    const std::string failure = CompareWithReference(*ema, ref);
    INFO("step " << step << ": " << failure);
    REQUIRE(failure.empty());
  }
  CHECK(ema->interval() == 2);
}

TEST_CASE("a gap-free run with an interval is bit-identical to consecutive steps") {
  std::mt19937_64 rng(11);
  std::vector<EmaTensorSpec> specs = RandomSpecs(rng, 6, 2000, {DType::kF32, DType::kBF16});
  auto every = MustCreate(specs, EmaOptions{0.99, 1, NonFiniteGuard::kDoubleBuffer, Isa::kScalar});
  auto fourth = MustCreate(specs, EmaOptions{0.99, 3, NonFiniteGuard::kCheckFirst, Isa::kAuto, 4});
  auto gappy = MustCreate(specs, EmaOptions{0.99, 1, NonFiniteGuard::kDoubleBuffer, Isa::kScalar});
  for (int64_t i = 1; i <= 12; ++i) {
    Sources src = RandomSources(specs, rng);
    REQUIRE_OK(every->Update(src.pointers, i));
    REQUIRE_OK(fourth->Update(src.pointers, 4 * i));
    REQUIRE_OK(gappy->Update(src.pointers, i == 12 ? 20 : i));  // 8 steps missed before the last
  }
  CHECK(Snapshot(*every) == Snapshot(*fourth));
  CHECK(Snapshot(*every) != Snapshot(*gappy));
}

TEST_CASE("mixed source dtypes in one set follow the reference") {
  std::mt19937_64 rng(99);
  for (Isa isa : Levels()) {
    std::vector<EmaTensorSpec> specs =
        RandomSpecs(rng, 16, 4000, {DType::kF32, DType::kBF16, DType::kF16});
    auto ema = MustCreate(specs, EmaOptions{0.99, 3, NonFiniteGuard::kDoubleBuffer, isa});
    Reference ref;
    for (int step = 0; step < 12; ++step) {
      Sources src = RandomSources(specs, rng);
      auto result = ema->Update(src.pointers, step);
      REQUIRE_OK(result);
      REQUIRE(result->applied);
      ref.Step(specs, src.tensor, ema->decay());
    }
    const std::string failure = CompareWithReference(*ema, ref);
    INFO(IsaName(isa) << ": " << failure);
    CHECK(failure.empty());
  }
}

TEST_CASE("odd sizes and unaligned sources") {
  std::mt19937_64 rng(5);
  std::vector<EmaTensorSpec> specs;
  const uint64_t sizes[] = {0, 1, 7, 63, 64 * 1024 + 5, 17, 0, 16, 15};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    specs.push_back({absl::StrCat("t", i), kSourceTypes[i % 3], sizes[i]});
  }
  std::vector<std::vector<std::vector<uint32_t>>> results;
  for (Isa isa : Levels()) {
    for (NonFiniteGuard guard : kGuards) {
      for (int threads : {1, 2, 3, 4}) {
        INFO(IsaName(isa) << " " << GuardName(guard) << " threads " << threads);
        std::mt19937_64 data_rng(77);  // the same data for every configuration
        auto ema = MustCreate(specs, EmaOptions{0.9, threads, guard, isa});
        Reference ref;
        for (int step = 0; step < 4; ++step) {
          Sources src = RandomSources(specs, data_rng);
          auto result = ema->Update(src.pointers, step);
          REQUIRE_OK(result);
          REQUIRE(result->applied);
          ref.Step(specs, src.tensor, ema->decay());
        }
        const std::string failure = CompareWithReference(*ema, ref);
        INFO(failure);
        CHECK(failure.empty());
        for (size_t t = 0; t < specs.size(); ++t) CHECK(ema->ema(t).size() == sizes[t]);
        results.push_back(Snapshot(*ema));
      }
    }
  }
  for (size_t i = 1; i < results.size(); ++i) CHECK(results[i] == results[0]);
}

TEST_CASE("thread counts 1 to 4, levels and guards all give bit-identical EMAs") {
  std::mt19937_64 rng(31);
  // Large enough that thread boundaries fall inside tensors.
  std::vector<EmaTensorSpec> specs =
      RandomSpecs(rng, 9, 40000, {DType::kF32, DType::kBF16, DType::kF16});
  std::vector<Sources> steps;
  for (int s = 0; s < 5; ++s) steps.push_back(RandomSources(specs, rng));
  std::vector<std::vector<uint32_t>> first;
  for (Isa isa : Levels()) {
    for (NonFiniteGuard guard : kGuards) {
      for (int threads = 1; threads <= 4; ++threads) {
        INFO(IsaName(isa) << " " << GuardName(guard) << " threads " << threads);
        auto ema = MustCreate(specs, EmaOptions{0.97, threads, guard, isa});
        CHECK(ema->threads() == threads);
        for (int s = 0; s < 5; ++s) {
          auto result = ema->Update(steps[s].pointers, s);
          REQUIRE_OK(result);
          REQUIRE(result->applied);
        }
        auto bits = Snapshot(*ema);
        if (first.empty()) {
          first = bits;
        } else {
          CHECK(bits == first);
        }
      }
    }
  }
}

TEST_CASE("the first update initialises the EMA to the converted sources") {
  std::mt19937_64 rng(3);
  for (Isa isa : Levels()) {
    for (NonFiniteGuard guard : kGuards) {
      std::vector<EmaTensorSpec> specs =
          RandomSpecs(rng, 6, 3000, {DType::kF32, DType::kBF16, DType::kF16});
      auto ema = MustCreate(specs, EmaOptions{0.999, 2, guard, isa});
      CHECK_FALSE(ema->initialized());
      CHECK(ema->last_step() == -1);
      CHECK(ema->ema(0).empty());
      Sources src = RandomSources(specs, rng);
      auto result = ema->Update(src.pointers, 0);
      REQUIRE_OK(result);
      CHECK(result->applied);
      CHECK(result->initialized);
      CHECK(ema->initialized());
      for (size_t t = 0; t < specs.size(); ++t) {
        absl::Span<const float> got = ema->ema(t);
        REQUIRE(got.size() == specs[t].elements);
        size_t mismatches = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          uint32_t want;
          switch (specs[t].dtype) {
            case DType::kF32:
              want = internal::LoadSourceBits<DType::kF32>(src.tensor[t], i);
              break;
            case DType::kBF16:
              want = internal::LoadSourceBits<DType::kBF16>(src.tensor[t], i);
              break;
            default:
              want = internal::LoadSourceBits<DType::kF16>(src.tensor[t], i);
          }
          mismatches += FloatToBits(got[i]) != want;
        }
        CHECK(mismatches == 0);
      }
    }
  }
}

uint32_t NonFiniteBits(DType dtype, int kind) {
  switch (kind) {
    case 0:  // NaN
      return dtype == DType::kF32 ? 0x7fc00001u : dtype == DType::kBF16 ? 0x7fc1u : 0x7e01u;
    case 1:  // +Inf
      return dtype == DType::kF32 ? 0x7f800000u : dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
    default:  // -Inf
      return dtype == DType::kF32 ? 0xff800000u : dtype == DType::kBF16 ? 0xff80u : 0xfc00u;
  }
}

TEST_CASE("a NaN or Inf in any source skips the whole update, leaving the EMA bit-for-bit") {
  std::mt19937_64 rng(17);
  for (Isa isa : Levels()) {
    for (DType dtype : kSourceTypes) {
      for (NonFiniteGuard guard : kGuards) {
        for (int threads : {1, 3}) {
          std::vector<EmaTensorSpec> specs = RandomSpecs(rng, 8, 3000, {dtype});
          specs[3].elements = 5000;  // tensors 3 and 6 get the bad values
          specs[6].elements = 70;
          auto ema = MustCreate(specs, EmaOptions{0.9, threads, guard, isa});
          Reference ref;
          Sources good = RandomSources(specs, rng);
          REQUIRE_OK(ema->Update(good.pointers, 0));
          ref.Step(specs, good.tensor, ema->decay());
          int64_t step = 1;
          uint64_t skipped = 0;
          for (int kind = 0; kind < 3; ++kind) {
            for (uint64_t pos : {uint64_t{0}, uint64_t{69}, uint64_t{rng() % 70}}) {
              INFO(IsaName(isa) << " " << format::DTypeName(dtype) << " " << GuardName(guard)
                                << " threads " << threads << " kind " << kind << " pos " << pos);
              const auto before = Snapshot(*ema);
              Sources bad = RandomSources(specs, rng);
              StoreBits(dtype, bad.tensor[6], pos, NonFiniteBits(dtype, kind));
              if (kind == 2) StoreBits(dtype, bad.tensor[3], 4999, NonFiniteBits(dtype, 0));
              auto result = ema->Update(bad.pointers, step++);
              REQUIRE_OK(result);
              CHECK_FALSE(result->applied);
              CHECK(result->nonfinite_tensor == specs[kind == 2 ? 3 : 6].name);
              CHECK(ema->counters().skipped_nonfinite == ++skipped);
              CHECK(ema->last_step() == 0);
              CHECK(Snapshot(*ema) == before);
            }
          }
          // The next finite update applies after a gap: the skipped steps
          // count as missed ones (decay d^k, k = steps since step 0).
          Sources next = RandomSources(specs, rng);
          auto result = ema->Update(next.pointers, step);
          REQUIRE_OK(result);
          CHECK(result->applied);
          CHECK_FALSE(result->initialized);
          const float dk = step == 1 ? ema->decay()
                                     : static_cast<float>(std::pow(double{ema->decay()}, step));
          ref.Step(specs, next.tensor, dk);
          const std::string failure = CompareWithReference(*ema, ref);
          INFO(failure);
          CHECK(failure.empty());
          CHECK(ema->counters().updates_applied == 2);
        }
      }
    }
  }
}

TEST_CASE("a non-finite first update leaves the EMA uninitialised") {
  for (Isa isa : Levels()) {
    for (NonFiniteGuard guard : kGuards) {
      std::vector<EmaTensorSpec> specs = {{"a", DType::kBF16, 100}, {"b", DType::kF16, 33}};
      auto ema = MustCreate(specs, EmaOptions{0.9, 2, guard, isa});
      std::mt19937_64 rng(1);
      Sources src = RandomSources(specs, rng);
      StoreBits(DType::kF16, src.tensor[1], 32, 0x7c00);
      auto result = ema->Update(src.pointers, 0);
      REQUIRE_OK(result);
      CHECK_FALSE(result->applied);
      CHECK(result->nonfinite_tensor == "b");
      CHECK_FALSE(ema->initialized());
      CHECK(ema->ema(0).empty());
      StoreBits(DType::kF16, src.tensor[1], 32, 0x3c00);  // 1.0
      result = ema->Update(src.pointers, 0);              // the skipped step may come again
      REQUIRE_OK(result);
      CHECK(result->applied);
      CHECK(result->initialized);
      CHECK(ema->ema(1)[32] == 1.0f);
    }
  }
}

TEST_CASE("Load sets the EMA, and updates continue from it") {
  std::mt19937_64 rng(23);
  for (Isa isa : Levels()) {
    for (NonFiniteGuard guard : kGuards) {
      std::vector<EmaTensorSpec> specs =
          RandomSpecs(rng, 7, 2000, {DType::kF32, DType::kBF16, DType::kF16});
      auto ema = MustCreate(specs, EmaOptions{0.95, 2, guard, isa});
      // Run one update first so that Load replaces live state.
      Sources first = RandomSources(specs, rng);
      REQUIRE_OK(ema->Update(first.pointers, 3));
      std::vector<std::vector<float>> restored(specs.size());
      std::vector<absl::Span<const float>> spans;
      Reference ref;
      ref.initialized = true;
      ref.value.resize(specs.size());
      ref.bound.resize(specs.size());
      for (size_t t = 0; t < specs.size(); ++t) {
        for (uint64_t i = 0; i < specs[t].elements; ++i) {
          restored[t].push_back(BitsToFloat(RandomFiniteBits(DType::kF32, rng)));
          ref.value[t].push_back(restored[t].back());
          ref.bound[t].push_back(0);
        }
        spans.push_back(restored[t]);
      }
      REQUIRE_OK(ema->Load(spans, 500));
      CHECK(ema->initialized());
      CHECK(ema->last_step() == 500);
      CHECK(ema->counters().loads == 1);
      for (size_t t = 0; t < specs.size(); ++t) {
        absl::Span<const float> got = ema->ema(t);
        CHECK(std::vector<float>(got.begin(), got.end()) == restored[t]);
      }
      // A stale step is refused; the next one continues from the loaded state.
      Sources src = RandomSources(specs, rng);
      REQUIRE_STATUS_CODE(ema->Update(src.pointers, 500), absl::StatusCode::kFailedPrecondition);
      auto result = ema->Update(src.pointers, 501);
      REQUIRE_OK(result);
      CHECK(result->applied);
      CHECK_FALSE(result->initialized);
      ref.Step(specs, src.tensor, ema->decay());
      const std::string failure = CompareWithReference(*ema, ref);
      INFO(failure);
      CHECK(failure.empty());

      // Refused loads change nothing.
      const auto before = Snapshot(*ema);
      std::vector<absl::Span<const float>> short_list(spans.begin(), spans.end() - 1);
      REQUIRE_STATUS_CODE(ema->Load(short_list, 600), absl::StatusCode::kInvalidArgument);
      size_t big = 0;
      for (size_t t = 0; t < specs.size(); ++t) {
        if (specs[t].elements > specs[big].elements) big = t;
      }
      REQUIRE(specs[big].elements > 0);
      auto wrong_size = spans;
      wrong_size[big] = wrong_size[big].subspan(1);
      REQUIRE_STATUS_CODE(ema->Load(wrong_size, 600), absl::StatusCode::kInvalidArgument);
      auto with_nan = restored;
      with_nan[big].back() = std::numeric_limits<float>::quiet_NaN();
      auto nan_spans = spans;
      nan_spans[big] = with_nan[big];
      REQUIRE_STATUS_CODE(ema->Load(nan_spans, 600), absl::StatusCode::kInvalidArgument);
      with_nan[big].front() = -std::numeric_limits<float>::infinity();
      with_nan[big].back() = 1.0f;
      nan_spans[big] = with_nan[big];
      REQUIRE_STATUS_CODE(ema->Load(nan_spans, 600), absl::StatusCode::kInvalidArgument);
      REQUIRE_STATUS_CODE(ema->Load(spans, -1), absl::StatusCode::kInvalidArgument);
      CHECK(Snapshot(*ema) == before);
      CHECK(ema->last_step() == 501);
    }
  }
}

TEST_CASE("Create refuses bad options and specs") {
  const std::vector<EmaTensorSpec> ok = {{"a", DType::kF32, 4}};
  for (double decay :
       {0.0, 1.0, -0.5, 1.5, std::nan(""), 1.0 - 1e-12, std::numeric_limits<double>::infinity()}) {
    INFO("decay " << decay);
    REQUIRE_STATUS_CODE(EmaUpdater::Create(ok, EmaOptions{decay}),
                        absl::StatusCode::kInvalidArgument);
  }
  REQUIRE_STATUS_CODE(EmaUpdater::Create(ok, EmaOptions{0.9, 0}),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(EmaUpdater::Create(ok, EmaOptions{0.9, 257}),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(EmaUpdater::Create({{"a", DType::kI32, 4}}, EmaOptions{}),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(EmaUpdater::Create({{"a", DType::kF64, 4}}, EmaOptions{}),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(
      EmaUpdater::Create({{"a", DType::kF32, 4}, {"a", DType::kBF16, 2}}, EmaOptions{}),
      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(EmaUpdater::Create({{"", DType::kF32, 4}}, EmaOptions{}),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(EmaUpdater::Create({{"a", DType::kF32, uint64_t{1} << 60}}, EmaOptions{}),
                      absl::StatusCode::kInvalidArgument);
  if (!IsaSupported(Isa::kAvx512)) {
    REQUIRE_STATUS_CODE(
        EmaUpdater::Create(ok, EmaOptions{0.9, 1, NonFiniteGuard::kDoubleBuffer, Isa::kAvx512}),
        absl::StatusCode::kInvalidArgument);
  }
  // An empty set is valid: updates do nothing but count.
  auto empty = MustCreate({}, EmaOptions{});
  auto result = empty->Update(absl::Span<const void* const>(), 0);
  REQUIRE_OK(result);
  CHECK(result->applied);
  CHECK(empty->state_bytes() == 0);
}

TEST_CASE("Update refuses bad arguments and leaves the EMA as it was") {
  std::vector<EmaTensorSpec> specs = {
      {"a", DType::kBF16, 10}, {"e", DType::kF32, 0}, {"b", DType::kF16, 5}};
  auto ema = MustCreate(specs, EmaOptions{0.9, 2});
  std::vector<uint16_t> a(10, 0x3f80), b(5, 0x3c00);  // 1.0 in bf16 and fp16
  std::vector<const void*> sources = {a.data(), nullptr, b.data()};
  REQUIRE_OK(ema->Update(sources, 0));
  const auto before = Snapshot(*ema);
  REQUIRE_STATUS_CODE(ema->Update(absl::MakeSpan(sources).subspan(1), 1),
                      absl::StatusCode::kInvalidArgument);
  std::vector<const void*> null_b = {a.data(), nullptr, nullptr};
  REQUIRE_STATUS_CODE(ema->Update(null_b, 1), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ema->Update(sources, 0), absl::StatusCode::kFailedPrecondition);
  REQUIRE_STATUS_CODE(ema->Update(sources, -3), absl::StatusCode::kInvalidArgument);
  CHECK(Snapshot(*ema) == before);

  // Base + offsets: every tensor must lie inside the region.
  std::vector<unsigned char> slot(64);
  std::memcpy(slot.data(), a.data(), 20);
  std::memcpy(slot.data() + 40, b.data(), 10);
  const std::vector<uint64_t> offsets = {0, 50, 40};
  REQUIRE_STATUS_CODE(ema->Update(slot.data(), 49, offsets, 1), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ema->Update(slot.data(), 64, {0, 65, 40}, 1),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ema->Update(slot.data(), 64, {0, 0, ~uint64_t{0}}, 1),
                      absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ema->Update(slot.data(), 64, {0, 0}, 1), absl::StatusCode::kInvalidArgument);
  REQUIRE_STATUS_CODE(ema->Update(nullptr, 64, offsets, 1), absl::StatusCode::kInvalidArgument);
  CHECK(Snapshot(*ema) == before);
  auto result = ema->Update(slot.data(), 50, offsets, 1);
  REQUIRE_OK(result);
  CHECK(result->applied);
  CHECK(Snapshot(*ema) == before);  // 0.9 * 1 + 0.1 * 1 rounds back to 1
  CHECK(ema->ema(0)[9] == 1.0f);
  CHECK(ema->ema(2)[4] == 1.0f);
  CHECK(ema->FindTensor("b") == 2u);
  CHECK_FALSE(ema->FindTensor("c").has_value());
  CHECK(ema->state_bytes() == 60);
}

TEST_CASE("the base+offsets form gives the same EMA as the pointer form") {
  std::mt19937_64 rng(8);
  std::vector<EmaTensorSpec> specs =
      RandomSpecs(rng, 5, 1000, {DType::kF32, DType::kBF16, DType::kF16});
  auto by_pointer = MustCreate(specs, EmaOptions{0.9, 2});
  auto by_offset = MustCreate(specs, EmaOptions{0.9, 2});
  for (int step = 0; step < 3; ++step) {
    Sources src = RandomSources(specs, rng, /*misalign=*/false);
    std::vector<unsigned char> slot;
    std::vector<uint64_t> offsets;
    for (size_t t = 0; t < specs.size(); ++t) {
      offsets.push_back(slot.size() + 1);  // odd offsets: unaligned sources
      slot.push_back(0);
      const size_t n = specs[t].elements * format::DTypeSize(specs[t].dtype);
      slot.insert(slot.end(), src.tensor[t], src.tensor[t] + n);
    }
    REQUIRE_OK(by_pointer->Update(src.pointers, step));
    REQUIRE_OK(by_offset->Update(slot.data(), slot.size(), offsets, step));
  }
  CHECK(Snapshot(*by_pointer) == Snapshot(*by_offset));
}

TEST_CASE("ZCC_EMA_ISA selects a level for Isa::kAuto") {
  const char* saved = std::getenv("ZCC_EMA_ISA");
  const std::string saved_value = saved ? saved : "";
  const std::vector<EmaTensorSpec> specs = {{"a", DType::kF32, 4}};
  for (Isa isa : Levels()) {
    REQUIRE(setenv("ZCC_EMA_ISA", std::string(IsaName(isa)).c_str(), 1) == 0);
    auto ema = MustCreate(specs, EmaOptions{});
    CHECK(ema->isa() == isa);
    // An explicit level wins over the environment.
    CHECK(
        MustCreate(specs, EmaOptions{0.9, 1, NonFiniteGuard::kDoubleBuffer, Isa::kScalar})->isa() ==
        Isa::kScalar);
  }
  REQUIRE(setenv("ZCC_EMA_ISA", "sse9", 1) == 0);
  REQUIRE_STATUS_CODE(EmaUpdater::Create(specs, EmaOptions{}), absl::StatusCode::kInvalidArgument);
  REQUIRE(setenv("ZCC_EMA_ISA", "", 1) == 0);
  CHECK(MustCreate(specs, EmaOptions{})->isa() == BestSupportedIsa());
  if (saved) {
    setenv("ZCC_EMA_ISA", saved_value.c_str(), 1);
  } else {
    unsetenv("ZCC_EMA_ISA");
  }
  CHECK(ParseIsaName("avx2").value() == Isa::kAvx2);
  CHECK_FALSE(ParseIsaName("AVX2").ok());
}

TEST_CASE("a worker group runs every index once per call, on persistent threads") {
  auto group = WorkerGroup::Create(4);
  REQUIRE_OK(group);
  std::vector<std::atomic<int>> calls(4);
  for (int round = 0; round < 200; ++round) {
    (*group)->RunOnAll([&](int i) { calls[i].fetch_add(1); });
  }
  for (auto& c : calls) CHECK(c.load() == 200);
  REQUIRE_STATUS_CODE(WorkerGroup::Create(0), absl::StatusCode::kInvalidArgument);
  auto single = WorkerGroup::Create(1);
  REQUIRE_OK(single);
  int ran = 0;
  (*single)->RunOnAll([&](int i) { ran += 1 + i; });
  CHECK(ran == 1);
}

TEST_CASE("EMAs sharing one worker group, updated from several threads at once, match EMAs "
          "with groups of their own bit for bit") {
  constexpr uint64_t kElements = 200'000;
  auto shared = WorkerGroup::Create(3);
  REQUIRE_OK(shared);
  std::shared_ptr<WorkerGroup> group = *std::move(shared);
  std::vector<std::vector<float>> sources(4, std::vector<float>(kElements));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-2, 2);
  std::vector<std::unique_ptr<EmaUpdater>> on_shared, on_own;
  for (int r = 0; r < 4; ++r) {
    EmaOptions with_group;
    with_group.decay = 0.9;
    with_group.workers = group;
    on_shared.push_back(MustCreate({{"w", format::DType::kF32, kElements}}, with_group));
    CHECK(on_shared.back()->threads() == 3);
    on_own.push_back(MustCreate({{"w", format::DType::kF32, kElements}},
                                EmaOptions{0.9, 3, NonFiniteGuard::kDoubleBuffer}));
  }
  for (int64_t step = 0; step < 12; ++step) {
    for (auto& src : sources) {
      for (float& x : src) x = value(rng);
    }
    std::vector<std::thread> ranks;
    for (int r = 0; r < 4; ++r) {
      ranks.emplace_back([&, r] {
        const void* p = sources[r].data();
        REQUIRE_OK(on_shared[r]->Update(absl::MakeConstSpan(&p, 1), step).status());
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < 4; ++r) {
      const void* p = sources[r].data();
      REQUIRE_OK(on_own[r]->Update(absl::MakeConstSpan(&p, 1), step).status());
    }
  }
  for (int r = 0; r < 4; ++r) {
    absl::Span<const float> a = on_shared[r]->ema(0);
    absl::Span<const float> b = on_own[r]->ema(0);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace zcc::ema
