// LatentMoE routed experts, simple form: one thread block per token, experts visited in turn,
// one warp per weight row. Correct for any dtype mix; bf16 inputs take the grouped-GEMM path
// (moe_grouped.cu) instead.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

__global__ void moe_experts_kernel(MoeArgs a) {
  pdl_enter();
  extern __shared__ float smem[];
  float* z = smem;            // [Dl]
  float* acc = z + a.Dl;      // [Dl]
  float* h = acc + a.Dl;      // [F]
  const int64_t m = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int i = threadIdx.x; i < a.Dl; i += blockDim.x) {
    z[i] = a.z[m * a.Dl + i];
    acc[i] = 0.f;
  }
  __syncthreads();
  for (int j = 0; j < a.k; ++j) {
    const int64_t e = a.ids[m * a.k + j];
    const float wgt = a.weights[m * a.k + j];
    for (int f = warp; f < a.F; f += nw) {
      const int64_t base = (e * a.F + f) * a.Dl;
      float g = 0.f, u = 0.f;
      for (int i = lane; i < a.Dl; i += 32) {
        g += a.w1[base + i] * z[i];
        u += a.w3[base + i] * z[i];
      }
      g = warp_sum(g);
      u = warp_sum(u);
      if (lane == 0) h[f] = glu_act(a.silu, g, u, a.beta, a.beta_linear);
    }
    __syncthreads();
    for (int d = warp; d < a.Dl; d += nw) {
      const int64_t base = (e * a.Dl + d) * a.F;
      float s = 0.f;
      for (int f = lane; f < a.F; f += 32) s += a.w2[base + f] * h[f];
      s = warp_sum(s);
      if (lane == 0) acc[d] += wgt * s;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < a.Dl; i += blockDim.x) a.y.set(m * a.Dl + i, acc[i]);
}

}  // namespace

void launch_moe_experts(const MoeArgs& a, cudaStream_t s) {
  if (a.M == 0) return;
  const size_t smem = (size_t(a.Dl) * 2 + a.F) * sizeof(float);
  K3_CUDA_OK(cudaFuncSetAttribute(moe_experts_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl("moe_experts_kernel", moe_experts_kernel, unsigned(a.M), 256, smem, s, a);
}

}  // namespace k3::cuda
