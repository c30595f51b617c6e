// KDA token recurrence (docs/MODEL.md §2.3). The scalar kernel, for any head size: one thread block per
// (sequence, head), thread j owns row j of S[V][K] (shared memory), tokens in order:
// S <- Diag(α) S; u = β(v - Sᵀk); S <- S + k uᵀ; o = Sᵀ q.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kda_rows.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

__global__ void kda_recurrent_kernel(KdaArgs a) {
  pdl_enter();
  extern __shared__ float smem[];
  const int K = a.K, V = a.V, ld = K + 1;
  float* S = smem;             // [V][K+1]
  float* qs = S + V * ld;      // [K]
  float* ks = qs + K;          // [K]
  float* al = ks + K;          // [K]
  const int n = blockIdx.x, h = blockIdx.y;
  const int64_t slot = a.slots[n];
  float* state = a.state + (slot * a.H + h) * int64_t(V) * K;
  for (int i = threadIdx.x; i < V * K; i += blockDim.x) S[(i / K) * ld + i % K] = state[i];
  __syncthreads();
  const int j = threadIdx.x;
  const int64_t t0 = kda_row_begin(a, n), t1 = kda_row_end(a, n);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t * a.H + h;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
      qs[i] = a.q[row * K + i];
      ks[i] = a.k[row * K + i];
      al[i] = expf(a.g[row * K + i]);
    }
    __syncthreads();
    if (j < V) {
      float* s = S + j * ld;
      float kv = 0.f;
      for (int i = 0; i < K; ++i) {
        s[i] *= al[i];
        kv += s[i] * ks[i];
      }
      const float u = a.beta[row] * (a.v[row * V + j] - kv);
      float o = 0.f;
      for (int i = 0; i < K; ++i) {
        s[i] += ks[i] * u;
        o += s[i] * qs[i];
      }
      a.o.set(row * V + j, o);
    }
    __syncthreads();
    const int cs = kda_ckpt_slot(a, n, int(t + 1 - t0));
    if (cs >= 0) {  // row j is final for this token; the next token's barrier orders the reads
      float* dst = a.ckpt + (int64_t(cs) * a.H + h) * int64_t(V) * K;
      for (int i = threadIdx.x; i < V * K; i += blockDim.x) dst[i] = S[(i / K) * ld + i % K];
    }
  }
  for (int i = threadIdx.x; i < V * K; i += blockDim.x) state[i] = S[(i / K) * ld + i % K];
}

// The same recurrence for K = V = D (64 or 128, K3's and Kimi Linear's heads), one block of 2·D
// threads per (sequence, head) and the state in registers: warp w owns rows [16 w, 16 w + 16), lane l
// their columns [4 l, 4 l + 4) (D = 128; 2 for D = 64), read once at the start and written once at the
// end. Per token the block stages q, k, v, the decays and β in shared memory, and each warp updates its
// rows by the fused decode kernel's step (kda_rows.cuh). It serves decode tokens and the rows of
// partial blocks in batch-invariant mode, where a few tokens per (sequence, head) move the whole
// state; the scalar kernel above (a row per thread, the state in shared memory) serves every other
// head size. A sequence with no rows in the call still reads and writes back its state unchanged.
constexpr int kRecRows = 16;

template <int D>
__global__ void __launch_bounds__(2 * D) kda_recurrent_rows_kernel(KdaArgs a) {
  pdl_enter();
  constexpr int NV = D / 32;
  __shared__ __align__(16) float qs[D], ks[D], vs[D], als[D];
  __shared__ float beta_s;
  const int n = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row0 = warp * kRecRows;
  float* state = a.state + (int64_t(a.slots[n]) * a.H + h) * int64_t(D) * D;
  float s[kRecRows][NV];
#pragma unroll
  for (int r = 0; r < kRecRows; ++r) {
    const float* x = state + (row0 + r) * D + lane * NV;
    if constexpr (NV == 4) {
      const float4 v = *reinterpret_cast<const float4*>(x);
      s[r][0] = v.x, s[r][1] = v.y, s[r][2] = v.z, s[r][3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(x);
      s[r][0] = v.x, s[r][1] = v.y;
    }
  }
  const int64_t t0 = kda_row_begin(a, n), t1 = kda_row_end(a, n);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t * a.H + h;
    if (tid < D) {
      qs[tid] = a.q[row * D + tid];
      ks[tid] = a.k[row * D + tid];
    } else {
      vs[tid - D] = a.v[row * D + tid - D];
      als[tid - D] = expf(a.g[row * D + tid - D]);
      if (tid == D) beta_s = a.beta[row];
    }
    __syncthreads();
    float q[NV], k[NV], al[NV];
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      q[e] = qs[lane * NV + e];
      k[e] = ks[lane * NV + e];
      al[e] = als[lane * NV + e];
    }
    const float beta = beta_s;
    auto elem = [&](int r, int e) { return s[r][e]; };
    auto put = [&](int r, const float (&v)[NV]) {
#pragma unroll
      for (int e = 0; e < NV; ++e) s[r][e] = v[e];
    };
    const float mine = kda_rows_step<NV, kRecRows>(elem, put, vs + row0, beta, q, k, al, lane);
    if (lane < kRecRows) a.o.set(row * D + row0 + lane, mine);
    const int cs = kda_ckpt_slot(a, n, int(t + 1 - t0));
    if (cs >= 0) {
      float* dst = a.ckpt + (int64_t(cs) * a.H + h) * int64_t(D) * D;
#pragma unroll
      for (int r = 0; r < kRecRows; ++r)
#pragma unroll
        for (int e = 0; e < NV; ++e) dst[(row0 + r) * D + lane * NV + e] = s[r][e];
    }
    __syncthreads();   // every warp has read this token's q, k, v before the next token's overwrite them
  }
#pragma unroll
  for (int r = 0; r < kRecRows; ++r)
#pragma unroll
    for (int e = 0; e < NV; ++e) state[(row0 + r) * D + lane * NV + e] = s[r][e];
}

template <int D>
void launch_rows(const KdaArgs& a, cudaStream_t s) {
  static_assert(2 * D / 32 * kRecRows == D, "the block's warps cover the D rows");
  launch_pdl("kda_recurrent_rows_kernel", kda_recurrent_rows_kernel<D>, dim3(a.N, a.H), 2 * D, 0, s, a);
}

}  // namespace

void launch_kda_recurrent(const KdaArgs& a, cudaStream_t s) {
  if (a.N == 0 || a.H == 0) return;
  if (a.K == a.V && (a.K == 64 || a.K == 128)) {
    if (a.K == 128) launch_rows<128>(a, s);
    else launch_rows<64>(a, s);
    return;
  }
  const int threads = ((a.V + 31) / 32) * 32;
  const size_t smem = (size_t(a.V) * (a.K + 1) + 3 * a.K) * sizeof(float);
  K3_CUDA_OK(cudaFuncSetAttribute(kda_recurrent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl("kda_recurrent_kernel", kda_recurrent_kernel, dim3(a.N, a.H), threads, smem, s, a);
}

}  // namespace k3::cuda
