// Shared-memory operand placement of the wgmma MLA decode kernel (mla_decode_wgmma.cu), kept
// apart so the layout self-checks (tests/cuda/test_cuda_wgmma.cpp: a host simulation of the
// descriptor address generation, and a one-block GPU probe) use exactly the kernel's formulas.
// Operands are 64-row tiles of 128B-swizzle atoms, wg::op_offset: Q [64 heads x 576 dims], each KV
// stage [64 tokens x 576 dims], P [64 heads x 64 tokens].
#pragma once
#include <cstdint>

#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::mlawg {

constexpr int kDk = 576;        // 512 latent + 64 rope dims per cache row
constexpr int kRows = 64;       // heads per block, tokens per KV tile
constexpr int kOperandBytes = (kDk / 64) * (kRows / 8) * wg::kAtomBytes;  // Q or one KV stage: 73728
constexpr int kPBytes = (kRows / 8) * wg::kAtomBytes;                     // 8192

// S = Q Kᵀ, k16 step ks (0..35: dims 16 ks..16 ks+15), warpgroup w (tokens 32w..32w+31).
// Start-address offsets of the A (from the Q base) and B (from the KV stage base) descriptors.
__host__ __device__ constexpr uint32_t s_a_off(int ks) {
  return uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32);
}
__host__ __device__ constexpr uint32_t s_b_off(int ks, int w) { return s_a_off(ks) + uint32_t(4 * w * wg::kAtomBytes); }

// O += P V, k16 step kk (0..3: tokens 16 kk..16 kk+15), warpgroup w, column block j (0..3: dims
// 64 (4w + j)..+63). A from the P base, B (MN-major) from the KV stage base.
__host__ __device__ constexpr uint32_t pv_a_off(int kk) { return uint32_t(kk * 32); }
__host__ __device__ constexpr uint32_t pv_b_off(int kk, int w, int j) {
  return uint32_t((8 * (4 * w + j) + 2 * kk) * wg::kAtomBytes);
}

}  // namespace k3::cuda::mlawg
