// Bulk (TMA) copies of a chunk's workspace tiles into a wgmma scan block's shared memory: one thread
// issues a handful of copies per chunk and every thread waits on an mbarrier, where the cp.async form
// spent 16 copies and their address arithmetic per thread per tile (a sixth of the 64-row scan's
// stall samples at T = 8192, H = 96). The tiles land in the 128B-swizzled operand layout of
// wgmma.cuh, as the cp.async copies put them.
#pragma once
#include <cuda.h>

#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::kda_chunk {

// The workspace (kda_chunk_layout.cuh) seen three ways, tile t = chunk·H + head:
//  tiles: bf16 rows of 128 (kTileRows128 a tile: W at +0, U at +64, Q⊙e^Γ at +128, K_d at +192),
//         boxes of 64 x 64 with the 128B swizzle (one k half of a [64][128] operand: 8 atoms);
//  mq:    bf16 rows of 64 (kTileRows64 a tile, M_qk at +512), the same boxes;
//  u32:   rows of 128, boxes of 32 x 64 without swizzle (a 32-row block's slice of U, row-major).
struct KdaScanMaps {
  CUtensorMap tiles, mq, u32;
};
constexpr int kTileRows128 = int(kWorkBytes / 256), kTileRows64 = int(kWorkBytes / 128);
static_assert(kWorkBytes % 256 == 0 && kOffMq * 2 == 512 * 128, "M_qk at row 512 of the 64-wide view");

#if defined(__CUDACC__)
// L: the block's layout (ScanWg, ScanWg32); VT rows of V from v0. bar_a counts W, Q⊙e^Γ, U; bar_b
// counts K_d, M_qk, e^{Γ_C}. Called by one thread.
template <class L, int VT>
struct ScanWgTma {
  uint32_t sbase;
  const KdaScanMaps* maps;
  void* work;
  int H, h, v0;
  bool write_o, zero_u;
  uint32_t bar_a, bar_b;
  __device__ __forceinline__ void wuq(int c) const {
    const int row = (c * H + h) * kTileRows128;
    const uint32_t bytes = 16384u + (write_o ? 16384u : 0u) + (zero_u ? 0u : uint32_t(kC * VT * 2));
    mbar_expect_tx(bar_a, bytes);
    for (int kh = 0; kh < 2; ++kh) {
      tma_load_2d(sbase + L::kOffW + kh * 8192, &maps->tiles, 64 * kh, row, bar_a);
      if (write_o) tma_load_2d(sbase + L::kOffQ + kh * 8192, &maps->tiles, 64 * kh, row + 128, bar_a);
    }
    if (zero_u) return;
    if constexpr (VT == 64) tma_load_2d(sbase + L::kOffU, &maps->tiles, v0, row + 64, bar_a);
    else tma_load_2d(sbase + L::kOffU, &maps->u32, v0, row + 64, bar_a);
  }
  __device__ __forceinline__ void kmg(int c) const {
    const int t = c * H + h;
    const uint32_t bytes = 16384u + (write_o ? 8192u : 0u) + uint32_t(kD * 4);
    mbar_expect_tx(bar_b, bytes);
    for (int kh = 0; kh < 2; ++kh)
      tma_load_2d(sbase + L::kOffKd + kh * 8192, &maps->tiles, 64 * kh, t * kTileRows128 + 192, bar_b);
    if (write_o) tma_load_2d(sbase + L::kOffMq, &maps->mq, 0, t * kTileRows64 + 512, bar_b);
    bulk_load(sbase + L::kOffGc, work_gc(work, c, H, h), kD * 4, bar_b);
  }
};

// Element pair (r, col), (r, col + 1) of the block's U slice as the copy left it: the 64-row block's
// box in the 128B swizzle, the 32-row block's row-major.
template <int VT>
__device__ __forceinline__ uint32_t u_pair(const unsigned char* us, int r, int col) {
  if constexpr (VT == 64) return *reinterpret_cast<const uint32_t*>(us + wg::op_offset(r, col >> 3) + (col & 7) * 2);
  else return *reinterpret_cast<const uint32_t*>(us + (r * VT + col) * 2);
}
#endif

}  // namespace k3::cuda::kda_chunk
