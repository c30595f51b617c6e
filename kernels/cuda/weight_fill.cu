// Generated weights filled on the GPU: the same counter-based draw as the host generator
// (common/core/counter_random.h), so a model generated in GPU memory holds the bits a generated
// file would. One thread per element in a grid-stride loop; the draw is integer work and one float
// multiply, rounded to bf16 with round-to-nearest-even like the host conversion.
#include <cuda_bf16.h>

#include <algorithm>

#include "common/core/counter_random.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

__global__ void fill_uniform_kernel(FOut y, int64_t n, int64_t first, uint64_t seed, float scale, bool round_to_bf16) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = counter_random::uniform(seed, static_cast<uint64_t>(first + i), scale);
    if (round_to_bf16) v = __bfloat162float(__float2bfloat16_rn(v));
    y.set(i, v);
  }
}

}  // namespace

void launch_fill_uniform(FOut y, int64_t n, int64_t first, uint64_t seed, float scale, bool round_to_bf16,
                         cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 32);
  launch_pdl("fill_uniform_kernel", fill_uniform_kernel, unsigned(blocks), 256, 0, s, y, n, first, seed, scale,
             round_to_bf16);
}

}  // namespace k3::cuda
