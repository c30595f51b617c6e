// Warp and block reductions shared by the row kernels.
#pragma once
#include <cuda_runtime.h>

namespace k3::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread of the block gets the sum; `scratch` holds >= 32 floats. Block size a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : -INFINITY;
  return warp_max(t);
}
__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }
// act(g, u) of a gated MLP: SiLU(g) * u, or SiTU (docs/MODEL.md §5.1).
__device__ __forceinline__ float glu_act(bool silu, float g, float u, float beta, float beta_l) {
  return silu ? g * sigmoidf(g) * u : beta * tanhf(g / beta) * sigmoidf(g) * beta_l * tanhf(u / beta_l);
}
// KDA log-decay of one channel from x = f + dt_bias: -e^{A_log} softplus(x) (Kimi Linear) or
// g_min σ(e^{A_log} x) (K3). softplus is x above 20, as in the reference implementations.
__device__ __forceinline__ float kda_log_decay(bool softplus, float a_log, float x, float g_min) {
  if (softplus) return -expf(a_log) * (x > 20.f ? x : log1pf(expf(x)));
  return g_min * sigmoidf(expf(a_log) * x);
}

}  // namespace k3::cuda
