// Absorbed MLA decode over a paged latent cache (MQA: one 576-wide KV head, H query heads):
// s = (q_lat·c + q_rope·kr)·scale, o = softmax(s)·c (512 wide), natural-log LSE.
//
// Fast path (R = 512, Dr = 64): mla_decode_mma_kernel<HT, WS, KT, NS>. A block serves 16·HT heads
// of one request and one KV split, or several consecutive splits in turn (MlaDecodePlan::
// splits_per_block, batch-invariant mode); WS warps share each 16-head tile. A KT-token tile of the cache is
// staged once in shared memory (NS-stage cp.async ring) and read by every warp: warp (ht, ws)
// computes the scores of its 16 heads against its KT/WS tokens with mma.sync (Q from shared memory,
// K = the staged rows), the WS warps of a head tile agree on the row max through shared memory,
// write bf16 probabilities P[16 x KT], and each warp accumulates P·V for its 512/WS latent columns in fp32
// registers (V = the first 512 dims of the same staged rows). Softmax statistics are fp32, in
// log2 units. Grid order puts the head groups of one split next to each other so they share the
// tile through L2. With more than one split each split writes an fp32 partial (o normalised by
// its own sum, lse) and the LSE merge combines them. The split plan depends on shapes only
// (max context = max_pages·page_size), never on seq_lens, so a decode step can be graph-captured.
// Other shapes use a simple per-(request, head) kernel, which is also the fast path's oracle.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fast_exp2.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kR = 512, kDr = 64, kDk = kR + kDr;
constexpr int kPlanTok = 64;            // split lengths are multiples of this (and of every tile size)
constexpr int kLdK = kDk + 8;           // bf16 pitch of Q and KV rows: +16 B, ldmatrix rows on distinct banks
constexpr int kChunksPerRow = kDk / 8;  // 16-byte copies per cache row

// HT head tiles of 16 per block, WS warps per head tile, KT tokens per KV tile, NS ring stages.
template <int HT, int WS, int KT, int NS>
struct MmaCfg {
  static constexpr int kTok = KT, kStages = NS, kLdP = KT + 8;  // P pitch: +16 B, distinct banks
  static constexpr int kWarps = HT * WS, kThreads = 32 * kWarps;
  static constexpr int kTokW = kTok / WS;  // score columns (tokens) per warp
  static constexpr int kNT = kTokW / 8;    // n8 score tiles per warp
  static constexpr int kColW = kR / WS;    // output columns per warp
  static constexpr int kNO = kColW / 8;    // n8 output tiles per warp
  // Few score tiles per warp make short dependent mma chains; a second accumulator set halves them.
  static constexpr int kSAcc = kNT < 4 ? 2 : 1;
  static constexpr int kQBytes = 16 * HT * kLdK * 2;
  static constexpr int kKvBytes = kStages * kTok * kLdK * 2;
  static constexpr int kPBytes = HT * 16 * kLdP * 2;
  static constexpr int kRedFloats = HT * WS * 16;  // one partial per (head tile, warp slot, row)
  static constexpr int kSmem = kQBytes + kKvBytes + kPBytes + 2 * kRedFloats * 4;
  // Two resident blocks when their shared memory (plus the 1 KB the runtime reserves) fits the SM.
  static constexpr int kMinBlocks = 2 * (kSmem + 1024) <= 228 * 1024 ? 2 : 1;
  static_assert(kPlanTok % KT == 0, "tiles must not straddle split boundaries");
  static_assert(kNT % 2 == 0 && kNO % 2 == 0, "B fragments are loaded two n8 tiles at a time");
  static_assert(kSmem <= 227 * 1024, "shared memory budget of one block");
};


// Issues the copies of tokens [t0, t0+kTok) into `dst` (rows past `end` are zero-filled, never read:
// unused cache rows may hold NaN). Eight lanes copy one row, 128 contiguous bytes per instruction,
// so a thread looks its page up once per row rather than once per 16-byte chunk.
template <int kThreads, int kTok>
__device__ __forceinline__ void issue_tile(__nv_bfloat16* dst, const MlaDecodeArgs& a, const int32_t* pages, int t0,
                                           int end, int page_shift) {
  constexpr int kRowLanes = 8, kGroups = kThreads / kRowLanes;
  static_assert(kChunksPerRow % kRowLanes == 0, "a row splits evenly over its lanes");
  const int c8 = (threadIdx.x % kRowLanes) * 8;
#pragma unroll
  for (int t = threadIdx.x / kRowLanes; t < kTok; t += kGroups) {
    const int tok = t0 + t;
    const bool valid = tok < end;
    // Power-of-two pages (the usual case) index with shifts, not a runtime division.
    const int pg = page_shift >= 0 ? tok >> page_shift : tok / a.page_size;
    const int in_page = page_shift >= 0 ? tok & (a.page_size - 1) : tok - pg * a.page_size;
    const int64_t page = valid ? pages[pg] : 0;
    const __nv_bfloat16* src = a.kv + (page * a.page_size + (valid ? in_page : 0)) * kDk + c8;
    __nv_bfloat16* d = dst + t * kLdK + c8;
#pragma unroll
    for (int k = 0; k < kChunksPerRow / kRowLanes; ++k)
      cp_async16(d + k * kRowLanes * 8, src + k * kRowLanes * 8, valid);
  }
}

template <int HT, int WS, int KT, int NS>
__global__ void __launch_bounds__(MmaCfg<HT, WS, KT, NS>::kThreads, MmaCfg<HT, WS, KT, NS>::kMinBlocks)
    mla_decode_mma_kernel(MlaDecodeArgs a, int tokens_per_split, int per_block, int splits, float* part_o,
                          float* part_lse) {
  pdl_enter();
  using C = MmaCfg<HT, WS, KT, NS>;
  constexpr int kTok = KT, kStages = NS, kLdP = C::kLdP;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* kv_s = reinterpret_cast<__nv_bfloat16*>(smem_raw + C::kQBytes);
  auto* p_s = reinterpret_cast<__nv_bfloat16*>(smem_raw + C::kQBytes + C::kKvBytes);
  float* red_max = reinterpret_cast<float*>(smem_raw + C::kQBytes + C::kKvBytes + C::kPBytes);
  float* red_l = red_max + C::kRedFloats;

  const int hg = blockIdx.x, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ht = warp / WS, ws = warp % WS;
  const int g = lane >> 2, t4 = lane & 3;  // C fragment: rows g and g+8, columns 2·t4, 2·t4+1 of each n8 tile
  const int h0 = hg * 16 * HT;
  const int seq = a.seq_lens[b];
  // Splits [first, last) one after the other (MlaDecodePlan::splits_per_block), each from a fresh start
  // and written as a block of its own would; the tile pipeline runs on through their boundaries. A tile
  // never straddles two splits, so masking at the block's end masks exactly what each split's would.
  const int first = int(blockIdx.y) * per_block, last = min(splits, first + per_block);
  const int begin = first * tokens_per_split;
  const int end = min(seq, last * tokens_per_split);
  const int32_t* pages = a.block_table + int64_t(b) * a.max_pages;
  const int page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;

  // The first tiles go in flight before Q is staged, so both latencies overlap.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int ts = begin + s * kTok;
    if (ts < end) issue_tile<C::kThreads, kTok>(kv_s + s * kTok * kLdK, a, pages, ts, end, page_shift);
    cp_async_commit();
  }
  for (int idx = tid; idx < 16 * HT * kChunksPerRow; idx += C::kThreads) {
    const int r = idx / kChunksPerRow, c8 = (idx % kChunksPerRow) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);  // heads >= H: zero rows (scores 0, never written out)
    if (h0 + r < a.H) {
      const int64_t row = int64_t(b) * a.H + h0 + r;
      v = c8 < kR ? *reinterpret_cast<const uint4*>(a.q_lat + row * kR + c8)
                  : *reinterpret_cast<const uint4*>(a.q_rope + row * kDr + (c8 - kR));
    }
    *reinterpret_cast<uint4*>(q_s + r * kLdK + c8) = v;
  }

  const __nv_bfloat16* q_w = q_s + ht * 16 * kLdK;
  __nv_bfloat16* p_w = p_s + ht * 16 * kLdP;
  float* red_max_w = red_max + ht * WS * 16;
  float* red_l_w = red_l + ht * WS * 16;
  const float sl2 = a.scale * kLog2e;  // scores in log2 units: p = 2^(s - m)
  int stage = 0;
  for (int split = first; split < last; ++split) {
    float o[C::kNO][4];
#pragma unroll
    for (int j = 0; j < C::kNO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows g, g+8 (same in all WS warps)
    float l0 = 0.f, l1 = 0.f;              // this lane's share of the running sums (own tokens only)

    const int split_end = min(end, (split + 1) * tokens_per_split);
    for (int t0 = split * tokens_per_split; t0 < split_end; t0 += kTok) {
      cp_async_wait<kStages - 2>();
      // Tile t0 is visible to every warp, and every warp has finished the previous tile, whose
      // stage the next copy refills.
      __syncthreads();
      {
        const int tn = t0 + (kStages - 1) * kTok;
        const int sn = (stage + kStages - 1) % kStages;
        if (tn < end) issue_tile<C::kThreads, kTok>(kv_s + sn * kTok * kLdK, a, pages, tn, end, page_shift);
        cp_async_commit();  // possibly empty: keeps the group count uniform for the wait above
      }
      const __nv_bfloat16* kt = kv_s + stage * kTok * kLdK;

      // Scores of 16 heads x this warp's kTokW tokens over the 576 dims.
      float sacc[C::kSAcc][C::kNT][4];
#pragma unroll
      for (int u = 0; u < C::kSAcc; ++u)
#pragma unroll
        for (int j = 0; j < C::kNT; ++j) sacc[u][j][0] = sacc[u][j][1] = sacc[u][j][2] = sacc[u][j][3] = 0.f;
      const __nv_bfloat16* k_w = kt + ws * C::kTokW * kLdK;
#pragma unroll
      for (int ks = 0; ks < kDk / 16; ++ks) {
        uint32_t af[4];
        load_a(af, q_w + ks * 16, kLdK);
#pragma unroll
        for (int jp = 0; jp < C::kNT / 2; ++jp) {
          uint32_t bfr[4];
          load_b_nk(bfr, k_w + jp * 16 * kLdK + ks * 16, kLdK);
          mma_bf16(sacc[ks % C::kSAcc][2 * jp], af, bfr);
          mma_bf16(sacc[ks % C::kSAcc][2 * jp + 1], af, bfr + 2);
        }
      }
      // Scale, mask tokens past the end, partial row max over this warp's tokens.
      float sc[C::kNT][4];
      float mx0 = -INFINITY, mx1 = -INFINITY;
      const int tw = t0 + ws * C::kTokW + 2 * t4;  // token of c[0] in n8 tile 0
#pragma unroll
      for (int j = 0; j < C::kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = sacc[0][j][e];
          if constexpr (C::kSAcc == 2) v += sacc[1][j][e];
          v = tw + 8 * j + (e & 1) < end ? v * sl2 : -INFINITY;
          sc[j][e] = v;
          if (e < 2) mx0 = fmaxf(mx0, v);
          else mx1 = fmaxf(mx1, v);
        }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      if (t4 == 0) {
        red_max_w[ws * 16 + g] = mx0;
        red_max_w[ws * 16 + g + 8] = mx1;
      }
      __syncthreads();
      // The warp holding token t0 (< end) has a finite max, so m_new is finite: corr = 2^(-inf) = 0
      // on the first tile, never 2^(-inf + inf).
      float mn0 = m0, mn1 = m1;
#pragma unroll
      for (int w = 0; w < WS; ++w) {
        mn0 = fmaxf(mn0, red_max_w[w * 16 + g]);
        mn1 = fmaxf(mn1, red_max_w[w * 16 + g + 8]);
      }
      const float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);
      m0 = mn0;
      m1 = mn1;
      l0 *= c0;
      l1 *= c1;
#pragma unroll
      for (int j = 0; j < C::kNT; ++j) {
        const float p0 = fast_exp2(sc[j][0] - mn0), p1 = fast_exp2(sc[j][1] - mn0);
        const float p2 = fast_exp2(sc[j][2] - mn1), p3 = fast_exp2(sc[j][3] - mn1);
        l0 += p0 + p1;
        l1 += p2 + p3;
        const int col = ws * C::kTokW + 8 * j + 2 * t4;
        *reinterpret_cast<uint32_t*>(p_w + g * kLdP + col) = pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(p_w + (g + 8) * kLdP + col) = pack_bf16(p2, p3);
      }
#pragma unroll
      for (int j = 0; j < C::kNO; ++j) {
        o[j][0] *= c0;
        o[j][1] *= c0;
        o[j][2] *= c1;
        o[j][3] *= c1;
      }
      __syncthreads();  // P of all WS warps of the head tile is written

      // O[16 x this warp's kColW columns] += P[16 x 64] · V[64 x kColW].
      const __nv_bfloat16* v_w = kt + ws * C::kColW;
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk) {
        uint32_t af[4];
        load_a(af, p_w + kk * 16, kLdP);
#pragma unroll
        for (int jp = 0; jp < C::kNO / 2; ++jp) {
          uint32_t bfr[4];
          load_b_kn(bfr, v_w + kk * 16 * kLdK + jp * 16, kLdK);
          mma_bf16(o[2 * jp], af, bfr);
          mma_bf16(o[2 * jp + 1], af, bfr + 2);
        }
      }
      stage = (stage + 1) % kStages;
    }

    // Row sums: the quad's lanes, then the WS warps (all used the same running max). The barrier first:
    // an empty split follows the previous one's reads of red_l without a tile between them.
    __syncthreads();
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (t4 == 0) {
      red_l_w[ws * 16 + g] = l0;
      red_l_w[ws * 16 + g + 8] = l1;
    }
    __syncthreads();
    float L0 = 0.f, L1 = 0.f;
#pragma unroll
    for (int w = 0; w < WS; ++w) {
      L0 += red_l_w[w * 16 + g];
      L1 += red_l_w[w * 16 + g + 8];
    }
    // l == 0 only when this split saw no token (empty request or split past the end): o = 0, lse = -inf.
    const float inv0 = L0 > 0.f ? 1.f / L0 : 0.f, inv1 = L1 > 0.f ? 1.f / L1 : 0.f;
    const float lse0 = L0 > 0.f ? (m0 + __log2f(L0)) * kLn2 : -INFINITY;
    const float lse1 = L1 > 0.f ? (m1 + __log2f(L1)) * kLn2 : -INFINITY;
    const int hA = h0 + ht * 16 + g, hB = hA + 8;
    const int col0 = ws * C::kColW + 2 * t4;
    const int64_t rowA = (splits == 1 ? 0 : int64_t(split) * a.B * a.H) + int64_t(b) * a.H + hA;
    const int64_t rowB = rowA + 8;
    if (splits == 1 && a.o.bf16) {
      auto* out = static_cast<__nv_bfloat16*>(a.o.p);
#pragma unroll
      for (int j = 0; j < C::kNO; ++j) {
        const int col = col0 + 8 * j;
        if (hA < a.H) *reinterpret_cast<__nv_bfloat162*>(out + rowA * kR + col) =
            __floats2bfloat162_rn(o[j][0] * inv0, o[j][1] * inv0);
        if (hB < a.H) *reinterpret_cast<__nv_bfloat162*>(out + rowB * kR + col) =
            __floats2bfloat162_rn(o[j][2] * inv1, o[j][3] * inv1);
      }
    } else {
      float* out = splits == 1 ? static_cast<float*>(a.o.p) : part_o;
#pragma unroll
      for (int j = 0; j < C::kNO; ++j) {
        const int col = col0 + 8 * j;
        if (hA < a.H) *reinterpret_cast<float2*>(out + rowA * kR + col) = make_float2(o[j][0] * inv0, o[j][1] * inv0);
        if (hB < a.H) *reinterpret_cast<float2*>(out + rowB * kR + col) = make_float2(o[j][2] * inv1, o[j][3] * inv1);
      }
    }
    if (ws == 0 && t4 == 0) {
      float* lse_out = splits == 1 ? a.lse : part_lse;
      if (hA < a.H) lse_out[rowA] = lse0;
      if (hB < a.H) lse_out[rowB] = lse1;
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave none behind
}

// Simple form for any (R, Dr): one block per (request, head), 128 tokens per step, fp32.
__global__ void mla_decode_simple_kernel(MlaDecodeArgs a) {
  pdl_enter();
  extern __shared__ float qs[];  // [R + Dr]
  __shared__ float p[128];
  __shared__ float scratch[32];
  const int b = blockIdx.x, h = blockIdx.y, Dk = a.R + a.Dr;
  const int64_t row = int64_t(b) * a.H + h;
  for (int i = threadIdx.x; i < Dk; i += blockDim.x)
    qs[i] = __bfloat162float(i < a.R ? a.q_lat[row * a.R + i] : a.q_rope[row * a.Dr + i - a.R]);
  __syncthreads();
  const int seq = a.seq_lens[b];
  const int32_t* pages = a.block_table + int64_t(b) * a.max_pages;
  float m = -INFINITY, l = 0.f;
  constexpr int kMaxPerThread = 8;  // R <= 1024
  float acc[kMaxPerThread] = {};
  for (int t0 = 0; t0 < seq; t0 += 128) {
    const int t = t0 + threadIdx.x;
    float s = -INFINITY;
    if (t < seq) {
      const __nv_bfloat16* kr = a.kv + (int64_t(pages[t / a.page_size]) * a.page_size + t % a.page_size) * Dk;
      s = 0.f;
      for (int i = 0; i < Dk; ++i) s += qs[i] * __bfloat162float(kr[i]);
      s *= a.scale;
    }
    const float m_new = fmaxf(m, block_max(s, scratch));
    const float e = t < seq ? __expf(s - m_new) : 0.f;
    __syncthreads();
    p[threadIdx.x] = e;
    const float sum = block_sum(e, scratch);
    const float corr = __expf(m - m_new);
    l = l * corr + sum;
    m = m_new;
    const int n = min(128, seq - t0);
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) {
      const int d = threadIdx.x + 128 * c;
      if (d >= a.R) continue;
      float v = acc[c] * corr;
      for (int j = 0; j < n; ++j) {
        const int tt = t0 + j;
        v += p[j] * __bfloat162float(a.kv[(int64_t(pages[tt / a.page_size]) * a.page_size + tt % a.page_size) * Dk + d]);
      }
      acc[c] = v;
    }
    __syncthreads();
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int c = 0; c < kMaxPerThread; ++c) {
    const int d = threadIdx.x + 128 * c;
    if (d < a.R) a.o.set(row * a.R + d, acc[c] * inv);
  }
  if (threadIdx.x == 0) a.lse[row] = l > 0.f ? m + logf(l) : -INFINITY;
}

bool fast_shape(int R, int Dr) { return R == kR && Dr == kDr; }

// Heads per block of the fast path: 16 while one head tile covers H (memory-bound: 4 warps split
// the tokens and columns), else 32 or 48, whichever pads H less (48 on a tie: fewer blocks re-read Q).
int heads_per_block(int H) {
  if (H <= 16) return 16;
  const int pad32 = (H + 31) / 32 * 32, pad48 = (H + 47) / 48 * 48;
  return pad48 <= pad32 ? 48 : 32;
}

template <int HT, int WS, int KT, int NS>
void launch_mma(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* part_o, float* part_lse, cudaStream_t s) {
  using C = MmaCfg<HT, WS, KT, NS>;
  auto* kernel = mla_decode_mma_kernel<HT, WS, KT, NS>;
  K3_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  static_assert(kPlanTok % KT == 0, "a tile never straddles two splits");
  const int per_block = std::clamp(plan.splits_per_block, 1, plan.splits);
  const dim3 grid((a.H + 16 * HT - 1) / (16 * HT), (plan.splits + per_block - 1) / per_block, a.B);
  launch_pdl("mla_decode_mma_kernel", kernel, grid, C::kThreads, C::kSmem, s, a, plan.tokens_per_split, per_block,
             plan.splits, part_o, part_lse);
}

}  // namespace

// Splits are chosen by a cost model in units of "one block processes one tile": every fast-path
// block needs most of an SM's shared memory (one resident block per SM), so blocks run in waves of
// num_sms; time ~ waves · tiles per split, plus for more than one split the merge (a launch, about
// one tile's time, and the fp32 partials written and read back, relative to the cache bytes an SM
// streams per tile). Splits keep >= 4 tiles (256 tokens): below that a split's fixed cost (Q
// staging, pipeline fill, partial write) outweighs the parallelism. Blocks are counted as the
// kernel that runs will form them: 64 heads per block on the wgmma kernel (it takes H >= 64), else
// heads_per_block. (Counting the mma.sync kernel's 32-head blocks for the wgmma kernel once left
// half the SMs idle at H = 64: 64 blocks planned as 128.)
MlaDecodePlan plan_mla_decode(int B, int H, int max_context, int num_sms, bool wgmma_kernel, int head_form) {
  MlaDecodePlan plan;
  const int tiles = std::max(1, (max_context + kPlanTok - 1) / kPlanTok);
  int per_request = 0;
  if (wgmma_kernel && H >= 64) {
    const MlaHeadGroups hg = mla_wgmma_head_groups(H, head_form);
    per_request = hg.g64 + hg.g32 + hg.g48;
  } else {
    per_request = (std::max(H, 1) + heads_per_block(H) - 1) / heads_per_block(H);
  }
  const int64_t groups = int64_t(std::max(B, 1)) * per_request;
  const int slots = std::max(num_sms, 1);
  const int max_splits = std::clamp(tiles / 4, 1, 64);
  const double tile_bytes_per_wave = double(slots) * kPlanTok * kDk * 2;
  double best_cost = 0.0;
  int best_per = tiles;
  for (int s = 1; s <= max_splits; ++s) {
    const int per = (tiles + s - 1) / s;
    const int used = (tiles + per - 1) / per;  // splits actually needed at this tile count
    if (used != s) continue;                   // the same plan as a smaller s
    const int64_t waves = (groups * used + slots - 1) / slots;
    double cost = double(waves) * per;
    if (used > 1) cost += 1.0 + 2.0 * used * double(B) * H * (kR + 1) * 4 / tile_bytes_per_wave;
    if (s == 1 || cost < best_cost) {
      best_cost = cost;
      best_per = per;
    }
  }
  plan.tokens_per_split = best_per * kPlanTok;
  plan.splits = (tiles + best_per - 1) / best_per;
  return plan;
}

int64_t mla_decode_workspace_floats(const MlaDecodePlan& plan, int B, int H, int R) {
  return plan.splits > 1 ? int64_t(plan.splits) * B * H * (R + 1) : 0;
}

void launch_mla_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* work, cudaStream_t s) {
  if (a.B == 0 || a.H == 0) return;
  if (!fast_shape(a.R, a.Dr)) {
    if (a.R > 1024) throw Error("mla_decode: latent width " + std::to_string(a.R) + " > 1024");
    launch_pdl("mla_decode_simple_kernel", mla_decode_simple_kernel, dim3(a.B, a.H), 128, (a.R + a.Dr) * sizeof(float),
               s, a);
    return;
  }
  float* part_o = work;
  float* part_lse = work + int64_t(plan.splits) * a.B * a.H * a.R;
  if (a.use_wgmma && a.H >= 64) {
    launch_mla_decode_wgmma(a, plan, part_o, part_lse, s);  // mla_decode_wgmma.cu
  } else {
    switch (heads_per_block(a.H)) {
      case 16: launch_mma<1, 4, 64, 2>(a, plan, part_o, part_lse, s); break;
      case 32: launch_mma<2, 2, 64, 2>(a, plan, part_o, part_lse, s); break;
      default: launch_mma<3, 2, 64, 2>(a, plan, part_o, part_lse, s); break;
    }
  }
  if (plan.splits > 1)
    launch_lse_merge(FIn{part_o, false}, part_lse, a.o, a.lse, plan.splits, int64_t(a.B) * a.H, a.R, s);
}

}  // namespace k3::cuda
