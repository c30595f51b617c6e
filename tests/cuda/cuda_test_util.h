// Helpers for CUDA-vs-CPU tests: inputs drawn in f32 and rounded to bf16 on the host, so both
// backends see bit-identical values; outputs poisoned with NaN before each run; errors measured as
// ||got - ref||_2 / ||ref||_2 with matching infinities (empty softmax rows) required to agree.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/core/tensor.h"
#include "kernels/backend.h"
#include "tests/kernels/kda_test_util.h"

namespace k3::cudatest {

struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
  std::string why_not;
};

// Null gpu (with the reason) where no CUDA device is visible.
inline Backends make_backends() {
  Backends b;
  b.cpu = make_cpu_backend({.threads = 0});
  b.gpu = make_cuda_backend(0, &b.why_not);
  return b;
}

#define K3_GPU_OR_SKIP(bk)                                          \
  auto bk = ::k3::cudatest::make_backends();                        \
  if (!bk.gpu) {                                                    \
    WARN("SKIPPED: " << bk.why_not);                                \
    return;                                                         \
  }

inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

inline Tensor randn(Shape shape, std::mt19937& rng, float scale = 1.f, bool bf16_round = true) {
  Tensor t = Tensor::zeros(std::move(shape));
  std::normal_distribution<float> nd(0.f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = bf16_round ? round_bf16(nd(rng)) : nd(rng);
  return t;
}
inline Tensor uniform(Shape shape, std::mt19937& rng, float lo, float hi, bool bf16_round = true) {
  Tensor t = Tensor::zeros(std::move(shape));
  std::uniform_real_distribution<float> ud(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = bf16_round ? round_bf16(ud(rng)) : ud(rng);
  return t;
}
inline Tensor filled(Shape shape, float v) {
  Tensor t = Tensor::zeros(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = v;
  return t;
}
inline Tensor ints(std::vector<int32_t> v) { return Tensor::from_i32({int64_t(v.size())}, v); }

// KDA's q and k as the CPU tests make them (rows of the last dimension scaled to norm `scale`), then
// rounded to bf16, the device's operand type.
inline void normalise_heads(Tensor& t, float scale) {
  k3::test::normalise_heads(t, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = round_bf16(t.f32()[i]);
}

// cu_seqlens of sequences of these lengths.
inline Tensor cu_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lens) cu.push_back(cu.back() + l);
  return ints(cu);
}

// KDA checkpoint slots for checkpoints every `interval` tokens (ops::KdaParams::checkpoint_slots):
// slots[n][j] numbers sequence n's checkpoint j in order (0 .. num-1), -1 past its end; M columns,
// the most checkpoints of any sequence plus `extra_cols`, at least 1.
struct CheckpointTable {
  std::vector<int32_t> slots;
  int64_t M = 1, num = 0;
};
inline CheckpointTable checkpoint_table(const std::vector<int32_t>& lens, int interval, int64_t extra_cols = 0) {
  CheckpointTable t;
  int64_t most = 0;
  for (int32_t l : lens) most = std::max<int64_t>(most, l / interval);
  t.M = std::max<int64_t>(1, most + extra_cols);
  t.slots.assign(lens.size() * size_t(t.M), -1);
  for (size_t n = 0; n < lens.size(); ++n)
    for (int64_t j = 0; j < lens[n] / interval; ++j) t.slots[n * size_t(t.M) + size_t(j)] = int32_t(t.num++);
  return t;
}

// A device output filled with NaN: an element the kernel forgets to write fails the comparison.
inline Tensor poisoned(Backend& gpu, const Shape& shape, DType dt) {
  return gpu.from_host(filled(shape, std::numeric_limits<float>::quiet_NaN()), dt);
}

struct Err {
  double rel = 0;       // ||got-ref|| / ||ref||
  bool bad_nan = false;  // NaN in got, or an infinity where ref has none
};
inline Err compare(const Tensor& got, const Tensor& ref) {
  REQUIRE(got.numel() == ref.numel());
  Err e;
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.f32()[i], r = ref.f32()[i];
    if (std::isinf(r) || std::isinf(g)) {
      if (g != r) e.bad_nan = true;
      continue;
    }
    if (std::isnan(g) || std::isnan(r)) {
      e.bad_nan = true;
      continue;
    }
    num += (g - r) * (g - r);
    den += r * r;
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// Copies `dev` to the host (f32) and checks it against `ref` within `tol`.
inline void expect_close(Backend& gpu, const Tensor& dev, const Tensor& ref, double tol, const std::string& what) {
  const Tensor got = gpu.to_host(dev);
  const Err e = compare(got, ref);
  INFO(what << ": rel err " << e.rel << " (tol " << tol << ")");
  CHECK_FALSE(e.bad_nan);
  CHECK(e.rel <= tol);
}

}  // namespace k3::cudatest
