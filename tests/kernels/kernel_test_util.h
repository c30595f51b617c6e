// Helpers shared by the kernel tests: seeded random tensors, comparisons, a CPU backend per thread
// count.
#pragma once
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/core/tensor.h"
#include "kernels/backend.h"

namespace k3::test {

inline std::unique_ptr<Backend> cpu_backend(int threads) { return make_cpu_backend({.threads = threads}); }

inline Tensor randn(Shape shape, std::mt19937& rng, float scale = 1.f) {
  Tensor t = Tensor::zeros(std::move(shape));
  std::normal_distribution<float> nd(0.f, scale);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
  return t;
}

inline Tensor uniform(Shape shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::zeros(std::move(shape));
  std::uniform_real_distribution<float> ud(lo, hi);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = ud(rng);
  return t;
}

inline Tensor filled(Shape shape, float v) {
  Tensor t = Tensor::zeros(std::move(shape));
  std::fill(t.f32(), t.f32() + t.numel(), v);
  return t;
}

inline Tensor i32(Shape shape, std::vector<int32_t> v) { return Tensor::from_i32(std::move(shape), v); }

inline float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.f32()[i]));
  return m;
}

inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}

// max |a - b| / max |b|: the error relative to the reference tensor's largest entry.
inline double rel_err(const Tensor& a, const Tensor& ref) {
  const double scale = std::max<double>(max_abs(ref), 1e-30);
  return max_abs_diff(a, ref) / scale;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace k3::test
