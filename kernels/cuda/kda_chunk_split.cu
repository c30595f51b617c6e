// Step 2 of the split chunked KDA scan (kda_split_plan.h): the fix-up chain of each split sequence,
// S_start[p+1] = S_start[p] A_p + B_p for p = 1 .. P-2, in fp32. One block per 16 state rows of a
// (sequence, head): its rows of S stay in shared memory across the chain; the whole 64 KiB A_p sits
// in one of two shared buffers, the next one's copy in flight while this product runs, and B_p comes
// into registers one step ahead. So a step costs its product (16 x 128 by 128 x 128, 8 outputs per
// thread) rather than a memory round trip: the chain is P-2 steps long, and it is what the split
// scan runs in series.
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

constexpr int kD = 128, kRows = 16, kThreads = 256;
constexpr int kSmem = (kRows * kD + 2 * kD * kD) * 4;  // S rows, two A buffers

__global__ void __launch_bounds__(kThreads) kda_split_fixup_kernel(int H, const int32_t* fixup, float* carry) {
  pdl_enter();
  extern __shared__ __align__(16) float smem[];
  float* xs = smem;                 // [16][128] this block's rows of S_start[p]
  float* abuf = smem + kRows * kD;  // [2][128][128] A_p, A_{p+1}
  const int r0 = blockIdx.x * kRows, h = blockIdx.y, i = blockIdx.z, tid = threadIdx.x;
  const KdaSplitSlots slots{fixup[2 * i], fixup[2 * i + 1]};
  const int P = slots.P;
  auto tile = [&](int slot) { return carry + (int64_t(slot) * H + h) * kD * kD; };
  auto fetch_a = [&](int p) {
    const float* A = tile(slots.a(p));
    float* dst = abuf + (p & 1) * kD * kD;
    for (int idx = tid; idx < kD * kD / 4; idx += kThreads) cp_async16(dst + 4 * idx, A + 4 * idx);
    cp_async_commit();
  };
  // Thread t owns row t / 16 and the 8 columns from 8 (t % 16) of the product.
  const int r = tid / 16, c0 = (tid % 16) * 8;
  auto load_b = [&](int p, float4& b0, float4& b1) {
    const float* Bp = tile(slots.b(p)) + int64_t(r0 + r) * kD + c0;
    b0 = *reinterpret_cast<const float4*>(Bp);
    b1 = *reinterpret_cast<const float4*>(Bp + 4);
  };
  if (P < 3) return;
  fetch_a(1);
  for (int idx = tid; idx < kRows * kD / 4; idx += kThreads)
    reinterpret_cast<float4*>(xs)[idx] = reinterpret_cast<const float4*>(tile(slots.start(1)) + int64_t(r0) * kD)[idx];
  float4 b0, b1;
  load_b(1, b0, b1);
  for (int p = 1; p <= P - 2; ++p) {
    cp_async_wait<0>();
    __syncthreads();  // A_p and this step's S rows are in; the other buffer is free
    if (p + 1 <= P - 2) fetch_a(p + 1);
    float acc[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    if (p + 1 <= P - 2) load_b(p + 1, b0, b1);
    const float* A = abuf + (p & 1) * kD * kD;
#pragma unroll 8
    for (int k = 0; k < kD; ++k) {
      const float x = xs[r * kD + k];
      const float4 a0 = *reinterpret_cast<const float4*>(A + k * kD + c0);
      const float4 a1 = *reinterpret_cast<const float4*>(A + k * kD + c0 + 4);
      acc[0] += x * a0.x, acc[1] += x * a0.y, acc[2] += x * a0.z, acc[3] += x * a0.w;
      acc[4] += x * a1.x, acc[5] += x * a1.y, acc[6] += x * a1.z, acc[7] += x * a1.w;
    }
    __syncthreads();  // every thread is done reading xs
    float* dst = tile(slots.start(p + 1)) + int64_t(r0 + r) * kD + c0;
    const float4 o0 = make_float4(acc[0], acc[1], acc[2], acc[3]), o1 = make_float4(acc[4], acc[5], acc[6], acc[7]);
    *reinterpret_cast<float4*>(xs + r * kD + c0) = o0;
    *reinterpret_cast<float4*>(xs + r * kD + c0 + 4) = o1;
    *reinterpret_cast<float4*>(dst) = o0;
    *reinterpret_cast<float4*>(dst + 4) = o1;
  }
}

}  // namespace

void launch_kda_split_fixup(int H, int seqs, int max_segments, const int32_t* fixup, float* carry, cudaStream_t s) {
  if (seqs == 0 || max_segments < 3) return;  // two segments need no fix-up: segment 0 gives segment 1's start
  K3_CUDA_OK(cudaFuncSetAttribute(kda_split_fixup_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  launch_pdl("kda_split_fixup_kernel", kda_split_fixup_kernel, dim3(kD / kRows, H, seqs), kThreads, kSmem, s, H, fixup,
             carry);
}

}  // namespace k3::cuda
