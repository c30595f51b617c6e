// Log-decay gates as Kimi Linear's unbounded softplus form produces them, g = -exp(A_log) *
// softplus(f + dt_bias), for tests of the chunked KDA forms against the token recurrence: a wide
// range of A_log and logits, tiny gates, gates of -20..-60 and of -1e3..-1e5. With `spikes`, every
// 23rd token from the 6th carries g = -1e4 and the tokens after it tiny gates only: there a chunk
// form that subtracts cumulative sums loses its precision, and one that forms e^{-Γ} overflows.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>

#include "common/core/tensor.h"

namespace k3::test {

// g: F32 [T, HK] (any [T, H, K] viewed flat per token).
inline void softplus_like_gates(Tensor& g, std::mt19937& rng, int64_t T, int64_t HK, bool spikes) {
  std::normal_distribution<float> logit(0.f, 3.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < HK; ++j) {
      const float p = u(rng);
      float v;
      if (p < 0.6f) {
        const float a_log = std::uniform_real_distribution<float>(-2.f, 3.f)(rng);
        const float x = logit(rng);
        v = -std::exp(a_log) * (x > 20.f ? x : std::log1p(std::exp(x)));
      } else if (p < 0.8f) {
        v = -1e-3f * u(rng);
      } else if (p < 0.95f) {
        v = -(20.f + 40.f * u(rng));
      } else {
        v = -std::pow(10.f, 3.f + 2.f * u(rng));
      }
      if (spikes && t % 23 == 5) v = -1e4f;
      if (spikes && t % 23 > 5) v = -1e-3f * u(rng);
      g.f32()[t * HK + j] = v;
    }
}

}  // namespace k3::test
