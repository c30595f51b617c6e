// KV tiles of the Hopper MLA decode kernels (mla_decode_wgmma.cu and its 32-head transposed block,
// mla_decode_t32.cuh): 64 cache rows of 576 bf16 (512 latent + 64 rope dims) in shared memory as
// 128B-swizzle atoms [9 dim chunks][8 token groups] (wgmma.cuh), loaded by the tensor memory
// accelerator, and the few numeric helpers both kernels share.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::mla_tiles {

constexpr int kR = 512, kDr = 64, kDk = kR + kDr;
constexpr int kTok = 64;              // tokens per KV tile (plan_mla_decode splits are multiples of 64)
constexpr int kDimAtoms = kDk / 64;   // 9 dim chunks of 64
constexpr int kChunks = kDk / 8;      // 16-byte chunks per row (72)
constexpr int kTileBytes = kDimAtoms * (kTok / 8) * wg::kAtomBytes;  // 73728
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2 of the page size when it is a power of two (shift and mask), else -1 (divide).
__device__ __forceinline__ int page_shift_of(int page_size) {
  return (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
}

// Tokens [t0, min(t0 + 64, end)) into the stage at shared address `dst`, issued by the 32 lanes of
// the calling warp: boxes of box_rows rows x 64 dims (box_rows divides the page size and 64, so a
// box never crosses a page), each landing at its rows of its dim chunk already swizzled (the copy
// engine applies the same 128B XOR that wg::op_offset encodes). Boxes wholly past `end` are not
// loaded (their page may not exist); the rows past `end` are zeroed by zero_tail once the copies
// are in.
__device__ __forceinline__ void issue_tile_tma(uint32_t dst, uint32_t bar, const CUtensorMap* map,
                                               const MlaDecodeArgs& a, const int32_t* pages, int t0, int end,
                                               int page_shift, int box_rows) {
  const int lane = threadIdx.x & 31;
  const int rows = min(kTok, end - t0);
  const int boxes = (rows + box_rows - 1) / box_rows * kDimAtoms;
  if (lane == 0) mbar_expect_tx(bar, uint32_t(boxes * box_rows * wg::kRowBytes));
  __syncwarp();
  for (int k = lane; k < boxes; k += 32) {
    const int rb = k / kDimAtoms, c = k % kDimAtoms;
    const int tok = t0 + rb * box_rows;
    const int pg = page_shift >= 0 ? tok >> page_shift : tok / a.page_size;
    const int in_page = page_shift >= 0 ? tok & (a.page_size - 1) : tok - pg * a.page_size;
    tma_load_2d(dst + uint32_t(c * 8 * wg::kAtomBytes + rb * box_rows * wg::kRowBytes), map, c * 64,
                pages[pg] * a.page_size + in_page, bar);
  }
}

// Rows [rows, 64) of a TMA-loaded stage, by `threads` threads of which this is number `t`: unused
// cache rows may hold NaN, and P = 0 times NaN is NaN.
__device__ __forceinline__ void zero_tail(unsigned char* stage, int rows, int t, int threads) {
  constexpr int kPerRow = kDimAtoms * 8;  // 16-byte chunks of one row across the 9 dim atoms
  for (int idx = t; idx < (kTok - rows) * kPerRow; idx += threads) {
    const int r = rows + idx / kPerRow, c = (idx % kPerRow) / 8, q = idx % 8;
    *reinterpret_cast<uint4*>(stage + c * 8 * wg::kAtomBytes + r * wg::kRowBytes + q * 16) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace k3::cuda::mla_tiles
