// Absorbed MLA decode over a paged latent cache (MQA: one 576-wide KV head, H query heads):
// s = (q_lat·c + q_rope·kr)·scale, o = softmax(s)·c (512 wide), natural-log LSE.
//
// Fast path (R = 512, Dr = 64): one block per (16-head group, KV split, request). A 64-token tile
// of the cache is staged in shared memory once and used by all 16 heads: scores = Q Kᵀ and
// P V are bf16 tensor-core products (fp32 accumulate), the online softmax is fp32. Grid order puts
// the head groups of one split next to each other so they share the tile through L2. With more
// than one split, each split writes an fp32 partial (o, lse) and the LSE merge combines them.
// The split plan depends on shapes only (max context = max_pages·page_size), never on seq_lens,
// so a decode step can be captured in a CUDA graph.
// Other shapes use a simple per-(request, head) kernel, which is also the fast path's oracle.
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

using namespace nvcuda;

constexpr int kR = 512, kDr = 64, kDk = kR + kDr;
constexpr int kHeads = 16;     // heads per block (one MMA row tile)
constexpr int kTok = 64;       // tokens per tile
constexpr int kLdK = kDk + 8;  // bf16 row pitch (16 B multiple, rows on different banks)
constexpr int kLdS = kTok + 4;
constexpr int kLdP = kTok + 8;
constexpr int kLdO = kR + 4;
constexpr int kThreads = 256;

struct Smem {
  __nv_bfloat16 q[kHeads * kLdK];
  __nv_bfloat16 k[2][kTok * kLdK];  // double buffer: tile i+1 streams in while tile i is used
  float sc[2][kHeads * kLdS];
  __nv_bfloat16 p[kHeads * kLdP];
  float pv[kHeads * kLdO];
  float corr[kHeads];
};

// Issues the copies of tile [t0, t0+64) into `dst`: 18 x 16 B per thread, all in flight at once.
__device__ __forceinline__ void issue_tile(__nv_bfloat16* dst, const MlaDecodeArgs& a, const int32_t* pages, int t0,
                                           int end, int page_shift) {
  constexpr int kChunks = kTok * (kDk / 8) / kThreads;
  static_assert(kTok * (kDk / 8) % kThreads == 0, "tile copy must split evenly");
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int idx = threadIdx.x + j * kThreads;
    const int t = idx / (kDk / 8), c8 = (idx % (kDk / 8)) * 8;
    const int tok = t0 + t;
    const bool valid = tok < end;
    // Power-of-two pages (the usual case) index with shifts: a runtime division per 16-byte chunk
    // was a third of this kernel's instructions.
    const int pg = page_shift >= 0 ? tok >> page_shift : tok / a.page_size;
    const int in_page = page_shift >= 0 ? tok & (a.page_size - 1) : tok - pg * a.page_size;
    const int64_t page = valid ? pages[pg] : 0;
    const __nv_bfloat16* src = a.kv + (page * a.page_size + (valid ? in_page : 0)) * kDk + c8;
    cp_async16(dst + t * kLdK + c8, src, valid);
  }
}

__global__ void __launch_bounds__(kThreads) mla_decode_tc_kernel(MlaDecodeArgs a, int tokens_per_split, int splits,
                                                                 float* part_o, float* part_lse) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int hg = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h0 = hg * kHeads;
  const int seq = a.seq_lens[b];
  const int begin = split * tokens_per_split;
  const int end = min(seq, begin + tokens_per_split);

  for (int idx = tid; idx < kHeads * (kDk / 8); idx += kThreads) {  // 16-byte chunks of Q
    const int h = idx / (kDk / 8), c8 = (idx % (kDk / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + h < a.H) {
      const int64_t row = int64_t(b) * a.H + h0 + h;
      v = c8 < kR ? *reinterpret_cast<const uint4*>(a.q_lat + row * kR + c8)
                  : *reinterpret_cast<const uint4*>(a.q_rope + row * kDr + (c8 - kR));
    }
    *reinterpret_cast<uint4*>(sm.q + h * kLdK + c8) = v;
  }
  // Output ownership: thread -> head row tid/16, columns (tid%16)*4 + 64*j.
  const int orow = tid / 16, ocol = (tid % 16) * 4;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;  // per head row, kept by warp (row/2) lanes; see softmax

  const int32_t* pages = a.block_table + int64_t(b) * a.max_pages;
  const int page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
  if (begin < end) issue_tile(sm.k[0], a, pages, begin, end, page_shift);
  cp_async_commit();
  int buf = 0;
  for (int t0 = begin; t0 < end; t0 += kTok, buf ^= 1) {
    if (t0 + kTok < end) issue_tile(sm.k[buf ^ 1], a, pages, t0 + kTok, end, page_shift);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = this tile
    cp_async_wait<1>();
    __syncthreads();
    const __nv_bfloat16* ktile = sm.k[buf];
    {  // scores: warp -> 16 tokens (warp % 4) x half of the 576 dims (warp / 4)
      const int ct = warp % 4, half = warp / 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.f);
      for (int kk = half * (kDk / 2); kk < (half + 1) * (kDk / 2); kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, sm.q + kk, kLdK);
        wmma::load_matrix_sync(fb, ktile + ct * 16 * kLdK + kk, kLdK);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(sm.sc[half] + ct * 16, c, kLdS, wmma::mem_row_major);
    }
    __syncthreads();
    // Online softmax: warp w owns head rows 2w and 2w+1; lane holds tokens lane and lane+32.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = 2 * warp + rr;
      float s0 = (sm.sc[0][r * kLdS + lane] + sm.sc[1][r * kLdS + lane]) * a.scale;
      float s1 = (sm.sc[0][r * kLdS + lane + 32] + sm.sc[1][r * kLdS + lane + 32]) * a.scale;
      if (t0 + lane >= end) s0 = -INFINITY;
      if (t0 + lane + 32 >= end) s1 = -INFINITY;
      const float m_old = __shfl_sync(0xffffffffu, m_run, rr);
      const float l_old = __shfl_sync(0xffffffffu, l_run, rr);
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));  // finite: the tile has >= 1 token
      const float p0 = __expf(s0 - m_new), p1 = __expf(s1 - m_new);
      const float corr = __expf(m_old - m_new);
      const float l_new = l_old * corr + warp_sum(p0 + p1);
      sm.p[r * kLdP + lane] = __float2bfloat16(p0);
      sm.p[r * kLdP + lane + 32] = __float2bfloat16(p1);
      if (lane == 0) sm.corr[r] = corr;
      if (lane == rr) {
        m_run = m_new;
        l_run = l_new;
      }
    }
    __syncthreads();
    {  // PV: warp -> 4 column tiles of 16 (64 columns) of the 512-wide output
      for (int j = 0; j < 4; ++j) {
        const int ct = warp * 4 + j;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        wmma::fill_fragment(c, 0.f);
#pragma unroll
        for (int kk = 0; kk < kTok; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
          wmma::load_matrix_sync(fa, sm.p + kk, kLdP);
          wmma::load_matrix_sync(fb, ktile + kk * kLdK + ct * 16, kLdK);
          wmma::mma_sync(c, fa, fb, c);
        }
        wmma::store_matrix_sync(sm.pv + ct * 16, c, kLdO, wmma::mem_row_major);
      }
    }
    __syncthreads();
    const float corr = sm.corr[orow];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 v = *reinterpret_cast<const float4*>(sm.pv + orow * kLdO + ocol + 64 * j);
      acc[j][0] = acc[j][0] * corr + v.x;
      acc[j][1] = acc[j][1] * corr + v.y;
      acc[j][2] = acc[j][2] * corr + v.z;
      acc[j][3] = acc[j][3] * corr + v.w;
    }
    __syncthreads();  // every warp is done with sm.k[buf] before the next iteration refills it
  }
  // Row statistics live in lane (row % 2) of warp (row / 2).
  __shared__ float row_l[kHeads], row_m[kHeads];
  if (lane < 2) {
    row_l[2 * warp + lane] = l_run;
    row_m[2 * warp + lane] = m_run;
  }
  __syncthreads();
  const int h = h0 + orow;
  if (h >= a.H) return;
  const float l = row_l[orow];
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const float lse = l > 0.f ? row_m[orow] + logf(l) : -INFINITY;
  const int64_t row = int64_t(b) * a.H + h;
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) a.o.set(row * kR + ocol + 64 * j + e, acc[j][e] * inv);
    if (tid % 16 == 0) a.lse[row] = lse;
  } else {
    const int64_t prow = int64_t(split) * a.B * a.H + row;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<float4*>(part_o + prow * kR + ocol + 64 * j) =
          make_float4(acc[j][0] * inv, acc[j][1] * inv, acc[j][2] * inv, acc[j][3] * inv);
    if (tid % 16 == 0) part_lse[prow] = lse;
  }
}

// Simple form for any (R, Dr): one block per (request, head), 128 tokens per step, fp32.
__global__ void mla_decode_simple_kernel(MlaDecodeArgs a) {
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

}  // namespace

MlaDecodePlan plan_mla_decode(int B, int H, int max_context, int num_sms) {
  MlaDecodePlan plan;
  const int groups = B * ((H + kHeads - 1) / kHeads);
  int splits = std::max(1, (2 * num_sms + groups - 1) / std::max(groups, 1));
  const int min_tokens = 256;  // below this a split's fixed cost outweighs the parallelism
  splits = std::min(splits, std::max(1, (max_context + min_tokens - 1) / min_tokens));
  splits = std::min(splits, 64);
  int per = (max_context + splits - 1) / splits;
  per = ((per + kTok - 1) / kTok) * kTok;
  plan.tokens_per_split = std::max(per, kTok);
  plan.splits = std::max(1, (max_context + plan.tokens_per_split - 1) / plan.tokens_per_split);
  return plan;
}

int64_t mla_decode_workspace_floats(const MlaDecodePlan& plan, int B, int H, int R) {
  return plan.splits > 1 ? int64_t(plan.splits) * B * H * (R + 1) : 0;
}

void launch_mla_decode(const MlaDecodeArgs& a, const MlaDecodePlan& plan, float* work, cudaStream_t s) {
  if (a.B == 0 || a.H == 0) return;
  if (!fast_shape(a.R, a.Dr)) {
    if (a.R > 1024) throw Error("mla_decode: latent width " + std::to_string(a.R) + " > 1024");
    mla_decode_simple_kernel<<<dim3(a.B, a.H), 128, (a.R + a.Dr) * sizeof(float), s>>>(a);
    K3_CUDA_LAUNCHED("mla_decode_simple_kernel");
    return;
  }
  float* part_o = work;
  float* part_lse = work + int64_t(plan.splits) * a.B * a.H * a.R;
  const size_t smem = sizeof(Smem);
  K3_CUDA_OK(cudaFuncSetAttribute(mla_decode_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid((a.H + kHeads - 1) / kHeads, plan.splits, a.B);
  mla_decode_tc_kernel<<<grid, kThreads, smem, s>>>(a, plan.tokens_per_split, plan.splits, part_o, part_lse);
  K3_CUDA_LAUNCHED("mla_decode_tc_kernel");
  if (plan.splits > 1)
    launch_lse_merge(FIn{part_o, false}, part_lse, a.o, a.lse, plan.splits, int64_t(a.B) * a.H, a.R, s);
}

}  // namespace k3::cuda
