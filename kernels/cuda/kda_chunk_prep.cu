// KDA chunked prefill, launch 1 of 2 (see kda_chunk.cu for the whole algorithm): one block per
// (chunk, head), all chunks in parallel, bf16 tensor-core operands (mma.sync, fp32 accumulate).
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fast_exp2.cuh"
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_prep_tiles.cuh"
#include "kernels/cuda/kda_chunk_runs.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

using namespace kda_chunk;

constexpr int kPrepThreads = 256;

// 64 token rows x 128 of one head -> bf16 shared rows (pitch kLdB); rows >= len become zeros.
// bf16 input streams by cp.async (the caller commits); fp32 input is converted on the way.
// Thread tid copies columns 8·(tid % 16) ..+7 of rows tid / 16 + 16i: its addresses are one base
// plus fixed steps (the loop with a division per element cost 8 % of the prep's instructions).
__device__ __forceinline__ void stage_bf16(bf16* dst, FIn src, int64_t row0, int64_t tok_stride, int len) {
  const int tid = threadIdx.x;
  if (src.bf16) {
    static_assert(kPrepThreads == 16 * 16, "16 threads a row, 16 rows a step");
    const int c8 = (tid & 15) * 8, r0 = tid >> 4;
    const bf16* p = static_cast<const bf16*>(src.p) + row0 + c8;
#pragma unroll
    for (int i = 0; i < kC / 16; ++i) {
      const int r = r0 + 16 * i;
      cp_async16(dst + r * kLdB + c8, p + (r < len ? r : 0) * tok_stride, r < len);
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

constexpr int kLdX = 52;  // fp32 pitch of the [16][48] block-row scratch of the solve

// ---------------------------------------------------------------------------------------------
// Γ = cumsum(g) (fp32, base-2 units: Γ·log2 e), then (bounded gate):
//  * one elementwise pass builds every scaled operand once, each element by one thread: Q⊙e^Γ and
//    K⊙e^{Γ_C−Γ} (to the workspace), K⊙e^Γ (for W), and the operands of the M tiles, all ≤ 1:
//      A_K[r] = K_r ⊙ 2^{Γ_r − Γ_{16R}}, A_Q[r] = Q_r ⊙ 2^{Γ_r − Γ_{16R}}   (R = ⌊r/16⌋),
//      Bh[s]  = K_s ⊙ 2^{Γ_{16c+15} − Γ_s}                                (c = ⌊s/16⌋);
//  * the 10 tiles (R ≥ c) of 16x16 of M_kk, then of M_qk, multiply A's rows 16R.. by Bh's rows
//    16c.., scaled along k by d_{R,c} = 2^{Γ_{16R} − Γ_{16c+15}} (one bf16x2 multiply per B
//    register): the three exponents add up to Γ_r − Γ_s. d is ≤ 1 left of the diagonal and
//    ≤ e^{75} on it (15 gates ≥ −5), inside the bf16 exponent range like every product
//    (≤ 128·|k|·|q|·e^{75}). An earlier form built the scaled operands tile by tile in registers:
//    with their conversions, 30 % of the prep's instructions;
//  * V streams in with q, k, g at the start (its own buffer), as a second cp.async group that is
//    only waited for before W/U;
//  * the 16x16 diagonal blocks of T are solved in registers by warps 0-1 (one lane per column)
//    while warps 2-7 compute the M_qk tiles, then the block rows below them;
//  * W and U are split so that every warp does 5 k-tile steps (row tiles mt and 3 − mt).
// 105 KB of shared memory: still two blocks per SM.
// ---------------------------------------------------------------------------------------------
constexpr int kPrepOffG = 0;                                  // fp32 Γ [64][136]; then bf16 Bh and K⊙e^Γ; then Tβ and fp32 X over Bh
constexpr int kPrepOffK = kPrepOffG + kC * kLdG * 4;            // bf16 K [64][136]; then A_K (unbounded: K⊙e^Γ)
constexpr int kPrepOffQ = kPrepOffK + kC * kLdB * 2;            // bf16 Q [64][136]; then A_Q; then fp32 T [64][68]
constexpr int kPrepOffV = kPrepOffQ + kC * kLdB * 2;            // bf16 V [64][136]
constexpr int kPrepOffMk = kPrepOffV + kC * kLdB * 2;           // fp32 β-scaled strict-lower M_kk [64][68]
constexpr int kPrepOffBeta = kPrepOffMk + kC * kLdT * 4;        // fp32 β [64]
constexpr int kPrepOffD = kPrepOffBeta + kC * 4;                // bf16 d_{R,c} [10][128]
constexpr int kPrepSmem = kPrepOffD + kNumMTiles * kD * 2;
constexpr int kPrepOffKg = kPrepOffG + kC * kLdB * 2;           // bf16 K⊙e^Γ [64][136], second half of Γ
constexpr int kPrepOffX = kC * kLdM * 2;                      // X scratch of the solve, after Tβ (both over Bh)
static_assert(kC * kLdT * 4 <= kC * kLdB * 2, "T must fit over Q");
static_assert(kC * kLdB * 2 <= kC * kLdT * 4, "the W / U staging tiles [64][136] must fit over T / M_kk");
static_assert(2 * kC * kLdB * 2 <= kC * kLdG * 4, "Bh and K⊙e^Γ must fit over Γ");
static_assert(kPrepOffX % 16 == 0 && kPrepOffX + 16 * kLdX * 4 <= kPrepOffKg, "Tβ and X must fit over Bh");
static_assert(kPrepOffK % 16 == 0 && kPrepOffQ % 16 == 0 && kPrepOffV % 16 == 0 && kPrepOffMk % 16 == 0 &&
              kPrepOffD % 16 == 0 && kPrepOffKg % 16 == 0);
static_assert(2 * (kPrepSmem + 1024) <= 228 * 1024, "two blocks per SM");
// Unbounded gate (kda_chunk_runs.cuh): G keeps the raw gates; the run sums Pe, Se [64][136] and the
// per-column runs [15][128] follow, fp32. 178 KB: one block per SM.
constexpr int kPrepOffPe = kPrepSmem;
constexpr int kPrepOffSe = kPrepOffPe + kC * kLdG * 4;
constexpr int kPrepOffRuns = kPrepOffSe + kC * kLdG * 4;
constexpr int kPrepSmemUnbounded = kPrepOffRuns + kRuns * kD * 4;
static_assert(kPrepOffPe % 16 == 0 && kPrepOffRuns % 16 == 0);
static_assert(kPrepSmemUnbounded + 1024 <= 228 * 1024, "one block per SM");

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

// Block rows i = 1..3 of T (T_ii solved): T_{i,<i} = −T_ii X, X = M_{i,<i} T_{<i,<i}, on tf32
// tensor cores (10-bit mantissa: finer than the bf16 that Tβ is rounded to next). Warp w < 2i takes
// the 8 columns n0 = 8w of block row i: X's tile (k from n0's block on: T is zero above it), through
// the warp's own columns of the scratch Xs into B fragments, then −T_ii X into T. Step i reads only
// rows < 16i and T_ii, which step i does not write. (The fp32 form with one thread per 4 outputs was
// 11 % of the prep's instructions.)
__device__ __forceinline__ void solve_block_rows(const float* Mk, float* Tm, float* Xs) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  static_assert(kPrepThreads / 32 >= 2 * (kC / 16 - 1), "one warp per 8 columns of the last block row");
#pragma unroll 1
  for (int i = 1; i < kC / 16; ++i) {
    if (warp < 2 * i) {
      const int n0 = 8 * warp, r0 = 16 * i;
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k0 = n0 & ~15; k0 < r0; k0 += 8) {
        const float* m = Mk + (r0 + g) * kLdT + k0 + t;
        const uint32_t af[4] = {to_tf32(m[0]), to_tf32(m[8 * kLdT]), to_tf32(m[4]), to_tf32(m[8 * kLdT + 4])};
        const uint32_t bf[2] = {to_tf32(Tm[(k0 + t) * kLdT + n0 + g]), to_tf32(Tm[(k0 + t + 4) * kLdT + n0 + g])};
        mma_tf32(x, af, bf);
      }
      float* xw = Xs + n0;
      *reinterpret_cast<float2*>(xw + g * kLdX + 2 * t) = make_float2(x[0], x[1]);
      *reinterpret_cast<float2*>(xw + (g + 8) * kLdX + 2 * t) = make_float2(x[2], x[3]);
      __syncwarp();
      float y[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int m0 = 0; m0 < 16; m0 += 8) {
        const float* tr = Tm + (r0 + g) * kLdT + r0 + m0 + t;
        const uint32_t af[4] = {to_tf32(tr[0]), to_tf32(tr[8 * kLdT]), to_tf32(tr[4]), to_tf32(tr[8 * kLdT + 4])};
        const uint32_t bf[2] = {to_tf32(xw[(m0 + t) * kLdX + g]), to_tf32(xw[(m0 + t + 4) * kLdX + g])};
        mma_tf32(y, af, bf);
      }
      *reinterpret_cast<float2*>(Tm + (r0 + g) * kLdT + n0 + 2 * t) = make_float2(-y[0], -y[1]);
      *reinterpret_cast<float2*>(Tm + (r0 + g + 8) * kLdT + n0 + 2 * t) = make_float2(-y[2], -y[3]);
    }
    __syncthreads();
  }
}

// Bounded gate, the elementwise pass (Γ in base-2 units in G): thread (rows 16R + tid/16 for
// R = 0..3, columns c8 = 8·(tid % 16) ..+7) writes Q⊙e^Γ, K⊙e^{Γ_C−Γ} to the workspace and A_K, A_Q
// over K, Q (each element read and written by its own thread), and returns Bh and K⊙e^Γ of its
// rows in registers: they go over Γ, which other threads still read. Then d_{R,c} and e^{Γ_C}.
// Γ_C = Γ_63: rows past len have g = 0, so Γ_63 = Γ_{len-1}.
__device__ __forceinline__ void bounded_pass(const float* G, bf16* Ks, bf16* Qs, uint32_t* d, bf16* wk,
                                             float* gc_out, uint4 (&bh)[4], uint4 (&kg)[4]) {
  const int tid = threadIdx.x, c8 = (tid & 15) * 8, rr = tid >> 4;
  float gl[8];
  *reinterpret_cast<float4*>(gl) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdG + c8);
  *reinterpret_cast<float4*>(gl + 4) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdG + c8 + 4);
#pragma unroll
  for (int R = 0; R < kC / 16; ++R) {
    const int r = 16 * R + rr;
    float gr[8], ga[8], gb[8];
    *reinterpret_cast<float4*>(gr) = *reinterpret_cast<const float4*>(G + r * kLdG + c8);
    *reinterpret_cast<float4*>(gr + 4) = *reinterpret_cast<const float4*>(G + r * kLdG + c8 + 4);
    *reinterpret_cast<float4*>(ga) = *reinterpret_cast<const float4*>(G + 16 * R * kLdG + c8);
    *reinterpret_cast<float4*>(ga + 4) = *reinterpret_cast<const float4*>(G + 16 * R * kLdG + c8 + 4);
    *reinterpret_cast<float4*>(gb) = *reinterpret_cast<const float4*>(G + (16 * R + 15) * kLdG + c8);
    *reinterpret_cast<float4*>(gb + 4) = *reinterpret_cast<const float4*>(G + (16 * R + 15) * kLdG + c8 + 4);
    uint4* qp = reinterpret_cast<uint4*>(Qs + r * kLdB + c8);
    uint4* kp = reinterpret_cast<uint4*>(Ks + r * kLdB + c8);
    const uint4 q8 = *qp, k8 = *kp;
    const uint32_t* qw = &q8.x;
    const uint32_t* kw = &k8.x;
    uint4 qg, kd, ak, aq;
    uint32_t *qgw = &qg.x, *kdw = &kd.x, *akw = &ak.x, *aqw = &aq.x, *bhw = &bh[R].x, *kgw = &kg[R].x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i0 = 2 * e, i1 = 2 * e + 1;
      const float2 q2 = bf2_to_f2(qw[e]), k2 = bf2_to_f2(kw[e]);
      const float eg0 = fast_exp2(gr[i0]), eg1 = fast_exp2(gr[i1]);                    // e^Γ_r
      const float ed0 = fast_exp2(gl[i0] - gr[i0]), ed1 = fast_exp2(gl[i1] - gr[i1]);  // e^{Γ_C − Γ_r}
      const float ea0 = fast_exp2(gr[i0] - ga[i0]), ea1 = fast_exp2(gr[i1] - ga[i1]);  // e^{Γ_r − Γ_16R}
      const float eb0 = fast_exp2(gb[i0] - gr[i0]), eb1 = fast_exp2(gb[i1] - gr[i1]);  // e^{Γ_16R+15 − Γ_r}
      qgw[e] = pack_bf16(q2.x * eg0, q2.y * eg1);
      kgw[e] = pack_bf16(k2.x * eg0, k2.y * eg1);
      kdw[e] = pack_bf16(k2.x * ed0, k2.y * ed1);
      akw[e] = pack_bf16(k2.x * ea0, k2.y * ea1);
      aqw[e] = pack_bf16(q2.x * ea0, q2.y * ea1);
      bhw[e] = pack_bf16(k2.x * eb0, k2.y * eb1);
    }
    *reinterpret_cast<uint4*>(wk + kOffQg + r * kD + c8) = qg;
    *reinterpret_cast<uint4*>(wk + kOffKd + r * kD + c8) = kd;
    *kp = ak;
    *qp = aq;
  }
  // d_{R,c} = 2^{Γ_16R − Γ_16c+15} as bf16 pairs [10][64]; e^{Γ_C} (fp32) to the workspace.
  for (int idx = tid; idx < kNumMTiles * (kD / 2); idx += kPrepThreads) {
    const int tile = idx / (kD / 2), k = 2 * (idx % (kD / 2)), R = m_tile_row(tile), cc = tile - m_tile_index(R, 0);
    const float2 gn = *reinterpret_cast<const float2*>(G + 16 * R * kLdG + k);
    const float2 ge = *reinterpret_cast<const float2*>(G + (16 * cc + 15) * kLdG + k);
    d[idx] = pack_bf16(fast_exp2(gn.x - ge.x), fast_exp2(gn.y - ge.y));
  }
  if (tid < kD) gc_out[tid] = fast_exp2(G[(kC - 1) * kLdG + tid]);
}

// kUnbounded: the gate may fall below K3's −5 (kda_chunk_runs.cuh); otherwise the bounded scheme.
template <bool kUnbounded>
__global__ void __launch_bounds__(kPrepThreads, kUnbounded ? 1 : 2)
    kda_chunk_prep_kernel(KdaArgs a, const int32_t* chunk_table, void* work) {
  pdl_enter();
  extern __shared__ __align__(128) unsigned char smraw[];
  float* G = reinterpret_cast<float*>(smraw + kPrepOffG);
  bf16* Bh = reinterpret_cast<bf16*>(smraw + kPrepOffG);
  bf16* Kg = reinterpret_cast<bf16*>(smraw + kPrepOffKg);
  bf16* Tb = reinterpret_cast<bf16*>(smraw + kPrepOffG);
  float* Xs = reinterpret_cast<float*>(smraw + kPrepOffG + kPrepOffX);
  bf16* Ks = reinterpret_cast<bf16*>(smraw + kPrepOffK);
  bf16* Qs = reinterpret_cast<bf16*>(smraw + kPrepOffQ);
  float* Tm = reinterpret_cast<float*>(smraw + kPrepOffQ);
  bf16* Vs = reinterpret_cast<bf16*>(smraw + kPrepOffV);
  float* Mk = reinterpret_cast<float*>(smraw + kPrepOffMk);
  float* beta = reinterpret_cast<float*>(smraw + kPrepOffBeta);
  uint32_t* dvec = reinterpret_cast<uint32_t*>(smraw + kPrepOffD);
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
  {
    const int c4 = (tid & 31) * 4, r0 = tid >> 5;  // 32 threads a row, 8 rows a step
    const float* gp = a.g + row0 + c4;
#pragma unroll
    for (int i = 0; i < kC / 8; ++i) {
      const int r = r0 + 8 * i;
      cp_async16(G + r * kLdG + c4, gp + (r < len ? r : 0) * tok_stride, r < len);
    }
  }
  stage_bf16(Ks, a.k, row0, tok_stride, len);
  stage_bf16(Qs, a.q, row0, tok_stride, len);
  cp_async_commit();
  stage_bf16(Vs, a.v, row0, tok_stride, len);
  cp_async_commit();
  if (tid < kC) beta[tid] = tid < len ? a.beta[(int64_t(t0) + tid) * H + h] : 0.f;
  // The strictly upper 16x16 tiles of M_qk are never computed; zero them so the workspace is
  // defined: row r of block R from column 16(R+1) on, in 16-byte stores, four threads a row.
  {
    const int r = tid >> 2, from = 16 * (r / 16 + 1);
    for (int s = from + 8 * (tid & 3); s < kC; s += 32) *reinterpret_cast<uint4*>(wk + kOffMq + r * kC + s) = uint4{};
  }
  cp_async_wait<1>();
  __syncthreads();
  float tcol[16];
  if constexpr (kUnbounded) {  // G keeps the raw gates; the run sums beside it
    gate_run_sums(G, Pe, Se, runs);
    __syncthreads();
    // The 6 tiles left of the diagonal, one per warp 0..5: (3,0), (3,1), (3,2), (2,0), (2,1), (1,0);
    // then the 4 diagonal tiles pair by pair, by all warps (6 and 7 start on them at once).
    if (warp < 6) {
      const int R = warp < 3 ? 3 : warp < 5 ? 2 : 1, ct = warp < 3 ? warp : warp < 5 ? warp - 3 : 0;
      runs_m_tile(R, ct, Ks, Qs, Mk, beta, wk + kOffMq, Pe, Se, runs);
    }
    diag_tiles_by_pairs(G, Ks, Qs, Mk, beta, wk + kOffMq);
    __syncthreads();  // M_kk complete; K, Q are no longer read raw
    if (warp < 2) {
      solve_diag_column(Mk, tcol);
    } else {
      // Q⊙e^Γ and K⊙e^{Γ_C−Γ} to the workspace; K becomes K⊙e^Γ in place (each element read and
      // written by one thread), reusing e^Γ. Exponents xe = Γ_r, xd = Γ_C − Γ_r from the runs.
      for (int idx = tid - 64; idx < kC * (kD / 8); idx += kPrepThreads - 64) {
        const int r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
        const uint4 q8 = *reinterpret_cast<const uint4*>(Qs + r * kLdB + c8);
        uint4* kp = reinterpret_cast<uint4*>(Ks + r * kLdB + c8);
        const uint4 k8 = *kp;
        float xe[8], xd[8];
        const float* head = runs + (kRunHead + r / 16) * kD + c8;
        const float* tail = runs + (kRunTail + r / 16) * kD + c8;
#pragma unroll
        for (int e = 0; e < 8; e += 4) {  // 16-byte aligned: pitches and c8 are multiples of 4 floats
          const float4 hd = *reinterpret_cast<const float4*>(head + e), pe = *reinterpret_cast<const float4*>(Pe + r * kLdG + c8 + e);
          const float4 tl = *reinterpret_cast<const float4*>(tail + e), se = *reinterpret_cast<const float4*>(Se + r * kLdG + c8 + e);
          xe[e] = hd.x + pe.x, xe[e + 1] = hd.y + pe.y, xe[e + 2] = hd.z + pe.z, xe[e + 3] = hd.w + pe.w;
          xd[e] = se.x + tl.x, xd[e + 1] = se.y + tl.y, xd[e + 2] = se.z + tl.z, xd[e + 3] = se.w + tl.w;
        }
        const uint32_t* qw = &q8.x;
        const uint32_t* kw = &k8.x;
        uint4 qo, ko, kg;
        uint32_t* qow = &qo.x;
        uint32_t* kow = &ko.x;
        uint32_t* kgw = &kg.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float e0 = __expf(xe[2 * e]), e1 = __expf(xe[2 * e + 1]);
          const float d0 = __expf(xd[2 * e]), d1 = __expf(xd[2 * e + 1]);
          const float2 q2 = bf2_to_f2(qw[e]), k2 = bf2_to_f2(kw[e]);
          qow[e] = pack_bf16(q2.x * e0, q2.y * e1);
          kow[e] = pack_bf16(k2.x * d0, k2.y * d1);
          kgw[e] = pack_bf16(k2.x * e0, k2.y * e1);
        }
        *reinterpret_cast<uint4*>(wk + kOffQg + r * kD + c8) = qo;
        *reinterpret_cast<uint4*>(wk + kOffKd + r * kD + c8) = ko;
        *kp = kg;
      }
      if (tid - 64 < kD) gc_out[tid - 64] = __expf(runs[kRunAll * kD + tid - 64]);
    }
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
    uint4 bh[4], kg[4];
    bounded_pass(G, Ks, Qs, dvec, wk, gc_out, bh, kg);
    __syncthreads();  // Γ is dead: Bh and K⊙e^Γ go over it
    {
      const int c8 = (tid & 15) * 8, rr = tid >> 4;
#pragma unroll
      for (int R = 0; R < kC / 16; ++R) {
        *reinterpret_cast<uint4*>(Bh + (16 * R + rr) * kLdB + c8) = bh[R];
        *reinterpret_cast<uint4*>(Kg + (16 * R + rr) * kLdB + c8) = kg[R];
      }
    }
    __syncthreads();
    // M_kk's 10 tiles: warps 0 and 1 take (3, 0..1) and (3, 2..3), sharing their A fragments;
    // warps 2..7 one each of (0,0), (1,0), (1,1), (2,0), (2,1), (2,2).
    if (warp < 2) {
      mkk_tiles<2>(3, 2 * warp, Ks, Bh, dvec, Mk, beta);
    } else {
      const int tile = warp - 2, R = m_tile_row(tile);
      mkk_tiles<1>(R, tile - m_tile_index(R, 0), Ks, Bh, dvec, Mk, beta);
    }
    __syncthreads();  // M_kk complete
    // Warps 0-1 solve T's diagonal blocks while warps 2-7 compute M_qk's tiles: (3, 0..1),
    // (3, 2..3), (2, 0..1), (1, 0..1), then (2, 2) and (0, 0).
    if (warp < 2) {
      solve_diag_column(Mk, tcol);
    } else if (warp < 6) {
      mqk_tiles<2>(warp < 4 ? 3 : warp == 4 ? 2 : 1, warp == 3 ? 2 : 0, Qs, Bh, dvec, wk + kOffMq);
    } else {
      mqk_tiles<1>(warp == 6 ? 2 : 0, warp == 6 ? 2 : 0, Qs, Bh, dvec, wk + kOffMq);
    }
  }
  __syncthreads();  // Q (A_Q) and Bh are dead: T goes over Q, Tβ and X over Bh
  if (warp < 2) {
    const int d0 = tid & ~15, lc = tid & 15;
#pragma unroll
    for (int r = 0; r < 16; ++r) Tm[(d0 + r) * kLdT + d0 + lc] = tcol[r];
  }
  __syncthreads();
  solve_block_rows(Mk, Tm, Xs);
  // Tβ (bf16). T's blocks above the diagonal were never written (stale shared memory): Tβ gets
  // explicit zeros there, without reading them (W/U never read them either).
  {
    const int s = 2 * (tid & 31), r0 = tid >> 5;  // columns s, s + 1 of rows r0 + 8i
    const float b0 = beta[s], b1 = beta[s + 1];
#pragma unroll
    for (int i = 0; i < kC / 8; ++i) {
      const int r = r0 + 8 * i;
      uint32_t x = 0u;
      if (s / 16 <= r / 16) {
        const float2 tv = *reinterpret_cast<const float2*>(Tm + r * kLdT + s);
        x = pack_bf16(tv.x * b0, tv.y * b1);
      }
      *reinterpret_cast<uint32_t*>(Tb + r * kLdM + s) = x;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // W = Tβ·(K⊙e^Γ), U = Tβ·V. Tβ is lower triangular, so row tile mt needs k tiles j ≤ mt; warp
  // (p = warp % 2, quarter = warp / 2) does row tiles p and 3 − p (5 k steps either way) of one
  // 64-column half of W (quarters 0, 1) or U (quarters 2, 3). The bf16 results are staged in
  // shared memory (W over the dead T, U over the dead M_kk) and leave in 16-byte row-contiguous
  // stores instead of 4-byte fragment-shaped ones (8 rows x 16 bytes per warp store).
  const int p = warp & 1, quarter = warp >> 1, g = lane >> 2, t = lane & 3;
  const bf16* Bsrc = quarter < 2 ? (kUnbounded ? Ks : Kg) : Vs;
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
  {
    const int c8 = (tid & 15) * 8, r0 = tid >> 4;  // 16 threads a row: one 256-byte row per store
#pragma unroll
    for (int i = 0; i < kC / 16; ++i) {
      const int r = r0 + 16 * i;
      *reinterpret_cast<uint4*>(wk + kOffW + r * kD + c8) = *reinterpret_cast<const uint4*>(Wst + r * kLdB + c8);
      *reinterpret_cast<uint4*>(wk + kOffU + r * kD + c8) = *reinterpret_cast<const uint4*>(Ust + r * kLdB + c8);
    }
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
    launch_pdl("kda_chunk_prep_kernel (unbounded gate)", kda_chunk_prep_kernel<true>, grid, kPrepThreads,
               kPrepSmemUnbounded, s, a, chunk_table, work);
    return;
  }
  K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_prep_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPrepSmem));
  launch_pdl("kda_chunk_prep_kernel", kda_chunk_prep_kernel<false>, grid, kPrepThreads, kPrepSmem, s, a, chunk_table,
             work);
}

}  // namespace k3::cuda
