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
// And the checkpoint slots [slot][head][v][k] as fp32 rows of 128 (row (slot·H + head)·128 + v):
//  ckpt:  boxes of 32 k x 32 v with the 128B swizzle, stored from a block's staging buffer.
struct KdaScanMaps {
  CUtensorMap tiles, mq, u32, ckpt;
};
constexpr int kTileRows128 = int(kWorkBytes / 256), kTileRows64 = int(kWorkBytes / 128);
static_assert(kWorkBytes % 256 == 0 && kOffMq * 2 == 512 * 128, "M_qk at row 512 of the 64-wide view");

#if defined(__CUDACC__)
// A wgmma scan block's dynamic shared memory from its 1024-byte boundary (the 128B-swizzle atoms;
// each layout's kSmem holds the slack).
__device__ __forceinline__ unsigned char* scan_wg_smem(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// L: the block's layout (ScanWg, ScanWg32); VT rows of V from v0. Two mbarriers at L::kOffBar:
// bar_a counts W, Q⊙e^Γ, U; bar_b counts K_d, M_qk, e^{Γ_C}. The copies and the checkpoint store
// are issued by one thread; every thread waits.
template <class L, int VT>
struct ScanWgTma {
  uint32_t sbase;
  const KdaScanMaps* maps;
  void* work;
  int H, h, v0;
  bool write_o, zero_u;
  uint32_t phase_a = 0, phase_b = 0;  // the parity each barrier's next completion has
  __device__ __forceinline__ uint32_t bar_a() const { return sbase + L::kOffBar; }
  __device__ __forceinline__ uint32_t bar_b() const { return sbase + L::kOffBar + 8; }
  // Every thread: thread 0 sets the barriers up, and the block barrier orders that before any
  // copy names them.
  __device__ __forceinline__ void init(int tid) const {
    if (tid == 0) {
      mbar_init(bar_a());
      mbar_init(bar_b());
    }
    __syncthreads();
  }
  // Every thread: until the chunk's first (W, Q⊙e^Γ, U) or second (K_d, M_qk, e^{Γ_C}) group is in.
  __device__ __forceinline__ void wait_wuq() {
    mbar_wait(bar_a(), phase_a);
    phase_a ^= 1;
  }
  __device__ __forceinline__ void wait_kmg() {
    mbar_wait(bar_b(), phase_b);
    phase_b ^= 1;
  }
  __device__ __forceinline__ void wuq(int c) const {
    const int row = (c * H + h) * kTileRows128;
    const uint32_t bytes = 16384u + (write_o ? 16384u : 0u) + (zero_u ? 0u : uint32_t(kC * VT * 2));
    mbar_expect_tx(bar_a(), bytes);
    for (int kh = 0; kh < 2; ++kh) {
      tma_load_2d(sbase + L::kOffW + kh * 8192, &maps->tiles, 64 * kh, row, bar_a());
      if (write_o) tma_load_2d(sbase + L::kOffQ + kh * 8192, &maps->tiles, 64 * kh, row + 128, bar_a());
    }
    if (zero_u) return;
    if constexpr (VT == 64) tma_load_2d(sbase + L::kOffU, &maps->tiles, v0, row + 64, bar_a());
    else tma_load_2d(sbase + L::kOffU, &maps->u32, v0, row + 64, bar_a());
  }
  __device__ __forceinline__ void kmg(int c) const {
    const int t = c * H + h;
    const uint32_t bytes = 16384u + (write_o ? 8192u : 0u) + uint32_t(kD * 4);
    mbar_expect_tx(bar_b(), bytes);
    for (int kh = 0; kh < 2; ++kh)
      tma_load_2d(sbase + L::kOffKd + kh * 8192, &maps->tiles, 64 * kh, t * kTileRows128 + 192, bar_b());
    if (write_o) tma_load_2d(sbase + L::kOffMq, &maps->mq, 0, t * kTileRows64 + 512, bar_b());
    bulk_load(sbase + L::kOffGc, work_gc(work, c, H, h), kD * 4, bar_b());
  }
  // Before the chunk loop: thread 0 issues both groups of the first chunk, if there is one.
  __device__ __forceinline__ void first(int tid, int c_begin, int c_end) const {
    if (tid == 0 && c_begin < c_end) {
      wuq(c_begin);
      kmg(c_begin);
    }
  }
  // The staged state (ckpt_stage_offset) to checkpoint slot `slot`; returns once the copy engine has
  // read the staging buffer, which the next chunk's copies may then overwrite.
  __device__ __forceinline__ void ckpt(int slot) const {
    const int row = (slot * H + h) * kD + v0;
#pragma unroll
    for (int half = 0; half < VT / 32; ++half)
#pragma unroll
      for (int kb = 0; kb < kD / 32; ++kb)
        tma_store_2d(&maps->ckpt, 32 * kb, row + 32 * half, sbase + uint32_t(L::ckpt_half(half) + kb * 4096));
    bulk_commit();
    bulk_wait_read_all();
  }
};

// Where a scan block stages its fp32 state [VT v][128 k] for the bulk store to a checkpoint slot:
// 32-row halves at L::ckpt_half(0), L::ckpt_half(1) (buffers free between the chunk's last product
// and the next chunk's K_d copy), each four 4 KiB boxes of 32 k in the 128B swizzle. The swizzle
// spreads both scans' per-thread writes over all 32 banks. Byte offset of element (v, k):
// Within a 32-row quarter (v < 32):
__device__ __forceinline__ uint32_t ckpt_swizzle(int v, int k) {
  return uint32_t((k >> 5) * 4096 + v * 128 + ((((k & 31) >> 2) ^ (v & 7)) << 4) + (k & 3) * 4);
}
template <class L>
__device__ __forceinline__ uint32_t ckpt_stage_offset(int v, int k) {
  return uint32_t(L::ckpt_half(v >> 5)) + ckpt_swizzle(v & 31, k);
}

// Element pair (r, col), (r, col + 1) of the block's U slice as the copy left it: the 64-row block's
// box in the 128B swizzle, the 32-row block's row-major.
template <int VT>
__device__ __forceinline__ uint32_t u_pair(const unsigned char* us, int r, int col) {
  if constexpr (VT == 64) return *reinterpret_cast<const uint32_t*>(us + wg::op_offset(r, col >> 3) + (col & 7) * 2);
  else return *reinterpret_cast<const uint32_t*>(us + (r * VT + col) * 2);
}
#endif

}  // namespace k3::cuda::kda_chunk
