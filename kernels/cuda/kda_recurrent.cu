// KDA token recurrence (docs/MODEL.md §2.3), the CUDA oracle: one thread block per (sequence, head),
// thread j owns row j of S[V][K] (shared memory), tokens in order:
// S <- Diag(α) S; u = β(v - Sᵀk); S <- S + k uᵀ; o = Sᵀ q.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace k3::cuda {
namespace {

__global__ void kda_recurrent_kernel(KdaArgs a) {
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
  const int64_t t0 = a.seq_rows ? a.seq_rows[2 * n] : a.cu_seqlens[n];
  const int64_t t1 = a.seq_rows ? a.seq_rows[2 * n + 1] : a.cu_seqlens[n + 1];
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

}  // namespace

void launch_kda_recurrent(const KdaArgs& a, cudaStream_t s) {
  if (a.N == 0 || a.H == 0) return;
  const int threads = ((a.V + 31) / 32) * 32;
  const size_t smem = (size_t(a.V) * (a.K + 1) + 3 * a.K) * sizeof(float);
  K3_CUDA_OK(cudaFuncSetAttribute(kda_recurrent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kda_recurrent_kernel<<<dim3(a.N, a.H), threads, smem, s>>>(a);
  K3_CUDA_LAUNCHED("kda_recurrent_kernel");
}

}  // namespace k3::cuda
