// KDA chunked prefill (docs/MODEL.md §2.4, chunk C = 64, K = V = 128), two launches, bf16 tensor-core
// operands (mma.sync m16n8k16 and, in the wide scan, wgmma; fp32 accumulate) throughout:
//
//  prep (one block per (chunk, head), all chunks in parallel): Γ = cumsum(g) inside the chunk (fp32);
//    M_kk, M_qk on 16x16 tiles (R, c ≤ R) with three exponent references,
//    exp(Γ_r − Γ_s) = exp(Γ_r − Γ_16R)·exp(Γ_16c+15 − Γ_s)·exp(Γ_16R − Γ_16c+15): the first two are
//    ≤ 1 and staged once per block as bf16 operands; the third, a vector along k, is ≤ 1 left of
//    the diagonal and ≤ e^{75} on it because the lower-bounded gate (g ≥ −5) limits 15 gates to
//    75 nats, so every factor and product (≤ 128·|k|·|q|·e^{75}) stays inside the fp32 = bf16
//    exponent range (e^{88}); every tile is a dense bf16 product;
//    T = (I + M_kk)^{-1} by 16x16 diagonal blocks (fp32) then block rows (tf32 mma), Tβ = T·Diag(β) (bf16);
//    W = Tβ (K⊙e^Γ), U = Tβ V (tensor cores); Q⊙e^Γ, K⊙e^{Γ_C−Γ}, M_qk (bf16), e^{Γ_C} (fp32)
//    -> workspace (kda_chunk_layout.cuh). e^Γ, e^{Γ_C−Γ} ≤ 1 (g ≤ 0); tiny ones underflow to 0,
//    which is their limit. The kernel is in kda_chunk_prep.cu.
//    Unbounded gate (Kimi Linear's softplus, KdaArgs::unbounded_gate): a variant of the same launch
//    takes every exponent as a sum of gates over a run from its fixed end (kda_chunk_runs.cuh): the
//    tiles left of the diagonal factor at n with both factors ≤ 1, the diagonal tiles go pair by
//    pair in fp32; 178 KB of shared memory, one block per SM. It writes the same workspace.
//  scan (one block per (sequence, head, VT rows of V), chunks in order): the state tile
//    S [VT v][128 k] lives in fp32 mma accumulators for the whole sequence; a bf16 copy in shared
//    memory ([v][k] is the [n][k] B layout) feeds V' = U − W Sᵀ and O = (Q⊙e^Γ) Sᵀ + M_qk V';
//    then S = Diag_k(e^{Γ_C}) S + V'ᵀ (K⊙e^{Γ_C−Γ}) (V' rounded to bf16 once, as its products'
//    operand). The next chunk's workspace tiles stream in by cp.async while this one computes.
//    Rows past a sequence's end are zero in every workspace tile (their β, K, Q, V are
//    zero-filled), so they add nothing. Optional checkpoints: after a chunk that ends a multiple of
//    the checkpoint interval, the fp32 state tile is also stored to the caller's checkpoint slot.
//    Split scan (kda_split_plan.h, few heads and long sequences): the grid's rows are jobs, each a
//    segment of a sequence scanned from its slot, zeros, the identity (with U = 0) or a carry slot,
//    with or without output; a fix-up launch (kda_chunk_split.cu) chains the segments in between.
//    Wide grids (>= 2 blocks of 32 rows per SM) run the same jobs on wgmma instead
//    (kda_chunk_scan_wg.cuh: one warpgroup per 64 rows, four asynchronous products a chunk), unless
//    the backend is told otherwise (CudaBackend::set_kda_chunk_scan_wgmma); narrow grids keep the
//    mma.sync blocks, whose smaller row tiles give more blocks. Wide grids that fit one wave of
//    32-row blocks run the wgmma scan in 32-row blocks (kda_chunk_scan_wg32.cuh: the state
//    transposed, three blocks per SM), wider ones in 64-row blocks (CudaBackend::set_kda_chunk_scan_wg_rows).
//    The wgmma scans take their tiles by TMA bulk copies (kda_chunk_scan_tma.cuh) and write a
//    checkpoint by staging the state in a free tile buffer and one bulk store. Calls with a
//    checkpoint after every chunk, whose heads fit one wave of SMs, run a head per block instead
//    (kda_chunk_scan_head.cuh: four 32-row warpgroups sharing two stages of tiles, each storing its
//    quarter of a checkpoint straight from its accumulators).
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_scan_head.cuh"
#include "kernels/cuda/kda_chunk_scan_job.cuh"
#include "kernels/cuda/kda_chunk_scan_wg.cuh"
#include "kernels/cuda/kda_chunk_scan_wg32.cuh"
#include "kernels/cuda/kda_scan_form.h"
#include "kernels/cuda/kda_split_plan.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.h"

namespace k3::cuda {
namespace {

using namespace kda_chunk;

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

// Eight warps are held to 128 registers so that two blocks share an SM, as four warps' 246 do.
template <int VT, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 8 ? 2 : 1)
    kda_chunk_scan_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                          const KdaScanJob* jobs, float* carry) {
  pdl_enter();
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
  const ScanBlockJob job = scan_block_job(a, seq_chunk0, jobs, carry, n, h, v0);
  const int c_begin = job.c_begin, c_end = job.c_end, seq = job.seq;
  const bool write_o = job.write_o, zero_u = job.zero_u;

  auto rows128 = [&](bf16* dst, const bf16* src) {  // [64][128] bf16 -> pitch kLdB
    for (int idx = tid; idx < kC * 16; idx += kThreads)
      cp_async16(dst + (idx >> 4) * kLdB + (idx & 15) * 8, src + (idx >> 4) * kD + (idx & 15) * 8);
  };
  auto fetch_wuq = [&](int c, int b) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(WBuf + b * kC * kLdB, wk + kOffW);
    if (write_o) rows128(QBuf + b * kC * kLdB, wk + kOffQg);  // Q⊙e^Γ and M_qk serve only the output
    bf16* us = UBuf + b * kC * kLdV;
    if (zero_u) return;  // never read
    for (int idx = tid; idx < kC * (VT / 8); idx += kThreads) {
      const int r = idx / (VT / 8), c8 = (idx % (VT / 8)) * 8;
      cp_async16(us + r * kLdV + c8, wk + kOffU + r * kD + v0 + c8);
    }
  };
  auto fetch_kmg = [&](int c, int b) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(KdBuf + b * kC * kLdB, wk + kOffKd);
    bf16* mq = MqBuf + b * kC * kLdM;
    for (int idx = tid; write_o && idx < kC * 8; idx += kThreads)
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
        S[gi][jn][2 * hf] = scan_init_value(job, v0, r, col);
        S[gi][jn][2 * hf + 1] = scan_init_value(job, v0, r, col + 1);
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
    // Checkpoint slot of this chunk's end (-1: none), read now so that its load latency hides
    // behind the chunk's products instead of stalling the chain at the end.
    const int ck = write_o ? kda_ckpt_slot(a, seq, 64 * chunk_table[4 * c + 3] + len) : -1;
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
      if (write_o) load_a(aq, Qs + 16 * mt * kLdB + 16 * kk, kLdB);
#pragma unroll
      for (int gi = 0; gi < kAG; ++gi) {
        uint32_t b[4];
        load_b_nk(b, Sb + 16 * (ag0 + gi) * kLdB + 16 * kk, kLdB);
        mma_bf16(Va[gi][0], aw, b);
        mma_bf16(Va[gi][1], aw, b + 2);
        if (write_o) {
          mma_bf16(Oa[gi][0], aq, b);
          mma_bf16(Oa[gi][1], aq, b + 2);
        }
      }
    }
#pragma unroll
    for (int gi = 0; gi < kAG; ++gi)
#pragma unroll
      for (int jn = 0; jn < 2; ++jn)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * mt + g + 8 * hf, col = 16 * (ag0 + gi) + 8 * jn + 2 * t;
          const float2 u = zero_u ? make_float2(0.f, 0.f) : bf2_to_f2(*reinterpret_cast<const uint32_t*>(Us + r * kLdV + col));
          *reinterpret_cast<uint32_t*>(Vp + r * kLdV + col) =
              pack_bf16(u.x - Va[gi][jn][2 * hf], u.y - Va[gi][jn][2 * hf + 1]);
        }
    __syncthreads();  // V' complete; W, U, Q⊙e^Γ and the bf16 state are no longer read this chunk
    if (kStages <= 2 && has_next) fetch_wuq(c + 1, 0);
    cp_async_commit();

    // (b) O += M_qk V' (M_qk lower triangular: k tiles j ≤ mt), rows < len to the output.
    for (int j = 0; write_o && j <= mt; ++j) {
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
          if (write_o && r < len) store_o_pair(a, t0, r, h, col, Oa[gi][jn][2 * hf], Oa[gi][jn][2 * hf + 1]);
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
    // Checkpoint: the fp32 state after this chunk, when it ends a multiple of the interval. Streaming
    // (evict-first) stores from the accumulators (64 KiB per head per checkpoint): nothing here reads
    // them back, so they should not displace the workspace tiles in L2.
    if (ck >= 0) {
      float* dst = a.ckpt + (int64_t(ck) * H + h) * kD * kD + int64_t(v0) * kD;
#pragma unroll
      for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
        for (int jn = 0; jn < 2; ++jn)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = 16 * srt + g + 8 * hf, col = 16 * (sc0 + gi) + 8 * jn + 2 * t;
            __stcs(reinterpret_cast<float2*>(dst + r * kD + col), make_float2(S[gi][jn][2 * hf], S[gi][jn][2 * hf + 1]));
          }
    }
    if (kStages == 1) {
      __syncthreads();  // K⊙e^{Γ_C−Γ}, M_qk, e^{Γ_C} and V' are no longer read
      if (has_next) fetch_kmg(c + 1, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  if (job.final_state == nullptr) return;
#pragma unroll
  for (int gi = 0; gi < kSG; ++gi)
#pragma unroll
    for (int jn = 0; jn < 2; ++jn)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * srt + g + 8 * hf, col = 16 * (sc0 + gi) + 8 * jn + 2 * t;
        *reinterpret_cast<float2*>(job.final_state + r * kD + col) =
            make_float2(S[gi][jn][2 * hf], S[gi][jn][2 * hf + 1]);
      }
}

template <int VT, int kWarps, int kStages>
void launch_scan(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work, int rows,
                 const KdaScanJob* jobs, float* carry, cudaStream_t s) {
  using Cfg = ScanCfg<VT, kWarps, kStages>;
  auto* kern = kda_chunk_scan_kernel<VT, kWarps, kStages>;
  K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem));
  launch_pdl("kda_chunk_scan_kernel", kern, dim3(kD / VT, a.H, rows), Cfg::kThreads, Cfg::kSmem, s, a, chunk_table,
             seq_chunk0, work, jobs, carry);
}

// The tensor maps of the wgmma scans' bulk copies over the workspace of num_chunks chunks (zeros
// when there are none: no block then copies anything), and over the checkpoint slots when asked for.
kda_chunk::KdaScanMaps scan_maps(const KdaArgs& a, void* work, int64_t num_chunks) {
  kda_chunk::KdaScanMaps m{};
  if (num_chunks <= 0) return m;
  const int64_t tiles = num_chunks * a.H;
  if (tiles * kda_chunk::kTileRows64 > 0x7fffffff)
    throw Error("kda_chunk: " + std::to_string(num_chunks) + " chunks x " + std::to_string(a.H) +
                " heads exceed the scan's copy coordinates; split the call");
  m.tiles = make_bf16_tensor_map(work, tiles * kda_chunk::kTileRows128, 128, 64, 64, true);
  m.mq = make_bf16_tensor_map(work, tiles * kda_chunk::kTileRows64, 64, 64, 64, true);
  m.u32 = make_bf16_tensor_map(work, tiles * kda_chunk::kTileRows128, 128, 32, 64, false);
  if (a.ckpt != nullptr) {
    const int64_t rows = a.ckpt_num_slots * a.H * kD;
    if (a.ckpt_num_slots <= 0) throw Error("kda_chunk: checkpoints given without their slot count");
    if (rows > 0x7fffffff)
      throw Error("kda_chunk: " + std::to_string(a.ckpt_num_slots) + " checkpoint slots x " + std::to_string(a.H) +
                  " heads exceed the scan's copy coordinates");
    m.ckpt = make_f32_tensor_map_sw128(a.ckpt, rows, kD, 32);
  }
  return m;
}

// A wgmma scan kernel (layout L, VT rows of V a block) over the grid (row tiles, heads, rows).
template <class L, int VT, class Kernel>
void launch_scan_wg(Kernel* kern, const char* name, const KdaArgs& a, const int32_t* chunk_table,
                    const int32_t* seq_chunk0, void* work, int num_chunks, int rows, const KdaScanJob* jobs,
                    float* carry, cudaStream_t s) {
  K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem));
  launch_pdl(name, kern, dim3(kD / VT, a.H, rows), L::kThreads, L::kSmem, s, a, chunk_table, seq_chunk0, work, jobs,
             carry, scan_maps(a, work, num_chunks));
}

// The scan kernel for the grid (kda_scan_form.h: the thresholds and the measurements behind them).
// `rows`: sequences, or jobs. The mma.sync shapes, H200 sweep 2026-11-29, ms at T=8192,H=96 /
// T=32768,H=32: <V tile, warps, stages> = <32,4,2> 2.20 / -, <32,4,3> 2.19 / 2.90, <64,4,1> 2.07 / 3.53,
// <64,8,2> 2.11 / 3.23, <16,4,2> 2.46 / 3.18. Wide V tiles halve the redundant W·Sᵀ/Q·Sᵀ operand
// traffic per state row but leave SMs idle when heads x sequences are few; a grid of at most one
// block per SM can afford double buffers for every tile. The wide mma.sync grid runs eight warps
// (the scan alone 704 instead of 730 us with four, H200, 2026-12-03).
void scan(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work, int num_chunks,
          int rows, const KdaScanJob* jobs, float* carry, int num_sms, cudaStream_t s) {
  const bool ckpt_every_chunk = a.ckpt != nullptr && a.ckpt_interval == kC;
  const KdaScanForm form = a.scan_one_form ? KdaScanForm::kWg32
                                           : pick_kda_scan_form(a.H, rows, num_sms, a.scan_wgmma, a.scan_wg_rows,
                                                                ckpt_every_chunk);
  switch (form) {
    case KdaScanForm::kWg32:
      return launch_scan_wg<kda_chunk::ScanWg32, 32>(kda_chunk::kda_chunk_scan_wg32_kernel, "kda_chunk_scan_wg32_kernel", a,
                                                     chunk_table, seq_chunk0, work, num_chunks, rows, jobs, carry, s);
    case KdaScanForm::kWgHead:
      return launch_scan_wg<kda_chunk::ScanHead, 128>(kda_chunk::kda_chunk_scan_head_kernel, "kda_chunk_scan_head_kernel",
                                                      a, chunk_table, seq_chunk0, work, num_chunks, rows, jobs, carry, s);
    case KdaScanForm::kWg64:
      return launch_scan_wg<kda_chunk::ScanWg, 64>(kda_chunk::kda_chunk_scan_wg_kernel, "kda_chunk_scan_wg_kernel", a,
                                                   chunk_table, seq_chunk0, work, num_chunks, rows, jobs, carry, s);
    case KdaScanForm::kMma64: launch_scan<64, 8, 1>(a, chunk_table, seq_chunk0, work, rows, jobs, carry, s); return;
    case KdaScanForm::kMma32x3: launch_scan<32, 4, 3>(a, chunk_table, seq_chunk0, work, rows, jobs, carry, s); return;
    case KdaScanForm::kMma32x2: launch_scan<32, 4, 2>(a, chunk_table, seq_chunk0, work, rows, jobs, carry, s); return;
  }
}

}  // namespace

int64_t kda_chunk_workspace_floats(int64_t num_chunks, int H) { return num_chunks * H * (kWorkBytes / 4); }

void launch_kda_chunk(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, int num_chunks,
                      float* work, int num_sms, cudaStream_t s) {
  if (a.K != kD || a.V != kD) throw Error("kda_chunk: the chunked kernel needs K = V = 128");
  if (a.N == 0 || a.H == 0) return;
  if (num_chunks > 0) launch_kda_chunk_prep(a, chunk_table, num_chunks, work, s);
  scan(a, chunk_table, seq_chunk0, work, num_chunks, a.N, nullptr, nullptr, num_sms, s);
}

void launch_kda_chunk_split(const KdaArgs& a, const int32_t* chunk_table, int num_chunks, float* work,
                            const KdaSplitPlan& split, const KdaScanJob* pass1, const KdaScanJob* pass3,
                            const int32_t* fixup, float* carry, int num_sms, cudaStream_t s) {
  if (a.K != kD || a.V != kD) throw Error("kda_chunk: the chunked kernel needs K = V = 128");
  if (a.N == 0 || a.H == 0) return;
  if (num_chunks > 0) launch_kda_chunk_prep(a, chunk_table, num_chunks, work, s);
  scan(a, chunk_table, nullptr, work, num_chunks, int(split.pass1.size()), pass1, carry, num_sms, s);
  launch_kda_split_fixup(a.H, int(split.fixup.size() / 2), split.max_segments, fixup, carry, s);
  scan(a, chunk_table, nullptr, work, num_chunks, int(split.pass3.size()), pass3, carry, num_sms, s);
}

}  // namespace k3::cuda
