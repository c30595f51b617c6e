// KDA chunked prefill, prep launch, for a gate without a lower bound (Kimi Linear's softplus form,
// docs/MODEL.md §2.4): the gate sums and the diagonal tiles of M_kk / M_qk that keep every exponent
// a sum of gates over a run of tokens, accumulated from the run's fixed end. Never a difference
// Γ_r − Γ_s of two cumulative sums (after one gate of −1e4 it keeps only ulp(1e4) ≈ 1e-3 of
// absolute precision), never a factor above 1 (e^{Γ_n − Γ_s} with s after n overflows fp32 once
// the gates between them sum below −88).
#pragma once
#include "kernels/cuda/kda_chunk_layout.cuh"

namespace k3::cuda::kda_chunk {

// Per-column run sums of one chunk (64 rows; rows past the chunk's length hold g = 0); n = 16R is
// the first row of row tile R:
//   Pe[r] = Σ_{n<t≤r} g_t  (0 on a tile's first row);  Se[r] = Σ_{r<t≤n+15} g_t  (0 on its last)
//   runs row kRunHead + R           = Σ_{t≤n} g_t            (Γ_n)
//   runs row kRunTail + R           = Σ_{t>n+15} g_t         (0 for the last tile)
//   runs row run_bridge(ct, R)      = Σ_{16(ct+1)≤t≤n} g_t   (ct < R)
//   runs row kRunAll                = Σ_t g_t                (Γ_C)
// so that, for r in row tile R and s in an earlier tile ct, each exponent is a sum of two sums of
// same-sign terms (relative error at most the run length times ε):
//   Γ_r = head[R] + Pe[r],  Γ_C − Γ_r = Se[r] + tail[R],  Γ_r − Γ_n = Pe[r],
//   Γ_n − Γ_s = Se[s] + bridge[ct, R].
constexpr int kRunHead = 0, kRunTail = 4, kRunBridge = 8, kRunAll = 14, kRuns = 15;
__device__ __forceinline__ int run_bridge(int ct, int R) { return kRunBridge + R * (R - 1) / 2 + ct; }
static_assert(kC == 64, "the run rows above assume four 16-row tiles");

// 256 threads over the raw gates G [64][kLdG]: threads 0..127 walk column tid forward (Pe, heads,
// Γ_C), threads 128..255 column tid − 128 backward (Se, tails, bridges). Pe and Se have pitch kLdG,
// runs pitch kD.
__device__ __forceinline__ void gate_run_sums(const float* G, float* Pe, float* Se, float* runs) {
  const int tid = threadIdx.x, col = tid & (kD - 1);
  if (tid < kD) {
    float total = 0.f;
    for (int R = 0; R < kC / 16; ++R) {
      const int n = 16 * R;
      total += G[n * kLdG + col];
      runs[(kRunHead + R) * kD + col] = total;
      float p = 0.f;
      Pe[n * kLdG + col] = 0.f;
      for (int rl = 1; rl < 16; ++rl) {
        const float gv = G[(n + rl) * kLdG + col];
        p += gv;
        total += gv;
        Pe[(n + rl) * kLdG + col] = p;
      }
    }
    runs[kRunAll * kD + col] = total;
  } else {
    float tail = 0.f;
    for (int R = kC / 16 - 1; R >= 0; --R) {
      const int n = 16 * R;
      runs[(kRunTail + R) * kD + col] = tail;
      float s = 0.f;
      Se[(n + 15) * kLdG + col] = 0.f;
      for (int rl = 14; rl >= 0; --rl) {
        const float gv = G[(n + rl + 1) * kLdG + col];
        s += gv;
        tail += gv;
        Se[(n + rl) * kLdG + col] = s;
      }
      tail += G[n * kLdG + col];
    }
    for (int R = 1; R < kC / 16; ++R) {
      float acc = 0.f;
      for (int t = 16 * R; t >= 16; --t) {
        acc += G[t * kLdG + col];
        if (t % 16 == 0) runs[run_bridge(t / 16 - 1, R) * kD + col] = acc;
      }
    }
  }
}

// The four diagonal 16x16 tiles, pair by pair (no factoring through a reference row can keep both
// factors ≤ 1 for pairs on both sides of it): M[r, s] = Σ_i x_r[i] k_s[i] e^{Σ_{s<t≤r} g_t[i]},
// the run summed from s down the rows, as the CPU reference does. Written: M_kk times β_r, strictly
// lower (zero on and above the diagonal), to Mk (fp32, pitch kLdT); M_qk, lower with the diagonal
// (zero above), to mq_out (bf16, pitch kC). K, Q: bf16 [64][kLdB]. In fp32 from the bf16 inputs.
// 256 threads: thread (tile R = tid / 64, column s = 16R + (tid / 4) % 16, channels i ≡ tid mod 4)
// sums its 32 channels for all rows of the tile; the 4 channel groups (adjacent lanes) are then
// summed by shuffles. A warp's lanes share R and the row, so the g, K_r, Q_r reads are broadcasts.
__device__ __forceinline__ void diag_tiles_by_pairs(const float* G, const bf16* Ks, const bf16* Qs, float* Mk,
                                                    const float* beta, bf16* mq_out) {
  const int tid = threadIdx.x, q4 = tid & 3, sl = (tid >> 2) & 15, n = 16 * (tid >> 6), s = n + sl;
  float ak[16], aq[16];
#pragma unroll
  for (int rl = 0; rl < 16; ++rl) ak[rl] = aq[rl] = 0.f;
#pragma unroll 1
  for (int i = q4; i < kD; i += 4) {
    const float ks = __bfloat162float(Ks[s * kLdB + i]);
    float run = 0.f;  // Σ_{s<t≤r} g_t[i]
#pragma unroll
    for (int rl = 0; rl < 16; ++rl) {
      if (rl < sl) continue;
      const int r = n + rl;
      if (rl > sl) run += G[r * kLdG + i];
      const float e = ks * __expf(run);
      ak[rl] += __bfloat162float(Ks[r * kLdB + i]) * e;
      aq[rl] += __bfloat162float(Qs[r * kLdB + i]) * e;
    }
  }
#pragma unroll
  for (int rl = 0; rl < 16; ++rl) {
    ak[rl] += __shfl_xor_sync(0xffffffffu, ak[rl], 1);
    ak[rl] += __shfl_xor_sync(0xffffffffu, ak[rl], 2);
    aq[rl] += __shfl_xor_sync(0xffffffffu, aq[rl], 1);
    aq[rl] += __shfl_xor_sync(0xffffffffu, aq[rl], 2);
  }
  if (q4 == 0) {
#pragma unroll
    for (int rl = 0; rl < 16; ++rl) {
      const int r = n + rl;
      Mk[r * kLdT + s] = rl > sl ? beta[r] * ak[rl] : 0.f;
      mq_out[r * kC + s] = __float2bfloat16(rl >= sl ? aq[rl] : 0.f);
    }
  }
}

}  // namespace k3::cuda::kda_chunk
