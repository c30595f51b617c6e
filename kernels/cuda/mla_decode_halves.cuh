// A 64-head block of the Hopper MLA decode kernel (mla_decode_wgmma.cu) in the seesaw over pairs of
// KV tiles (as mla_decode_seesaw.cuh), rescheduled so that no product waits for shared memory it does
// not need and no tile waits for a warpgroup that no longer reads it:
//   * P stays in registers for the warpgroup that computed it: the scores' accumulator is repacked
//     as the A operand of the P V product (wgmma with A from registers), so the local product starts
//     right after the softmax. Only the other warpgroup's copy of P goes through shared memory.
//   * Each stage has an mbarrier per 64-dim chunk, and S waits chunk by chunk (one commit group per
//     chunk, a wgmma.fence after each wait: a wait between two wgmmas of one group makes ptxas
//     serialize them all), so the scores of a tile start when its first chunk is in.
//   * A stage is refilled by halves, each half by the warpgroup that last reads it, with no
//     "empty" barrier: WG 0 reads dims 0..255 (V left) and WG 1 dims 256..511 (V right); the scores
//     of a tile (all 576 dims) are computed before either product of that tile can start, which the
//     hand-over barriers below already order.
// For tiles A = 2i (stage 0) and B = 2i + 1 (stage 1), m the running max (shared, in shared memory):
//   WG 0: S_A (waited for at the end of the last pair) -> m_A = max(m, rowmax S_A), c_A = 2^(m - m_A),
//         P_A = 2^(S_A - m_A); "scale A"; O_L *= c_A; O_L += P_A V_A,L (P_A from registers); waits
//         "scale B" (c_B = 2^(m_A - m_B)); writes P_A c_B into stage 0's rope chunk (S_A has read it)
//         while its product runs; "P_A"; once P_A V_A,L is done, refills stage 0 dims 0..255 with
//         tile A + 2; waits "P_B"; O_L *= c_B; O_L += P_B V_B,L (P_B from stage 1's rope chunk);
//         S_{A+2} chunks 4..8; once P_B V_B,L is done, refills stage 1 dims 0..255 and the rope chunk
//         with B + 2; S_{A+2} chunks 0..3.
//   WG 1: S_B (likewise) -> waits "scale A"; m_B = max(m_A, rowmax S_B), c_B; "scale B"; O_R *= c_A c_B;
//         P_B into stage 1's rope chunk; "P_B"; O_R += P_B V_B,R (from registers); waits "P_A";
//         O_R += P_A c_B V_A,R; once P_B V_B,R is done, refills stage 1 dims 256..511 with B + 2; once
//         P_A V_A,R is done, stage 0 dims 256..575 with A + 2; S_{B+2}.
// Every read of a refilled range precedes its refill in the refilling warpgroup's own order (its
// wgmma waits) or, for the scores of the other warpgroup's tile, by a hand-over barrier passed
// before. A stage's rope chunk carries P only between the tile's scores and its refill. Each
// warpgroup keeps the row sums of the tiles' P it multiplied, rescaled alike; they are added at the
// end. With an odd tile count the last pair has no B: WG 1 then only adds P_A V_A,R.
// Measured on the H200 (docs/PERF.md): the scores waited for chunk by chunk are 3-11 % faster than
// with one wait for the whole tile; P_A written before its own product is waited for, up to 3 %
// faster than after. Against mla_decode_seesaw.cuh the block is 3-5 % faster where each block walks
// 8192 tokens or more (the refills' latency hides better) and 4-5 % slower on shorter ones (its own
// schedule is slower once the rows are in L2), so the launch picks it by length (launch.h,
// MlaDecodeArgs::wgmma_seesaw_halves).
// The schedule follows FlashMLA's dense decode kernel (github.com/deepseek-ai/FlashMLA, sm90), read
// for its schedule; that kernel keeps Q's rope chunk in registers to free shared memory for P_B,
// this one puts each P into the rope chunk of its own tile's stage instead.
#pragma once
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mla_wgmma_layout.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::mla_halves {

using namespace mla_tiles;

constexpr int kHeads = 64;
constexpr int kQBytes = mlawg::kOperandBytes;      // 73728
constexpr int kKvOff = kQBytes;                     // stage s at kKvOff + s * kTileBytes
constexpr int kRopeOff = 8 * 8 * wg::kAtomBytes;    // the rope chunk inside a stage
constexpr int kRowsOff = kKvOff + 2 * kTileBytes;   // floats: max[64], scale_a[64], scale_b[64], sums[64]
constexpr int kBarOff = kRowsOff + 4 * kHeads * 4;
constexpr int kSmemFromBase = kBarOff + 2 * kDimAtoms * 8;  // an mbarrier per (stage, dim chunk)

// Named barriers (0 is __syncthreads): producer bar.arrive, consumer bar.sync, 256 threads each.
constexpr int kScaleA = 1, kScaleB = 2, kPa = 3, kPb = 4;
__device__ __forceinline__ void wg_sync(int w) { bar_sync<128>(5 + w); }

// Dim chunks [kLo, kHi) of a tile into the stage at `dst`, chunk c counted on the mbarrier at
// bar0 + 8 c; issued by the 32 lanes of the calling warp.
template <int kLo, int kHi>
__device__ __forceinline__ void issue_chunks(uint32_t dst, uint32_t bar0, const CUtensorMap* map, const MlaDecodeArgs& a,
                                             const int32_t* pages, int t0, int end, int page_shift, int box_rows) {
  issue_chunks_tma<kLo, kHi, true>(dst, bar0, map, a, pages, t0, end, page_shift, box_rows);
}

// S (+)= Q K over dim chunks [kLo, kHi) of the stage whose chunk barriers start at bar0: waits for
// each chunk, then its four k steps as one commit group. kZero: the first step overwrites S.
template <int kLo, int kHi, bool kZero>
__device__ __forceinline__ void score_chunks(float (&s)[32], wg::DescBase q, wg::DescBase k, uint32_t bar0,
                                             uint32_t parity) {
#pragma unroll
  for (int c = kLo; c < kHi; ++c) {
    mbar_wait(bar0 + 8 * c, parity);
    wg::fence();
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4)
      wg::mma_m64n64<0>(s, q.at(mlawg::s_a_off(4 * c + k4)), k.at(mlawg::s_a_off(4 * c + k4)),
                        kZero && c == kLo && k4 == 0 ? 0 : 1);
    wg::commit();
  }
}

// A last tile shorter than 64 rows: every chunk is waited for and the rows past `end` zeroed (unused
// cache rows may hold NaN, and P = 0 times NaN is NaN) before this warpgroup's scores read them; the
// other warpgroup reads its half after a hand-over barrier that follows.
__device__ __forceinline__ void zero_short_tile(unsigned char* stage, uint32_t bar0, uint32_t parity, int t0, int end,
                                                int ti, int w) {
  if (end - t0 >= kTok) return;
  for (int c = 0; c < kDimAtoms; ++c) mbar_wait(bar0 + 8 * c, parity);
  zero_tail(stage, end - t0, ti, 128);
  wg::fence_proxy_async();
  wg_sync(w);
}

// The scores' accumulator s (row r0 + 8 (e >> 1), column 8 j + 2 t4 + (e & 1) in s[4 j + e]) as the A
// fragments of the four k16 steps of P V: pa[kk] covers columns 16 kk..16 kk + 15 (wgmma.cuh,
// mma_m64n256_rs_kt).
__device__ __forceinline__ void pack_p(uint32_t (&pa)[4][4], const float (&s)[32]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// P (fp32, the scores' accumulator layout) times the rows' factors, as bf16 into the operand at p:
// the same stores as store_p, packed one k16 step at a time.
__device__ __forceinline__ void store_p_scaled(uint32_t p, const float (&s)[32], float f0, float f1, int wq, int lane) {
  const int row = 16 * wq + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t r[4] = {pack_bf16(s[8 * kk] * f0, s[8 * kk + 1] * f0), pack_bf16(s[8 * kk + 2] * f1, s[8 * kk + 3] * f1),
                           pack_bf16(s[8 * kk + 4] * f0, s[8 * kk + 5] * f0), pack_bf16(s[8 * kk + 6] * f1, s[8 * kk + 7] * f1)};
    stmatrix_x4(p + wg::op_offset(row, 2 * kk + (lane >> 4)), r);
  }
}

// Heads [h0, h0 + 64) of request blockIdx.z, split blockIdx.y; 256 threads.
__device__ __forceinline__ void block(const MlaDecodeArgs& a, int tokens_per_split, float* part_o, float* part_lse,
                                      const CUtensorMap* kv_map, int box_rows, int h0, unsigned char* base,
                                      uint32_t base_addr) {
  const int b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 7, ti = tid & 127;
  const int wq = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g, r1 = r0 + 8;
  const auto [begin, end, pages, page_shift] = split_rows(a, tokens_per_split);
  const uint32_t st0 = base_addr + kKvOff, st1 = st0 + kTileBytes;
  unsigned char* const stage0 = base + kKvOff;
  unsigned char* const stage1 = stage0 + kTileBytes;
  float* const max_s = reinterpret_cast<float*>(base + kRowsOff);  // the running max (log2 units)
  float* const scale_a = max_s + kHeads;                            // 2^(m - m_A)
  float* const scale_b = scale_a + kHeads;                          // 2^(m_A - m_B)
  float* const sums_s = scale_b + kHeads;                           // WG 1's row sums at the end
  const uint32_t bars0 = base_addr + kBarOff, bars1 = bars0 + 8 * kDimAtoms;  // chunk c of stage s: + 8 c
  const wg::DescBase q_desc(base_addr), k0_desc(st0), k1_desc(st1);
  const wg::DescBase v0_desc(st0, 8 * wg::kAtomBytes, wg::kAtomBytes), v1_desc(st1, 8 * wg::kAtomBytes, wg::kAtomBytes);
  const wg::DescBase p0_desc(st0 + kRopeOff), p1_desc(st1 + kRopeOff);

  if (tid < 32) {
    if (tid == 0)
      for (int i = 0; i < 2 * kDimAtoms; ++i) mbar_init(bars0 + 8 * i);
    __syncwarp();
    if (begin < end) issue_chunks<0, kDimAtoms>(st0, bars0, kv_map, a, pages, begin, end, page_shift, box_rows);
    if (begin + kTok < end)
      issue_chunks<0, kDimAtoms>(st1, bars1, kv_map, a, pages, begin + kTok, end, page_shift, box_rows);
  }
  stage_q<kHeads>(base, a, b, h0, tid, 256);
  if (tid < kHeads) max_s[tid] = -INFINITY;
  wg::fence_proxy_async();  // Q stores -> async proxy
  __syncthreads();          // Q is staged, the running max set, the mbarriers exist

  const float sl2 = a.scale * kLog2e;
  const float slack = a.wgmma_lazy_rescale ? 8.f : 0.f;
  const auto next_max = [&](float m, float x) { return x > m + slack ? x : m; };
  float o[128];  // this warpgroup's m64n256 accumulator: dims 256 w + ...
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];   // scores of this warpgroup's tile, then its P in fp32
  uint32_t pa[4][4];  // P (bf16) as the A operand of the local product, then as stored for the other
  float l0 = 0.f, l1 = 0.f;  // this thread's share of the row sums of the P this warpgroup multiplied
  uint32_t parity = 0;       // of the next completion of this warpgroup's stage (WG 0: stage 0, WG 1: 1)

  const auto rescale = [&](float c0, float c1) {
    if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) rescale_rows(o, c0, c1);
  };
  // After the scores' last commit group: waits, scales to log2 units, masks tokens past `end`;
  // returns the rows' maxima of this tile.
  const auto finish_scores = [&](int t0, float& x0, float& x1) {
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) wg::reg_fence(s[i]);
    scale_mask_rowmax<64>(s, t0, end, t4, sl2, x0, x1);
  };
  // O += P V over this warpgroup's half of V: P from registers (local) or from a rope chunk (remote).
  const auto pv_local = [&](const wg::DescBase& v) {
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg::mma_m64n256_rs_kt(o, pa[kk], v.at(mlawg::pv_b_off(kk, w, 0)));
  };
  const auto pv_remote = [&](const wg::DescBase& p, const wg::DescBase& v) {
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg::mma_m64n256_kt(o, p.at(mlawg::pv_a_off(kk)), v.at(mlawg::pv_b_off(kk, w, 0)));
  };
  const auto fence_o = [&] {
#pragma unroll
    for (int i = 0; i < 128; ++i) wg::reg_fence(o[i]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) wg::reg_fence(pa[kk][i]);
  };

  // The first pair's scores: WG 0 tile A on stage 0, WG 1 tile B on stage 1. Every region that issues
  // wgmma waits for all of it before it ends, and each pair below is one of four compile-time forms
  // with no wgmma under a run-time condition: otherwise ptxas serializes every wgmma of the kernel
  // (advisory C7520).
  {
    const int t0 = begin + w * kTok;
    if (t0 < end) {
      zero_short_tile(w ? stage1 : stage0, w ? bars1 : bars0, 0, t0, end, ti, w);
      score_chunks<0, kDimAtoms, true>(s, q_desc, w ? k1_desc : k0_desc, w ? bars1 : bars0, 0);
      parity = 1;
      wg::wait<0>();
    }
  }

  // kB: tile B exists; kNextA / kNextB: tiles A + 2 / B + 2 exist (kNextB implies kNextA implies kB).
  const auto wg0_pair = [&]<bool kB, bool kNextA, bool kNextB>(int tA) {
    const int tB = tA + kTok;
    float x0, x1;
    finish_scores(tA, x0, x1);
    const float m0 = max_s[r0], m1 = max_s[r1];
    const float mn0 = next_max(m0, x0), mn1 = next_max(m1, x1);
    const float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);
    __syncwarp();  // the quad's reads of the running max come before its update
    if (t4 == 0) {
      max_s[r0] = mn0;
      max_s[r1] = mn1;
      scale_a[r0] = c0;
      scale_a[r1] = c1;
    }
    float sum0, sum1;
    exp2_rows<64>(s, mn0, mn1, sum0, sum1);
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
    pack_p(pa, s);
    arrive(kScaleA);
    rescale(c0, c1);
    pv_local(v0_desc);
    wg::commit();
    sync(kScaleB);  // WG 1's m_B and c_B (1 without a tile B)
    const float d0 = scale_b[r0], d1 = scale_b[r1];
    store_p_scaled(st0 + kRopeOff, s, d0, d1, wq, lane);  // pa is still the local product's operand
    wg::fence_proxy_async();  // P_A stores -> async proxy
    arrive(kPa);
    wg::wait<0>();  // P_A V_A,L is done: stage 0's dims 0..255 are free
    fence_o();
    if (kNextA && ti < 32) issue_chunks<0, 4>(st0, bars0, kv_map, a, pages, tA + 2 * kTok, end, page_shift, box_rows);
    if constexpr (kB) {
      sync(kPb);  // P_B is in stage 1's rope chunk
      rescale(d0, d1);
      l0 *= d0;
      l1 *= d1;
      pv_remote(p1_desc, v1_desc);
      wg::commit();
    }
    if constexpr (kNextA) {
      zero_short_tile(stage0, bars0, parity, tA + 2 * kTok, end, ti, w);
      score_chunks<0, 4, true>(s, q_desc, k0_desc, bars0, parity);
      wg::wait<4>();  // P_B V_B,L is done: stage 1's dims 0..255 and rope chunk are free
    } else {
      wg::wait<0>();
    }
    if (kNextB && ti < 32) {
      issue_chunks<0, 4>(st1, bars1, kv_map, a, pages, tB + 2 * kTok, end, page_shift, box_rows);
      issue_chunks<8, 9>(st1, bars1, kv_map, a, pages, tB + 2 * kTok, end, page_shift, box_rows);
    }
    if constexpr (kNextA) {
      score_chunks<4, kDimAtoms, false>(s, q_desc, k0_desc, bars0, parity);
      parity ^= 1u;
    }
    wg::wait<0>();
    fence_o();
  };
  const auto wg1_pair = [&]<bool kB, bool kNextA, bool kNextB>(int tA) {
    const int tB = tA + kTok;
    float x0 = -INFINITY, x1 = -INFINITY;
    if constexpr (kB) finish_scores(tB, x0, x1);
    sync(kScaleA);  // m_A and c_A
    const float ma0 = max_s[r0], ma1 = max_s[r1];
    const float c0 = scale_a[r0], c1 = scale_a[r1];
    const float mn0 = kB ? next_max(ma0, x0) : ma0, mn1 = kB ? next_max(ma1, x1) : ma1;
    const float d0 = fast_exp2(ma0 - mn0), d1 = fast_exp2(ma1 - mn1);
    __syncwarp();
    if (t4 == 0) {
      max_s[r0] = mn0;
      max_s[r1] = mn1;
      scale_b[r0] = d0;
      scale_b[r1] = d1;
    }
    arrive(kScaleB);
    float sum0 = 0.f, sum1 = 0.f;
    if constexpr (kB) exp2_rows<64>(s, mn0, mn1, sum0, sum1);
    l0 = l0 * c0 * d0 + sum0;
    l1 = l1 * c1 * d1 + sum1;
    rescale(c0 * d0, c1 * d1);
    if constexpr (kB) {
      pack_p(pa, s);
      store_p(st1 + kRopeOff, pa, wq, lane);
      wg::fence_proxy_async();  // P_B stores -> async proxy
      arrive(kPb);
      pv_local(v1_desc);
      wg::commit();
    }
    sync(kPa);  // P_A c_B is in stage 0's rope chunk
    pv_remote(p0_desc, v0_desc);
    wg::commit();
    if constexpr (kB) {
      wg::wait<1>();  // P_B V_B,R is done: stage 1's dims 256..511 are free
      if (kNextB && ti < 32)
        issue_chunks<4, 8>(st1, bars1, kv_map, a, pages, tB + 2 * kTok, end, page_shift, box_rows);
    }
    wg::wait<0>();  // P_A V_A,R is done: stage 0's dims 256..575 are free
    fence_o();
    if (kNextA && ti < 32)
      issue_chunks<4, kDimAtoms>(st0, bars0, kv_map, a, pages, tA + 2 * kTok, end, page_shift, box_rows);
    if constexpr (kNextB) {
      zero_short_tile(stage1, bars1, parity, tB + 2 * kTok, end, ti, w);
      score_chunks<4, 8, true>(s, q_desc, k1_desc, bars1, parity);
      score_chunks<0, 4, false>(s, q_desc, k1_desc, bars1, parity);
      score_chunks<8, kDimAtoms, false>(s, q_desc, k1_desc, bars1, parity);
      parity ^= 1u;
      wg::wait<0>();
    }
  };
  const auto pair = [&]<bool kB, bool kNextA, bool kNextB>(int tA) {
    if (w == 0) wg0_pair.template operator()<kB, kNextA, kNextB>(tA);
    else wg1_pair.template operator()<kB, kNextA, kNextB>(tA);
  };

  int tA = begin;
  for (; tA + 3 * kTok < end; tA += 2 * kTok) pair.template operator()<true, true, true>(tA);
  if (tA + 2 * kTok < end) {
    pair.template operator()<true, true, false>(tA);
    tA += 2 * kTok;
  }
  if (tA + kTok < end) pair.template operator()<true, false, false>(tA);
  else if (tA < end) pair.template operator()<false, false, false>(tA);

  // Row sums (both warpgroups end on the same running max).
  block_row_sums(l0, l1, sums_s, w, t4, r0);
  store_rows64(a, part_o, part_lse, o, h0, r0, w, t4, sums_s[r0], sums_s[r1], max_s[r0], max_s[r1], blockIdx.y,
               gridDim.y);
}

}  // namespace k3::cuda::mla_halves
