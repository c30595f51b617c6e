// The short-conv part of a KDA decode step, per channel: load the channel's new input, weights and
// cached window; compute SiLU(conv) and write the window shifted by one position back to the cache.
#pragma once
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {

// One conv channel's inputs. Loading every channel a thread owns (and the gate inputs) before the
// first store keeps the per-token part at one memory latency: a store to the conv cache could alias
// the loads that follow it, so interleaving them would serialise one latency per channel.
constexpr int kMaxW = 8;
struct ConvChannel {
  float x = 0.f, w_last = 0.f;
  float w[kMaxW - 1] = {}, win[kMaxW - 1] = {};
};

__device__ __forceinline__ ConvChannel load_conv(const KdaDecodeArgs& a, int64_t b, int64_t slot, int64_t c) {
  const int W = a.W;
  const int64_t C = int64_t(3) * a.H * a.D;
  ConvChannel t;
  t.x = a.qkv[b * C + c];
  t.w_last = a.conv_w[c * W + W - 1];
#pragma unroll
  for (int j = 0; j < kMaxW - 1; ++j) {
    if (j < W - 1) {
      t.w[j] = a.conv_w[c * W + j];
      t.win[j] = a.conv_cache.get((slot * (W - 1) + j) * C + c);
    }
  }
  return t;
}

// SiLU(conv) of a loaded channel; writes the window shifted by one position back to the cache.
__device__ __forceinline__ float finish_conv(const KdaDecodeArgs& a, int64_t slot, int64_t c, const ConvChannel& t) {
  const int W = a.W;
  const int64_t C = int64_t(3) * a.H * a.D;
  // Rounded as short_conv_kernel rounds (spelled out: the compiler may fuse the first product into
  // the first add either way round).
  float acc = __fmul_rn(t.w_last, t.x);
#pragma unroll
  for (int j = 0; j < kMaxW - 1; ++j) {
    if (j < W - 1) {
      acc = __fmaf_rn(t.w[j], t.win[j], acc);
      if (j > 0) a.conv_cache.set((slot * (W - 1) + j - 1) * C + c, t.win[j]);
    }
  }
  if (W > 1) a.conv_cache.set((slot * (W - 1) + W - 2) * C + c, t.x);
  return acc * sigmoidf(acc);
}

}  // namespace k3::cuda
