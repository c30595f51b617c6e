// Block AttnRes mix, one thread block per row, fp32 throughout (docs/MODEL.md §4.1):
// l_j = query·V_j / sqrt(mean(V_j²)+eps), p = softmax(l), y = Σ p_j V_j.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

__global__ void attnres_mix_kernel(AttnResCandidates c, const float* query, FOut y, int D, float eps) {
  pdl_enter();
  __shared__ float scratch[32];
  __shared__ float p[kMaxAttnResCandidates];
  const int64_t row = blockIdx.x;
  for (int j = 0; j < c.m; ++j) {
    float dot = 0.f, ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = c.c[j][row * D + i];
      dot += query[i] * v;
      ss += v * v;
    }
    dot = block_sum(dot, scratch);
    ss = block_sum(ss, scratch);
    if (threadIdx.x == 0) p[j] = dot * rsqrtf(ss / D + eps);
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = 0; j < c.m; ++j) mx = fmaxf(mx, p[j]);
  float w[kMaxAttnResCandidates];
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxAttnResCandidates; ++j) {
    w[j] = j < c.m ? __expf(p[j] - mx) : 0.f;
    sum += w[j];
  }
  const float inv = 1.f / sum;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxAttnResCandidates; ++j)
      if (j < c.m) acc += w[j] * c.c[j][row * D + i];
    y.set(row * D + i, acc * inv);
  }
}

}  // namespace

void launch_attnres_mix(const AttnResCandidates& c, const float* query, FOut y, int64_t M, int D, float eps,
                        cudaStream_t s) {
  if (M == 0) return;
  launch_pdl("attnres_mix_kernel", attnres_mix_kernel, unsigned(M), 256, 0, s, c, query, y, D, eps);
}

}  // namespace k3::cuda
