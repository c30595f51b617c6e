// A 48-head block of the Hopper MLA decode kernel (mla_decode_wgmma.cu) in transposed form and in a
// seesaw, for head counts that 64-head blocks pad: K3's 96 heads run as two 48-head blocks per
// request instead of two 64-head blocks (the second half empty), so the tensor work is the useful
// work, 3/4 of the padded form's.
//
// Transposed: the heads are the N = 48 of each instruction, the M = 64 rows are tokens (scores) or
// latent dims (output):
//   Sᵀ[64 tokens x 48 heads] = K Qᵀ: 36 wgmma m64n48k16 over the 576 dims (A = the staged cache
//      rows, B = Q, both K-major; 24 fp32 registers per thread).
//   softmax per head = per column over the tile's 64 rows: each thread's 2 rows, the 8 row groups of a
//      warp by shuffles, the 4 warps through shared memory (one warpgroup barrier).
//   Pᵀ (bf16, [48 heads][64 tokens], K-major) into the tile's rope chunk, which only Sᵀ reads.
//   Oᵀ[256 dims x 48 heads] += Vᵀ Pᵀ per warpgroup: 4 dim tiles x 4 token steps of m64n48k16, A = Vᵀ
//      read MN-major from the staged rows, B = Pᵀ (4 x 24 = 96 fp32 registers per thread).
// Seesaw (as mla_decode_seesaw.cuh, the 64-head form): tiles come in pairs A = 2i, B = 2i + 1;
//   WG 0: Sᵀ_A -> m_A = max(m, colmax Sᵀ_A), Pᵀ_A, the column scale 2^(m - m_A) -> "A ready";
//         Oᵀ_L (dims 0..255) rescaled, += Vᵀ_A Pᵀ_A; waits "B ready": rescaled by B's scale, += Vᵀ_B Pᵀ_B.
//   WG 1: Sᵀ_B (while WG 0 computes Sᵀ_A); waits "A ready"; Oᵀ_R (dims 256..511) rescaled by A's scale,
//         += Vᵀ_A Pᵀ_A issued; m_B = max(m_A, colmax Sᵀ_B), Pᵀ_B -> "B ready"; then += Vᵀ_B Pᵀ_B.
// so one warpgroup's softmax runs while the other's products keep the tensor cores busy. A stage is
// refilled when both warpgroups are done with it (an mbarrier of two arrivals).
// Why 48 and not 96 heads in one block: Oᵀ of 96 heads is 192 KiB of fp32 accumulators, most of the
// register file; 48 heads hold 96 KiB, as a 64-head block's O holds 128. The two blocks of a request
// read the same cache rows, the second mostly from L2.
//
// Shared memory (offsets from the block's 1024-byte aligned base):
//   Q      [9 dim chunks][6 head groups] atoms      54 KiB
//   KV     2 stages, 72 KiB each (mla_decode_tiles.cuh); Pᵀ of a tile in its rope chunk (6 of 8 atoms)
//   red    [2 warpgroups][4 warps][48] floats: column maxima, at the end the column sums
//   scale  [2][48], max [2][48] floats: A's and B's column scales and maxima
//   bars   full[2], empty[2]
// At the end the stages hold the normalised Oᵀ as rows [48 heads][512 dims] (+ 4 floats of padding
// per row against bank conflicts), written out row by row in full 16-byte pieces.
#pragma once
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mma.cuh"

namespace k3::cuda::mla_t48 {

using namespace mla_tiles;

constexpr int kHeads = 48;
constexpr int kHeadGroups = kHeads / 8;
constexpr int kCols = kHeads / 8 * 2;                              // accumulator columns per thread
constexpr int kQBytes = kDimAtoms * kHeadGroups * wg::kAtomBytes;  // 55296
constexpr int kKvOff = kQBytes;
constexpr int kRopeOff = 8 * 8 * wg::kAtomBytes;  // the rope chunk inside a stage
constexpr int kRedOff = kKvOff + 2 * kTileBytes;
constexpr int kRedFloats = 2 * 4 * kHeads;
constexpr int kScaleOff = kRedOff + kRedFloats * 4;  // floats: scale[2][48], max[2][48]
constexpr int kBarOff = kScaleOff + 4 * kHeads * 4;
constexpr int kSmemFromBase = kBarOff + 4 * 8;
constexpr int kOutStride = kR + 4;  // floats per head row of the staged output
static_assert(kQBytes % wg::kAtomBytes == 0, "stages stay 1024-byte aligned");
static_assert(kHeadGroups <= kTok / 8, "Pᵀ (an atom per head group) fits in the rope chunk (an atom per token group)");
static_assert(kHeads * kOutStride * 4 <= 2 * kTileBytes, "the staged output fits in the two stages");

// Heads [h0, h0 + 48) of request blockIdx.z, split blockIdx.y; 256 threads; `base` is the block's
// 1024-byte aligned shared memory (kSmemFromBase bytes) at shared address base_addr.
__device__ __forceinline__ void block(const MlaDecodeArgs& a, int tokens_per_split, float* part_o, float* part_lse,
                                      const CUtensorMap* kv_map, int box_rows, int h0, unsigned char* base,
                                      uint32_t base_addr) {
  using namespace transposed;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 7, ti = tid & 127;
  const int wq = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const SplitRows rows = split_rows(a, tokens_per_split);
  const int end = rows.end;
  const uint32_t q_addr = base_addr, kv_addr = base_addr + kKvOff;
  float* red = reinterpret_cast<float*>(base + kRedOff);      // [2][4][48]
  float* scale_s = reinterpret_cast<float*>(base + kScaleOff);  // [2][48]: A's, B's column scale
  float* max_s = scale_s + 2 * kHeads;                          // [2][48]: m_A, m_B
  const PairStages stages{kv_addr, base_addr + kBarOff, base_addr + kBarOff + 16, kv_map, box_rows};
  if (tid < 32) stages.start(a, rows);
  stage_q<kHeads>(base, a, blockIdx.z, h0, tid, 256);
  wg::fence_proxy_async();  // Q stores -> async proxy
  __syncthreads();          // Q is staged and the mbarriers exist

  const float sl2 = a.scale * kLog2e;
  const float slack = a.wgmma_lazy_rescale ? 8.f : 0.f;
  // The thread's accumulator column c (0..11), in Sᵀ and in Oᵀ, is head head_of(c); its registers are
  // r = reg_of(c) (row g) and r + 2 (row g + 8) of each 24-register set (wgmma.cuh's layout: d[4j + e]
  // is row g + 8 (e >> 1), column 8j + 2 t4 + (e & 1)).
  const auto head_of = [&](int c) { return 8 * (c >> 1) + 2 * t4 + (c & 1); };
  const auto reg_of = [](int c) { return 4 * (c >> 1) + (c & 1); };
  float o[4][2 * kCols];  // Oᵀ dim tiles 4w..4w+3 of this warpgroup
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int r = 0; r < 2 * kCols; ++r) o[i][r] = 0.f;
  float m[kCols], l[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    m[c] = -INFINITY;
    l[c] = 0.f;  // this thread's share (its two tokens of each of its warpgroup's tiles)
  }
  float s[2 * kCols];
  uint32_t full_phase = 0, empty_phase = 0;

  const auto rescale = [&](const float (&corr)[kCols]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        o[i][reg_of(c)] *= corr[c];
        o[i][reg_of(c) + 2] *= corr[c];
      }
  };
  const auto pv_issue = [&](uint32_t kt) {
    wg::fence();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk)
        wg::mma_m64n48<1, 0>(o[i], wg::make_desc(kt + pv_a_off(4 * w + i, kk)),
                             wg::make_desc(kt + kRopeOff + pv_b_off(kk)));
    wg::commit();
  };
  const auto pv_wait = [&] {
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int r = 0; r < 2 * kCols; ++r) wg::reg_fence(o[i][r]);
  };
  // Scores of this warpgroup's tile at stage kt, tokens [t0, t0 + 64), in log2 units, -inf past `end`;
  // x: the tile's column maxima (every thread of the warpgroup gets its columns'). s[reg_of(c)] is token
  // t0 + 16 wq + g, s[reg_of(c) + 2] token t0 + 16 wq + g + 8.
  const auto scores = [&](uint32_t kt, unsigned char* stage, uint32_t bar, uint32_t parity, int t0,
                          float (&x)[kCols]) {
    await_tile(bar, parity, stage, end - t0, ti, w);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kDk / 16; ++ks)
      wg::mma_m64n48<0, 0>(s, wg::make_desc(kt + s_a_off(ks)), wg::make_desc(q_addr + s_b_off<kHeadGroups>(ks)),
                           ks > 0);
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int r = 0; r < 2 * kCols; ++r) wg::reg_fence(s[r]);
    const int tok = t0 + 16 * wq + g;
    const bool ok0 = tok < end, ok1 = tok + 8 < end;
    float* rw = red + w * 4 * kHeads;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int r = reg_of(c);
      s[r] = ok0 ? s[r] * sl2 : -INFINITY;
      s[r + 2] = ok1 ? s[r + 2] * sl2 : -INFINITY;
      float cm = fmaxf(s[r], s[r + 2]);
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 4));
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
      if (g == 0) rw[wq * kHeads + head_of(c)] = cm;
    }
    wg_sync(w);  // the four warps' maxima are in; also every warp's Sᵀ has read the rope chunk
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int n = head_of(c);
      x[c] = fmaxf(fmaxf(rw[n], rw[kHeads + n]), fmaxf(rw[2 * kHeads + n], rw[3 * kHeads + n]));
    }
  };
  // Pᵀ = 2^(s - mn) as bf16 into the stage's rope chunk; `sum`: the columns' sums of this thread's two
  // tokens.
  const auto write_p = [&](unsigned char* stage, const float (&mn)[kCols], float (&sum)[kCols]) {
    unsigned char* p = stage + kRopeOff;
    const int k = 16 * wq + g;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float p0 = fast_exp2(s[reg_of(c)] - mn[c]), p1 = fast_exp2(s[reg_of(c) + 2] - mn[c]);
      sum[c] = p0 + p1;
      *reinterpret_cast<__nv_bfloat16*>(p + p_offset(head_of(c), k)) = __float2bfloat16_rn(p0);
      *reinterpret_cast<__nv_bfloat16*>(p + p_offset(head_of(c), k + 8)) = __float2bfloat16_rn(p1);
    }
    wg::fence_proxy_async();  // Pᵀ stores -> async proxy
  };
  const auto next_max = [&](float mm, float x) { return x > mm + slack ? x : mm; };
  // A [48] row of shared floats: the thread's columns written by warp 0's g == 0 lanes (which hold all 48
  // between them), or read by every thread.
  const auto put_cols = [&](float* row, const float (&v)[kCols]) {
    if (wq == 0 && g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) row[head_of(c)] = v[c];
  };
  const auto get_cols = [&](const float* row, float (&v)[kCols]) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) v[c] = row[head_of(c)];
  };
  const auto release = [&](int st, int t_next) { stages.release(st, t_next, w, ti, empty_phase, a, rows); };
  const auto any_moved = [&](const float (&corr)[kCols]) {
    bool moved = false;
#pragma unroll
    for (int c = 0; c < kCols; ++c) moved |= corr[c] != 1.f;
    return __any_sync(0xffffffffu, moved);
  };

  for (int tA = rows.begin; tA < end; tA += 2 * kTok) {
    const int tB = tA + kTok;
    const bool has_b = tB < end;
    const uint32_t ktA = kv_addr, ktB = kv_addr + kTileBytes;
    unsigned char* stA = base + kKvOff;
    unsigned char* stB = stA + kTileBytes;
    if (w == 0) {
      float x[kCols], corr[kCols], sum[kCols];
      scores(ktA, stA, stages.full0, full_phase & 1u, tA, x);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float mn = next_max(m[c], x[c]);
        corr[c] = fast_exp2(m[c] - mn);
        m[c] = mn;
      }
      write_p(stA, m, sum);
#pragma unroll
      for (int c = 0; c < kCols; ++c) l[c] = l[c] * corr[c] + sum[c];
      put_cols(scale_s, corr);
      put_cols(max_s, m);
      wg_sync(0);  // Pᵀ_A of all four warps is in shared memory before either warpgroup's products read it
      arrive(1);   // "A ready"
      if (any_moved(corr)) rescale(corr);
      pv_issue(ktA);
      if (has_b) {
        sync(2);  // "B ready": Pᵀ_B, B's scale and m_B (while Vᵀ_A Pᵀ_A runs)
        float d[kCols];
        get_cols(scale_s + kHeads, d);
        get_cols(max_s + kHeads, m);
        pv_wait();
        release(0, tA + 2 * kTok);
        if (any_moved(d)) rescale(d);
#pragma unroll
        for (int c = 0; c < kCols; ++c) l[c] *= d[c];
        pv_issue(ktB);
        pv_wait();
        release(1, tB + 2 * kTok);
      } else {
        pv_wait();
        release(0, tA + 2 * kTok);
      }
    } else {
      float x[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) x[c] = -INFINITY;
      if (has_b) scores(ktB, stB, stages.full0 + 8, (full_phase >> 1) & 1u, tB, x);
      sync(1);  // "A ready": Pᵀ_A, A's scale and m_A
      float c_a[kCols], ma[kCols];
      get_cols(scale_s, c_a);
      get_cols(max_s, ma);
#pragma unroll
      for (int c = 0; c < kCols; ++c) l[c] *= c_a[c];
      if (any_moved(c_a)) rescale(c_a);
      pv_issue(ktA);  // runs while this warpgroup does B's softmax
      if (has_b) {
        float d[kCols], sum[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          m[c] = next_max(ma[c], x[c]);
          d[c] = fast_exp2(ma[c] - m[c]);
        }
        write_p(stB, m, sum);
        put_cols(scale_s + kHeads, d);
        put_cols(max_s + kHeads, m);
        wg_sync(1);  // Pᵀ_B of all four warps is in shared memory
        arrive(2);   // "B ready"
        pv_wait();
        release(0, tA + 2 * kTok);
        if (any_moved(d)) rescale(d);
#pragma unroll
        for (int c = 0; c < kCols; ++c) l[c] = l[c] * d[c] + sum[c];
        pv_issue(ktB);
        pv_wait();
        release(1, tB + 2 * kTok);
      } else {
#pragma unroll
        for (int c = 0; c < kCols; ++c) m[c] = ma[c];
        pv_wait();
        release(0, tA + 2 * kTok);
      }
    }
    full_phase ^= has_b ? 3u : 1u;
  }

  // Column sums: the 8 row groups of a warp, then the 4 warps and 2 warpgroups through shared memory
  // (both warpgroups end on the same running max).
  __syncthreads();  // every stage, Pᵀ and red is done with
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 4);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 8);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 16);
    if (g == 0) red[(w * 4 + wq) * kHeads + head_of(c)] = l[c];
  }
  __syncthreads();
  float inv[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    float L = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) L += red[q * kHeads + head_of(c)];
    inv[c] = L > 0.f ? 1.f / L : 0.f;
    l[c] = L;
  }
  // Normalised Oᵀ into the stages as [head][dim] rows: o[i][reg_of(c) + 2 h] is dim 64 (4w + i) + 16 wq +
  // g + 8 h of head head_of(c).
  float* staged = reinterpret_cast<float*>(base + kKvOff);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        staged[head_of(c) * kOutStride + 64 * (4 * w + i) + 16 * wq + g + 8 * h] = o[i][reg_of(c) + 2 * h] * inv[c];
  const int splits = gridDim.y;
  const int64_t row0 = (splits == 1 ? 0 : int64_t(blockIdx.y) * a.B * a.H) + int64_t(blockIdx.z) * a.H + h0;
  if (w == 0 && wq == 0 && g == 0) {
    float* lse_out = splits == 1 ? a.lse : part_lse;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (h0 + head_of(c) < a.H)
        lse_out[row0 + head_of(c)] = l[c] > 0.f ? (m[c] + __log2f(l[c])) * kLn2 : -INFINITY;
  }
  __syncthreads();
  // Rows out in 16-byte pieces of 4 dims (bf16: 8-byte pieces): 128 pieces per head row.
  const bool to_bf16 = splits == 1 && a.o.bf16;
  float* out = splits == 1 ? static_cast<float*>(a.o.p) : part_o;
  for (int idx = tid; idx < kHeads * (kR / 4); idx += 256) {
    const int n = idx / (kR / 4), d4 = idx % (kR / 4);
    if (h0 + n >= a.H) continue;
    const float4 v = *reinterpret_cast<const float4*>(staged + n * kOutStride + 4 * d4);
    const int64_t at = (row0 + n) * kR + 4 * d4;
    if (to_bf16) {
      auto* ob = static_cast<__nv_bfloat16*>(a.o.p) + at;
      *reinterpret_cast<__nv_bfloat162*>(ob) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(ob + 2) = __floats2bfloat162_rn(v.z, v.w);
    } else {
      *reinterpret_cast<float4*>(out + at) = v;
    }
  }
}

}  // namespace k3::cuda::mla_t48
