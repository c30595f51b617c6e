// A 64-head block of the Hopper MLA decode kernel (mla_decode_wgmma.cu) whose two warpgroups work in
// a seesaw over pairs of KV tiles instead of in lockstep on one: the 64-head form splits every tile's
// scores between the warpgroups and meets at two block barriers per tile (row max, P), so the tensor
// cores wait while both do the softmax. Here, for tiles A = 2i and B = 2i + 1:
//   WG 0: S_A = Q K_Aᵀ (36 m64n64k16, all 64 tokens) -> m_A = max(m, rowmax S_A), P_A, the row
//         scale 2^(m - m_A); P_A into the stage's rope chunk, m_A and the scale into shared memory;
//         "A ready". O_L (dims 0..255) rescaled, += P_A V_A. Waits "B ready": O_L rescaled by B's
//         scale, += P_B V_B.
//   WG 1: S_B = Q K_Bᵀ, computed while WG 0 computes S_A; waits "A ready"; m_B = max(m_A, rowmax
//         S_B), P_B into B's rope chunk, "B ready". O_R (dims 256..511) rescaled by A's scale,
//         += P_A V_A, rescaled by B's, += P_B V_B.
// So one warpgroup's softmax runs while the other's products keep the tensor cores busy; and each
// warpgroup issues P_A V_A before it waits for B (WG 0) or computes B's softmax (WG 1). The running
// max is shared: after a pair it is m_B, which WG 0 reads before its next tile. Each warpgroup
// keeps the row sums of its own tiles' P, rescaled by both scales; they are added at the end.
// A rope chunk (dims 512..575 of the 64 cached rows, 8 KiB) is read only by S, so once S of a
// tile is done it holds that tile's P (64 heads x 64 tokens bf16, the same 8 atoms): no P buffer.
// A stage is refilled when both warpgroups are done with it (an mbarrier of 2 arrivals); warp 0
// refills stage A, warp 4 stage B. Named barriers 1 ("A ready") and 2 ("B ready") hand P and the
// maxima from one warpgroup to the other (bar.arrive by the producer, bar.sync by the consumer).
// With an odd tile count the last pair has no B: WG 1 then only adds P_A V_A.
// The seesaw waits for its rows: with every request's rows kept in L2 it runs 14-29 % faster
// (k3-bench's "_l2hot" rows). Measured on the H200 and not kept, since none of them shortened that
// wait: L2 prefetch of the tiles 2-6 ahead, the two head groups of a request sharing every tile by
// multicast loads (a cluster of two, each block issuing half the boxes), and the refills' page ids
// read from shared memory instead of the block table; nor did staggering the pair (WG 1 computing
// S_B after issuing P_A V_A, stage A released right after), which lost more by running S_A and S_B
// one after the other than it gained (docs/PERF.md).
#pragma once
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mla_wgmma_layout.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::mla_seesaw {

using namespace mla_tiles;

constexpr int kHeads = 64;
constexpr int kQBytes = mlawg::kOperandBytes;  // 73728
constexpr int kKvOff = kQBytes;
constexpr int kRopeOff = 8 * 8 * wg::kAtomBytes;  // the rope chunk inside a stage
constexpr int kRowsOff = kKvOff + 2 * kTileBytes;  // floats: scale[2][64], max[2][64], sums[64]
constexpr int kBarOff = kRowsOff + 5 * kHeads * 4;
constexpr int kSmemFromBase = kBarOff + 4 * 8;  // full[2], empty[2]

// Heads [h0, h0 + 64) of request blockIdx.z, splits [blockIdx.y · per_block, + per_block) of `splits`, one
// after the other (MlaDecodePlan::splits_per_block: each split's partial is what a block of its own would
// write; per_block > 1 needs splits of an even tile count, so that no pair straddles two); 256 threads.
__device__ __forceinline__ void block(const MlaDecodeArgs& a, int tokens_per_split, int per_block, int splits,
                                      float* part_o, float* part_lse, const CUtensorMap* kv_map, int box_rows, int h0,
                                      unsigned char* base, uint32_t base_addr) {
  const int b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 7, ti = tid & 127;
  const int wq = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g, r1 = r0 + 8;
  const SplitRows rows = split_rows(a, tokens_per_split, per_block);  // the pipeline runs through all of them
  const int end = rows.end;
  const uint32_t q_addr = base_addr, kv_addr = base_addr + kKvOff;
  float* scale_s = reinterpret_cast<float*>(base + kRowsOff);  // [2][64]: A's, B's row scale
  float* max_s = scale_s + 2 * kHeads;                          // [2][64]: m_A, m_B
  float* sums_s = max_s + 2 * kHeads;                           // [64]: WG 1's row sums
  const PairStages stages{kv_addr, base_addr + kBarOff, base_addr + kBarOff + 16, kv_map, box_rows};
  const uint32_t full0 = stages.full0;
  if (tid < 32) stages.start(a, rows);
  stage_q<kHeads>(base, a, b, h0, tid, 256);
  wg::fence_proxy_async();  // Q stores -> async proxy
  __syncthreads();          // Q is staged and the mbarriers exist

  const float sl2 = a.scale * kLog2e;
  const float slack = a.wgmma_lazy_rescale ? 8.f : 0.f;
  float o[128];  // this warpgroup's m64n256 accumulator: dims 256 w + 64 (j / 8)...
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows r0, r1 (the same in both warpgroups)
  float l0 = 0.f, l1 = 0.f;              // this thread's share of the row sums of its warpgroup's tiles
  uint32_t full_phase = 0, empty_phase = 0;  // bit s: parity of the next completion of stage s

  const auto rescale = [&](float c0, float c1) { rescale_rows(o, c0, c1); };
  // O += P V for the stage at kt (whose rope chunk holds P), this warpgroup's 256 dims: issued here,
  // waited for by pv_wait, so the softmax of the other tile can run while the products do.
  const auto pv_issue = [&](uint32_t kt) {
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kTok / 16; ++kk)
      wg::mma_m64n256_kt(o, wg::make_desc(kt + kRopeOff + mlawg::pv_a_off(kk)),
                         wg::make_desc(kt + mlawg::pv_b_off(kk, w, 0), 8 * wg::kAtomBytes, wg::kAtomBytes));
    wg::commit();
  };
  const auto pv_wait = [&] {
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) wg::reg_fence(o[i]);
  };
  // Scores of this warpgroup's tile at stage kt, tokens [t0, t0 + 64): s[4j + e] is row r0 + 8 (e >> 1),
  // token t0 + 8j + 2 t4 + (e & 1), scaled to log2 units, -inf past `end`; returns the row maxima.
  float s[32];
  // Waits for the stage (its mbarrier `bar`, phase parity `parity`) first. (One mbarrier per dim
  // chunk, each waited for before its four k steps, measured 20-27 % slower on the H200.)
  const auto scores = [&](uint32_t kt, unsigned char* stage, uint32_t bar, uint32_t parity, int t0, float& x0,
                          float& x1) {
    await_tile(bar, parity, stage, end - t0, ti, w);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kDk / 16; ++ks)
      wg::mma_m64n64<0>(s, wg::make_desc(q_addr + mlawg::s_a_off(ks)), wg::make_desc(kt + mlawg::s_a_off(ks)), ks > 0);
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) wg::reg_fence(s[i]);
    scale_mask_rowmax<64>(s, t0, end, t4, sl2, x0, x1);
    wg_sync(w);  // every warp's products have read the rope chunk that P is written into next
  };
  // P = 2^(s - m) as bf16 into the stage's rope chunk (S has read it); returns the rows' sums.
  const auto write_p = [&](unsigned char* stage, float mn0, float mn1, float& sum0, float& sum1) {
    unsigned char* p = stage + kRopeOff;
    sum0 = 0.f;
    sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = fast_exp2(s[4 * j] - mn0), p1 = fast_exp2(s[4 * j + 1] - mn0);
      const float p2 = fast_exp2(s[4 * j + 2] - mn1), p3 = fast_exp2(s[4 * j + 3] - mn1);
      sum0 += p0 + p1;
      sum1 += p2 + p3;
      const int col = 8 * j + 2 * t4;
      *reinterpret_cast<uint32_t*>(p + wg::op_offset(r0, col >> 3) + (col & 7) * 2) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(p + wg::op_offset(r1, col >> 3) + (col & 7) * 2) = pack_bf16(p2, p3);
    }
    wg::fence_proxy_async();  // P stores -> async proxy
  };
  // The lazy running max (mla_decode_wgmma.cu): moves only past m + slack.
  const auto next_max = [&](float m, float x) { return x > m + slack ? x : m; };
  // Done with stage st: the refilling warp waits for both warpgroups and loads the tile two ahead.
  const auto release = [&](int st, int t_next) { stages.release(st, t_next, w, ti, empty_phase, a, rows); };

  const int first = int(blockIdx.y) * per_block, last = min(splits, first + per_block);
  for (int split = first; split < last; ++split) {
    const int split_end = min(end, (split + 1) * tokens_per_split);
    for (int tA = split * tokens_per_split; tA < split_end; tA += 2 * kTok) {
      const int tB = tA + kTok;
      const bool has_b = tB < split_end;
      const uint32_t ktA = kv_addr, ktB = kv_addr + kTileBytes;
      unsigned char* stA = base + kKvOff;
      unsigned char* stB = stA + kTileBytes;
      if (w == 0) {
        float x0, x1;
        scores(ktA, stA, full0, full_phase & 1u, tA, x0, x1);
        const float mn0 = next_max(m0, x0), mn1 = next_max(m1, x1);
        const float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);
        const bool moved = __any_sync(0xffffffffu, mn0 != m0 || mn1 != m1);
        float sum0, sum1;
        write_p(stA, mn0, mn1, sum0, sum1);
        if (t4 == 0) {
          scale_s[r0] = c0;
          scale_s[r1] = c1;
          max_s[r0] = mn0;
          max_s[r1] = mn1;
        }
        m0 = mn0;
        m1 = mn1;
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
        wg_sync(0);  // P_A of all four warps is in shared memory before either warpgroup's products read it
        arrive(1);   // "A ready"
        if (moved) rescale(c0, c1);
        pv_issue(ktA);
        if (has_b) {
          sync(2);  // "B ready": P_B, B's scale and m_B (while P_A V_A runs)
          const float d0 = scale_s[kHeads + r0], d1 = scale_s[kHeads + r1];
          const float nm0 = max_s[kHeads + r0], nm1 = max_s[kHeads + r1];
          pv_wait();
          release(0, tA + 2 * kTok);
          if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) rescale(d0, d1);
          l0 *= d0;
          l1 *= d1;
          m0 = nm0;
          m1 = nm1;
          pv_issue(ktB);
          pv_wait();
          release(1, tB + 2 * kTok);
        } else {
          pv_wait();
          release(0, tA + 2 * kTok);
        }
      } else {
        float x0 = -INFINITY, x1 = -INFINITY;
        if (has_b) {
          scores(ktB, stB, full0 + 8, (full_phase >> 1) & 1u, tB, x0, x1);
        }
        sync(1);  // "A ready": P_A, A's scale and m_A
        const float c0 = scale_s[r0], c1 = scale_s[r1];
        const float ma0 = max_s[r0], ma1 = max_s[r1];
        l0 *= c0;
        l1 *= c1;
        if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) rescale(c0, c1);
        pv_issue(ktA);  // runs while this warpgroup does B's softmax
        if (has_b) {
          const float mn0 = next_max(ma0, x0), mn1 = next_max(ma1, x1);
          const float d0 = fast_exp2(ma0 - mn0), d1 = fast_exp2(ma1 - mn1);
          float sum0, sum1;
          write_p(stB, mn0, mn1, sum0, sum1);
          if (t4 == 0) {
            scale_s[kHeads + r0] = d0;
            scale_s[kHeads + r1] = d1;
            max_s[kHeads + r0] = mn0;
            max_s[kHeads + r1] = mn1;
          }
          wg_sync(1);  // P_B of all four warps is in shared memory
          arrive(2);   // "B ready"
          pv_wait();
          release(0, tA + 2 * kTok);
          if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) rescale(d0, d1);
          l0 = l0 * d0 + sum0;
          l1 = l1 * d1 + sum1;
          m0 = mn0;
          m1 = mn1;
          pv_issue(ktB);
          pv_wait();
          release(1, tB + 2 * kTok);
        } else {
          m0 = ma0;
          m1 = ma1;
          pv_wait();
          release(0, tA + 2 * kTok);
        }
      }
      full_phase ^= has_b ? 3u : 1u;
    }

    // Row sums (both warpgroups end on the same running max), the split's result, and a fresh start for
    // the next split (whose first tiles are already on their way).
    block_row_sums(l0, l1, sums_s, w, t4, r0);
    store_rows64(a, part_o, part_lse, o, h0, r0, w, t4, sums_s[r0], sums_s[r1], m0, m1, split, splits);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m0 = m1 = -INFINITY;
    l0 = l1 = 0.f;
  }
}

}  // namespace k3::cuda::mla_seesaw
