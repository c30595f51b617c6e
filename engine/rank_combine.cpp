// The expert combine of the EP path (engine/rank_step.h). Its own file so that CMake compiles it without
// FMA contraction, like kernels/: the CPU moe_experts' sum rounds each product; the CUDA one is compiled
// with contraction (nvcc's default), so for a GPU rank the sum is explicit fused multiply-adds.
#include <algorithm>
#include <cmath>

#include "engine/rank_step.h"

namespace k3::rank {

void combine_slots(const float* h, const float* weights, int64_t rows, int64_t k, int64_t width, float* y,
                   bool fused_multiply_add) {
  for (int64_t m = 0; m < rows; ++m) {
    float* yr = y + m * width;
    std::fill(yr, yr + width, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const float wj = weights[m * k + j];
      const float* hj = h + (m * k + j) * width;
      if (fused_multiply_add)
        for (int64_t i = 0; i < width; ++i) yr[i] = std::fma(wj, hj[i], yr[i]);
      else
        for (int64_t i = 0; i < width; ++i) yr[i] += wj * hj[i];
    }
  }
}

}  // namespace k3::rank
