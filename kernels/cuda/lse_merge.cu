// Merge of N partial attention results over disjoint key sets (natural-log LSE):
// lse = m + log Σ exp(lse_n - m), o = Σ exp(lse_n - lse) o_n. A partition with lse = -inf has no
// keys and contributes nothing; when every partition is empty, o = 0 and lse = -inf (the
// `m == -inf` guard keeps exp(-inf - -inf) = NaN out).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

constexpr int kMaxParts = 64;

__global__ void lse_merge_kernel(FIn o_parts, const float* lse_parts, FOut o, float* lse, int N, int64_t rows, int D) {
  pdl_enter();
  __shared__ float w[kMaxParts];
  __shared__ float total_lse;
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int n = 0; n < N; ++n) m = fmaxf(m, lse_parts[n * rows + r]);
    float sum = 0.f;
    for (int n = 0; n < N; ++n) {
      const float l = lse_parts[n * rows + r];
      // The largest part's weight is exactly 1 (not __expf(0)): a merge of one non-empty part then
      // returns that part bit for bit, as the unsplit kernel would (chunk invariance relies on it).
      w[n] = (m == -INFINITY || l == -INFINITY) ? 0.f : l == m ? 1.f : __expf(l - m);
      sum += w[n];
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int n = 0; n < N; ++n) w[n] *= inv;
    total_lse = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
  __syncthreads();
  if (lse && threadIdx.x == 0) lse[r] = total_lse;
  if (!o_parts.bf16 && D % 4 == 0) {
    // fp32 partials (split-KV): 16-byte loads, four partitions' loads in flight per step. A
    // zero weight never loads (an empty partition may hold garbage), so 0 * NaN cannot appear.
    const float* parts = static_cast<const float*>(o_parts.p);
    for (int d4 = threadIdx.x; d4 < D / 4; d4 += blockDim.x) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      int n = 0;
      for (; n + 4 <= N; n += 4) {
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          v[j] = w[n + j] != 0.f ? *reinterpret_cast<const float4*>(parts + ((n + j) * rows + r) * D + 4 * d4)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc.x += w[n + j] * v[j].x;
          acc.y += w[n + j] * v[j].y;
          acc.z += w[n + j] * v[j].z;
          acc.w += w[n + j] * v[j].w;
        }
      }
      for (; n < N; ++n) {
        if (w[n] == 0.f) continue;
        const float4 v = *reinterpret_cast<const float4*>(parts + (n * rows + r) * D + 4 * d4);
        acc.x += w[n] * v.x;
        acc.y += w[n] * v.y;
        acc.z += w[n] * v.z;
        acc.w += w[n] * v.w;
      }
      o.set(r * D + 4 * d4, acc.x);
      o.set(r * D + 4 * d4 + 1, acc.y);
      o.set(r * D + 4 * d4 + 2, acc.z);
      o.set(r * D + 4 * d4 + 3, acc.w);
    }
    return;
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int n = 0; n < N; ++n)
      if (w[n] != 0.f) acc += w[n] * o_parts[(n * rows + r) * D + d];  // skip: an empty part may hold garbage
    o.set(r * D + d, acc);
  }
}

}  // namespace

void launch_lse_merge(FIn o_parts, const float* lse_parts, FOut o, float* lse, int N, int64_t rows, int D,
                      cudaStream_t s) {
  if (rows == 0) return;
  if (N > kMaxParts) throw Error("lse_merge: at most " + std::to_string(kMaxParts) + " partitions, got " + std::to_string(N));
  launch_pdl("lse_merge_kernel", lse_merge_kernel, unsigned(rows), 128, 0, s, o_parts, lse_parts, o, lse, N, rows, D);
}

}  // namespace k3::cuda
