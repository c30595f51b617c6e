// Depthwise causal conv + SiLU over a varlen batch: one thread per (sequence, channel) walks the
// sequence with the last W-1 pre-conv rows in registers, then writes them back as the new cache.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

template <int W>
__global__ void short_conv_kernel(FIn x, FIn w, FOut cache, const int32_t* slots, const int32_t* cu, FOut y, int C) {
  pdl_enter();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = blockIdx.y;
  if (c >= C) return;
  const int64_t slot = slots[n];
  float taps[W], win[W - 1];
#pragma unroll
  for (int j = 0; j < W; ++j) taps[j] = w[int64_t(c) * W + j];
#pragma unroll
  for (int j = 0; j < W - 1; ++j) win[j] = cache.get((slot * (W - 1) + j) * C + c);
  for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
    const float cur = x[t * C + c];
    // Every rounding spelled out, as the fused KDA decode's conv (kda_decode_conv.cuh) rounds.
    float acc = __fmul_rn(taps[W - 1], cur);
#pragma unroll
    for (int j = 0; j < W - 1; ++j) acc = __fmaf_rn(taps[j], win[j], acc);
    y.set(t * C + c, acc * sigmoidf(acc));
#pragma unroll
    for (int j = 0; j + 1 < W - 1; ++j) win[j] = win[j + 1];
    win[W - 2] = cur;
  }
#pragma unroll
  for (int j = 0; j < W - 1; ++j) cache.set((slot * (W - 1) + j) * C + c, win[j]);
}

}  // namespace

void launch_short_conv(FIn x, FIn w, FOut cache, const int32_t* slots, const int32_t* cu_seqlens, FOut y, int N, int C,
                       int W, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const dim3 grid((C + 127) / 128, N);
  switch (W) {
    case 2:
      launch_pdl("short_conv_kernel", short_conv_kernel<2>, grid, 128, 0, s, x, w, cache, slots, cu_seqlens, y, C);
      break;
    case 3:
      launch_pdl("short_conv_kernel", short_conv_kernel<3>, grid, 128, 0, s, x, w, cache, slots, cu_seqlens, y, C);
      break;
    case 4:
      launch_pdl("short_conv_kernel", short_conv_kernel<4>, grid, 128, 0, s, x, w, cache, slots, cu_seqlens, y, C);
      break;
    default: throw Error("short_conv: kernel width " + std::to_string(W) + " not supported (2..4)");
  }
}

}  // namespace k3::cuda
