// The fixed-order bf16 GEMM of batch-invariant serving: y = alpha x w^T + beta y, optionally batched
// with strides (head_gemm). cuBLASLt picks its algorithm (tile shape, split-K) by M, so a request's
// logits would change with the batch it is in; these kernels do not.
//
// The contract: every output element is the same sequence of floating-point operations whatever M
// and whatever tiling or grid M leads to. Two forms keep it, chosen by K, the row pitches and the
// pointers' alignment, never by M:
//  * wgmma (gemm_fixed_wgmma.cu), when K >= 64 and every pitch is a multiple of 8 elements with
//    16-byte aligned bases (what TMA loads). K is cut into parts of kFixedGemmPartK by K alone; each
//    part is one chain of wgmma m64n64k16 in increasing k from zero (zero-padded past K); the parts
//    are added left to right in fp32. Whether one CTA adds them as they complete or each part goes
//    to its own CTA and a second kernel adds them (small M: more CTAs than tiles) is a choice of
//    speed only: the additions are the same.
//  * mma.sync (gemm_fixed_mma.cu) for every other shape: K cut into super-steps of 256 owned by the
//    CTA's 8 warps, their partials added in a fixed tree.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/any_ptr.h"

namespace k3::cuda {

struct FixedGemmArgs {
  const void* x = nullptr;  // bf16 [batch][M, K] (row pitch ldx)
  const void* w = nullptr;  // bf16 [batch][N, K] (row pitch ldw)
  FOut y;                   // [batch][M, N] (row pitch ldy), bf16 or f32
  int64_t M = 0, N = 0, K = 0, ldx = 0, ldw = 0, ldy = 0;
  int64_t batch = 1, stride_x = 0, stride_w = 0, stride_y = 0;
  float alpha = 1.f, beta = 0.f;
};

constexpr int kFixedGemmPartK = 512;

// How one call runs. Everything but `wgmma` follows M and the GPU's size, and changes no bit.
struct FixedGemmPlan {
  bool wgmma = false;       // the form, by K, pitches and alignment only
  int warpgroups = 1;       // wgmma: 64-row slabs per CTA (1 or 2)
  int block_n = 64;         // wgmma: columns per CTA
  int parts = 1;            // wgmma: ceil(K / kFixedGemmPartK)
  bool split = false;       // wgmma: one CTA per part, the parts added by a second kernel
  size_t workspace_bytes = 0;  // fp32 partials when split
};

FixedGemmPlan plan_gemm_fixed(const FixedGemmArgs& a, int num_sms);

// `work` holds plan.workspace_bytes (may be null when that is 0).
void launch_gemm_fixed(const FixedGemmArgs& a, const FixedGemmPlan& plan, void* work, cudaStream_t s);

// The two forms (called through launch_gemm_fixed).
void launch_gemm_fixed_mma(const FixedGemmArgs& a, cudaStream_t s);
void launch_gemm_fixed_wgmma(const FixedGemmArgs& a, const FixedGemmPlan& plan, float* work, cudaStream_t s);

}  // namespace k3::cuda
