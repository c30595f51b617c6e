// KDA chunked prefill (MODEL.md §2.4, chunk C = 64, K = V = 128), two launches, bf16 tensor-core
// operands (mma.sync m16n8k16, fp32 accumulate) throughout:
//
//  prep (one block per (chunk, head), all chunks in parallel): Γ = cumsum(g) inside the chunk (fp32);
//    M_kk, M_qk on 16-row tiles with the tile's first row n as the exponent reference,
//    exp(Γ_r − Γ_s) = exp(Γ_r − Γ_n)·exp(Γ_n − Γ_s): the left factor is ≤ 1 and the right one
//    ≤ e^{75} because the lower-bounded gate (g ≥ −5) limits a 16-token tile to 80 nats (s ≤ n+15:
//    at most 15 gates), so both factors and the products (≤ 128·|k|·|q|·e^{75}) stay inside the
//    fp32 = bf16 exponent range (e^{88}); every stripe is a dense bf16 product;
//    T = (I + M_kk)^{-1} by forward substitution (fp32), Tβ = T·Diag(β) (bf16);
//    W = Tβ (K⊙e^Γ), U = Tβ V (tensor cores); Q⊙e^Γ, K⊙e^{Γ_C−Γ}, M_qk (bf16), e^{Γ_C} (fp32)
//    -> workspace. e^Γ, e^{Γ_C−Γ} ≤ 1 (g ≤ 0); tiny ones underflow to 0, which is their limit.
//  scan (one block per (sequence, head, VT rows of V), chunks in order): the state tile
//    S [VT v][128 k] lives in fp32 mma accumulators for the whole sequence; a bf16 copy in shared
//    memory ([v][k] is the [n][k] B layout) feeds V' = U − W Sᵀ and O = (Q⊙e^Γ) Sᵀ + M_qk V';
//    then S = Diag_k(e^{Γ_C}) S + V'ᵀ (K⊙e^{Γ_C−Γ}) (V' rounded to bf16 once, as its products'
//    operand). The next chunk's workspace tiles stream in by cp.async while this one computes.
//    Rows past a sequence's end are zero in every workspace tile (their β, K, Q, V are
//    zero-filled), so they add nothing.
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;     // chunk
constexpr int kD = 128;    // K = V
constexpr int kLdB = 136;  // padded bf16 pitch of [*, 128] tiles: 272 B rows, ldmatrix conflict-free
constexpr int kLdM = 72;   // padded bf16 pitch of [*, 64] tiles
constexpr int kLdF = 132;  // padded fp32 pitch of [*, 128]
constexpr int kLdT = 68;   // padded fp32 pitch of [*, 64]

// Workspace per (chunk, head): bf16 W, U, Q⊙e^Γ, K⊙e^{Γ_C−Γ} [64][128], M_qk [64][64], then fp32 e^{Γ_C} [128].
constexpr int64_t kOffW = 0, kOffU = kOffW + kC * kD, kOffQg = kOffU + kC * kD, kOffKd = kOffQg + kC * kD,
                  kOffMq = kOffKd + kC * kD, kBf16Per = kOffMq + kC * kC;
constexpr int64_t kWorkBytes = kBf16Per * 2 + kD * 4;  // 74240, a multiple of 16
static_assert(kWorkBytes % 16 == 0);

__device__ __forceinline__ bf16* work_tiles(void* work, int64_t c, int H, int h) {
  return reinterpret_cast<bf16*>(static_cast<char*>(work) + (c * H + h) * kWorkBytes);
}
__device__ __forceinline__ float* work_gc(void* work, int64_t c, int H, int h) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(work_tiles(work, c, H, h)) + kBf16Per * 2);
}

__device__ __forceinline__ float2 bf2_to_f2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

// ---------------------------------------------------------------------------------------------
// prep
// ---------------------------------------------------------------------------------------------
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

// Shared memory of the prep kernel (bytes), 110 KB so that two blocks share an SM.
constexpr int kPrepOffG = 0;                                // fp32 Γ [64][132]; later bf16 Tβ [64][72]
constexpr int kPrepOffK = kPrepOffG + kC * kLdF * 4;        // bf16 K [64][136]; later K⊙e^Γ
constexpr int kPrepOffQ = kPrepOffK + kC * kLdB * 2;        // bf16 Q [64][136]; later V
constexpr int kPrepOffA = kPrepOffQ + kC * kLdB * 2;        // bf16 stripe A side [32][136]  } later fp32
constexpr int kPrepOffB = kPrepOffA + 32 * kLdB * 2;        // bf16 stripe B side [64][136]  } T [64][68]
constexpr int kPrepOffMk = kPrepOffB + kC * kLdB * 2;       // fp32 β-scaled strict-lower M_kk [64][68]
constexpr int kPrepOffBeta = kPrepOffMk + kC * kLdT * 4;    // fp32 β [64]
constexpr int kPrepSmem = kPrepOffBeta + kC * 4;
constexpr int kLdX = 52;  // fp32 pitch of the [16][48] block-row scratch of the solve
static_assert(kC * kLdT * 4 + 16 * kLdX * 4 <= 32 * kLdB * 2 + kC * kLdB * 2, "T and its scratch must fit over the stripe buffers");
static_assert(kC * kLdM * 2 <= kC * kLdF * 4, "Tβ must fit over Γ");

// One 16-row stripe (rows n..n+15) of M_kk (strict lower, times β_r, fp32 smem) and M_qk (lower
// incl. diagonal, bf16 workspace). A side: K_r, Q_r times e^{Γ_r−Γ_n} ≤ 1; B side: K_s times
// e^{Γ_n−Γ_s} (≤ 1 for s ≤ n, ≤ e^{75} for n < s ≤ n+15).
__device__ __forceinline__ void prep_stripe(int R, const float* G, const bf16* Ks, const bf16* Qs, bf16* Ab, bf16* Bb,
                                            float* Mk, const float* beta, bf16* mq_out) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n = 16 * R;
  for (int idx = tid; idx < 16 * (kD / 2); idx += kPrepThreads) {
    const int i = idx / (kD / 2), c = (idx % (kD / 2)) * 2, r = n + i;
    const float2 gr = *reinterpret_cast<const float2*>(G + r * kLdF + c);
    const float2 gn = *reinterpret_cast<const float2*>(G + n * kLdF + c);
    const float f0 = __expf(gr.x - gn.x), f1 = __expf(gr.y - gn.y);
    const float2 k2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + r * kLdB + c));
    const float2 q2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Qs + r * kLdB + c));
    *reinterpret_cast<uint32_t*>(Ab + i * kLdB + c) = pack_bf16(k2.x * f0, k2.y * f1);
    *reinterpret_cast<uint32_t*>(Ab + (16 + i) * kLdB + c) = pack_bf16(q2.x * f0, q2.y * f1);
  }
  for (int idx = tid; idx < (n + 16) * (kD / 2); idx += kPrepThreads) {
    const int s = idx / (kD / 2), c = (idx % (kD / 2)) * 2;
    const float2 gs = *reinterpret_cast<const float2*>(G + s * kLdF + c);
    const float2 gn = *reinterpret_cast<const float2*>(G + n * kLdF + c);
    const float f0 = __expf(gn.x - gs.x), f1 = __expf(gn.y - gs.y);
    const float2 k2 = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Ks + s * kLdB + c));
    *reinterpret_cast<uint32_t*>(Bb + s * kLdB + c) = pack_bf16(k2.x * f0, k2.y * f1);
  }
  __syncthreads();
  if (warp < 2 * (R + 1)) {
    const int which = warp / (R + 1), ct = warp % (R + 1);  // which: 0 = M_kk, 1 = M_qk; ct: 16-col tile
    float acc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[4], b[4];
      load_a(a, Ab + which * 16 * kLdB + 16 * kk, kLdB);
      load_b_nk(b, Bb + 16 * ct * kLdB + 16 * kk, kLdB);
      mma_bf16(acc[0], a, b);
      mma_bf16(acc[1], a, b + 2);
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = n + g + 8 * hf, s = 16 * ct + 8 * j + 2 * t;
        const float x0 = acc[j][2 * hf], x1 = acc[j][2 * hf + 1];
        if (which == 0) {
          Mk[r * kLdT + s] = s < r ? beta[r] * x0 : 0.f;
          Mk[r * kLdT + s + 1] = s + 1 < r ? beta[r] * x1 : 0.f;
        } else {
          *reinterpret_cast<uint32_t*>(mq_out + r * kC + s) = pack_bf16(s <= r ? x0 : 0.f, s + 1 <= r ? x1 : 0.f);
        }
      }
  }
  __syncthreads();
}

// T = (I + M)^{-1} for strictly lower M (fp32, pitch kLdT); T holds the identity on entry.
// By 16x16 blocks: each diagonal block by a 15-step forward substitution (four lanes of one warp own
// a column and split its dot products, so only warp-level synchronisation), then block rows
// i = 1..3 from T_ij = −T_ii Σ_{j≤k<i} M_ik T_kj: X = M[16i.., 0..16i) · T[0..16i, 0..16i) (T is zero
// above its diagonal, so the k range starts at 0 without changing the sum), then −T_ii X.
__device__ __forceinline__ void solve_unit_lower(const float* Mk, float* Tm, float* Xs) {
  const int tid = threadIdx.x;
  {
    const int cc = tid >> 2, q4 = tid & 3, d0 = cc & ~15, lc = cc & 15;
    for (int r = 1; r < 16; ++r) {
      float part = 0.f;
      if (lc < r) {
        for (int s = lc + q4; s < r; s += 4) part += Mk[(d0 + r) * kLdT + d0 + s] * Tm[(d0 + s) * kLdT + cc];
      }
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (lc < r && q4 == 0) Tm[(d0 + r) * kLdT + cc] = -part;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int i = 1; i < kC / 16; ++i) {
    const int w4 = 4 * i;  // float4 groups per row of the block row (16i columns)
    if (tid < 16 * w4) {
      const int a = tid / w4, b = (tid % w4) * 4;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      const float* mrow = Mk + (16 * i + a) * kLdT;
      for (int k = b & ~15; k < 16 * i; ++k) {  // T[k][b..b+3] = 0 for k < the block of b
        const float m = mrow[k];
        const float4 tv = *reinterpret_cast<const float4*>(Tm + k * kLdT + b);
        x.x += m * tv.x;
        x.y += m * tv.y;
        x.z += m * tv.z;
        x.w += m * tv.w;
      }
      *reinterpret_cast<float4*>(Xs + a * kLdX + b) = x;
    }
    __syncthreads();
    if (tid < 16 * w4) {
      const int a = tid / w4, b = (tid % w4) * 4;
      float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
      const float* trow = Tm + (16 * i + a) * kLdT + 16 * i;
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const float tv = trow[m];
        const float4 xv = *reinterpret_cast<const float4*>(Xs + m * kLdX + b);
        y.x -= tv * xv.x;
        y.y -= tv * xv.y;
        y.z -= tv * xv.z;
        y.w -= tv * xv.w;
      }
      *reinterpret_cast<float4*>(Tm + (16 * i + a) * kLdT + b) = y;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kPrepThreads, 2)
    kda_chunk_prep_kernel(KdaArgs a, const int32_t* chunk_table, void* work) {
  extern __shared__ __align__(128) unsigned char smraw[];
  float* G = reinterpret_cast<float*>(smraw + kPrepOffG);
  bf16* Tb = reinterpret_cast<bf16*>(smraw + kPrepOffG);
  bf16* Ks = reinterpret_cast<bf16*>(smraw + kPrepOffK);
  bf16* Qs = reinterpret_cast<bf16*>(smraw + kPrepOffQ);
  bf16* Vs = Qs;
  bf16* Ab = reinterpret_cast<bf16*>(smraw + kPrepOffA);
  bf16* Bb = reinterpret_cast<bf16*>(smraw + kPrepOffB);
  float* Tm = reinterpret_cast<float*>(smraw + kPrepOffA);
  float* Xs = Tm + kC * kLdT;
  float* Mk = reinterpret_cast<float*>(smraw + kPrepOffMk);
  float* beta = reinterpret_cast<float*>(smraw + kPrepOffBeta);
  const int c = blockIdx.x, h = blockIdx.y, H = a.H, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t0 = chunk_table[4 * c], len = chunk_table[4 * c + 1];
  bf16* wk = work_tiles(work, c, H, h);
  float* gc_out = work_gc(work, c, H, h);

  const int64_t row0 = (int64_t(t0) * H + h) * kD, tok_stride = int64_t(H) * kD;
  for (int idx = tid; idx < kC * (kD / 4); idx += kPrepThreads) {
    const int r = idx / (kD / 4), c4 = (idx % (kD / 4)) * 4;
    cp_async16(G + r * kLdF + c4, a.g + row0 + (r < len ? r : 0) * tok_stride + c4, r < len);
  }
  stage_bf16(Ks, a.k, row0, tok_stride, len);
  stage_bf16(Qs, a.q, row0, tok_stride, len);
  cp_async_commit();
  if (tid < kC) beta[tid] = tid < len ? a.beta[(int64_t(t0) + tid) * H + h] : 0.f;
  // The strictly upper 16x16 tiles of M_qk are never computed; zero them so the workspace is defined.
  for (int idx = tid; idx < kC * kC / 2; idx += kPrepThreads) {
    const int r = idx / (kC / 2), s = (idx % (kC / 2)) * 2;
    if (s / 16 > r / 16) *reinterpret_cast<uint32_t*>(wk + kOffMq + r * kC + s) = 0u;
  }
  cp_async_wait<0>();
  __syncthreads();
  {  // Γ = cumsum(g) down each column: two halves of 32 rows, the upper half adds the lower total.
    const int col = tid & (kD - 1), r0 = (tid >> 7) * 32;
    float run[32];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < 32; ++r) {
      acc += G[(r0 + r) * kLdF + col];
      run[r] = acc;
    }
    if (r0 == 0) {
#pragma unroll
      for (int r = 0; r < 32; ++r) G[r * kLdF + col] = run[r];
    }
    __syncthreads();
    if (r0 != 0) {
      const float off = G[31 * kLdF + col];
#pragma unroll
      for (int r = 0; r < 32; ++r) G[(r0 + r) * kLdF + col] = run[r] + off;
    }
    __syncthreads();
  }
  for (int R = 0; R < kC / 16; ++R) prep_stripe(R, G, Ks, Qs, Ab, Bb, Mk, beta, wk + kOffMq);

  // One pass over Q, K, Γ: Q⊙e^Γ and K⊙e^{Γ_C−Γ} to the workspace (Γ_C = Γ_63: rows past len have
  // g = 0, so Γ_63 = Γ_{len-1}); K becomes K⊙e^Γ in place (each element read and written by one
  // thread), reusing e^Γ. T starts as the identity over the dead stripe buffers.
  for (int idx = tid; idx < kC * (kD / 8); idx += kPrepThreads) {
    const int r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
    const uint4 q8 = *reinterpret_cast<const uint4*>(Qs + r * kLdB + c8);
    uint4* kp = reinterpret_cast<uint4*>(Ks + r * kLdB + c8);
    const uint4 k8 = *kp;
    float gr[8], gl[8];
    *reinterpret_cast<float4*>(gr) = *reinterpret_cast<const float4*>(G + r * kLdF + c8);
    *reinterpret_cast<float4*>(gr + 4) = *reinterpret_cast<const float4*>(G + r * kLdF + c8 + 4);
    *reinterpret_cast<float4*>(gl) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdF + c8);
    *reinterpret_cast<float4*>(gl + 4) = *reinterpret_cast<const float4*>(G + (kC - 1) * kLdF + c8 + 4);
    const uint32_t* qw = &q8.x;
    const uint32_t* kw = &k8.x;
    uint4 qo, ko, kg;
    uint32_t* qow = &qo.x;
    uint32_t* kow = &ko.x;
    uint32_t* kgw = &kg.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float e0 = __expf(gr[2 * e]), e1 = __expf(gr[2 * e + 1]);
      const float d0 = __expf(gl[2 * e] - gr[2 * e]), d1 = __expf(gl[2 * e + 1] - gr[2 * e + 1]);
      const float2 q2 = bf2_to_f2(qw[e]), k2 = bf2_to_f2(kw[e]);
      qow[e] = pack_bf16(q2.x * e0, q2.y * e1);
      kow[e] = pack_bf16(k2.x * d0, k2.y * d1);
      kgw[e] = pack_bf16(k2.x * e0, k2.y * e1);
    }
    *reinterpret_cast<uint4*>(wk + kOffQg + r * kD + c8) = qo;
    *reinterpret_cast<uint4*>(wk + kOffKd + r * kD + c8) = ko;
    *kp = kg;
  }
  if (tid < kD) gc_out[tid] = __expf(G[(kC - 1) * kLdF + tid]);
  for (int idx = tid; idx < kC * kC; idx += kPrepThreads) {
    const int r = idx / kC, s = idx % kC;
    Tm[r * kLdT + s] = (r == s) ? 1.f : 0.f;
  }
  __syncthreads();
  // Q is dead: V streams into its buffer while T is solved.
  stage_bf16(Vs, a.v, row0, tok_stride, len);
  cp_async_commit();
  solve_unit_lower(Mk, Tm, Xs);
  // Tβ (bf16) over the dead Γ.
  for (int idx = tid; idx < kC * (kC / 2); idx += kPrepThreads) {
    const int r = idx / (kC / 2), s = (idx % (kC / 2)) * 2;
    *reinterpret_cast<uint32_t*>(Tb + r * kLdM + s) =
        pack_bf16(Tm[r * kLdT + s] * beta[s], Tm[r * kLdT + s + 1] * beta[s + 1]);
  }
  cp_async_wait<0>();
  __syncthreads();
  // W = Tβ·(K⊙e^Γ), U = Tβ·V: warp (mt, half) owns token rows 16mt.. and 64 columns; Tβ is lower
  // triangular, so only k tiles j ≤ mt contribute.
  const int mt = warp & 3, cg0 = (warp >> 2) * 4, g = lane >> 2, t = lane & 3;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    const bf16* Bsrc = pass == 0 ? Ks : Vs;
    float acc[4][2][4] = {};
    for (int j = 0; j <= mt; ++j) {
      uint32_t af[4];
      load_a(af, Tb + 16 * mt * kLdM + 16 * j, kLdM);
#pragma unroll
      for (int gi = 0; gi < 4; ++gi) {
        uint32_t b[4];
        load_b_kn(b, Bsrc + 16 * j * kLdB + 16 * (cg0 + gi), kLdB);
        mma_bf16(acc[gi][0], af, b);
        mma_bf16(acc[gi][1], af, b + 2);
      }
    }
    bf16* dst = wk + (pass == 0 ? kOffW : kOffU);
#pragma unroll
    for (int gi = 0; gi < 4; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * mt + g + 8 * hf, col = 16 * (cg0 + gi) + 8 * jn + 2 * t;
          *reinterpret_cast<uint32_t*>(dst + r * kD + col) = pack_bf16(acc[gi][jn][2 * hf], acc[gi][jn][2 * hf + 1]);
        }
  }
}

// ---------------------------------------------------------------------------------------------
// scan
// ---------------------------------------------------------------------------------------------
// VT: state rows (of V) per block; kWarps: 4 or 8; kStages: 1: single buffers, the next chunk's
// tiles are fetched after their last use in this chunk (one more barrier, least shared memory);
// 2: K⊙e^{Γ_C−Γ}, M_qk and e^{Γ_C} double-buffered (fetched at the top of the previous chunk),
// W, U, Q⊙e^Γ fetched mid-chunk after their last use; 3: every tile double-buffered, all fetched
// at the top of the previous chunk (one block per SM; for grids that fill at most one wave).
template <int VT, int kWarps, int kStages>
struct ScanCfg {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLdV = VT + 8;  // bf16 pitch of [64][VT] tiles (16-byte rows, conflict-free)
  // (a)/(b): warp -> token tile mt = warp % 4 and kAG 16-column groups of the VT outputs.
  static constexpr int kAG = (VT / 16) * 4 / kWarps;
  // (c): warp -> state row tile warp % (VT/16) and kSG 16-column groups of the 128 k columns.
  static constexpr int kRowT = VT / 16;
  static constexpr int kSG = 8 * kRowT / kWarps;
  static_assert(kWarps == 4 || kWarps == 8);
  static_assert(kAG >= 1 && kSG >= 1 && 128 % VT == 0 && VT % 16 == 0);
  static constexpr int kBufA = kStages == 3 ? 2 : 1;  // buffers of W, Q⊙e^Γ, U
  static constexpr int kBufB = kStages >= 2 ? 2 : 1;  // buffers of K⊙e^{Γ_C−Γ}, M_qk, e^{Γ_C}
  static_assert(kStages >= 1 && kStages <= 3);
  static constexpr int kOffW = 0;                                 // [bufA][64][136]
  static constexpr int kOffQ = kOffW + kBufA * kC * kLdB * 2;     // [bufA][64][136]
  static constexpr int kOffU = kOffQ + kBufA * kC * kLdB * 2;     // [bufA][64][kLdV]
  static constexpr int kOffS = kOffU + kBufA * kC * kLdV * 2;
  static constexpr int kOffVp = kOffS + VT * kLdB * 2;
  static constexpr int kOffKd = kOffVp + kC * kLdV * 2;           // [bufB][64][136]
  static constexpr int kOffMq = kOffKd + kBufB * kC * kLdB * 2;    // [bufB][64][72]
  static constexpr int kOffGc = kOffMq + kBufB * kC * kLdM * 2;    // [bufB][128] fp32
  static constexpr int kSmem = kOffGc + kBufB * kD * 4;
};

template <int VT, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps)
    kda_chunk_scan_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work) {
  using Cfg = ScanCfg<VT, kWarps, kStages>;
  constexpr int kThreads = Cfg::kThreads, kLdV = Cfg::kLdV, kAG = Cfg::kAG, kSG = Cfg::kSG, kRowT = Cfg::kRowT;
  extern __shared__ __align__(128) unsigned char smraw[];
  bf16* WBuf = reinterpret_cast<bf16*>(smraw + Cfg::kOffW);
  bf16* QBuf = reinterpret_cast<bf16*>(smraw + Cfg::kOffQ);
  bf16* UBuf = reinterpret_cast<bf16*>(smraw + Cfg::kOffU);
  bf16* Sb = reinterpret_cast<bf16*>(smraw + Cfg::kOffS);
  bf16* Vp = reinterpret_cast<bf16*>(smraw + Cfg::kOffVp);
  bf16* KdBuf = reinterpret_cast<bf16*>(smraw + Cfg::kOffKd);
  bf16* MqBuf = reinterpret_cast<bf16*>(smraw + Cfg::kOffMq);
  float* GcBuf = reinterpret_cast<float*>(smraw + Cfg::kOffGc);
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int v0 = vt * VT;
  float* state = a.state + (int64_t(a.slots[n]) * H + h) * kD * kD + int64_t(v0) * kD;
  const int c_begin = seq_chunk0[n], c_end = seq_chunk0[n + 1];

  auto rows128 = [&](bf16* dst, const bf16* src) {  // [64][128] bf16 -> pitch kLdB
    for (int idx = tid; idx < kC * 16; idx += kThreads)
      cp_async16(dst + (idx >> 4) * kLdB + (idx & 15) * 8, src + (idx >> 4) * kD + (idx & 15) * 8);
  };
  auto fetch_wuq = [&](int c, int b) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(WBuf + b * kC * kLdB, wk + kOffW);
    rows128(QBuf + b * kC * kLdB, wk + kOffQg);
    bf16* us = UBuf + b * kC * kLdV;
    for (int idx = tid; idx < kC * (VT / 8); idx += kThreads) {
      const int r = idx / (VT / 8), c8 = (idx % (VT / 8)) * 8;
      cp_async16(us + r * kLdV + c8, wk + kOffU + r * kD + v0 + c8);
    }
  };
  auto fetch_kmg = [&](int c, int b) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(KdBuf + b * kC * kLdB, wk + kOffKd);
    bf16* mq = MqBuf + b * kC * kLdM;
    for (int idx = tid; idx < kC * 8; idx += kThreads)
      cp_async16(mq + (idx >> 3) * kLdM + (idx & 7) * 8, wk + kOffMq + (idx >> 3) * kC + (idx & 7) * 8);
    const float* gc = work_gc(work, c, H, h);
    if (tid < kD / 4) cp_async16(GcBuf + b * kD + 4 * tid, gc + 4 * tid);
  };

  // The state tile of this warp: rows 16·srt + g (+8), columns 16·(sc0+gi) + 8·jn + 2t (+1).
  const int srt = warp % kRowT, sc0 = (warp / kRowT) * kSG;
  float S[kSG][2][4];
#pragma unroll
  for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
    for (int jn = 0; jn < 2; ++jn)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * srt + g + 8 * hf, col = 16 * (sc0 + gi) + 8 * jn + 2 * t;
        const float2 f = *reinterpret_cast<const float2*>(state + r * kD + col);
        S[gi][jn][2 * hf] = f.x;
        S[gi][jn][2 * hf + 1] = f.y;
      }
  auto store_sb = [&] {
#pragma unroll
    for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * srt + g + 8 * hf, col = 16 * (sc0 + gi) + 8 * jn + 2 * t;
          *reinterpret_cast<uint32_t*>(Sb + r * kLdB + col) = pack_bf16(S[gi][jn][2 * hf], S[gi][jn][2 * hf + 1]);
        }
  };
  store_sb();
  if (c_begin < c_end) {
    fetch_wuq(c_begin, 0);
    fetch_kmg(c_begin, 0);
  }
  cp_async_commit();

  const int mt = warp & 3, ag0 = (warp >> 2) * kAG;
  for (int c = c_begin; c < c_end; ++c) {
    const int t0 = chunk_table[4 * c], len = chunk_table[4 * c + 1];
    const int parity = (c - c_begin) & 1;
    const int bufA = Cfg::kBufA == 2 ? parity : 0, bufB = Cfg::kBufB == 2 ? parity : 0;
    const bool has_next = c + 1 < c_end;
    cp_async_wait<0>();
    __syncthreads();  // this chunk's tiles and last chunk's bf16 state are visible; old buffers are free
    if (kStages >= 2 && has_next) fetch_kmg(c + 1, bufB ^ 1);
    if (kStages == 3 && has_next) fetch_wuq(c + 1, bufA ^ 1);
    cp_async_commit();
    const bf16* Ws = WBuf + bufA * kC * kLdB;
    const bf16* Qs = QBuf + bufA * kC * kLdB;
    const bf16* Us = UBuf + bufA * kC * kLdV;
    const bf16* Kd = KdBuf + bufB * kC * kLdB;
    const bf16* Mq = MqBuf + bufB * kC * kLdM;
    const float* gC = GcBuf + bufB * kD;

    // (a) V' = U − W Sᵀ and the inter-chunk part of O, (Q⊙e^Γ) Sᵀ, share the B fragments of S.
    float Va[kAG][2][4] = {}, Oa[kAG][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t aw[4], aq[4];
      load_a(aw, Ws + 16 * mt * kLdB + 16 * kk, kLdB);
      load_a(aq, Qs + 16 * mt * kLdB + 16 * kk, kLdB);
#pragma unroll
      for (int gi = 0; gi < kAG; ++gi) {
        uint32_t b[4];
        load_b_nk(b, Sb + 16 * (ag0 + gi) * kLdB + 16 * kk, kLdB);
        mma_bf16(Va[gi][0], aw, b);
        mma_bf16(Va[gi][1], aw, b + 2);
        mma_bf16(Oa[gi][0], aq, b);
        mma_bf16(Oa[gi][1], aq, b + 2);
      }
    }
#pragma unroll
    for (int gi = 0; gi < kAG; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * mt + g + 8 * hf, col = 16 * (ag0 + gi) + 8 * jn + 2 * t;
          const float2 u = bf2_to_f2(*reinterpret_cast<const uint32_t*>(Us + r * kLdV + col));
          *reinterpret_cast<uint32_t*>(Vp + r * kLdV + col) =
              pack_bf16(u.x - Va[gi][jn][2 * hf], u.y - Va[gi][jn][2 * hf + 1]);
        }
    __syncthreads();  // V' complete; W, U, Q⊙e^Γ and the bf16 state are no longer read this chunk
    if (kStages <= 2 && has_next) fetch_wuq(c + 1, 0);
    cp_async_commit();

    // (b) O += M_qk V' (M_qk lower triangular: k tiles j ≤ mt), rows < len to the output.
    for (int j = 0; j <= mt; ++j) {
      uint32_t am[4];
      load_a(am, Mq + 16 * mt * kLdM + 16 * j, kLdM);
#pragma unroll
      for (int gi = 0; gi < kAG; ++gi) {
        uint32_t b[4];
        load_b_kn(b, Vp + 16 * j * kLdV + 16 * (ag0 + gi), kLdV);
        mma_bf16(Oa[gi][0], am, b);
        mma_bf16(Oa[gi][1], am, b + 2);
      }
    }
#pragma unroll
    for (int gi = 0; gi < kAG; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * mt + g + 8 * hf, col = v0 + 16 * (ag0 + gi) + 8 * jn + 2 * t;
          if (r < len) {
            const int64_t o = ((int64_t(t0) + r) * H + h) * kD + col;
            const float x0 = Oa[gi][jn][2 * hf], x1 = Oa[gi][jn][2 * hf + 1];
            if (a.o.bf16) *reinterpret_cast<uint32_t*>(static_cast<bf16*>(a.o.p) + o) = pack_bf16(x0, x1);
            else *reinterpret_cast<float2*>(static_cast<float*>(a.o.p) + o) = make_float2(x0, x1);
          }
        }

    // (c) S = Diag_k(e^{Γ_C}) S + V'ᵀ (K⊙e^{Γ_C−Γ}), then its bf16 copy for the next chunk (nobody
    // reads Sb between the barrier above and the next chunk's top barrier).
#pragma unroll
    for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn) {
        const float2 d = *reinterpret_cast<const float2*>(gC + 16 * (sc0 + gi) + 8 * jn + 2 * t);
        S[gi][jn][0] *= d.x;
        S[gi][jn][1] *= d.y;
        S[gi][jn][2] *= d.x;
        S[gi][jn][3] *= d.y;
      }
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      uint32_t av[4];
      load_a_trans(av, Vp + 16 * kk * kLdV + 16 * srt, kLdV);
#pragma unroll
      for (int gi = 0; gi < kSG; ++gi) {
        uint32_t b[4];
        load_b_kn(b, Kd + 16 * kk * kLdB + 16 * (sc0 + gi), kLdB);
        mma_bf16(S[gi][0], av, b);
        mma_bf16(S[gi][1], av, b + 2);
      }
    }
    store_sb();
    if (kStages == 1) {
      __syncthreads();  // K⊙e^{Γ_C−Γ}, M_qk, e^{Γ_C} and V' are no longer read
      if (has_next) fetch_kmg(c + 1, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
    for (int jn = 0; jn < 2; ++jn)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * srt + g + 8 * hf, col = 16 * (sc0 + gi) + 8 * jn + 2 * t;
        *reinterpret_cast<float2*>(state + r * kD + col) = make_float2(S[gi][jn][2 * hf], S[gi][jn][2 * hf + 1]);
      }
}

template <int VT, int kWarps, int kStages>
void launch_scan(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                 cudaStream_t s) {
  using Cfg = ScanCfg<VT, kWarps, kStages>;
  auto* kern = kda_chunk_scan_kernel<VT, kWarps, kStages>;
  K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem));
  kern<<<dim3(kD / VT, a.H, a.N), Cfg::kThreads, Cfg::kSmem, s>>>(a, chunk_table, seq_chunk0, work);
  K3_CUDA_LAUNCHED("kda_chunk_scan_kernel");
}

}  // namespace

int64_t kda_chunk_workspace_floats(int64_t num_chunks, int H) { return num_chunks * H * (kWorkBytes / 4); }

void launch_kda_chunk(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, int num_chunks,
                      float* work, cudaStream_t s) {
  if (a.K != kD || a.V != kD) throw Error("kda_chunk: the chunked kernel needs K = V = 128");
  if (a.N == 0 || a.H == 0) return;
  if (num_chunks > 0) {
    K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPrepSmem));
    kda_chunk_prep_kernel<<<dim3(num_chunks, a.H), kPrepThreads, kPrepSmem, s>>>(a, chunk_table, work);
    K3_CUDA_LAUNCHED("kda_chunk_prep_kernel");
  }
  // Scan shape by grid size (H200 sweep, 2026-11-29, ms at T=8192,H=96 / T=32768,H=32):
  // <V tile, warps, stages> = <32,4,2> 2.20 / -, <32,4,3> 2.19 / 2.90, <64,4,1> 2.07 / 3.53,
  // <64,8,2> 2.11 / 3.23, <16,4,2> 2.46 / 3.18. Wide V tiles halve the redundant W·Sᵀ/Q·Sᵀ
  // operand traffic per state row but leave SMs idle when heads x sequences are few; a grid of at
  // most one block per SM can afford double buffers for every tile.
  int dev = 0, sms = 0;
  K3_CUDA_OK(cudaGetDevice(&dev));
  K3_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t blocks32 = int64_t(kD / 32) * a.H * a.N;
  if (blocks32 >= 2 * int64_t(sms))
    launch_scan<64, 4, 1>(a, chunk_table, seq_chunk0, work, s);
  else if (blocks32 <= sms)
    launch_scan<32, 4, 3>(a, chunk_table, seq_chunk0, work, s);
  else
    launch_scan<32, 4, 2>(a, chunk_table, seq_chunk0, work, s);
}

}  // namespace k3::cuda
