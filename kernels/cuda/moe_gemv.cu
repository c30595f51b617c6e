// LatentMoE routed experts for a few (token, expert) pairs, the decode shape: one warp per output
// row, 16-byte loads along the bf16 weight row, fp32 sums. The grouped GEMM (moe_grouped.cu) runs
// one 64-row tensor-core tile per (expert, column block) whatever the pair count, so at batch 1 it
// keeps 32 blocks busy and streams the touched experts latency-bound; here every output row of
// every pair is its own warp (F/8 x pairs blocks for W1/W3, Dl/8 x pairs for W2).
//   1. up:      h[p, f] = SiTU(W1_e[f] . z[m], W3_e[f] . z[m])      (p = m*k + j, e = ids[p]; fp32 h)
//   2. down:    out[p, d] = W2_e[d] . h[p]
//   3. combine: y[m, d] = sum_j weights[m, j] * out[m*k + j, d], in j order.
// A pair whose id is outside [0, E) contributes nothing (as in the grouped path). The sums run in a
// different order from the grouped GEMM's, so the backend uses this path only when it is not asked
// for batch invariance.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;  // output rows per block

__device__ __forceinline__ float dot8(const uint4& w, const float* x) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    s += f.x * x[2 * i] + f.y * x[2 * i + 1];
  }
  return s;
}

__global__ void __launch_bounds__(kWarps * 32)
    moe_gemv_up_kernel(const __nv_bfloat16* z, const int32_t* ids, const __nv_bfloat16* w1, const __nv_bfloat16* w3,
                       float* h, int k, int E, int F, int Dl, float beta, float beta_linear) {
  pdl_enter();
  extern __shared__ float zs[];  // [Dl]
  const int p = blockIdx.x, m = p / k, e = ids[p];
  for (int i = threadIdx.x; i < Dl; i += blockDim.x) zs[i] = __bfloat162float(z[int64_t(m) * Dl + i]);
  __syncthreads();
  const int lane = threadIdx.x & 31, f = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (f >= F) return;
  float g = 0.f, u = 0.f;
  if (e >= 0 && e < E) {
    const auto* r1 = reinterpret_cast<const uint4*>(w1 + (int64_t(e) * F + f) * Dl);
    const auto* r3 = reinterpret_cast<const uint4*>(w3 + (int64_t(e) * F + f) * Dl);
    for (int c = lane; c < Dl / 8; c += 32) {
      const uint4 a = r1[c], b = r3[c];
      g += dot8(a, zs + c * 8);
      u += dot8(b, zs + c * 8);
    }
    g = warp_sum(g);
    u = warp_sum(u);
  }
  if (lane == 0)
    h[int64_t(p) * F + f] =
        (e >= 0 && e < E) ? beta * tanhf(g / beta) * sigmoidf(g) * beta_linear * tanhf(u / beta_linear) : 0.f;
}

__global__ void __launch_bounds__(kWarps * 32)
    moe_gemv_down_kernel(const float* h, const int32_t* ids, const __nv_bfloat16* w2, float* out, int E, int F, int Dl) {
  pdl_enter();
  extern __shared__ float hs[];  // [F]
  const int p = blockIdx.x, e = ids[p];
  for (int i = threadIdx.x; i < F; i += blockDim.x) hs[i] = h[int64_t(p) * F + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, d = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (d >= Dl) return;
  float s = 0.f;
  if (e >= 0 && e < E) {
    const auto* r = reinterpret_cast<const uint4*>(w2 + (int64_t(e) * Dl + d) * F);
    for (int c = lane; c < F / 8; c += 32) s += dot8(r[c], hs + c * 8);
    s = warp_sum(s);
  }
  if (lane == 0) out[int64_t(p) * Dl + d] = s;
}

__global__ void moe_gemv_combine_kernel(const float* out, const float* weights, FOut y, int k, int Dl) {
  pdl_enter();
  const int64_t m = blockIdx.x;
  for (int d = threadIdx.x; d < Dl; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += weights[m * k + j] * out[(m * k + j) * Dl + d];
    y.set(m * Dl + d, acc);
  }
}

}  // namespace

bool moe_gemv_supported(const MoeArgs& a) {
  // SiTU only: the SiLU experts (Kimi Linear) take the grouped path.
  return !a.silu && a.z.bf16 && a.w1.bf16 && a.w3.bf16 && a.w2.bf16 && a.M * a.k <= kMoeGemvMaxPairs && a.Dl % 8 == 0 &&
         a.F % 8 == 0 && a.Dl <= 8192 && a.F <= 8192 && aligned16(a.w1.p) && aligned16(a.w3.p) && aligned16(a.w2.p);
}

size_t moe_gemv_workspace_bytes(const MoeArgs& a) {
  const size_t P = size_t(a.M) * a.k;
  return (P * a.F * 4 + 255) / 256 * 256 + P * a.Dl * 4;
}

void launch_moe_gemv(const MoeArgs& a, void* workspace, cudaStream_t s) {
  if (a.M == 0) return;
  const int P = a.M * a.k;
  auto* h = static_cast<float*>(workspace);
  auto* out = reinterpret_cast<float*>(static_cast<char*>(workspace) + (size_t(P) * a.F * 4 + 255) / 256 * 256);
  const auto* z = static_cast<const __nv_bfloat16*>(a.z.p);
  launch_pdl("moe_gemv_up_kernel", moe_gemv_up_kernel, dim3(P, (a.F + kWarps - 1) / kWarps), kWarps * 32,
             size_t(a.Dl) * 4, s, z, a.ids, static_cast<const __nv_bfloat16*>(a.w1.p),
             static_cast<const __nv_bfloat16*>(a.w3.p), h, a.k, a.E, a.F, a.Dl, a.beta, a.beta_linear);
  launch_pdl("moe_gemv_down_kernel", moe_gemv_down_kernel, dim3(P, (a.Dl + kWarps - 1) / kWarps), kWarps * 32,
             size_t(a.F) * 4, s, h, a.ids, static_cast<const __nv_bfloat16*>(a.w2.p), out, a.E, a.F, a.Dl);
  launch_pdl("moe_gemv_combine_kernel", moe_gemv_combine_kernel, a.M, 256, 0, s, out, a.weights, a.y, a.k, a.Dl);
}

}  // namespace k3::cuda
