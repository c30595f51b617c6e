// Step 2 of the split chunked KDA scan (kda_split_plan.h): the fix-up chain of each split sequence,
// S_start[p+1] = S_start[p] A_p + B_p for p = 1 .. P-2, in fp32. One block per 16 state rows of a
// (sequence, head): its rows of S stay in shared memory across the chain, A_p streams through in
// slabs of 32 rows (every block of the head reads the same A_p, mostly from L2), B_p is read where
// it is added. The chain is P-2 products of 16 x 128 by 128 x 128: short next to the scans.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace k3::cuda {
namespace {

constexpr int kD = 128, kRows = 16, kSlab = 32, kThreads = 256;

__global__ void __launch_bounds__(kThreads) kda_split_fixup_kernel(int H, const int32_t* fixup, float* carry) {
  __shared__ __align__(16) float xs[kRows][kD];
  __shared__ __align__(16) float as[kSlab][kD];
  const int r0 = blockIdx.x * kRows, h = blockIdx.y, i = blockIdx.z, tid = threadIdx.x;
  const int P = fixup[2 * i], base = fixup[2 * i + 1];
  auto tile = [&](int slot) { return carry + (int64_t(slot) * H + h) * kD * kD; };
  auto start_slot = [&](int p) { return base + p - 1; };
  auto a_slot = [&](int p) { return base + (P - 1) + p - 1; };
  auto b_slot = [&](int p) { return base + 2 * (P - 1) - 1 + p - 1; };
  // Thread t owns row t / 16 and the 8 columns from 8 (t % 16) of the product.
  const int r = tid / 16, c0 = (tid % 16) * 8;
  for (int idx = tid; idx < kRows * kD / 4; idx += kThreads)
    reinterpret_cast<float4*>(&xs[0][0])[idx] =
        reinterpret_cast<const float4*>(tile(start_slot(1)) + int64_t(r0) * kD)[idx];
  for (int p = 1; p <= P - 2; ++p) {
    const float* A = tile(a_slot(p));
    const float* Bp = tile(b_slot(p)) + int64_t(r0 + r) * kD + c0;
    float acc[8];
    const float4 b0 = *reinterpret_cast<const float4*>(Bp), b1 = *reinterpret_cast<const float4*>(Bp + 4);
    acc[0] = b0.x, acc[1] = b0.y, acc[2] = b0.z, acc[3] = b0.w;
    acc[4] = b1.x, acc[5] = b1.y, acc[6] = b1.z, acc[7] = b1.w;
    for (int k0 = 0; k0 < kD; k0 += kSlab) {
      __syncthreads();  // the previous slab (and, at k0 = 0, the previous xs) is read
      for (int idx = tid; idx < kSlab * kD / 4; idx += kThreads)
        reinterpret_cast<float4*>(&as[0][0])[idx] = reinterpret_cast<const float4*>(A + int64_t(k0) * kD)[idx];
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kSlab; ++kk) {
        const float x = xs[r][k0 + kk];
        const float4 a0 = *reinterpret_cast<const float4*>(&as[kk][c0]);
        const float4 a1 = *reinterpret_cast<const float4*>(&as[kk][c0 + 4]);
        acc[0] += x * a0.x, acc[1] += x * a0.y, acc[2] += x * a0.z, acc[3] += x * a0.w;
        acc[4] += x * a1.x, acc[5] += x * a1.y, acc[6] += x * a1.z, acc[7] += x * a1.w;
      }
    }
    __syncthreads();  // every thread is done reading xs
    float* dst = tile(start_slot(p + 1)) + int64_t(r0 + r) * kD + c0;
    *reinterpret_cast<float4*>(&xs[r][c0]) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *reinterpret_cast<float4*>(&xs[r][c0 + 4]) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

}  // namespace

void launch_kda_split_fixup(int H, int seqs, int max_segments, const int32_t* fixup, float* carry, cudaStream_t s) {
  if (seqs == 0 || max_segments < 3) return;  // two segments need no fix-up: segment 0 gives segment 1's start
  kda_split_fixup_kernel<<<dim3(kD / kRows, H, seqs), kThreads, 0, s>>>(H, fixup, carry);
  K3_CUDA_LAUNCHED("kda_split_fixup_kernel");
}

}  // namespace k3::cuda
