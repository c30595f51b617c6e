// The short-conv part of a KDA decode step, per channel: load the channel's new input, weights and
// cached window; compute SiLU(conv); write the window shifted by one position back to the cache.
// Shared by the decode forms (kda_decode.cu, kda_decode_rows.cu), which differ in which block writes.
#pragma once
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {

// One conv channel's inputs. Loading every channel a thread owns (and the gate inputs) before the
// first store keeps the per-token part at one memory latency: a store to the conv cache could alias
// the loads that follow it, so interleaving them would serialise one latency per channel.
// kWin >= W - 1 cached positions: a form may instantiate a smaller kWin for the common widths to
// hold fewer registers.
constexpr int kMaxW = 8;
template <int kWin = kMaxW - 1>
struct ConvChannel {
  float x = 0.f, w_last = 0.f;
  float w[kWin] = {}, win[kWin] = {};
};

template <int kWin = kMaxW - 1>
__device__ __forceinline__ ConvChannel<kWin> load_conv(const KdaDecodeArgs& a, int64_t b, int64_t slot, int64_t c) {
  const int W = a.W;
  const int64_t C = int64_t(3) * a.H * a.D;
  ConvChannel<kWin> t;
  t.x = a.qkv[b * C + c];
  t.w_last = a.conv_w[c * W + W - 1];
#pragma unroll
  for (int j = 0; j < kWin; ++j) {
    if (j < W - 1) {
      t.w[j] = a.conv_w[c * W + j];
      t.win[j] = a.conv_cache.get((slot * (W - 1) + j) * C + c);
    }
  }
  return t;
}

// SiLU(conv) of a loaded channel.
template <int kWin>
__device__ __forceinline__ float conv_out(int W, const ConvChannel<kWin>& t) {
  float acc = t.w_last * t.x;
#pragma unroll
  for (int j = 0; j < kWin; ++j)
    if (j < W - 1) acc += t.w[j] * t.win[j];
  return acc * sigmoidf(acc);
}

// Writes the channel's window shifted by one position (the new input last) back to the cache.
template <int kWin>
__device__ __forceinline__ void conv_shift_store(const KdaDecodeArgs& a, int64_t slot, int64_t c,
                                                 const ConvChannel<kWin>& t) {
  const int W = a.W;
  const int64_t C = int64_t(3) * a.H * a.D;
#pragma unroll
  for (int j = 1; j < kWin; ++j)
    if (j < W - 1) a.conv_cache.set((slot * (W - 1) + j - 1) * C + c, t.win[j]);
  if (W > 1) a.conv_cache.set((slot * (W - 1) + W - 2) * C + c, t.x);
}

// Both: the form where the computing thread is the channel's only reader.
__device__ __forceinline__ float finish_conv(const KdaDecodeArgs& a, int64_t slot, int64_t c, const ConvChannel<>& t) {
  const float y = conv_out(a.W, t);
  conv_shift_store(a, slot, c, t);
  return y;
}

}  // namespace k3::cuda
