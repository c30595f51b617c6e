// KDA chunked prefill, the prep's M_kk and M_qk tiles (kda_chunk_prep.cu): the 10 tiles (R, c ≤ R)
// of 16x16 of a 64-row chunk, their products from staged operands (bounded gate) or from the run
// sums (unbounded gate, left of the diagonal), and their stores. Shared-memory operands are bf16
// [64][kLdB]; Mk fp32 [64][kLdT]; M_qk goes to the workspace (pitch kC).
#pragma once
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_runs.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::kda_chunk {

// Tile (R, c) is number R(R+1)/2 + c: (0,0), (1,0), (1,1), (2,0), ... (3,3).
constexpr int kNumMTiles = 10;
__host__ __device__ constexpr int m_tile_index(int R, int c) { return R * (R + 1) / 2 + c; }
__host__ __device__ constexpr int m_tile_row(int tile) { return tile < 1 ? 0 : tile < 3 ? 1 : tile < 6 ? 2 : 3; }
static_assert(m_tile_index(3, 3) + 1 == kNumMTiles && m_tile_row(m_tile_index(2, 2)) == 2 && m_tile_row(6) == 3);

// The tiles (R, c0 .. c0+NT−1) of A (rows 16R..16R+15, A_K or A_Q) x (Bh ⊙ d_{R,c})ᵀ into acc,
// by the calling warp; A's fragment is loaded once per k step for the NT tiles. d: bf16 pairs
// [10][64]. B reg 2·hf + kh holds (n-row g + 8hf, k-cols 16kk + 8kh + 2t, +1), so it takes the d
// pair 8kk + 4kh + t (mma.cuh).
template <int NT>
__device__ __forceinline__ void staged_m_tiles(float (&acc)[NT][2][4], const bf16* A, const bf16* Bh,
                                               const uint32_t* d, int R, int c0) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4];
    load_a(a, A + 16 * R * kLdB + 16 * kk, kLdB);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      uint32_t b[4];
      load_b_nk(b, Bh + 16 * (c0 + i) * kLdB + 16 * kk, kLdB);
      const uint32_t* dv = d + m_tile_index(R, c0 + i) * (kD / 2) + 8 * kk + t;
      const uint32_t d0 = dv[0], d1 = dv[4];
      b[0] = mul_bf16x2(b[0], d0);
      b[1] = mul_bf16x2(b[1], d1);
      b[2] = mul_bf16x2(b[2], d0);
      b[3] = mul_bf16x2(b[3], d1);
      mma_bf16(acc[i][0], a, b);
      mma_bf16(acc[i][1], a, b + 2);
    }
  }
}

// f(r, s, x0, x1) for each accumulator pair of tiles (R, c0 .. c0+NT−1): row r, columns s, s + 1.
template <int NT, typename F>
__device__ __forceinline__ void each_tile_pair(const float (&acc)[NT][2][4], int R, int c0, F&& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        f(16 * R + g + 8 * hf, 16 * (c0 + i) + 8 * j + 2 * t, acc[i][j][2 * hf], acc[i][j][2 * hf + 1]);
}

// M_kk tiles: β_r-scaled, strictly lower (zeros on and above the diagonal), fp32 to Mk.
template <int NT>
__device__ __forceinline__ void store_mkk_tiles(const float (&acc)[NT][2][4], int R, int c0, float* Mk,
                                                const float* beta) {
  each_tile_pair<NT>(acc, R, c0, [&](int r, int s, float x0, float x1) {
    const float br = beta[r];
    *reinterpret_cast<float2*>(Mk + r * kLdT + s) = make_float2(s < r ? br * x0 : 0.f, s + 1 < r ? br * x1 : 0.f);
  });
}

// M_qk tiles: lower with the diagonal (zeros above), bf16 to the workspace (pitch kC).
template <int NT>
__device__ __forceinline__ void store_mqk_tiles(const float (&acc)[NT][2][4], int R, int c0, bf16* mq_out) {
  each_tile_pair<NT>(acc, R, c0, [&](int r, int s, float x0, float x1) {
    *reinterpret_cast<uint32_t*>(mq_out + r * kC + s) = pack_bf16(s <= r ? x0 : 0.f, s + 1 <= r ? x1 : 0.f);
  });
}

template <int NT>
__device__ __forceinline__ void mkk_tiles(int R, int c0, const bf16* Ak, const bf16* Bh, const uint32_t* d,
                                          float* Mk, const float* beta) {
  float acc[NT][2][4];
  staged_m_tiles<NT>(acc, Ak, Bh, d, R, c0);
  store_mkk_tiles<NT>(acc, R, c0, Mk, beta);
}

template <int NT>
__device__ __forceinline__ void mqk_tiles(int R, int c0, const bf16* Aq, const bf16* Bh, const uint32_t* d,
                                          bf16* mq_out) {
  float acc[NT][2][4];
  staged_m_tiles<NT>(acc, Aq, Bh, d, R, c0);
  store_mqk_tiles<NT>(acc, R, c0, mq_out);
}

// Unbounded gate: tile (R, ct < R), left of the diagonal, of M_kk and M_qk by the calling warp, the
// scaled operands built in registers from the run sums of kda_chunk_runs.cuh: rows r = 16R + (0..15)
// K_r, Q_r times e^{Pe[r]}, columns s = 16ct + (0..15) K_s times e^{Se[s] + bridge}, both ≤ 1 for
// any g ≤ 0. Fragment element (mma.cuh): A reg 2·kh + hf = (row g + 8hf, cols 16kk + 8kh + 2t, +1);
// B reg 2·hf + kh = (n-row g + 8hf, k-cols 16kk + 8kh + 2t, +1): regs 0,1 the first n8 tile.
__device__ __forceinline__ void runs_m_tile(int R, int ct, const bf16* Ks, const bf16* Qs, float* Mk,
                                            const float* beta, bf16* mq_out, const float* Pe, const float* Se,
                                            const float* runs) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n = 16 * R;
  float acc_k[1][2][4] = {}, acc_q[1][2][4] = {};
#pragma unroll 4  // full unrolling costs 128 registers and a spill
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t ak[4], aq[4], b[4];
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
      const int c = 16 * kk + 8 * kh + 2 * t;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = n + g + 8 * hf;
        const float2 pe = *reinterpret_cast<const float2*>(Pe + r * kLdG + c);
        const float f0 = __expf(pe.x), f1 = __expf(pe.y);
        const float2 k2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + r * kLdB + c));
        const float2 q2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Qs + r * kLdB + c));
        ak[2 * kh + hf] = pack_bf16(k2.x * f0, k2.y * f1);
        aq[2 * kh + hf] = pack_bf16(q2.x * f0, q2.y * f1);
        const int s = 16 * ct + g + 8 * hf;
        const float2 se = *reinterpret_cast<const float2*>(Se + s * kLdG + c);
        const float2 br = *reinterpret_cast<const float2*>(runs + run_bridge(ct, R) * kD + c);
        const float2 ks = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + s * kLdB + c));
        b[2 * hf + kh] = pack_bf16(ks.x * __expf(se.x + br.x), ks.y * __expf(se.y + br.y));
      }
    }
    mma_bf16(acc_k[0][0], ak, b);
    mma_bf16(acc_k[0][1], ak, b + 2);
    mma_bf16(acc_q[0][0], aq, b);
    mma_bf16(acc_q[0][1], aq, b + 2);
  }
  store_mkk_tiles<1>(acc_k, R, ct, Mk, beta);
  store_mqk_tiles<1>(acc_q, R, ct, mq_out);
}

}  // namespace k3::cuda::kda_chunk
