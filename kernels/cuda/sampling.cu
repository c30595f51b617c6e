// Greedy sampling on the device: per row the argmax with the lowest id on ties (the CPU rule in
// kernels/cpu/sampling.cpp), so a decode step brings back B token ids instead of B x V logits.
#include <cfloat>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

struct Best {
  float v;
  int i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__global__ void argmax_rows_kernel(const float* logits, int64_t V, int32_t* out) {
  pdl_enter();
  const float* row = logits + int64_t(blockIdx.x) * V;
  Best b{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) b = better(b, Best{row[i], int(i)});
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    b = better(b, other);
  }
  __shared__ Best warp_best[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_best[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < (blockDim.x >> 5) ? warp_best[lane] : Best{-INFINITY, INT_MAX};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
      b = better(b, other);
    }
    // Every entry -inf or NaN: the CPU rule keeps id 0.
    if (lane == 0) out[blockIdx.x] = b.i == INT_MAX ? 0 : b.i;
  }
}

}  // namespace

void launch_argmax_rows(const float* logits, int64_t B, int64_t V, int32_t* out, cudaStream_t s) {
  if (B == 0) return;
  launch_pdl("argmax_rows_kernel", argmax_rows_kernel, unsigned(B), 1024, 0, s, logits, V, out);
}

}  // namespace k3::cuda
