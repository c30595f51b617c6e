// Causal attention with materialised K/V (MLA prefill), simple form: one thread block per
// (query row, head), keys in tiles of 128 with an online softmax; fp32 math, natural-log LSE.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxDv = 256;

__global__ void mla_prefill_kernel(MlaPrefillArgs a) {
  pdl_enter();
  extern __shared__ float q[];  // [Dqk]
  __shared__ float p[kThreads];
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y;
  for (int i = threadIdx.x; i < a.Dqk; i += kThreads) q[i] = a.q[(int64_t(t) * a.H + h) * a.Dqk + i];
  __syncthreads();
  const int64_t last = a.past + t;  // inclusive
  const int64_t nkeys = last + 1 < a.S ? last + 1 : a.S;
  float m = -INFINITY, l = 0.f;
  float acc[kMaxDv / kThreads] = {0.f, 0.f};
  for (int64_t j0 = 0; j0 < nkeys; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < nkeys) {
      s = 0.f;
      for (int i = 0; i < a.Dqk; ++i) s += q[i] * a.k[(j * a.H + h) * a.Dqk + i];
      s *= a.scale;
    }
    const float tile_max = block_max(s, scratch);
    const float m_new = fmaxf(m, tile_max);
    const float e = j < nkeys ? __expf(s - m_new) : 0.f;
    __syncthreads();
    p[threadIdx.x] = e;
    const float tile_sum = block_sum(e, scratch);  // contains a barrier: p is visible after it
    const float corr = __expf(m - m_new);
    l = l * corr + tile_sum;
    m = m_new;
    const int n = int(nkeys - j0 < kThreads ? nkeys - j0 : kThreads);
#pragma unroll
    for (int c = 0; c < kMaxDv / kThreads; ++c) {
      const int d = threadIdx.x + c * kThreads;
      if (d >= a.Dv) continue;
      float v = acc[c] * corr;
      for (int jj = 0; jj < n; ++jj) v += p[jj] * a.v[((j0 + jj) * a.H + h) * a.Dv + d];
      acc[c] = v;
    }
    __syncthreads();
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int c = 0; c < kMaxDv / kThreads; ++c) {
    const int d = threadIdx.x + c * kThreads;
    if (d < a.Dv) a.o.set((int64_t(t) * a.H + h) * a.Dv + d, acc[c] * inv);
  }
  if (a.lse && threadIdx.x == 0) a.lse[int64_t(t) * a.H + h] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace

void launch_mla_prefill(const MlaPrefillArgs& a, cudaStream_t s) {
  if (a.T == 0 || a.H == 0) return;
  if (a.Dv > kMaxDv) throw Error("mla_prefill: Dv " + std::to_string(a.Dv) + " > " + std::to_string(kMaxDv));
  launch_pdl("mla_prefill_kernel", mla_prefill_kernel, dim3(a.T, a.H), kThreads, a.Dqk * sizeof(float), s, a);
}

}  // namespace k3::cuda

// ---- the GEMM form's softmax: scores [rows = heads x T, S] F32 -> P bf16, causal, natural-log lse ----
namespace k3::cuda {
namespace {

__global__ void causal_softmax_kernel(const float* scores, __nv_bfloat16* probs, float* lse, int T, int S, int H,
                                      int h0, int64_t past) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;  // (head in group) * T + t
  const int t = int(row % T), hg = int(row / T);
  const float* s = scores + row * S;
  __nv_bfloat16* p = probs + row * S;
  const int64_t n = std::min<int64_t>(past + t + 1, S);  // keys j <= past + t
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, scratch);
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) l += __expf(s[j] - m);
  l = block_sum(l, scratch);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    p[j] = __float2bfloat16(j < n ? __expf(s[j] - m) * inv : 0.f);
  if (lse != nullptr && threadIdx.x == 0) lse[int64_t(t) * H + h0 + hg] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace

void launch_causal_softmax(const float* scores, __nv_bfloat16* probs, float* lse, int heads, int T, int S, int H,
                           int h0, int64_t past, cudaStream_t s) {
  if (heads == 0 || T == 0) return;
  launch_pdl("causal_softmax_kernel", causal_softmax_kernel, unsigned(int64_t(heads) * T), 256, 0, s, scores, probs,
             lse, T, S, H, h0, past);
}

}  // namespace k3::cuda
