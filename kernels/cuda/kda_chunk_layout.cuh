// Shared by the two launches of the KDA chunked prefill (kda_chunk_prep.cu, kda_chunk.cu): tile
// sizes, padded shared-memory pitches and the bf16 workspace one (chunk, head) hands from prep to scan.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"  // bf2_to_f2, pack_bf16

namespace k3::cuda {
namespace kda_chunk {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;     // chunk
constexpr int kD = 128;    // K = V
constexpr int kLdB = 136;  // padded bf16 pitch of [*, 128] tiles: 272 B rows, ldmatrix conflict-free
constexpr int kLdM = 72;   // padded bf16 pitch of [*, 64] tiles
constexpr int kLdT = 68;   // padded fp32 pitch of [*, 64]
constexpr int kLdG = 136;  // fp32 pitch of the prep's [64][128] gate sums: 8 banks per row, so a
                           // fragment-shaped float2 read (rows g = 0..3 of a half warp, columns
                           // 2t..2t+1) hits 32 distinct banks

// Workspace per (chunk, head): bf16 W, U, Q⊙e^Γ, K⊙e^{Γ_C−Γ} [64][128], M_qk [64][64], then fp32 e^{Γ_C} [128].
constexpr int64_t kOffW = 0, kOffU = kOffW + kC * kD, kOffQg = kOffU + kC * kD, kOffKd = kOffQg + kC * kD,
                  kOffMq = kOffKd + kC * kD, kBf16Per = kOffMq + kC * kC;
constexpr int64_t kWorkBytes = kBf16Per * 2 + kD * 4;  // 74240, a multiple of 16
static_assert(kWorkBytes % 16 == 0);

__device__ __forceinline__ bf16* work_tiles(void* work, int64_t c, int H, int h) {
  return reinterpret_cast<bf16*>(static_cast<char*>(work) + (c * H + h) * kWorkBytes);
}
__device__ __forceinline__ float* work_gc(void* work, int64_t c, int H, int h) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(work_tiles(work, c, H, h)) + kBf16Per * 2);
}

}  // namespace kda_chunk

// Prep launch (kda_chunk_prep.cu): one block per (chunk, head) fills that chunk's workspace.
void launch_kda_chunk_prep(const KdaArgs& a, const int32_t* chunk_table, int num_chunks, void* work, cudaStream_t s);

}  // namespace k3::cuda
