// noaux_tc router: one thread block per token. k rounds of a block-wide argmax over s + bias
// (ties toward the lower expert id), so ids come out in descending order of s + bias.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

struct Best {
  float v;
  int id;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}

__global__ void router_topk_kernel(const float* logits, const float* bias, int32_t* ids, float* weights, int E, int k,
                                   float scale) {
  pdl_enter();
  extern __shared__ float smem[];
  float* score = smem;          // [E] sigmoid(logit)
  float* key = smem + E;        // [E] score + bias; -inf once taken
  __shared__ Best warp_best[32];
  __shared__ float picked_score[64];
  __shared__ int picked_id[64];
  const int64_t row = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float s = sigmoidf(logits[row * E + e]);
    score[e] = s;
    key[e] = s + bias[e];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = 0; j < k; ++j) {
    Best b{-INFINITY, 0x7fffffff};
    for (int e = threadIdx.x; e < E; e += blockDim.x) b = better(b, Best{key[e], e});
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
      b = better(b, other);
    }
    if (lane == 0) warp_best[warp] = b;
    __syncthreads();
    if (threadIdx.x == 0) {
      Best t = warp_best[0];
      for (int w = 1; w < nw; ++w) t = better(t, warp_best[w]);
      picked_id[j] = t.id;
      picked_score[j] = score[t.id];
      key[t.id] = -INFINITY;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += picked_score[j];
    for (int j = 0; j < k; ++j) {
      ids[row * k + j] = picked_id[j];
      weights[row * k + j] = scale * picked_score[j] / (sum + 1e-20f);
    }
  }
}

}  // namespace

void launch_router_topk(const float* logits, const float* bias, int32_t* ids, float* weights, int64_t M, int E, int k,
                        float scale, cudaStream_t s) {
  if (M == 0) return;
  const size_t smem = size_t(E) * 2 * sizeof(float);
  K3_CUDA_OK(cudaFuncSetAttribute(router_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl("router_topk_kernel", router_topk_kernel, unsigned(M), 256, smem, s, logits, bias, ids, weights, E, k,
             scale);
}

}  // namespace k3::cuda
