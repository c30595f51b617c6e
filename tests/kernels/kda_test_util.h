// KDA test inputs shared by the CPU KDA tests: random varlen cases (normalised q/k, gates in a
// range, random or zero state), the KdaParams over them, and the per-matrix state error.
#pragma once
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace k3::test {

struct KdaCase {
  Tensor q, k, v, g, beta, state, slots, cu;
  int64_t T, H, K, V;
};

// Row-wise L2 normalisation of [T, H, D] per head (q also * D^-1/2), like the model does.
inline void normalise_heads(Tensor& t, float scale) {
  const int64_t D = t.dim(-1), rows = t.numel() / D;
  for (int64_t r = 0; r < rows; ++r) {
    float* p = t.f32() + r * D;
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(p[i]) * p[i];
    for (int64_t i = 0; i < D; ++i) p[i] = float(p[i] * scale / std::sqrt(ss + 1e-6));
  }
}

// Sequences of the given lengths, slot of sequence n = slot_of[n] among num_slots.
inline KdaCase make_case(std::mt19937& rng, std::vector<int32_t> lens, std::vector<int32_t> slot_of, int64_t num_slots,
                  int64_t H, int64_t K, int64_t V, bool random_state, float g_lo, float g_hi) {
  KdaCase c;
  c.T = std::accumulate(lens.begin(), lens.end(), 0);
  c.H = H, c.K = K, c.V = V;
  c.q = randn({c.T, H, K}, rng);
  c.k = randn({c.T, H, K}, rng);
  normalise_heads(c.q, 1.f / std::sqrt(float(K)));
  normalise_heads(c.k, 1.f);
  c.v = randn({c.T, H, V}, rng);
  c.g = uniform({c.T, H, K}, rng, g_lo, g_hi);
  c.beta = uniform({c.T, H}, rng, 0.05f, 0.95f);
  c.state = random_state ? randn({num_slots, H, V, K}, rng, 0.5f) : Tensor::zeros({num_slots, H, V, K});
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  c.cu = i32({int64_t(cu.size())}, cu);
  c.slots = i32({int64_t(slot_of.size())}, slot_of);
  return c;
}

inline ops::KdaParams params(const KdaCase& c, Tensor state, Tensor o, int chunk = 64) {
  return {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .state = state, .slots = c.slots,
          .cu_seqlens = c.cu, .o = o, .chunk_size = chunk};
}

inline double worst_state_err(const Tensor& s, const Tensor& ref, int64_t mats, int64_t size) {
  double worst = 0;
  for (int64_t m = 0; m < mats; ++m) {
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double a = s.f32()[m * size + i], b = ref.f32()[m * size + i];
      d2 += (a - b) * (a - b);
      r2 += b * b;
    }
    if (r2 > 0) worst = std::max(worst, std::sqrt(d2 / r2));
    else worst = std::max(worst, std::sqrt(d2));
  }
  return worst;
}

}  // namespace k3::test
