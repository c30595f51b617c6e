// The mma.sync form of the fixed-order GEMM (gemm_fixed.h), for shapes the wgmma form's TMA loads
// cannot take (K < 64, a pitch that is not a multiple of 8 elements, an unaligned base).
//
// Its order is a function of K alone: K is cut into super-steps of kKStep = 256; warp w of the CTA's
// 8 owns the 32 columns [32w, 32w + 32) of every super-step and accumulates them with tensor-core
// products in increasing k (two k16 steps each), zero-padded past K; the 8 warp partials are then added
// in a fixed tree ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). The tile (BM x BN) is picked
// from M only to fill the SMs: narrow N tiles at small M (M = 1 at N = 2048 gives 128 CTAs). Weight
// and activation tiles stream through a cp.async ring of kStages super-steps.
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_fixed.h"
#include "kernels/cuda/gemm_fixed_epilogue.cuh"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

using namespace nvcuda;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpK = 32;                 // columns of a super-step owned by one warp
constexpr int kKStep = kWarps * kWarpK;    // 256: the K super-step, fixed (never depends on M)
constexpr int kLd = kKStep + 8;            // smem row pitch (bf16): 528 bytes, rows spread over banks

template <int BM, int BN>
struct Cfg {
  static constexpr int kStages = BM + BN <= 32 ? 4 : BM + BN <= 80 ? 3 : 2;
  static constexpr int kStageElems = (BM + BN) * kLd;
  static constexpr int kCLd = BN + 4;  // fp32 partial tile pitch
  static constexpr size_t kSmem = std::max(size_t(kStages) * kStageElems * sizeof(__nv_bfloat16),
                                           size_t(kWarps / 2) * BM * kCLd * sizeof(float));
};

// 8 bf16 of `row` from k (zeros past K or for a missing row): cp.async when aligned, else by hand.
__device__ __forceinline__ void load8(__nv_bfloat16* dst, const __nv_bfloat16* row, int64_t k, int64_t K) {
  if (row == nullptr || k >= K) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    return;
  }
  const __nv_bfloat16* src = row + k;
  if (k + 8 <= K && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    cp_async16(dst, src);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = k + i < K ? src[i] : __float2bfloat16(0.f);
}

template <int BM, int BN>
__global__ void __launch_bounds__(kThreads) gemm_fixed_kernel(FixedGemmArgs a) {
  pdl_enter();
  using C = Cfg<BM, BN>;
  constexpr int kFm = BM / 16, kFn = BN / 16;
  const int64_t n0 = int64_t(blockIdx.x) * BN, m0 = int64_t(blockIdx.y) * BM, b = blockIdx.z;
  const auto* x = static_cast<const __nv_bfloat16*>(a.x) + b * a.stride_x;
  const auto* w = static_cast<const __nv_bfloat16*>(a.w) + b * a.stride_w;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* ring = reinterpret_cast<__nv_bfloat16*>(smem);
  const int warp = threadIdx.x >> 5;
  const int64_t steps = (a.K + kKStep - 1) / kKStep;

  auto load_step = [&](int64_t step) {
    __nv_bfloat16* As = ring + (step % C::kStages) * C::kStageElems;
    __nv_bfloat16* Bs = As + BM * kLd;
    const int64_t k0 = step * kKStep;
    for (int c = threadIdx.x; c < (BM + BN) * (kKStep / 8); c += kThreads) {
      const int row = c / (kKStep / 8), kc = (c % (kKStep / 8)) * 8;
      if (row < BM) {
        load8(As + row * kLd + kc, m0 + row < a.M ? x + (m0 + row) * a.ldx : nullptr, k0 + kc, a.K);
      } else {
        const int r = row - BM;
        load8(Bs + r * kLd + kc, n0 + r < a.N ? w + (n0 + r) * a.ldw : nullptr, k0 + kc, a.K);
      }
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFm][kFn];
#pragma unroll
  for (int i = 0; i < kFm; ++i)
#pragma unroll
    for (int j = 0; j < kFn; ++j) wmma::fill_fragment(acc[i][j], 0.f);

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < steps) load_step(s);
    cp_async_commit();
  }
  for (int64_t t = 0; t < steps; ++t) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // step t landed for every thread; the buffer of step t - 1 is free
    if (t + C::kStages - 1 < steps) load_step(t + C::kStages - 1);
    cp_async_commit();
    const __nv_bfloat16* As = ring + (t % C::kStages) * C::kStageElems;
    const __nv_bfloat16* Bs = As + BM * kLd;
#pragma unroll
    for (int kk = 0; kk < kWarpK; kk += 16) {
      const int col = warp * kWarpK + kk;
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[kFm];
#pragma unroll
      for (int i = 0; i < kFm; ++i) wmma::load_matrix_sync(fa[i], As + 16 * i * kLd + col, kLd);
#pragma unroll
      for (int j = 0; j < kFn; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, Bs + 16 * j * kLd + col, kLd);
#pragma unroll
        for (int i = 0; i < kFm; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it for the partials

  // Fixed tree over the warp partials: warps [h, 2h) hand theirs to warps [0, h), h = 4, 2, 1.
  auto* part = reinterpret_cast<float*>(smem);
  // This warp's partial tile into shared memory at p (a hand-over in the tree, then warp 0's sum).
  auto store_acc = [&](float* p) {
#pragma unroll
    for (int i = 0; i < kFm; ++i)
#pragma unroll
      for (int j = 0; j < kFn; ++j)
        wmma::store_matrix_sync(p + 16 * i * C::kCLd + 16 * j, acc[i][j], C::kCLd, wmma::mem_row_major);
  };
#pragma unroll
  for (int h = kWarps / 2; h >= 1; h /= 2) {
    if (warp >= h && warp < 2 * h) store_acc(part + (warp - h) * BM * C::kCLd);
    __syncthreads();
    if (warp < h) {
      const float* p = part + warp * BM * C::kCLd;
#pragma unroll
      for (int i = 0; i < kFm; ++i)
#pragma unroll
        for (int j = 0; j < kFn; ++j) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
          wmma::load_matrix_sync(o, p + 16 * i * C::kCLd + 16 * j, C::kCLd, wmma::mem_row_major);
#pragma unroll
          for (int e = 0; e < o.num_elements; ++e) acc[i][j].x[e] = acc[i][j].x[e] + o.x[e];
        }
    }
    __syncthreads();
  }
  if (warp == 0) store_acc(part);
  __syncthreads();
  for (int c = threadIdx.x; c < BM * BN; c += kThreads) {
    const int row = c / BN, col = c % BN;
    if (m0 + row >= a.M || n0 + col >= a.N) continue;
    store_fixed_gemm(a.y, b * a.stride_y + (m0 + row) * a.ldy + n0 + col, part[row * C::kCLd + col], a.alpha, a.beta);
  }
}

template <int BM, int BN>
void launch_tile(const FixedGemmArgs& a, cudaStream_t s) {
  constexpr size_t smem = Cfg<BM, BN>::kSmem;
  K3_CUDA_OK(cudaFuncSetAttribute(gemm_fixed_kernel<BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((a.N + BN - 1) / BN), unsigned((a.M + BM - 1) / BM), unsigned(a.batch));
  launch_pdl("gemm_fixed_kernel", gemm_fixed_kernel<BM, BN>, grid, kThreads, smem, s, a);
}

}  // namespace

void launch_gemm_fixed_mma(const FixedGemmArgs& a, cudaStream_t s) {
  if (a.M == 0 || a.N == 0 || a.batch == 0) return;
  // The tile follows M only to fill the SMs and reuse weight tiles; the K order is the same for all.
  if (a.M <= 16) launch_tile<16, 16>(a, s);
  else if (a.M <= 32) launch_tile<32, 16>(a, s);
  else if (a.M <= 64) launch_tile<64, 16>(a, s);
  else if (a.M <= 1024) launch_tile<64, 32>(a, s);
  else launch_tile<64, 64>(a, s);
}

}  // namespace k3::cuda
