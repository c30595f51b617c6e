// MLA decode on Hopper (R = 512, Dr = 64, H >= 64) in a block whose three warpgroups keep one role
// each, over a ring of three KV stages:
//   WG 0 (scores): holds the 64 heads' Q over the 512 latent dims in registers, as the A operand of
//        S = Q Kᵀ (wgmma with A from registers, 128 registers a thread; the 64 rope dims of Q stay in
//        shared memory), so Q takes 8 KiB of shared memory instead of 72 and the rest holds a third
//        stage. Per 64-token tile: S in two halves of 32 tokens (m64n32k16), the online softmax (the
//        running max, lazy as in the other forms), P = 2^(S - m) as bf16 into the tile's rope chunk
//        (which only S reads), the rows' factors 2^(m_old - m) beside it; "ready".
//   WG 1 / WG 2 (output dims 0..255 / 256..511): wait "ready", rescale O by the factors, O += P V
//        (4 m64n256k16), "empty". When both are done with a stage, WG 1's first warp refills it with
//        the tile three ahead.
// So the scores of tile k + 1 run on the tensor cores while the output warpgroups multiply tile k, and
// WG 0's softmax of one tile overlaps the products of the tile before (in the seesaw forms,
// mla_decode_seesaw.cuh, each warpgroup's scores wait for its own products); a tile has two tiles' time
// to arrive instead of one.
// The registers are split by setmaxnreg: 184 for WG 0 (Q, S), 160 for each output warpgroup (O), which
// is what 384 threads of 168 hold; with S of a whole tile (32 accumulators) WG 0 would need about 190.
// At a split's end WG 0 hands the rows' max and sum to the output warpgroups (named barriers), which
// write the result as the other 64-head forms do (store_rows64). A block may take several consecutive
// splits (batch-invariant mode, MlaDecodePlan::splits_per_block); the ring runs on through them.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mla_decode_roles.h"
#include "kernels/cuda/mla_decode_tiles.cuh"
#include "kernels/cuda/mla_wgmma_layout.cuh"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

using namespace mla_tiles;

constexpr int kHeads = 64;
constexpr int kStages = 3;
constexpr int kThreads = 384;
constexpr int kScoreRegs = 184, kOutRegs = 160;
// The block starts with 168 registers a thread (the most 384 threads may have); setmaxnreg moves them
// between the warpgroups of the block, so the three budgets must fit in what the block holds (an
// increase waits until the others' decreases have released enough: more would wait forever).
constexpr int kBlockRegs = 65536 / kThreads / 8 * 8;
static_assert(kScoreRegs + 2 * kOutRegs <= 3 * kBlockRegs, "the three budgets fit the block's registers");
constexpr int kRopeOff = 8 * 8 * wg::kAtomBytes;            // the rope chunk inside a stage: P once S is done
constexpr int kQRopeOff = kStages * kTileBytes;             // Q's rope dims, a 64 x 64 K-major operand (8 KiB)
constexpr int kScaleOff = kQRopeOff + 8 * wg::kAtomBytes;   // float [kStages][64]: the factors of each stage's P
constexpr int kRowsOff = kScaleOff + kStages * kHeads * 4;  // float max[64], sum[64]: a split's rows
constexpr int kBarOff = kRowsOff + 2 * kHeads * 4;          // mbarriers full[kStages], ready[..], empty[..]
constexpr int kSmem = wg::kAtomBytes /*alignment slack*/ + kBarOff + 3 * kStages * 8;
static_assert(kSmem <= 227 * 1024, "shared memory budget of one block");
// Named barriers (0 is __syncthreads): a split's rows handed to the output warpgroups, their slot free
// again, and WG 0's own barrier.
constexpr int kRowsReady = 1, kRowsFree = 2, kScoreGroup = 3;

// 4-byte shared-memory accesses by 32-bit shared address: the roles keep their shared arrays as
// addresses (one register each) rather than generic pointers (two), which keeps each role in its budget.
__device__ __forceinline__ void st_shared(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// What both roles know of the block: its rows, its splits, and the ring's shared addresses.
struct Block {
  const MlaDecodeArgs& a;
  SplitRows rows;
  int tokens_per_split, first, last, h0;
  uint32_t kv_addr, full0, ready0, empty0;
  __device__ uint32_t stage(int st) const { return kv_addr + uint32_t(st) * kTileBytes; }
  // The factor of row r of the P in stage st; a split's row max and sum (kScaleOff, kRowsOff).
  __device__ uint32_t scale_at(int st, int r) const { return kv_addr + kScaleOff + uint32_t(st * kHeads + r) * 4; }
  __device__ uint32_t max_at(int r) const { return kv_addr + kRowsOff + uint32_t(r) * 4; }
  __device__ uint32_t sum_at(int r) const { return kv_addr + kRowsOff + uint32_t(kHeads + r) * 4; }
};

// This thread's share of Q's latent dims (rows r0 and r0 + 8 of the 64 heads from h0) in the A-fragment
// order of the 32 k16 steps over dims 0..511 (wgmma.cuh, mma_m64n64_rs); heads past H are zero rows.
// The 64 rope dims go to shared memory instead (kQRopeOff, by all of WG 0: stage_q's layout), which
// keeps WG 0 within its register budget.
constexpr int kLatSteps = kR / 16;
__device__ __forceinline__ void load_q(const Block& k, int r0, int t4, int ti, uint32_t (&qa)[kLatSteps][4]) {
  const MlaDecodeArgs& a = k.a;
  const int64_t row0 = int64_t(blockIdx.z) * a.H + k.h0 + r0, row1 = row0 + 8;
  const bool in0 = k.h0 + r0 < a.H, in1 = k.h0 + r0 + 8 < a.H;
  const auto pair = [&](int64_t row, bool in, int c) -> uint32_t {
    return in ? *reinterpret_cast<const uint32_t*>(a.q_lat + row * kR + c) : 0u;
  };
#pragma unroll
  for (int ks = 0; ks < kLatSteps; ++ks) {
    const int c = 16 * ks + 2 * t4;
    qa[ks][0] = pair(row0, in0, c);
    qa[ks][1] = pair(row1, in1, c);
    qa[ks][2] = pair(row0, in0, c + 8);
    qa[ks][3] = pair(row1, in1, c + 8);
  }
  for (int idx = ti; idx < kHeads * (kDr / 8); idx += 128) {
    const int r = idx / (kDr / 8), c = idx % (kDr / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (k.h0 + r < a.H)
      v = *reinterpret_cast<const uint4*>(a.q_rope + (int64_t(blockIdx.z) * a.H + k.h0 + r) * kDr + c * 8);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(k.kv_addr + kQRopeOff + wg::op_offset(r, c)),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
  wg::fence_proxy_async();
  bar_sync<128>(kScoreGroup);
}

__device__ __forceinline__ void score_role(const Block& k, int ti) {
  const int lane = ti & 31, wq = ti >> 5, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g, r1 = r0 + 8;
  uint32_t qa[kLatSteps][4];
  load_q(k, r0, t4, ti, qa);
  const wg::DescBase kv_desc(k.kv_addr);
  const uint32_t q_rope = k.kv_addr + kQRopeOff;
  const float sl2 = k.a.scale * kLog2e;
  const float slack = k.a.wgmma_lazy_rescale ? 8.f : 0.f;  // the lazy running max (mla_decode_wgmma.cu)
  const int end = k.rows.end;
  int tile = 0;  // tiles of this block so far: tile i sits in stage i % kStages, use i / kStages
  for (int split = k.first; split < k.last; ++split) {
    float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows r0, r1 (log2 units)
    float l0 = 0.f, l1 = 0.f;              // this thread's share of their sums
    const int split_end = min(end, (split + 1) * k.tokens_per_split);
    for (int t0 = split * k.tokens_per_split; t0 < split_end; t0 += kTok, ++tile) {
      const int st = tile % kStages;
      mbar_wait(k.full0 + 8 * st, uint32_t(tile / kStages) & 1u);
      if (end - t0 < kTok) {  // unused cache rows may hold NaN: zero them before any product reads them
        zero_tail(k.stage(st), end - t0, ti, 128);
        wg::fence_proxy_async();
        bar_sync<128>(kScoreGroup);
      }
      // S in two halves of 32 tokens (16 accumulators each, which keeps WG 0 in its register budget):
      // each half moves the running max on its own; P of the first half waits packed in bf16 (pa0)
      // until the second half's scores have read the rope chunk, and is brought to the tile's final
      // max when the second half moved it (rare with the lazy max: one multiply per element then).
      uint32_t pa[4][4];  // P of the tile as the A fragments of its four k16 steps
      float c0 = 1.f, c1 = 1.f, sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float s[16];
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < kLatSteps; ++ks)
          wg::mma_m64n32_rs(s, qa[ks], kv_desc.at(uint32_t(st) * kTileBytes + mlawg::s_b_off(ks, h)), ks > 0);
#pragma unroll
        for (int ks = kLatSteps; ks < kDk / 16; ++ks)  // the rope dims: A from shared memory
          wg::mma_m64n32<0, 0>(s, wg::make_desc(q_rope + (ks & 3) * 32),
                               kv_desc.at(uint32_t(st) * kTileBytes + mlawg::s_b_off(ks, h)));
        wg::commit();
        wg::wait<0>();
#pragma unroll
        for (int i = 0; i < 16; ++i) wg::reg_fence(s[i]);
        float x0, x1;
        scale_mask_rowmax<32>(s, t0 + 32 * h, end, t4, sl2, x0, x1);
        const float mn0 = x0 > m0 + slack ? x0 : m0, mn1 = x1 > m1 + slack ? x1 : m1;
        // On a split's first half m = -inf and the half's max is finite (t0 < end, and half 1 always
        // follows half 0's finite max), so the factor is 2^(-inf) = 0, never 2^(-inf + inf).
        const float f0 = fast_exp2(m0 - mn0), f1 = fast_exp2(m1 - mn1);
        float q0, q1;
        exp2_rows<32>(s, mn0, mn1, q0, q1);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          pa[2 * h + kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
          pa[2 * h + kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
          pa[2 * h + kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
          pa[2 * h + kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        if (h == 0) {
          c0 = f0;
          c1 = f1;
          sum0 = q0;
          sum1 = q1;
        } else {
          if (__any_sync(0xffffffffu, f0 != 1.f || f1 != 1.f)) {  // half 1 moved the max: rebase half 0's P
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
              const float2 a0 = bf2_to_f2(pa[kk][0]), a1 = bf2_to_f2(pa[kk][1]);
              const float2 a2 = bf2_to_f2(pa[kk][2]), a3 = bf2_to_f2(pa[kk][3]);
              pa[kk][0] = pack_bf16(a0.x * f0, a0.y * f0);
              pa[kk][1] = pack_bf16(a1.x * f1, a1.y * f1);
              pa[kk][2] = pack_bf16(a2.x * f0, a2.y * f0);
              pa[kk][3] = pack_bf16(a3.x * f1, a3.y * f1);
            }
          }
          c0 *= f0;
          c1 *= f1;
          sum0 = sum0 * f0 + q0;
          sum1 = sum1 * f1 + q1;
        }
        m0 = mn0;
        m1 = mn1;
      }
      bar_sync<128>(kScoreGroup);  // every warp's scores have read the rope chunk that P goes into
      store_p(k.stage(st) + kRopeOff, pa, wq, lane);
      if (t4 == 0) {
        st_shared(k.scale_at(st, r0), c0);
        st_shared(k.scale_at(st, r1), c1);
      }
      l0 = l0 * c0 + sum0;
      l1 = l1 * c1 + sum1;
      wg::fence_proxy_async();  // P -> the async proxy that the output products read it through
      mbar_arrive(k.ready0 + 8 * st);
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (split > k.first) bar_sync<kThreads>(kRowsFree);  // the output warpgroups have read the last split's
    if (t4 == 0) {
      st_shared(k.max_at(r0), m0);
      st_shared(k.max_at(r1), m1);
      st_shared(k.sum_at(r0), l0);
      st_shared(k.sum_at(r1), l1);
    }
    bar_arrive<kThreads>(kRowsReady);
  }
}

__device__ __forceinline__ void output_role(const Block& k, int w, int ti, int splits, float* part_o, float* part_lse,
                                            const CUtensorMap* kv_map, int box_rows) {
  const int lane = ti & 31, wq = ti >> 5, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * wq + g, r1 = r0 + 8;
  const int end = k.rows.end;
  float o[128];  // the m64n256 accumulator of dims 256 w..256 w + 255
  int tile = 0;
  for (int split = k.first; split < k.last; ++split) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const int split_end = min(end, (split + 1) * k.tokens_per_split);
    for (int t0 = split * k.tokens_per_split; t0 < split_end; t0 += kTok, ++tile) {
      const int st = tile % kStages;
      const uint32_t use = uint32_t(tile / kStages) & 1u, stage = k.stage(st);
      mbar_wait(k.ready0 + 8 * st, use);
      const float c0 = ld_shared(k.scale_at(st, r0)), c1 = ld_shared(k.scale_at(st, r1));
      if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) rescale_rows(o, c0, c1);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk)
        wg::mma_m64n256_kt(o, wg::make_desc(stage + kRopeOff + mlawg::pv_a_off(kk)),
                           wg::make_desc(stage + mlawg::pv_b_off(kk, w, 0), 8 * wg::kAtomBytes, wg::kAtomBytes));
      wg::commit();
      wg::wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) wg::reg_fence(o[i]);
      if (ti == 0) mbar_arrive(k.empty0 + 8 * st);
      const int next = k.first * k.tokens_per_split + (tile + kStages) * kTok;
      if (w == 0 && ti < 32 && next < end) {  // both output warpgroups are done with the stage: refill it
        mbar_wait(k.empty0 + 8 * st, use);
        // The page table's address is taken again here rather than held through the loop beside O.
        const int32_t* pages = k.a.block_table + int64_t(blockIdx.z) * k.a.max_pages;
        issue_tile_tma(stage, k.full0 + 8 * st, kv_map, k.a, pages, next, end, page_shift_of(k.a.page_size), box_rows);
      }
    }
    bar_sync<kThreads>(kRowsReady);
    const float L0 = ld_shared(k.sum_at(r0)), L1 = ld_shared(k.sum_at(r1));
    const float M0 = ld_shared(k.max_at(r0)), M1 = ld_shared(k.max_at(r1));
    if (split + 1 < k.last) bar_arrive<kThreads>(kRowsFree);
    store_rows64(k.a, part_o, part_lse, o, kHeads * int(blockIdx.x), r0, w, t4, L0, L1, M0, M1, split, splits);
  }
}

// The block's view of its rows and ring, from the kernel's parameters and the shared window; each role
// builds it after its register budget is set, so no value lives across the role branch.
__device__ __forceinline__ Block make_block(const MlaDecodeArgs& a, int tokens_per_split, int per_block, int splits,
                                            unsigned char* smem_raw) {
  const uint32_t raw_addr = smem_u32(smem_raw);
  const uint32_t pad = (wg::kAtomBytes - (raw_addr & (wg::kAtomBytes - 1))) & (wg::kAtomBytes - 1);
  const uint32_t kv_addr = raw_addr + pad, full0 = kv_addr + kBarOff;
  const int first = int(blockIdx.y) * per_block;
  return Block{a,
               split_rows(a, tokens_per_split, per_block),
               tokens_per_split,
               first,
               min(splits, first + per_block),
               kHeads * int(blockIdx.x),
               kv_addr,
               full0,
               full0 + 8 * kStages,
               full0 + 16 * kStages};
}

// Heads [64 blockIdx.x, + 64) of request blockIdx.z, splits [blockIdx.y · per_block, + per_block).
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_roles_kernel(MlaDecodeArgs a, int tokens_per_split, int per_block, int splits, float* part_o,
                            float* part_lse, const __grid_constant__ CUtensorMap kv_map, int box_rows) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];  // aligned to 1024 in make_block (swizzle atoms)
  const int role = threadIdx.x >> 7;
  if (threadIdx.x < 32) {  // the ring's barriers, then its first tiles in flight
    const Block k = make_block(a, tokens_per_split, per_block, splits, smem_raw);
    if (threadIdx.x == 0)
      for (int st = 0; st < kStages; ++st) {
        mbar_init(k.full0 + 8 * st);
        mbar_init(k.ready0 + 8 * st, 128);  // every thread of WG 0 after its P stores
        mbar_init(k.empty0 + 8 * st, 2);    // one thread of each output warpgroup
      }
    __syncwarp();
    for (int st = 0; st < kStages; ++st)
      if (k.rows.begin + st * kTok < k.rows.end)
        issue_tile_tma(k.stage(st), k.full0 + 8 * st, &kv_map, a, k.rows.pages, k.rows.begin + st * kTok, k.rows.end,
                       k.rows.page_shift, box_rows);
  }
  __syncthreads();  // the barriers exist before anyone waits on them
  if (role == 0) {
    wg::setmaxnreg_inc<kScoreRegs>();
    score_role(make_block(a, tokens_per_split, per_block, splits, smem_raw), threadIdx.x & 127);
  } else {
    wg::setmaxnreg_dec<kOutRegs>();
    output_role(make_block(a, tokens_per_split, per_block, splits, smem_raw), role - 1, threadIdx.x & 127, splits,
                part_o, part_lse, &kv_map, box_rows);
  }
}

}  // namespace

void launch_mla_decode_roles(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* part_o, float* part_lse,
                             const CUtensorMap& kv_map, int box_rows, cudaStream_t s) {
  K3_CHECK(a.H >= kHeads, "mla_decode roles: needs H >= 64, got " + std::to_string(a.H));
  K3_CUDA_OK(cudaFuncSetAttribute(mla_decode_roles_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int per_block = std::clamp(plan.splits_per_block, 1, std::max(plan.splits, 1));
  const dim3 grid((a.H + kHeads - 1) / kHeads, (plan.splits + per_block - 1) / per_block, a.B);
  launch_pdl("mla_decode_roles_kernel", mla_decode_roles_kernel, grid, kThreads, kSmem, s, a, plan.tokens_per_split,
             per_block, plan.splits, part_o, part_lse, kv_map, box_rows);
}

}  // namespace k3::cuda
