// A 32-head block of the Hopper MLA decode kernel (mla_decode_wgmma.cu) in transposed form, so that a
// head count that is not a multiple of 64 (K3's 96 = 64 + 32) runs no padded tensor work: the
// 64-head form's M = 64 rows are heads, and its second group of 96 heads is half empty (1.33x the
// useful work); here the heads are the N = 32 of the instruction and the M = 64 rows are tokens
// (scores) or latent dims (output).
//
// Per 64-token KV tile, all in one warpgroup:
//   Sᵀ[64 tokens x 32 heads] = K Qᵀ: 36 wgmma m64n32k16 over the 576 dims (A = the staged cache rows,
//      B = Q, both K-major; 16 fp32 registers per thread).
//   softmax per head = per column, over the tile's 64 rows: each thread's 2 rows, the 8 row groups
//      of a warp by shuffles, the 4 warps through shared memory (a warpgroup barrier).
//   Pᵀ (bf16) to shared memory as [32 heads][64 tokens] K-major, the running Oᵀ rescaled per column.
//   Oᵀ[512 dims x 32 heads] += Vᵀ Pᵀ: 8 dim tiles x 4 token steps of m64n32k16 with A = Vᵀ read
//      MN-major from the same staged rows (V = the first 512 dims of each row) and B = Pᵀ
//      (8 x 16 = 128 fp32 registers per thread).
// The two warpgroups work independently on alternate tiles (warpgroup w: tiles w, w + 2, ...), each
// with its own stage, mbarrier, running max and Oᵀ, as two splits of the context inside one block:
// no block barrier inside the loop, so one warpgroup's softmax and loads overlap the other's tensor
// work. At the end the two partial results are merged by their maxima and sums (warpgroup 1 hands
// its scaled Oᵀ to warpgroup 0 through the freed stage memory).
//
// Shared memory (offsets from the block's 1024-byte aligned base):
//   Q     [9 dim chunks][4 head groups] atoms       36 KiB
//   KV    2 stages (one per warpgroup), 72 KiB each (mla_decode_tiles.cuh)
//   P     2 x [1 token chunk][4 head groups] atoms  2 x 4 KiB
//   red   2 x 4 warps x 32 heads floats (column maxima; at the end the sums and maxima of the merge)
//   bars  2 mbarriers
#pragma once
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::mla_t32 {

using namespace mla_tiles;

constexpr int kHeads = 32;
constexpr int kHeadGroups = kHeads / 8;
constexpr int kQBytes = kDimAtoms * kHeadGroups * wg::kAtomBytes;  // 36864
constexpr int kPBytes = kHeadGroups * wg::kAtomBytes;              // 4096
constexpr int kRedFloats = 4 * kHeads;                             // per warpgroup
constexpr int kKvOff = kQBytes;
constexpr int kPOff = kKvOff + 2 * kTileBytes;
constexpr int kRedOff = kPOff + 2 * kPBytes;
constexpr int kBarOff = kRedOff + 2 * kRedFloats * 4 + 2 * kHeads * 4;
constexpr int kSmemFromBase = kBarOff + 2 * 8;
static_assert(kQBytes % wg::kAtomBytes == 0 && kPOff % wg::kAtomBytes == 0, "atoms stay 1024-byte aligned");
static_assert(8 * 16 * 128 * 4 <= kTileBytes, "warpgroup 1's Oᵀ (8 x 16 floats per thread) fits in one freed stage");

using transposed::p_offset;
using transposed::pv_a_off;
using transposed::pv_b_off;
using transposed::s_a_off;
__device__ __forceinline__ uint32_t s_b_off(int ks) { return transposed::s_b_off<kHeadGroups>(ks); }

// Barrier of warpgroup w's 128 threads (ids 1 and 2; 0 is __syncthreads).
__device__ __forceinline__ void wg_sync(int w) { bar_sync<128>(1 + w); }

// Heads [h0, h0 + 32) of request blockIdx.z, split blockIdx.y; 256 threads; `base` is the block's
// 1024-byte aligned shared memory (kSmemFromBase bytes) at shared address base_addr.
__device__ __forceinline__ void block(const MlaDecodeArgs& a, int tokens_per_split, float* part_o, float* part_lse,
                                      const CUtensorMap* kv_map, int box_rows, int h0, unsigned char* base,
                                      uint32_t base_addr) {
  const int split = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 7, ti = tid & 127;
  const int wq = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const auto [begin, end, pages, page_shift] = split_rows(a, tokens_per_split);
  const uint32_t q_addr = base_addr, stage_addr = base_addr + kKvOff + w * kTileBytes;
  const uint32_t p_addr = base_addr + kPOff + w * kPBytes, bar0 = base_addr + kBarOff, bar = bar0 + 8 * w;
  unsigned char* stage = base + kKvOff + w * kTileBytes;
  unsigned char* p_s = base + kPOff + w * kPBytes;
  float* red = reinterpret_cast<float*>(base + kRedOff) + w * kRedFloats;

  // Both warpgroups' first tiles go in flight before Q is staged, so the latencies overlap.
  if (tid < 32) {
    if (tid == 0) {
      mbar_init(bar0);
      mbar_init(bar0 + 8);
    }
    __syncwarp();
    for (int s = 0; s < 2; ++s)
      if (begin + s * kTok < end)
        issue_tile_tma(base_addr + kKvOff + s * kTileBytes, bar0 + 8 * s, kv_map, a, pages, begin + s * kTok, end,
                       page_shift, box_rows);
  }
  stage_q<kHeads>(base, a, b, h0, tid, 256);
  wg::fence_proxy_async();  // Q stores -> async proxy
  __syncthreads();          // Q is staged and the mbarriers exist

  const float sl2 = a.scale * kLog2e;  // scores in log2 units
  const float slack = a.wgmma_lazy_rescale ? 8.f : 0.f;
  // Column c = 2j + e' of this thread is head 8j + 2 t4 + e' (j = 0..3, e' = 0..1).
  float o[8][16];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int r = 0; r < 16; ++r) o[i][r] = 0.f;
  float m[8], l[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    m[c] = -INFINITY;
    l[c] = 0.f;  // this thread's share (its two tokens per tile)
  }

  uint32_t phase = 0;
  for (int t0 = begin + w * kTok; t0 < end; t0 += 2 * kTok) {
    mbar_wait(bar, phase);
    phase ^= 1u;
    if (end - t0 < kTok) {
      zero_tail(stage, end - t0, ti, 128);
      wg::fence_proxy_async();
      wg_sync(w);
    }
    // Sᵀ: s[4j + e] is token t0 + 16 wq + g + 8 (e >> 1), head 8j + 2 t4 + (e & 1).
    float s[16];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kDk / 16; ++ks)
      wg::mma_m64n32<0, 0>(s, wg::make_desc(stage_addr + s_a_off(ks)), wg::make_desc(q_addr + s_b_off(ks)), ks > 0);
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int r = 0; r < 16; ++r) wg::reg_fence(s[r]);

    const int tok = t0 + 16 * wq + g;
    const bool ok0 = tok < end, ok1 = tok + 8 < end;
    float cm[8];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v0 = ok0 ? s[4 * j + e] * sl2 : -INFINITY, v1 = ok1 ? s[4 * j + 2 + e] * sl2 : -INFINITY;
        s[4 * j + e] = v0;
        s[4 * j + 2 + e] = v1;
        cm[2 * j + e] = fmaxf(v0, v1);
      }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      cm[c] = fmaxf(cm[c], __shfl_xor_sync(0xffffffffu, cm[c], 4));
      cm[c] = fmaxf(cm[c], __shfl_xor_sync(0xffffffffu, cm[c], 8));
      cm[c] = fmaxf(cm[c], __shfl_xor_sync(0xffffffffu, cm[c], 16));
    }
    if (g == 0)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) red[wq * kHeads + 8 * j + 2 * t4 + e] = cm[2 * j + e];
    wg_sync(w);
    // Token t0 < end is warp 0's row 0, so every column's tile max is finite and corr = 2^(-inf) = 0
    // on the first tile. The lazy max as in the 64-head form: it moves only past m + slack.
    float corr[8];
    bool moved = false;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * t4 + e, c = 2 * j + e;
        const float x = fmaxf(fmaxf(red[n], red[kHeads + n]), fmaxf(red[2 * kHeads + n], red[3 * kHeads + n]));
        const float mn = x > m[c] + slack ? x : m[c];
        moved |= mn != m[c];
        corr[c] = fast_exp2(m[c] - mn);
        m[c] = mn;
        l[c] *= corr[c];
        const float p0 = fast_exp2(s[4 * j + e] - mn), p1 = fast_exp2(s[4 * j + 2 + e] - mn);
        l[c] += p0 + p1;
        const int k = 16 * wq + g;
        *reinterpret_cast<__nv_bfloat16*>(p_s + p_offset(n, k)) = __float2bfloat16_rn(p0);
        *reinterpret_cast<__nv_bfloat16*>(p_s + p_offset(n, k + 8)) = __float2bfloat16_rn(p1);
      }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][4 * j + e] *= corr[2 * j + (e & 1)];
    }
    wg::fence_proxy_async();  // Pᵀ stores -> async proxy
    wg_sync(w);               // Pᵀ of the four warps is written

    wg::fence();
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk)
        wg::mma_m64n32<1, 0>(o[i], wg::make_desc(stage_addr + pv_a_off(i, kk)), wg::make_desc(p_addr + pv_b_off(kk)));
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int r = 0; r < 16; ++r) wg::reg_fence(o[i][r]);
    wg_sync(w);  // every warp's products have read the stage and Pᵀ: the stage may be refilled
    const int tn = t0 + 2 * kTok;
    if (tn < end && ti < 32) issue_tile_tma(stage_addr, bar, kv_map, a, pages, tn, end, page_shift, box_rows);
  }

  // Merge the two warpgroups: sums over the 8 row groups of each warp, then over warps and
  // warpgroups through shared memory; maxima are the same in every thread of a warpgroup.
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 4);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 8);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 16);
  }
  __syncthreads();  // both warpgroups are done with their stages, Pᵀ and red
  float* sums = reinterpret_cast<float*>(base + kRedOff);  // [2 warpgroups][4 warps][32 heads]
  float* maxes = sums + 2 * kRedFloats;                   // [2 warpgroups][32 heads]
  if (g == 0)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * t4 + e;
        sums[w * kRedFloats + wq * kHeads + n] = l[2 * j + e];
        if (wq == 0) maxes[w * kHeads + n] = m[2 * j + e];
      }
  __syncthreads();
  float f_mine[8], inv[8], lse[8];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = 8 * j + 2 * t4 + e, c = 2 * j + e;
      const float m0 = maxes[n], m1 = maxes[kHeads + n], M = fmaxf(m0, m1);
      float L0 = 0.f, L1 = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        L0 += sums[q * kHeads + n];
        L1 += sums[kRedFloats + q * kHeads + n];
      }
      // A warpgroup that saw no token has m = -inf and L = 0; neither did any: M = -inf, o = 0.
      const float f0 = M == -INFINITY ? 0.f : fast_exp2(m0 - M), f1 = M == -INFINITY ? 0.f : fast_exp2(m1 - M);
      const float L = f0 * L0 + f1 * L1;
      f_mine[c] = w == 0 ? f0 : f1;
      inv[c] = L > 0.f ? 1.f / L : 0.f;
      lse[c] = L > 0.f ? (M + __log2f(L)) * kLn2 : -INFINITY;
    }
  float* handed = reinterpret_cast<float*>(base + kKvOff);  // warpgroup 1's scaled Oᵀ, 64 KiB
  if (w == 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int r = 0; r < 16; ++r) handed[(i * 16 + r) * 128 + ti] = o[i][r] * f_mine[2 * (r >> 2) + (r & 1)];
  }
  __syncthreads();
  if (w == 1) return;
  const int splits = gridDim.y;
  const int64_t row0 = (splits == 1 ? 0 : int64_t(split) * a.B * a.H) + int64_t(b) * a.H + h0;
  const bool to_bf16 = splits == 1 && a.o.bf16;
  float* out = splits == 1 ? static_cast<float*>(a.o.p) : part_o;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int c = 2 * (r >> 2) + (r & 1), n = 8 * (r >> 2) + 2 * t4 + (r & 1);
      if (h0 + n >= a.H) continue;
      const float v = (o[i][r] * f_mine[c] + handed[(i * 16 + r) * 128 + ti]) * inv[c];
      const int64_t at = (row0 + n) * kR + 64 * i + 16 * wq + g + 8 * ((r >> 1) & 1);
      if (to_bf16) static_cast<__nv_bfloat16*>(a.o.p)[at] = __float2bfloat16_rn(v);
      else out[at] = v;
    }
  if (wq == 0 && g == 0) {
    float* lse_out = splits == 1 ? a.lse : part_lse;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * t4 + e;
        if (h0 + n < a.H) lse_out[row0 + n] = lse[2 * j + e];
      }
  }
}

}  // namespace k3::cuda::mla_t32
