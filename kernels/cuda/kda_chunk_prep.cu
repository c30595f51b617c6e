// KDA chunked prefill, launch 1 of 2 (see kda_chunk.cu for the whole algorithm): one block per
// (chunk, head), all chunks in parallel, bf16 tensor-core operands (mma.sync, fp32 accumulate).
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fast_exp2.cuh"
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_runs.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda {
namespace {

using namespace kda_chunk;

constexpr int kPrepThreads = 256;

// 64 token rows x 128 of one head -> bf16 shared rows (pitch kLdB); rows >= len become zeros.
// bf16 input streams by cp.async (the caller commits); fp32 input is converted on the way.
__device__ __forceinline__ void stage_bf16(bf16* dst, FIn src, int64_t row0, int64_t tok_stride, int len) {
  const int tid = threadIdx.x;
  if (src.bf16) {
    const auto* p = static_cast<const bf16*>(src.p);
    for (int idx = tid; idx < kC * (kD / 8); idx += kPrepThreads) {
      const int r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
      cp_async16(dst + r * kLdB + c8, p + row0 + (r < len ? r : 0) * tok_stride + c8, r < len);
    }
  } else {
    const auto* p = static_cast<const float*>(src.p);
    for (int idx = tid; idx < kC * (kD / 2); idx += kPrepThreads) {
      const int r = idx / (kD / 2), c2 = (idx % (kD / 2)) * 2;
      float2 f = make_float2(0.f, 0.f);
      if (r < len) f = *reinterpret_cast<const float2*>(p + row0 + r * tok_stride + c2);
      *reinterpret_cast<uint32_t*>(dst + r * kLdB + c2) = pack_bf16(f.x, f.y);
    }
  }
}

// e^x for the prep's exponents. The bounded gate keeps Γ in base-2 units (Γ·log2 e, scaled once in
// the cumsum), so each exponential is a single ex2 instead of a multiply and an ex2: 8 % less prep
// time on the H200 (docs/PERF.md). The unbounded variant's run sums stay natural (__expf).
template <bool kUnbounded>
__device__ __forceinline__ float exp_gate(float x) {
  if constexpr (kUnbounded) {
    return __expf(x);
  } else {
    return fast_exp2(x);
  }
}

constexpr int kLdX = 52;  // fp32 pitch of the [16][48] block-row scratch of the solve

// ---------------------------------------------------------------------------------------------
// Γ = cumsum(g) (fp32, base-2 units: Γ·log2 e), then, overlapped where the data allows:
//  * M_kk, M_qk: the scaled operands are built straight into mma fragments (registers) by the
//    warp that multiplies them: 10 tiles (R ≥ ct) of 16x16, each tile one warp, M_kk and M_qk of
//    a tile sharing the B fragment and the A-side exponentials (an earlier version staged 16-row
//    stripes in shared memory: 4 x 2 barriers, most warps idle during a stripe's products; the
//    whole prefill went from 2.06 to 1.58 ms at T = 8192, H = 96 on the H200 with this kernel);
//  * V streams in with q, k, g at the start (its own buffer), as a second cp.async group that is
//    only waited for before W/U;
//  * the 16x16 diagonal blocks of T are solved in registers by warps 0-1 (one lane per column)
//    while warps 2-7 do the Q⊙e^Γ / K⊙e^{Γ_C−Γ} / K⊙e^Γ pass, then the block rows below them;
//  * W and U are split so that every warp does 5 k-tile steps (row tiles mt and 3 − mt).
// 102 KB of shared memory: still two blocks per SM.
// ---------------------------------------------------------------------------------------------
constexpr int kPrepOffG = 0;                                  // fp32 Γ [64][136]; later bf16 Tβ and fp32 X
constexpr int kPrepOffK = kPrepOffG + kC * kLdG * 4;            // bf16 K [64][136]; later K⊙e^Γ
constexpr int kPrepOffQ = kPrepOffK + kC * kLdB * 2;            // bf16 Q [64][136]; later fp32 T [64][68]
constexpr int kPrepOffV = kPrepOffQ + kC * kLdB * 2;            // bf16 V [64][136]
constexpr int kPrepOffMk = kPrepOffV + kC * kLdB * 2;           // fp32 β-scaled strict-lower M_kk [64][68]
constexpr int kPrepOffBeta = kPrepOffMk + kC * kLdT * 4;        // fp32 β [64]
constexpr int kPrepSmem = kPrepOffBeta + kC * 4;
constexpr int kPrepOffX = kC * kLdM * 2;                      // X scratch of the solve, after Tβ (both over Γ)
static_assert(kC * kLdT * 4 <= kC * kLdB * 2, "T must fit over Q");
static_assert(kC * kLdB * 2 <= kC * kLdT * 4, "the W / U staging tiles [64][136] must fit over T / M_kk");
static_assert(kPrepOffX % 16 == 0 && kPrepOffX + 16 * kLdX * 4 <= kC * kLdG * 4, "Tβ and X must fit over Γ");
static_assert(kPrepOffK % 16 == 0 && kPrepOffQ % 16 == 0 && kPrepOffV % 16 == 0 && kPrepOffMk % 16 == 0);
static_assert(2 * (kPrepSmem + 1024) <= 228 * 1024, "two blocks per SM");
// Unbounded gate (kda_chunk_runs.cuh): G keeps the raw gates; the run sums Pe, Se [64][136] and the
// per-column runs [15][128] follow, fp32. 178 KB: one block per SM.
constexpr int kPrepOffPe = kPrepSmem;
constexpr int kPrepOffSe = kPrepOffPe + kC * kLdG * 4;
constexpr int kPrepOffRuns = kPrepOffSe + kC * kLdG * 4;
constexpr int kPrepSmemUnbounded = kPrepOffRuns + kRuns * kD * 4;
static_assert(kPrepOffPe % 16 == 0 && kPrepOffRuns % 16 == 0);
static_assert(kPrepSmemUnbounded + 1024 <= 228 * 1024, "one block per SM");

// Tiles (R, ct0 .. ct0+NT−1), all ≤ R, of M_kk (strict lower, times β_r, fp32 smem) and M_qk
// (lower incl. the diagonal, bf16 workspace) by the calling warp. Rows r = n + (0..15), n = 16R:
// A operands K_r, Q_r times e^{Γ_r−Γ_n} (≤ 1, r ≥ n), built once per k step and shared by the NT
// tiles; columns s = 16ct + (0..15): B operand K_s times e^{Γ_n−Γ_s}, ≤ 1 for s ≤ n and ≤ e^{75}
// for n < s ≤ n+15 (diagonal tile only): at most 15 gates of g ≥ −5 between them. So every
// operand, and every product (≤ 128·|k|·|q|·e^{75}), stays inside the fp32 = bf16 exponent range;
// kUnbounded (tiles left of the diagonal only, ct0 + NT − 1 < R): the same two factors from the run
// sums of kda_chunk_runs.cuh instead of differences of Γ = G, e^{Pe[r]} and e^{Se[s] + bridge},
// both ≤ 1 for any g ≤ 0.
// Fragment element (mma.cuh): A reg 2·kh + hf = (row g + 8hf, cols 16kk + 8kh + 2t, +1);
// B reg 2·hf + kh = (n-row g + 8hf, k-cols 16kk + 8kh + 2t, +1): regs 0,1 the first n8 tile.
template <int NT, bool kUnbounded>
__device__ __forceinline__ void prep_m_tiles(int R, int ct0, const float* G, const bf16* Ks, const bf16* Qs,
                                             float* Mk, const float* beta, bf16* mq_out, const float* Pe,
                                             const float* Se, const float* runs) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n = 16 * R;
  float acc[NT][2][2][4] = {};  // [tile][M_kk, M_qk][n8 tile]
#pragma unroll 4  // full unrolling costs 128 registers and a spill (NT = 1)
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t ak[4], aq[4], b[NT][4];
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
      const int c = 16 * kk + 8 * kh + 2 * t;
      const float2 gn = kUnbounded ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2*>(G + n * kLdG + c);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = n + g + 8 * hf;
        float f0, f1;  // e^{Γ_r − Γ_n}
        if constexpr (kUnbounded) {
          const float2 pe = *reinterpret_cast<const float2*>(Pe + r * kLdG + c);
          f0 = __expf(pe.x), f1 = __expf(pe.y);
        } else {
          const float2 gr = *reinterpret_cast<const float2*>(G + r * kLdG + c);
          f0 = exp_gate<false>(gr.x - gn.x), f1 = exp_gate<false>(gr.y - gn.y);
        }
        const float2 k2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + r * kLdB + c));
        const float2 q2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Qs + r * kLdB + c));
        ak[2 * kh + hf] = pack_bf16(k2.x * f0, k2.y * f1);
        aq[2 * kh + hf] = pack_bf16(q2.x * f0, q2.y * f1);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const int s = 16 * (ct0 + i) + g + 8 * hf;
          float e0, e1;  // e^{Γ_n − Γ_s}
          if constexpr (kUnbounded) {
            const float2 se = *reinterpret_cast<const float2*>(Se + s * kLdG + c);
            const float2 br = *reinterpret_cast<const float2*>(runs + run_bridge(ct0 + i, R) * kD + c);
            e0 = __expf(se.x + br.x), e1 = __expf(se.y + br.y);
          } else {
            const float2 gs = *reinterpret_cast<const float2*>(G + s * kLdG + c);
            e0 = exp_gate<false>(gn.x - gs.x), e1 = exp_gate<false>(gn.y - gs.y);
          }
          const float2 ks = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + s * kLdB + c));
          b[i][2 * hf + kh] = pack_bf16(ks.x * e0, ks.y * e1);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      mma_bf16(acc[i][0][0], ak, b[i]);
      mma_bf16(acc[i][0][1], ak, b[i] + 2);
      mma_bf16(acc[i][1][0], aq, b[i]);
      mma_bf16(acc[i][1][1], aq, b[i] + 2);
    }
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = n + g + 8 * hf, s = 16 * (ct0 + i) + 8 * j + 2 * t;
        const float x0 = acc[i][0][j][2 * hf], x1 = acc[i][0][j][2 * hf + 1];
        Mk[r * kLdT + s] = s < r ? beta[r] * x0 : 0.f;
        Mk[r * kLdT + s + 1] = s + 1 < r ? beta[r] * x1 : 0.f;
        const float y0 = acc[i][1][j][2 * hf], y1 = acc[i][1][j][2 * hf + 1];
        *reinterpret_cast<uint32_t*>(mq_out + r * kC + s) = pack_bf16(s <= r ? y0 : 0.f, s + 1 <= r ? y1 : 0.f);
      }
}

// Column lc = tid % 16 of the inverse of the unit lower diagonal block d0 = tid & ~15 of I + M, for
// tid < 64, by forward substitution in registers: t_r = δ_{r,lc} − Σ_{s<r} M_rs t_s, where the
// terms s < lc are exact zeros (t_s = 0 there, M finite). M is read as a broadcast (the two
// diagonal blocks a warp touches sit 16 banks apart).
__device__ __forceinline__ void solve_diag_column(const float* Mk, float t[16]) {
  const int d0 = threadIdx.x & ~15, lc = threadIdx.x & 15;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const float* mrow = Mk + (d0 + r) * kLdT + d0;
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < r; ++s) acc += mrow[s] * t[s];
    t[r] = r < lc ? 0.f : (r == lc ? 1.f : -acc);
  }
}

// Block rows i = 1..3 of T as in solve_block_rows (same sums, k and m ascending), with thread
// (a = tid % 16, b = 4·(tid / 16)) for the 64i outputs of float4 width: a warp covers one row
// per lane pair and two adjacent b groups of one 16-column block, so its k range (from the
// block of b) is uniform, T and X reads are broadcasts of two addresses, and M / T_ii rows are
// read as float4 (16 rows of pitch 68: two wavefronts).
__device__ __forceinline__ void solve_block_rows(const float* Mk, float* Tm, float* Xs) {
  const int tid = threadIdx.x, a = tid & 15, b = (tid >> 4) * 4;
  for (int i = 1; i < kC / 16; ++i) {
    if (tid < 64 * i) {
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      const float* mrow = Mk + (16 * i + a) * kLdT;
      for (int k0 = b & ~15; k0 < 16 * i; k0 += 4) {  // T[k][b..b+3] = 0 for k < the block of b
        const float4 m4 = *reinterpret_cast<const float4*>(mrow + k0);
        const float mv[4] = {m4.x, m4.y, m4.z, m4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 tv = *reinterpret_cast<const float4*>(Tm + (k0 + u) * kLdT + b);
          x.x += mv[u] * tv.x;
          x.y += mv[u] * tv.y;
          x.z += mv[u] * tv.z;
          x.w += mv[u] * tv.w;
        }
      }
      *reinterpret_cast<float4*>(Xs + a * kLdX + b) = x;
    }
    __syncthreads();
    if (tid < 64 * i) {
      float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
      const float* trow = Tm + (16 * i + a) * kLdT + 16 * i;
#pragma unroll
      for (int m0 = 0; m0 < 16; m0 += 4) {
        const float4 t4 = *reinterpret_cast<const float4*>(trow + m0);
        const float tv[4] = {t4.x, t4.y, t4.z, t4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 xv = *reinterpret_cast<const float4*>(Xs + (m0 + u) * kLdX + b);
          y.x -= tv[u] * xv.x;
          y.y -= tv[u] * xv.y;
          y.z -= tv[u] * xv.z;
          y.w -= tv[u] * xv.w;
        }
      }
      // Columns b < 16i only: nobody reads them in this step (the T_ii reads are columns ≥ 16i).
      *reinterpret_cast<float4*>(Tm + (16 * i + a) * kLdT + b) = y;
    }
    __syncthreads();
  }
}

// kUnbounded: the gate may fall below K3's −5 (kda_chunk_runs.cuh); otherwise the bounded scheme.
template <bool kUnbounded>
__global__ void __launch_bounds__(kPrepThreads, kUnbounded ? 1 : 2)
    kda_chunk_prep_kernel(KdaArgs a, const int32_t* chunk_table, void* work) {
  extern __shared__ __align__(128) unsigned char smraw[];
  float* G = reinterpret_cast<float*>(smraw + kPrepOffG);
  bf16* Tb = reinterpret_cast<bf16*>(smraw + kPrepOffG);
  float* Xs = reinterpret_cast<float*>(smraw + kPrepOffG + kPrepOffX);
  bf16* Ks = reinterpret_cast<bf16*>(smraw + kPrepOffK);
  bf16* Qs = reinterpret_cast<bf16*>(smraw + kPrepOffQ);
  float* Tm = reinterpret_cast<float*>(smraw + kPrepOffQ);
  bf16* Vs = reinterpret_cast<bf16*>(smraw + kPrepOffV);
  float* Mk = reinterpret_cast<float*>(smraw + kPrepOffMk);
  float* beta = reinterpret_cast<float*>(smraw + kPrepOffBeta);
  float* Pe = kUnbounded ? reinterpret_cast<float*>(smraw + kPrepOffPe) : nullptr;
  float* Se = kUnbounded ? reinterpret_cast<float*>(smraw + kPrepOffSe) : nullptr;
  float* runs = kUnbounded ? reinterpret_cast<float*>(smraw + kPrepOffRuns) : nullptr;
  // Heads fastest: the blocks running at once read whole token rows of q, k, v, g (all heads) and
  // write neighbouring workspace tiles (4 % less prep time than chunks fastest on the H200).
  // One-dimensional grid: a chunk count past 65535 (a y dimension's limit) still launches.
  const int H = a.H, h = int(blockIdx.x % unsigned(H)), c = int(blockIdx.x / unsigned(H));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t0 = chunk_table[4 * c], len = chunk_table[4 * c + 1];
  bf16* wk = work_tiles(work, c, H, h);
  float* gc_out = work_gc(work, c, H, h);

  // Group 1: g, k, q (needed first); group 2: v (needed only by U, at the end).
  const int64_t row0 = (int64_t(t0) * H + h) * kD, tok_stride = int64_t(H) * kD;
  for (int idx = tid; idx < kC * (kD / 4); idx += kPrepThreads) {
    const int r = idx / (kD / 4), c4 = (idx % (kD / 4)) * 4;
    cp_async16(G + r * kLdG + c4, a.g + row0 + (r < len ? r : 0) * tok_stride + c4, r < len);
  }
  stage_bf16(Ks, a.k, row0, tok_stride, len);
  stage_bf16(Qs, a.q, row0, tok_stride, len);
  cp_async_commit();
  stage_bf16(Vs, a.v, row0, tok_stride, len);
  cp_async_commit();
  if (tid < kC) beta[tid] = tid < len ? a.beta[(int64_t(t0) + tid) * H + h] : 0.f;
  // The strictly upper 16x16 tiles of M_qk are never computed; zero them so the workspace is defined.
  for (int idx = tid; idx < kC * kC / 2; idx += kPrepThreads) {
    const int r = idx / (kC / 2), s = (idx % (kC / 2)) * 2;
    if (s / 16 > r / 16) *reinterpret_cast<uint32_t*>(wk + kOffMq + r * kC + s) = 0u;
  }
  cp_async_wait<1>();
  __syncthreads();
  if constexpr (kUnbounded) {  // G keeps the raw gates; the run sums beside it
    gate_run_sums(G, Pe, Se, runs);
    __syncthreads();
  } else {  // Γ = cumsum(g)·log2 e down each column: two halves of 32 rows, the upper half adds the lower total.
    const int col = tid & (kD - 1), r0 = (tid >> 7) * 32;
    float run[32];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      acc += G[(r0 + r) * kLdG + col];
      run[r] = acc * kLog2e;
    }
    if (r0 == 0) {
#pragma unroll
      for (int r = 0; r < 32; ++r) G[r * kLdG + col] = run[r];
    }
    __syncthreads();
    if (r0 != 0) {
      const float off = G[31 * kLdG + col];
#pragma unroll
      for (int r = 0; r < 32; ++r) G[(r0 + r) * kLdG + col] = run[r] + off;
    }
    __syncthreads();
  }
  if constexpr (kUnbounded) {
    // The 6 tiles left of the diagonal, one per warp 0..5: (3,0), (3,1), (3,2), (2,0), (2,1), (1,0);
    // then the 4 diagonal tiles pair by pair, by all warps (6 and 7 start on them at once).
    if (warp < 6) {
      const int R = warp < 3 ? 3 : warp < 5 ? 2 : 1, ct = warp < 3 ? warp : warp < 5 ? warp - 3 : 0;
      prep_m_tiles<1, true>(R, ct, G, Ks, Qs, Mk, beta, wk + kOffMq, Pe, Se, runs);
    }
    diag_tiles_by_pairs(G, Ks, Qs, Mk, beta, wk + kOffMq);
  } else {
    // The 10 tiles (R, ct ≤ R): warps 0 and 1 take (3, 0..1) and (3, 2..3), sharing their A side
    // (24 instead of 32 exponentials per lane and k step); warps 2..7 one each of (0,0), (1,0),
    // (1,1), (2,0), (2,1), (2,2).
    if (warp < 2) {
      prep_m_tiles<2, false>(3, 2 * warp, G, Ks, Qs, Mk, beta, wk + kOffMq, nullptr, nullptr, nullptr);
    } else {
      const int tile = warp - 2, R = tile < 1 ? 0 : tile < 3 ? 1 : 2, ct = tile - R * (R + 1) / 2;
      prep_m_tiles<1, false>(R, ct, G, Ks, Qs, Mk, beta, wk + kOffMq, nullptr, nullptr, nullptr);
    }
  }
  __syncthreads();  // M_kk complete; K, Q are no longer read raw

  float tcol[16];
  if (warp < 2) {
    solve_diag_column(Mk, tcol);
  } else {
    // Q⊙e^Γ and K⊙e^{Γ_C−Γ} to the workspace (Γ_C = Γ_63: rows past len have g = 0, so
    // Γ_63 = Γ_{len-1}); K becomes K⊙e^Γ in place (each element read and written by one thread),
    // reusing e^Γ. Exponents xe = Γ_r, xd = Γ_C − Γ_r: from Γ = G, or (unbounded) from the runs.
    for (int idx = tid - 64; idx < kC * (kD / 8); idx += kPrepThreads - 64) {
      const int r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
      const uint4 q8 = *reinterpret_cast<const uint4*>(Qs + r * kLdB + c8);
      uint4* kp = reinterpret_cast<uint4*>(Ks + r * kLdB + c8);
      const uint4 k8 = *kp;
      float xe[8], xd[8];
      if constexpr (kUnbounded) {
        const float* head = runs + (kRunHead + r / 16) * kD + c8;
        const float* tail = runs + (kRunTail + r / 16) * kD + c8;
#pragma unroll
        for (int e = 0; e < 8; e += 4) {  // 16-byte aligned: pitches and c8 are multiples of 4 floats
          const float4 hd = *reinterpret_cast<const float4*>(head + e), pe = *reinterpret_cast<const float4*>(Pe + r * kLdG + c8 + e);
          const float4 tl = *reinterpret_cast<const float4*>(tail + e), se = *reinterpret_cast<const float4*>(Se + r * kLdG + c8 + e);
          xe[e] = hd.x + pe.x, xe[e + 1] = hd.y + pe.y, xe[e + 2] = hd.z + pe.z, xe[e + 3] = hd.w + pe.w;
          xd[e] = se.x + tl.x, xd[e + 1] = se.y + tl.y, xd[e + 2] = se.z + tl.z, xd[e + 3] = se.w + tl.w;
        }
      } else {
        float gl[8];
        *reinterpret_cast<float4*>(xe) = *reinterpret_cast<const float4*>(G + r * kLdG + c8);
        *reinterpret_cast<float4*>(xe + 4) = *reinterpret_cast<const float4*>(G + r * kLdG + c8 + 4);
        *reinterpret_cast<float4*>(gl) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdG + c8);
        *reinterpret_cast<float4*>(gl + 4) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdG + c8 + 4);
#pragma unroll
        for (int e = 0; e < 8; ++e) xd[e] = gl[e] - xe[e];
      }
      const uint32_t* qw = &q8.x;
      const uint32_t* kw = &k8.x;
      uint4 qo, ko, kg;
      uint32_t* qow = &qo.x;
      uint32_t* kow = &ko.x;
      uint32_t* kgw = &kg.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float e0 = exp_gate<kUnbounded>(xe[2 * e]), e1 = exp_gate<kUnbounded>(xe[2 * e + 1]);
        const float d0 = exp_gate<kUnbounded>(xd[2 * e]), d1 = exp_gate<kUnbounded>(xd[2 * e + 1]);
        const float2 q2 = bf2_to_f2(qw[e]), k2 = bf2_to_f2(kw[e]);
        qow[e] = pack_bf16(q2.x * e0, q2.y * e1);
        kow[e] = pack_bf16(k2.x * d0, k2.y * d1);
        kgw[e] = pack_bf16(k2.x * e0, k2.y * e1);
      }
      *reinterpret_cast<uint4*>(wk + kOffQg + r * kD + c8) = qo;
      *reinterpret_cast<uint4*>(wk + kOffKd + r * kD + c8) = ko;
      *kp = kg;
    }
    if (tid - 64 < kD)
      gc_out[tid - 64] = exp_gate<kUnbounded>(kUnbounded ? runs[kRunAll * kD + tid - 64] : G[(kC - 1) * kLdG + tid - 64]);
  }
  __syncthreads();  // Q and Γ are dead: T goes over Q, Tβ and X over Γ
  if (warp < 2) {
    const int d0 = tid & ~15, lc = tid & 15;
#pragma unroll
    for (int r = 0; r < 16; ++r) Tm[(d0 + r) * kLdT + d0 + lc] = tcol[r];
  }
  __syncthreads();
  solve_block_rows(Mk, Tm, Xs);
  // Tβ (bf16) over the dead Γ. T's blocks above the diagonal were never written (stale shared
  // memory): Tβ gets explicit zeros there, without reading them (W/U never read them either).
  for (int idx = tid; idx < kC * (kC / 2); idx += kPrepThreads) {
    const int r = idx / (kC / 2), s = (idx % (kC / 2)) * 2;
    *reinterpret_cast<uint32_t*>(Tb + r * kLdM + s) =
        s / 16 <= r / 16 ? pack_bf16(Tm[r * kLdT + s] * beta[s], Tm[r * kLdT + s + 1] * beta[s + 1]) : 0u;
  }
  cp_async_wait<0>();
  __syncthreads();
  // W = Tβ·(K⊙e^Γ), U = Tβ·V. Tβ is lower triangular, so row tile mt needs k tiles j ≤ mt; warp
  // (p = warp % 2, quarter = warp / 2) does row tiles p and 3 − p (5 k steps either way) of one
  // 64-column half of W (quarters 0, 1) or U (quarters 2, 3). The bf16 results are staged in
  // shared memory (W over the dead T, U over the dead M_kk) and leave in 16-byte row-contiguous
  // stores instead of 4-byte fragment-shaped ones (8 rows x 16 bytes per warp store).
  const int p = warp & 1, quarter = warp >> 1, g = lane >> 2, t = lane & 3;
  const bf16* Bsrc = quarter < 2 ? Ks : Vs;
  bf16* Wst = reinterpret_cast<bf16*>(smraw + kPrepOffQ);
  bf16* Ust = reinterpret_cast<bf16*>(smraw + kPrepOffMk);
  bf16* dst = quarter < 2 ? Wst : Ust;
  const int cb = 64 * (quarter & 1);
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int mt = half == 0 ? p : 3 - p;
    float acc[4][2][4] = {};
    for (int j = 0; j <= mt; ++j) {
      uint32_t af[4];
      load_a(af, Tb + 16 * mt * kLdM + 16 * j, kLdM);
#pragma unroll
      for (int gi = 0; gi < 4; ++gi) {
        uint32_t b[4];
        load_b_kn(b, Bsrc + 16 * j * kLdB + cb + 16 * gi, kLdB);
        mma_bf16(acc[gi][0], af, b);
        mma_bf16(acc[gi][1], af, b + 2);
      }
    }
#pragma unroll
    for (int gi = 0; gi < 4; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * mt + g + 8 * hf, col = cb + 16 * gi + 8 * jn + 2 * t;
          *reinterpret_cast<uint32_t*>(dst + r * kLdB + col) = pack_bf16(acc[gi][jn][2 * hf], acc[gi][jn][2 * hf + 1]);
        }
  }
  __syncthreads();
  for (int idx = tid; idx < 2 * kC * (kD / 8); idx += kPrepThreads) {
    const int which = idx / (kC * (kD / 8)), r = (idx / (kD / 8)) % kC, c8 = (idx % (kD / 8)) * 8;
    const bf16* src = which == 0 ? Wst : Ust;
    *reinterpret_cast<uint4*>(wk + (which == 0 ? kOffW : kOffU) + r * kD + c8) =
        *reinterpret_cast<const uint4*>(src + r * kLdB + c8);
  }
}

}  // namespace

void launch_kda_chunk_prep(const KdaArgs& a, const int32_t* chunk_table, int num_chunks, void* work, cudaStream_t s) {
  const int64_t blocks = int64_t(num_chunks) * a.H;
  if (blocks > 0x7fffffff)
    throw Error("kda_chunk: " + std::to_string(num_chunks) + " chunks x " + std::to_string(a.H) +
                " heads exceed one launch's grid; split the call");
  const dim3 grid{static_cast<unsigned>(blocks)};
  if (a.unbounded_gate) {
    K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_prep_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kPrepSmemUnbounded));
    kda_chunk_prep_kernel<true><<<grid, kPrepThreads, kPrepSmemUnbounded, s>>>(a, chunk_table, work);
    K3_CUDA_LAUNCHED("kda_chunk_prep_kernel (unbounded gate)");
    return;
  }
  K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_prep_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPrepSmem));
  kda_chunk_prep_kernel<false><<<grid, kPrepThreads, kPrepSmem, s>>>(a, chunk_table, work);
  K3_CUDA_LAUNCHED("kda_chunk_prep_kernel");
}

}  // namespace k3::cuda
