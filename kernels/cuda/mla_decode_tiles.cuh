// KV tiles of the Hopper MLA decode kernels (mla_decode_wgmma.cu and its 32-head transposed block,
// mla_decode_t32.cuh): 64 cache rows of 576 bf16 (512 latent + 64 rope dims) in shared memory as
// 128B-swizzle atoms [9 dim chunks][8 token groups] (wgmma.cuh), loaded by the tensor memory
// accelerator, and the few numeric helpers both kernels share.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/fast_exp2.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::mla_tiles {

constexpr int kR = 512, kDr = 64, kDk = kR + kDr;
constexpr int kTok = 64;              // tokens per KV tile (plan_mla_decode splits are multiples of 64)
constexpr int kDimAtoms = kDk / 64;   // 9 dim chunks of 64
constexpr int kChunks = kDk / 8;      // 16-byte chunks per row (72)
constexpr int kTileBytes = kDimAtoms * (kTok / 8) * wg::kAtomBytes;  // 73728

// log2 of the page size when it is a power of two (shift and mask), else -1 (divide).
__device__ __forceinline__ int page_shift_of(int page_size) {
  return (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
}

// Dim chunks [kLo, kHi) of tokens [t0, min(t0 + 64, end)) into the stage at shared address `dst`,
// issued by the 32 lanes of the calling warp: boxes of box_rows rows x 64 dims (box_rows divides the
// page size and 64, so a box never crosses a page), each landing at its rows of its dim chunk already
// swizzled (the copy engine applies the same 128B XOR that wg::op_offset encodes). Counted on the
// mbarrier at `bar`, or with kBarPerChunk chunk c on the one at bar + 8 c. Boxes wholly past `end`
// are not loaded (their page may not exist); the rows past `end` are zeroed by zero_tail once the
// copies are in.
template <int kLo, int kHi, bool kBarPerChunk>
__device__ __forceinline__ void issue_chunks_tma(uint32_t dst, uint32_t bar, const CUtensorMap* map,
                                                 const MlaDecodeArgs& a, const int32_t* pages, int t0, int end,
                                                 int page_shift, int box_rows) {
  constexpr int kChunksHere = kHi - kLo;
  const int lane = threadIdx.x & 31;
  const int row_boxes = (min(kTok, end - t0) + box_rows - 1) / box_rows;
  const uint32_t chunk_bytes = uint32_t(row_boxes * box_rows * wg::kRowBytes);
  if (lane == 0) {
    if constexpr (kBarPerChunk) {
#pragma unroll
      for (int c = kLo; c < kHi; ++c) mbar_expect_tx(bar + 8 * c, chunk_bytes);
    } else {
      mbar_expect_tx(bar, chunk_bytes * kChunksHere);
    }
  }
  __syncwarp();
  for (int k = lane; k < row_boxes * kChunksHere; k += 32) {
    const int rb = k / kChunksHere, c = kLo + k % kChunksHere;
    const int tok = t0 + rb * box_rows;
    const int pg = page_shift >= 0 ? tok >> page_shift : tok / a.page_size;
    const int in_page = page_shift >= 0 ? tok & (a.page_size - 1) : tok - pg * a.page_size;
    tma_load_2d(dst + uint32_t(c * 8 * wg::kAtomBytes + rb * box_rows * wg::kRowBytes), map, c * 64,
                pages[pg] * a.page_size + in_page, kBarPerChunk ? bar + 8 * c : bar);
  }
}
// The whole tile, counted on one mbarrier.
__device__ __forceinline__ void issue_tile_tma(uint32_t dst, uint32_t bar, const CUtensorMap* map,
                                               const MlaDecodeArgs& a, const int32_t* pages, int t0, int end,
                                               int page_shift, int box_rows) {
  issue_chunks_tma<0, kDimAtoms, false>(dst, bar, map, a, pages, t0, end, page_shift, box_rows);
}

// The cache rows of the block at split blockIdx.y of request blockIdx.z: tokens [begin, end) of the
// request (splits tokens_per_split long, the last cut at its length), whose page ids start at
// `pages`; page_shift as page_shift_of.
struct SplitRows {
  int begin, end;
  const int32_t* pages;
  int page_shift;
};
// The rows of this block: splits [blockIdx.y · per_block, + per_block) of request blockIdx.z, cut at its end.
__device__ __forceinline__ SplitRows split_rows(const MlaDecodeArgs& a, int tokens_per_split, int per_block = 1) {
  const int b = blockIdx.z, begin = int(blockIdx.y) * per_block * tokens_per_split;
  return {begin, min(a.seq_lens[b], begin + per_block * tokens_per_split), a.block_table + int64_t(b) * a.max_pages,
          page_shift_of(a.page_size)};
}

// Named barriers of the two-warpgroup seesaw blocks (256 threads; 0 is __syncthreads): hand-overs from
// one warpgroup to the other (bar.arrive by the producer, bar.sync by the consumer), and each warpgroup's
// own barrier (ids 3 and 4).
__device__ __forceinline__ void arrive(int id) { bar_arrive<256>(id); }
__device__ __forceinline__ void sync(int id) { bar_sync<256>(id); }
__device__ __forceinline__ void wg_sync(int w) { bar_sync<128>(3 + w); }

// The two stages of the seesaw blocks (mla_decode_seesaw.cuh, mla_decode_t48.cuh): stage s at kv_addr +
// s kTileBytes has a "full" mbarrier at full0 + 8 s (its tile is in) and an "empty" one at empty0 + 8 s
// (both warpgroups are done with it: two arrivals). Tiles alternate between the stages.
struct PairStages {
  uint32_t kv_addr, full0, empty0;
  const CUtensorMap* map;
  int box_rows;

  // By warp 0: thread 0 makes the four mbarriers, then the warp puts the first two tiles in flight.
  __device__ __forceinline__ void start(const MlaDecodeArgs& a, const SplitRows& rows) const {
    if (threadIdx.x == 0)
      for (int s = 0; s < 2; ++s) {
        mbar_init(full0 + 8 * s);
        mbar_init(empty0 + 8 * s, 2);  // one arrival per warpgroup
      }
    __syncwarp();
    for (int s = 0; s < 2; ++s)
      if (rows.begin + s * kTok < rows.end)
        issue_tile_tma(kv_addr + s * kTileBytes, full0 + 8 * s, map, a, rows.pages, rows.begin + s * kTok, rows.end,
                       rows.page_shift, box_rows);
  }
  // Warpgroup w (ti: this thread's index in it) is done with stage st: one arrival per warpgroup; warp 0
  // of warpgroup st waits for both and loads the tile at t_next into the stage, if it is before the end.
  // empty_phase: bit s is the parity of stage s's next "empty" completion (every thread keeps its own).
  __device__ __forceinline__ void release(int st, int t_next, int w, int ti, uint32_t& empty_phase,
                                          const MlaDecodeArgs& a, const SplitRows& rows) const {
    if (ti == 0) mbar_arrive(empty0 + 8 * st);
    if (w == st && ti < 32 && t_next < rows.end) {
      mbar_wait(empty0 + 8 * st, (empty_phase >> st) & 1u);
      issue_tile_tma(kv_addr + st * kTileBytes, full0 + 8 * st, map, a, rows.pages, t_next, rows.end, rows.page_shift,
                     box_rows);
    }
    empty_phase ^= 1u << st;
  }
};

// Operand placement of the transposed blocks (mla_decode_t32.cuh, mla_decode_t48.cuh), where the heads
// are the N of each instruction: Q is [9 dim chunks][kHeadGroups head groups] atoms, Pᵀ one 64-token row
// per head (atoms by head group).
namespace transposed {
// Byte offset of Pᵀ's element (head n, token k) from Pᵀ's base.
__device__ __forceinline__ uint32_t p_offset(int n, int k) {
  return uint32_t((n >> 3) * wg::kAtomBytes) + wg::sw128_offset(n & 7, k >> 3) + uint32_t((k & 7) * 2);
}
// Sᵀ = K Qᵀ, k16 step ks (dims 16 ks..16 ks+15): A from the stage, B from Q.
__device__ __forceinline__ uint32_t s_a_off(int ks) { return uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32); }
template <int kHeadGroups>
__device__ __forceinline__ uint32_t s_b_off(int ks) {
  return uint32_t((ks >> 2) * kHeadGroups * wg::kAtomBytes + (ks & 3) * 32);
}
// Oᵀ += Vᵀ Pᵀ, dim tile i (dims 64 i..64 i+63), token step kk: A = Vᵀ MN-major from the stage (one atom
// along the dims, two token groups); B = Pᵀ K-major at kk * 32 bytes from its base.
__device__ __forceinline__ uint32_t pv_a_off(int i, int kk) { return uint32_t((8 * i + 2 * kk) * wg::kAtomBytes); }
__device__ __forceinline__ uint32_t pv_b_off(int kk) { return uint32_t(kk * 32); }
}  // namespace transposed

// Byte offset of 16-byte chunk c (0..71) of head row r of a Q operand of kRows heads, K-major atoms
// [c / 8][r / 8] (kRows = 64: wg::op_offset).
template <int kRows>
__device__ __forceinline__ uint32_t q_offset(int r, int c) {
  return uint32_t(((c >> 3) * (kRows / 8) + (r >> 3)) * wg::kAtomBytes) + wg::sw128_offset(r & 7, c & 7);
}

// Q of heads [h0, h0 + kRows) of request b into shared memory at q, by `threads` threads of which
// this is number t; heads >= H are zero rows (scores 0, never written out).
template <int kRows>
__device__ __forceinline__ void stage_q(unsigned char* q, const MlaDecodeArgs& a, int b, int h0, int t, int threads) {
  for (int idx = t; idx < kRows * kChunks; idx += threads) {
    const int r = idx / kChunks, c = idx % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < a.H) {
      const int64_t row = int64_t(b) * a.H + h0 + r;
      v = c < kR / 8 ? *reinterpret_cast<const uint4*>(a.q_lat + row * kR + c * 8)
                     : *reinterpret_cast<const uint4*>(a.q_rope + row * kDr + (c - kR / 8) * 8);
    }
    *reinterpret_cast<uint4*>(q + q_offset<kRows>(r, c)) = v;
  }
}

// The result of a 64-head block for this thread's rows r0 and r0 + 8 (heads h0 + r0, h0 + r0 + 8):
// its warpgroup w's m64n256 accumulator o[4q + e] is row r0 + 8 (e >> 1), column 256 w + 8 q + 2 t4 +
// (e & 1), divided by the row sum L; with one split (of `splits`) into a.o (bf16 or fp32) and a.lse,
// else into the fp32 partials of split `split`. L == 0 only when the split saw no token (an empty
// request or a split past the end): o = 0, lse = -inf. m: the rows' running max in log2 units.
__device__ __forceinline__ void store_rows64(const MlaDecodeArgs& a, float* part_o, float* part_lse, const float* o,
                                             int h0, int r0, int w, int t4, float L0, float L1, float m0, float m1,
                                             int split, int splits) {
  const float inv0 = L0 > 0.f ? 1.f / L0 : 0.f, inv1 = L1 > 0.f ? 1.f / L1 : 0.f;
  const int hA = h0 + r0, hB = hA + 8;
  const int64_t rowA = (splits == 1 ? 0 : int64_t(split) * a.B * a.H) + int64_t(blockIdx.z) * a.H + hA;
  const int64_t rowB = rowA + 8;
  const int colw = 256 * w + 2 * t4;
  if (splits == 1 && a.o.bf16) {
    auto* out = static_cast<__nv_bfloat16*>(a.o.p);
#pragma unroll
    for (int q = 0; q < 32; ++q) {
      const int col = colw + 8 * q;
      if (hA < a.H) *reinterpret_cast<__nv_bfloat162*>(out + rowA * kR + col) =
          __floats2bfloat162_rn(o[4 * q] * inv0, o[4 * q + 1] * inv0);
      if (hB < a.H) *reinterpret_cast<__nv_bfloat162*>(out + rowB * kR + col) =
          __floats2bfloat162_rn(o[4 * q + 2] * inv1, o[4 * q + 3] * inv1);
    }
  } else {
    float* out = splits == 1 ? static_cast<float*>(a.o.p) : part_o;
#pragma unroll
    for (int q = 0; q < 32; ++q) {
      const int col = colw + 8 * q;
      if (hA < a.H) *reinterpret_cast<float2*>(out + rowA * kR + col) = make_float2(o[4 * q] * inv0, o[4 * q + 1] * inv0);
      if (hB < a.H) *reinterpret_cast<float2*>(out + rowB * kR + col) =
          make_float2(o[4 * q + 2] * inv1, o[4 * q + 3] * inv1);
    }
  }
  if (w == 0 && t4 == 0) {
    float* lse_out = splits == 1 ? a.lse : part_lse;
    if (hA < a.H) lse_out[rowA] = L0 > 0.f ? (m0 + __log2f(L0)) * kLn2 : -INFINITY;
    if (hB < a.H) lse_out[rowB] = L1 > 0.f ? (m1 + __log2f(L1)) * kLn2 : -INFINITY;
  }
}

// Scores of 64 heads x kN tokens in the m64nN accumulator layout (s[4 j + e]: row r0 + 8 (e >> 1),
// token t0 + 8 j + 2 t4 + (e & 1)) scaled to log2 units (sl2), -inf past `end`, in place; x0 / x1: the
// maxima of this thread's two rows over those tokens (reduced over the quad that holds each row).
template <int kN>
__device__ __forceinline__ void scale_mask_rowmax(float (&s)[kN / 2], int t0, int end, int t4, float sl2, float& x0,
                                                  float& x1) {
  x0 = -INFINITY;
  x1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = t0 + 8 * j + 2 * t4 + (e & 1) < end ? s[4 * j + e] * sl2 : -INFINITY;
      s[4 * j + e] = v;
      if (e < 2) x0 = fmaxf(x0, v);
      else x1 = fmaxf(x1, v);
    }
  x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
  x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
  x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
  x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
}

// P = 2^(s - m) in place for scores of kN tokens in the m64nN accumulator layout (s[4 j + e]: row r0 +
// 8 (e >> 1)), m0 / m1 the rows' running max; sum0 / sum1: this thread's share of the rows' sums.
template <int kN>
__device__ __forceinline__ void exp2_rows(float (&s)[kN / 2], float m0, float m1, float& sum0, float& sum1) {
  sum0 = 0.f;
  sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    s[4 * j] = fast_exp2(s[4 * j] - m0);
    s[4 * j + 1] = fast_exp2(s[4 * j + 1] - m0);
    s[4 * j + 2] = fast_exp2(s[4 * j + 2] - m1);
    s[4 * j + 3] = fast_exp2(s[4 * j + 3] - m1);
    sum0 += s[4 * j] + s[4 * j + 1];
    sum1 += s[4 * j + 2] + s[4 * j + 3];
  }
}

// An m64n256 output accumulator (o[4 q + e]: row r0 + 8 (e >> 1)) times its rows' factors.
__device__ __forceinline__ void rescale_rows(float (&o)[128], float c0, float c1) {
#pragma unroll
  for (int i = 0; i < 128; i += 4) {
    o[i] *= c0;
    o[i + 1] *= c0;
    o[i + 2] *= c1;
    o[i + 3] *= c1;
  }
}

// The row sums of a 64-head block whose two warpgroups each kept this thread's share (l0: row r0, l1:
// row r0 + 8) of the tiles they multiplied, relative to the same running max: summed over the quad,
// then over the warpgroups through sums_s[64]; the block's row sums are then sums_s[r0], sums_s[r0 + 8].
// Starts with a block barrier (every earlier use of shared rows is over) and ends with one.
__device__ __forceinline__ void block_row_sums(float l0, float l1, float* sums_s, int w, int t4, int r0) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  __syncthreads();
  if (w == 1 && t4 == 0) {
    sums_s[r0] = l0;
    sums_s[r0 + 8] = l1;
  }
  __syncthreads();
  if (w == 0 && t4 == 0) {
    sums_s[r0] += l0;
    sums_s[r0 + 8] += l1;
  }
  __syncthreads();
}

// pa into the 64 x 64 K-major operand at shared address p (a stage's rope chunk): per k16 step one
// stmatrix of four 8x8 matrices (rows 0-7 / 8-15 of this warp's 16, columns 0-7 / 8-15 of the step),
// which is exactly the A fragment's register order.
__device__ __forceinline__ void store_p(uint32_t p, const uint32_t (&pa)[4][4], int wq, int lane) {
  const int row = 16 * wq + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) stmatrix_x4(p + wg::op_offset(row, 2 * kk + (lane >> 4)), pa[kk]);
}

// Rows [rows, 64) of a TMA-loaded stage at shared address `stage`, by `threads` threads of which this is
// number `t`: unused cache rows may hold NaN, and P = 0 times NaN is NaN. (By shared address: the
// fixed-role block keeps its stages as 32-bit addresses, one register each.)
__device__ __forceinline__ void zero_tail(uint32_t stage, int rows, int t, int threads) {
  constexpr int kPerRow = kDimAtoms * 8;  // 16-byte chunks of one row across the 9 dim atoms
  for (int idx = t; idx < (kTok - rows) * kPerRow; idx += threads) {
    const int r = rows + idx / kPerRow, c = (idx % kPerRow) / 8, q = idx % 8;
    const uint32_t at = stage + uint32_t(c * 8 * wg::kAtomBytes + r * wg::kRowBytes + q * 16);
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0u) : "memory");
  }
}
__device__ __forceinline__ void zero_tail(unsigned char* stage, int rows, int t, int threads) {
  zero_tail(smem_u32(stage), rows, t, threads);
}

// Warpgroup w of a seesaw block waits for its tile at `stage` (mbarrier `bar`, phase parity `parity`),
// of which `rows` rows are before the request's end; the rest are zeroed (ti: the thread's index in the
// warpgroup) and handed to the async proxy before the scores read them.
__device__ __forceinline__ void await_tile(uint32_t bar, uint32_t parity, unsigned char* stage, int rows, int ti,
                                           int w) {
  mbar_wait(bar, parity);
  if (rows < kTok) {
    zero_tail(stage, rows, ti, 128);
    wg::fence_proxy_async();
    wg_sync(w);
  }
}

}  // namespace k3::cuda::mla_tiles
