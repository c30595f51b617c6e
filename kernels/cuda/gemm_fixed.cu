// Fixed-order bf16 GEMM for batch-invariant serving: y = alpha x w^T + beta y, optionally batched
// with strides (head_gemm). Every output element is the same sequence of tensor-core products over
// K in steps of 16, whatever M, N, the tile or the grid, and there is no split-K: a row's result
// never depends on which other rows share the call. cuBLASLt picks algorithms (tile shapes, split-K)
// by M, so a request's logits would change with the batch it is in; this kernel does not.
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace k3::cuda {
namespace {

using namespace nvcuda;
constexpr int kTile = 64;
constexpr int kK = 32;
constexpr int kLd = kK + 8;
constexpr int kCLd = kTile + 4;

__device__ __forceinline__ void load8(__nv_bfloat16* dst, const __nv_bfloat16* row, int k0, int64_t K) {
  const __nv_bfloat16* src = row + k0;
  if (row != nullptr && k0 + 8 <= K && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = (row != nullptr && k0 + i < K) ? src[i] : __float2bfloat16(0.f);
}

__global__ void __launch_bounds__(128) gemm_fixed_kernel(FixedGemmArgs a) {
  const int64_t m0 = int64_t(blockIdx.x) * kTile, n0 = int64_t(blockIdx.y) * kTile, b = blockIdx.z;
  const auto* x = static_cast<const __nv_bfloat16*>(a.x) + b * a.stride_x;
  const auto* w = static_cast<const __nv_bfloat16*>(a.w) + b * a.stride_w;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* As = reinterpret_cast<__nv_bfloat16*>(smem);
  auto* Bs = As + kTile * kLd;
  const int warp = threadIdx.x >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  for (int k0 = 0; k0 < a.K; k0 += kK) {
    for (int c = threadIdx.x; c < kTile * (kK / 8); c += blockDim.x) {
      const int row = c / (kK / 8), kc = (c % (kK / 8)) * 8;
      load8(As + row * kLd + kc, m0 + row < a.M ? x + (m0 + row) * a.ldx : nullptr, k0 + kc, a.K);
      load8(Bs + row * kLd + kc, n0 + row < a.N ? w + (n0 + row) * a.ldw : nullptr, k0 + kc, a.K);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * kLd + kk, kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, Bs + (wn + 16 * j) * kLd + kk, kLd);
#pragma unroll
        for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
      }
    }
    __syncthreads();
  }
  auto* Cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(Cs + (wm + 16 * i) * kCLd + wn + 16 * j, acc[i][j], kCLd, wmma::mem_row_major);
  __syncthreads();
  for (int c = threadIdx.x; c < kTile * kTile; c += blockDim.x) {
    const int row = c / kTile, col = c % kTile;
    if (m0 + row >= a.M || n0 + col >= a.N) continue;
    const int64_t o = b * a.stride_y + (m0 + row) * a.ldy + n0 + col;
    float v = a.alpha * Cs[row * kCLd + col];
    if (a.beta != 0.f) v += a.beta * a.y.get(o);
    a.y.set(o, v);
  }
}

}  // namespace

void launch_gemm_fixed(const FixedGemmArgs& a, cudaStream_t s) {
  if (a.M == 0 || a.N == 0 || a.batch == 0) return;
  const size_t smem = std::max(size_t(kTile) * kLd * 2 * sizeof(__nv_bfloat16), size_t(kTile) * kCLd * sizeof(float));
  K3_CUDA_OK(cudaFuncSetAttribute(gemm_fixed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((a.M + kTile - 1) / kTile), unsigned((a.N + kTile - 1) / kTile), unsigned(a.batch));
  gemm_fixed_kernel<<<grid, 128, smem, s>>>(a);
  K3_CUDA_LAUNCHED("gemm_fixed_kernel");
}

}  // namespace k3::cuda
