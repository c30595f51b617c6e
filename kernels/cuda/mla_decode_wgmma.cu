// Absorbed MLA decode on Hopper warpgroup MMA (wgmma, sm_90a) for the fast shape R = 512, Dr = 64:
// same semantics and outputs as mla_decode_mma_kernel (mla_decode.cu), selected there for H >= 64
// when MlaDecodeArgs::use_wgmma is set.
//
// Block = (64-head group, KV split, request); 256 threads = 2 warpgroups (WG 0: warps 0-3, WG 1:
// warps 4-7; a warpgroup starts at a warp index divisible by 4). Per 64-token KV tile:
//   1. S = Q Kᵀ: each warpgroup computes the 64 heads x its 32 tokens (WG w: tokens 32w..32w+31)
//      over K = 576 with 36 wgmma m64n32k16 (A = Q, B = the staged K rows, both K-major in shared
//      memory). 16 fp32 accumulators per thread.
//      Or (split S, a switch) WG w: all 64 tokens over dims 288w..288w+287 with 18 m64n64k16, the
//      two partial sums exchanged through shared memory.
//   2. Online softmax per row (row = head): a row's 32 values of one warpgroup sit in one quad of
//      one warp (accumulator layout, wgmma.cuh); the two warpgroups agree on the row max through
//      shared memory (as the WS warps of mla_decode_mma_kernel do). P (bf16) goes to shared memory
//      in the 128B-swizzled K-major layout, the running O is rescaled in registers.
//   3. O += P V: warpgroup w owns output columns 256w..256w+255 as 4 x 64-column accumulator sets
//      (4 x 32 = 128 fp32 registers per thread); per 16-token k step, one wgmma m64n256k16 (four
//      m64n64k16, as first written, measured the same and were removed) with A = P (K-major) and B = V = dims
//      256w.. of the same staged rows, read MN-major (imm-trans-b = 1; the n256 descriptor carries
//      the 8192-byte stride between dim chunks in LBO, wgmma.cuh).
// The KV tile is loaded once per stage by cp.async (16-byte copies, rows past seq_len zero-filled:
// unused cache rows may hold NaN), 2 stages, directly into the swizzled layout (the cp.async
// destination applies the same XOR the wgmma descriptor implies).
// By default the tile comes instead by the tensor memory accelerator: warp 0 issues one bulk tensor
// copy per (64-dim chunk, box of rows within one page), 9 to 72 instructions for the whole tile
// where cp.async needs 4608, landing swizzled; an mbarrier per stage counts the bytes in. With few
// per-thread copies in flight the cp.async form streams ~1.7 TB/s; the copy engine keeps a whole
// tile in flight per block whatever the warps are doing.
//
// Shared-memory layout (all offsets from a 1024-byte aligned base; atoms as in wgmma.cuh):
//   Q    [9 dim chunks][8 head groups] atoms      = 72 KiB   (atom (c, g) at (8c + g) * 1024)
//   KV   2 stages x [9 dim chunks][8 token groups] = 144 KiB (atom (c, g) at (8c + g) * 1024)
//   P    [8 head groups] atoms (64 tokens = one atom along K) = 8 KiB
//   red  2 x 2 x 64 floats (row max and row sum partials of the two warpgroups)
// A "dim chunk" c is dims 64c..64c+63 (c = 8: the 64 rope dims). Descriptors (wgmma.cuh): LBO =
// SBO = 1024 = the distance between consecutive 8-row groups of every operand, 128B swizzle, base
// offset 0. Descriptor start addresses per instruction:
//   S step ks (0..35):  A = Q  + 8192 (ks / 4) + 32 (ks % 4)
//                       B = KV + 8192 (ks / 4) + 4096 w + 32 (ks % 4)   (token groups 4w..4w+3)
//   PV step kk (0..3), column block j (0..3), dim chunk c = 4w + j:
//                       A = P + 32 kk                                     (tokens 16kk..16kk+15)
//                       B = KV + 8192 c + 2048 kk                         (token groups 2kk, 2kk+1)
//
// Cost of H = 96: two head groups, the second with 32 zero rows, so the tensor work is 128/96 =
// 1.33x the useful work (the cache bytes are read once from HBM; the second group hits L2).
//
// The body above is the lockstep form. Other block forms share the launch (same grid, same
// shared-memory size, chosen per launch or per block): the seesaw form of a 64-head block
// (mla_decode_seesaw.cuh, the default: each warpgroup computes the scores of its own tile of a pair,
// so one warpgroup's softmax overlaps the other's products); the seesaw that keeps P in registers
// and refills each half of a stage on its own (mla_decode_halves.cuh, the default on splits of 8192
// tokens or more); and the 32-head transposed block (mla_decode_t32.cuh, MlaDecodeArgs::wgmma_t32:
// no padded rows for a last group of 32 heads, measured slower); and the 48-head transposed seesaw
// (mla_decode_t48.cuh, MlaDecodeArgs::wgmma_t48: H = 96 as two blocks of 48 heads, no padded rows).
// The block of three warpgroups in fixed roles (mla_decode_roles.cu, MlaDecodeArgs::wgmma_roles) is a
// kernel of its own (384 threads, Q in registers, three stages), launched from here on the same grid.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mla_decode_halves.cuh"
#include "kernels/cuda/mla_decode_roles.h"
#include "kernels/cuda/mla_decode_seesaw.cuh"
#include "kernels/cuda/mla_decode_t32.cuh"
#include "kernels/cuda/mla_decode_t48.cuh"
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mla_wgmma_layout.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda {
namespace {

using namespace mla_tiles;
constexpr int kHeads = 64;                 // rows of one block = wgmma M
constexpr int kStages = 2;
constexpr int kThreads = 256;              // 2 warpgroups
constexpr int kQBytes = mlawg::kOperandBytes;     // 73728
constexpr int kPBytes = mlawg::kPBytes;           // 8192
static_assert(kDimAtoms * (kTok / 8) * wg::kAtomBytes == kTileBytes && kHeads == mlawg::kRows && kTok == mlawg::kRows &&
              kDk == mlawg::kDk, "layout header and kernel agree");
constexpr int kRedFloats = 2 * kHeads;     // one partial per (warpgroup, row)
constexpr int kBarBytes = kStages * 8;   // one mbarrier per stage (TMA loads)
constexpr int kSmem =
    wg::kAtomBytes /*alignment slack*/ + kQBytes + kStages * kTileBytes + kPBytes + 2 * kRedFloats * 4 + kBarBytes;
static_assert(kSmem <= 227 * 1024, "shared memory budget of one block");
static_assert(wg::kAtomBytes + mla_t32::kSmemFromBase <= kSmem && wg::kAtomBytes + mla_seesaw::kSmemFromBase <= kSmem &&
                  wg::kAtomBytes + mla_halves::kSmemFromBase <= kSmem &&
                  wg::kAtomBytes + mla_t48::kSmemFromBase <= kSmem,
              "the 32- and 48-head blocks and the seesaw blocks fit in the same launch");

using wg::op_offset;  // Q, KV stages and P: 64-row operands of [chunk / 8][row / 8] atoms

// Copies tokens [t0, t0 + 64) into the stage at `dst` (rows past `end` zero-filled, never read from
// the cache). Eight lanes copy one row: for each 64-dim atom, lane l8 copies logical chunk l8, and
// the 8 lanes together fill the row's 128 swizzled bytes (a permutation of its 8 chunks).
__device__ __forceinline__ void issue_tile(unsigned char* dst, const MlaDecodeArgs& a, const int32_t* pages, int t0,
                                           int end, int page_shift) {
  const int l8 = threadIdx.x & 7;
#pragma unroll
  for (int t = threadIdx.x >> 3; t < kTok; t += kThreads / 8) {
    const int tok = t0 + t;
    const bool valid = tok < end;
    const int pg = page_shift >= 0 ? tok >> page_shift : tok / a.page_size;
    const int in_page = page_shift >= 0 ? tok & (a.page_size - 1) : tok - pg * a.page_size;
    const int64_t page = valid ? pages[pg] : 0;
    const __nv_bfloat16* src = a.kv + (page * a.page_size + (valid ? in_page : 0)) * kDk + l8 * 8;
#pragma unroll
    for (int c = 0; c < kDimAtoms; ++c) cp_async16(dst + op_offset(t, c * 8 + l8), src + c * 64, valid);
  }
}

// L2 prefetch of tokens [t0, min(t0 + 64, end)): one bulk prefetch per page run, issued by the first
// lanes of warp 0 (a tile spans at most 64 / page_size + 1 page runs; 65 lanes cover page size 1).
__device__ __forceinline__ void prefetch_tile_l2(const MlaDecodeArgs& a, const int32_t* pages, int t0, int end) {
  if (t0 >= end) return;
  const int t1 = min(end, t0 + kTok);
  const int ps = a.page_size;
  const int first_page = t0 / ps, last_page = (t1 - 1) / ps;
  for (int pg = first_page + threadIdx.x; pg <= last_page; pg += 32) {
    const int lo = max(t0, pg * ps), hi = min(t1, (pg + 1) * ps);
    const __nv_bfloat16* src = a.kv + (int64_t(pages[pg]) * ps + (lo - pg * ps)) * kDk;
    prefetch_l2_bulk(src, unsigned(hi - lo) * kDk * 2);  // rows of 1152 bytes: 16-byte multiples
  }
}

// kSeesaw: 0 = the lockstep body below, 1 = the seesaw block (mla_decode_seesaw.cuh), 2 = the seesaw
// refilled by halves with P kept in registers (mla_decode_halves.cuh), 3 = every block the 48-head
// transposed seesaw (mla_decode_t48.cuh).
template <bool kSplitS, bool kTma, int kSeesaw = 0>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_wgmma_kernel(MlaDecodeArgs a, int tokens_per_split, int splits_per_block, int splits, float* part_o,
                            float* part_lse, const __grid_constant__ CUtensorMap kv_map, int box_rows, int groups64) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 at run time below
  // Atoms must be 1024-byte aligned in the shared window (descriptor base offset 0).
  const uint32_t raw_addr = smem_u32(smem_raw);
  const uint32_t pad = (wg::kAtomBytes - (raw_addr & (wg::kAtomBytes - 1))) & (wg::kAtomBytes - 1);
  unsigned char* q_s = smem_raw + pad;
  unsigned char* kv_s = q_s + kQBytes;
  unsigned char* p_s = kv_s + kStages * kTileBytes;
  float* red_max = reinterpret_cast<float*>(p_s + kPBytes);
  float* red_l = red_max + kRedFloats;
  const uint32_t bar_addr = smem_u32(red_l + kRedFloats);  // kStages mbarriers, 8 bytes each
  const uint32_t q_addr = raw_addr + pad, kv_addr = q_addr + kQBytes, p_addr = kv_addr + kStages * kTileBytes;
  // Blocks past the 64-head groups hold 32 heads each in the transposed form (mla_decode_t32.cuh);
  // 64-head blocks run in the seesaw form when asked (mla_decode_seesaw.cuh).
  if constexpr (kSeesaw == 3) {
    static_assert(kTma && !kSplitS, "the 48-head blocks load by TMA");
    mla_t48::block(a, tokens_per_split, part_o, part_lse, &kv_map, box_rows, mla_t48::kHeads * int(blockIdx.x), q_s,
                   q_addr);
    return;
  } else if constexpr (kSeesaw != 0) {
    static_assert(kTma && !kSplitS, "the seesaw blocks load by TMA and split S over tokens");
    if (int(blockIdx.x) < groups64) {
      if constexpr (kSeesaw == 2)
        mla_halves::block(a, tokens_per_split, part_o, part_lse, &kv_map, box_rows, kHeads * int(blockIdx.x), q_s, q_addr);
      else
        mla_seesaw::block(a, tokens_per_split, splits_per_block, splits, part_o, part_lse, &kv_map, box_rows,
                          kHeads * int(blockIdx.x), q_s, q_addr);
      return;
    }
  }
  if constexpr (kTma && kSeesaw == 0) {
    if (int(blockIdx.x) >= groups64) {
      mla_t32::block(a, tokens_per_split, part_o, part_lse, &kv_map, box_rows,
                     kHeads * groups64 + mla_t32::kHeads * (int(blockIdx.x) - groups64), q_s, q_addr);
      return;
    }
  }

  const int hg = blockIdx.x, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31;
  const int w = tid >> 7;              // warpgroup
  const int wq = (tid >> 5) & 3;       // warp within the warpgroup: rows 16 wq..16 wq+15
  const int g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g, r1 = r0 + 8;  // this thread's two rows (heads within the group)
  const int h0 = hg * kHeads;
  const auto [begin, end, pages, page_shift] = split_rows(a, tokens_per_split);

  // The first tile goes in flight before Q is staged, so both latencies overlap; the tiles after
  // the ones loaded into shared memory are prefetched into L2 (l2_prefetch_tiles of them ahead).
  if constexpr (kTma) {
    if (tid < 32) {
      if (tid == 0)
        for (int s = 0; s < kStages; ++s) mbar_init(bar_addr + 8 * s);
      __syncwarp();
      for (int s = 0; s < kStages - 1; ++s) {
        const int ts = begin + s * kTok;
        if (ts < end)
          issue_tile_tma(kv_addr + s * kTileBytes, bar_addr + 8 * s, &kv_map, a, pages, ts, end, page_shift, box_rows);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const int ts = begin + s * kTok;
      if (ts < end) issue_tile(kv_s + s * kTileBytes, a, pages, ts, end, page_shift);
      cp_async_commit();
    }
  }
  const int pf = a.l2_prefetch_tiles;
  if (tid < 32)  // tiles kStages .. kStages + pf - 2; the loop below prefetches from kStages + pf - 1 on
    for (int i = 0; i + 1 < pf; ++i) prefetch_tile_l2(a, pages, begin + (kStages + i) * kTok, end);
  stage_q<kHeads>(q_s, a, b, h0, tid, kThreads);

  if constexpr (kTma) __syncthreads();  // the barriers thread 0 set up exist before anyone waits on them
  const float sl2 = a.scale * kLog2e;  // scores in log2 units
  const float slack = a.wgmma_lazy_rescale ? 8.f : 0.f;
  float o[4][32];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[j][i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows r0, r1 (same in both warpgroups)
  float l0 = 0.f, l1 = 0.f;              // this thread's share of the running sums (own tokens only)

  int stage = 0;
  uint32_t phases = 0;  // TMA: bit s = parity of the next completion of stage s's barrier
  for (int t0 = begin; t0 < end; t0 += kTok) {
    if constexpr (kTma) {
      mbar_wait(bar_addr + 8 * stage, (phases >> stage) & 1u);
      phases ^= 1u << stage;
      if (end - t0 < kTok) zero_tail(kv_s + stage * kTileBytes, end - t0, tid, kThreads);
    } else {
      cp_async_wait<kStages - 2>();
    }
    // This thread's cp.async data or tail zeros (and, on the first tile, its Q stores) -> async
    // proxy; the barrier then makes every thread's part visible, and tells the next copy that every
    // warp has finished the previous tile (its S and PV wgmma were waited for below).
    wg::fence_proxy_async();
    __syncthreads();
    {
      const int tn = t0 + (kStages - 1) * kTok;
      const int sn = (stage + kStages - 1) % kStages;
      if constexpr (kTma) {
        if (tn < end && tid < 32)
          issue_tile_tma(kv_addr + sn * kTileBytes, bar_addr + 8 * sn, &kv_map, a, pages, tn, end, page_shift, box_rows);
      } else {
        if (tn < end) issue_tile(kv_s + sn * kTileBytes, a, pages, tn, end, page_shift);
        cp_async_commit();  // possibly empty: keeps the group count uniform for the wait above
      }
      if (pf > 0 && tid < 32) prefetch_tile_l2(a, pages, tn + pf * kTok, end);
    }
    const uint32_t kt = kv_addr + stage * kTileBytes;

    // 1. S[64 heads x this warpgroup's 32 tokens].
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    if constexpr (kSplitS) {
      // Split over dims instead of tokens: this warpgroup takes all 64 tokens over dims 288w..288w+287
      // (18 m64n64 steps: half the instructions, and Q is read once per 64 tokens rather than per 32,
      // 147 KiB of shared-memory operand reads per tile instead of 221). The halves are summed
      // through shared memory: each warpgroup hands the other the 16 partials of the other's 32
      // tokens, WG 0 through P (free until this tile's P is written, after the max barrier), WG 1
      // through this stage's rope chunk (dims 512..575: no longer read once both S are done).
      float sf[32];
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kDk / 32; ++kk) {
        const int ks = (kDk / 32) * w + kk;
        wg::mma_m64n64<0>(sf, wg::make_desc(q_addr + mlawg::s_a_off(ks)), wg::make_desc(kt + mlawg::s_a_off(ks)), kk > 0);
      }
      wg::commit();
      wg::wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) wg::reg_fence(sf[i]);
      __syncthreads();  // both warpgroups' S reads of the rope chunk are done
      const int ti = tid & 127;
      float4* mine = reinterpret_cast<float4*>(w == 0 ? p_s : kv_s + stage * kTileBytes + (kDimAtoms - 1) * 8 * wg::kAtomBytes);
      const float4* theirs = reinterpret_cast<const float4*>(w == 1 ? p_s : kv_s + stage * kTileBytes + (kDimAtoms - 1) * 8 * wg::kAtomBytes);
      // sf[16 w'..16 w'+15] are warpgroup w''s tokens (j = 4w'..4w'+3); selects, not a runtime index
      // (which would put sf in local memory).
      float give[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        give[i] = w ? sf[i] : sf[16 + i];
        s[i] = w ? sf[16 + i] : sf[i];
      }
#pragma unroll
      for (int i4 = 0; i4 < 4; ++i4)
        mine[i4 * 128 + ti] = make_float4(give[4 * i4], give[4 * i4 + 1], give[4 * i4 + 2], give[4 * i4 + 3]);
      __syncthreads();
#pragma unroll
      for (int i4 = 0; i4 < 4; ++i4) {
        const float4 v = theirs[i4 * 128 + ti];
        s[4 * i4] += v.x;
        s[4 * i4 + 1] += v.y;
        s[4 * i4 + 2] += v.z;
        s[4 * i4 + 3] += v.w;
      }
    } else {
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kDk / 16; ++ks) {
        wg::mma_m64n32_kk(s, wg::make_desc(q_addr + mlawg::s_a_off(ks)), wg::make_desc(kt + mlawg::s_b_off(ks, w)), ks > 0);
      }
      wg::commit();
      wg::wait<0>();
#pragma unroll
      for (int i = 0; i < 16; ++i) wg::reg_fence(s[i]);
    }

    // 2. Scale, mask tokens past the end, row max over both warpgroups. s[4j + e]: row r0 + 8 (e >> 1),
    // token t0 + 32w + 8j + 2 t4 + (e & 1).
    float mx0, mx1;
    scale_mask_rowmax<32>(s, t0 + 32 * w, end, t4, sl2, mx0, mx1);
    if (t4 == 0) {
      red_max[w * kHeads + r0] = mx0;
      red_max[w * kHeads + r1] = mx1;
    }
    __syncthreads();
    // Token t0 < end belongs to warpgroup 0, so m_new is finite: corr = 2^(-inf) = 0 on the first
    // tile, never 2^(-inf + inf). The running max moves only when the tile's max passes it by more
    // than `slack` (0: the exact max; lazy: 8, so p <= 2^8, exact in bf16's relative precision and
    // undone by the final 1/l): both warpgroups see the same maxima and decide alike. A warp none of
    // whose rows moved skips the O rescale (a multiply by 1).
    const float x0 = fmaxf(red_max[r0], red_max[kHeads + r0]), x1 = fmaxf(red_max[r1], red_max[kHeads + r1]);
    const float mn0 = x0 > m0 + slack ? x0 : m0;
    const float mn1 = x1 > m1 + slack ? x1 : m1;
    const bool moved = __any_sync(0xffffffffu, mn0 != m0 || mn1 != m1);
    const float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = fast_exp2(s[4 * j + 0] - mn0), p1 = fast_exp2(s[4 * j + 1] - mn0);
      const float p2 = fast_exp2(s[4 * j + 2] - mn1), p3 = fast_exp2(s[4 * j + 3] - mn1);
      l0 += p0 + p1;
      l1 += p2 + p3;
      const int col = 32 * w + 8 * j + 2 * t4;  // token within the tile (even: both in one chunk)
      *reinterpret_cast<uint32_t*>(p_s + op_offset(r0, col >> 3) + (col & 7) * 2) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(p_s + op_offset(r1, col >> 3) + (col & 7) * 2) = pack_bf16(p2, p3);
    }
    if (moved) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 32; i += 4) {
          o[j][i] *= c0;
          o[j][i + 1] *= c0;
          o[j][i + 2] *= c1;
          o[j][i + 3] *= c1;
        }
    }
    wg::fence_proxy_async();  // P stores -> async proxy
    __syncthreads();          // P of both warpgroups is written

    // 3. O[64 x 256 columns of this warpgroup] += P[64 x 64] · V[64 x 256].
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kTok / 16; ++kk) {
      const uint64_t da = wg::make_desc(p_addr + mlawg::pv_a_off(kk));
      // o[4][32] is the m64n256 accumulator set: four n64 sets back to back.
      wg::mma_m64n256_kt(*reinterpret_cast<float(*)[128]>(&o[0][0]), da,
                         wg::make_desc(kt + mlawg::pv_b_off(kk, w, 0), 8 * wg::kAtomBytes, wg::kAtomBytes));
    }
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 32; ++i) wg::reg_fence(o[j][i]);
    stage = (stage + 1) % kStages;
  }
  if constexpr (!kTma) cp_async_wait<0>();  // only empty groups can remain; leave none behind

  // Row sums: the quad's lanes, then the two warpgroups (both used the same running max).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t4 == 0) {
    red_l[w * kHeads + r0] = l0;
    red_l[w * kHeads + r1] = l1;
  }
  __syncthreads();
  store_rows64(a, part_o, part_lse, &o[0][0], h0, r0, w, t4, red_l[r0] + red_l[kHeads + r0],
               red_l[r1] + red_l[kHeads + r1], m0, m1, blockIdx.y, gridDim.y);
}

}  // namespace

MlaHeadGroups mla_wgmma_head_groups(int H, int head_form) {
  if (head_form == kMlaHeadForm48) return {0, 0, (H + mla_t48::kHeads - 1) / mla_t48::kHeads};
  if (head_form == 2) return {0, (H + mla_t32::kHeads - 1) / mla_t32::kHeads};
  if (head_form == 1 && H % kHeads > 0 && H % kHeads <= mla_t32::kHeads) return {H / kHeads, 1};
  return {(H + kHeads - 1) / kHeads, 0};
}

void launch_mla_decode_wgmma(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* part_o, float* part_lse,
                             cudaStream_t s) {
  K3_CHECK(a.R == kR && a.Dr == kDr, "mla_decode_wgmma: needs R = 512, Dr = 64");
  K3_CHECK(plan.splits == 1 || plan.tokens_per_split % kTok == 0, "mla_decode_wgmma: split length must be a multiple of 64");
  // TMA boxes: the largest row count that divides both the page and the 64-token tile (a box then
  // never crosses a page); at least 8 rows (one swizzle atom) and row coordinates below 2^31.
  const int box_rows = std::gcd(a.page_size, kTok);
  const bool tma = a.wgmma_tma && box_rows >= 8 && a.kv_rows > 0 && a.kv_rows < (int64_t(1) << 31);
  const CUtensorMap map = tma ? make_bf16_tensor_map_sw128(a.kv, a.kv_rows, kDk, box_rows) : CUtensorMap{};
  if (tma && a.wgmma_roles && !a.wgmma_split_s) {
    launch_mla_decode_roles(a, plan, part_o, part_lse, map, box_rows, s);  // mla_decode_roles.cu
    return;
  }
  const int head_form = tma ? mla_wgmma_head_form(a) : 0;
  auto* kern = a.wgmma_split_s ? (tma ? mla_decode_wgmma_kernel<true, true> : mla_decode_wgmma_kernel<true, false>)
               : !tma          ? mla_decode_wgmma_kernel<false, false>
               : head_form == kMlaHeadForm48 ? mla_decode_wgmma_kernel<false, true, 3>
               : mla_wgmma_seesaw_halves(a, plan) ? mla_decode_wgmma_kernel<false, true, 2>
               : a.wgmma_seesaw ? mla_decode_wgmma_kernel<false, true, 1>
                                : mla_decode_wgmma_kernel<false, true>;
  K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  // The 32-head transposed blocks load by TMA only.
  const MlaHeadGroups groups = mla_wgmma_head_groups(a.H, head_form);
  // Only the 64-head seesaw blocks take several splits each, and only splits of an even tile count.
  const bool seesaw = kern == mla_decode_wgmma_kernel<false, true, 1>;
  const int per_block = seesaw && groups.g32 == 0 && plan.tokens_per_split % (2 * kTok) == 0
                            ? std::clamp(plan.splits_per_block, 1, plan.splits)
                            : 1;
  const dim3 grid(groups.g64 + groups.g32 + groups.g48, (plan.splits + per_block - 1) / per_block, a.B);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  // Clusters of the head groups of one request (and split): scheduled together on one GPU processing
  // cluster, so the second group's reads of the same cache rows find them in L2.
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = unsigned(grid.x);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  const bool clustered = a.wgmma_cluster && grid.x > 1 && grid.x <= 8;
  int n = clustered ? 1 : 0;
  if (kPdlLaunches) attrs[n++] = pdl_attribute();  // the kernel starts with pdl_enter (pdl.cuh)
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  K3_CUDA_OK(cudaLaunchKernelEx(&cfg, kern, a, plan.tokens_per_split, per_block, plan.splits, part_o, part_lse, map,
                                box_rows, groups.g64));
}

}  // namespace k3::cuda
