// KDA decode step for a batch of requests (one token each), in two launches:
//  1. prep, one block per (request, head): short-conv update of q/k/v (cache updated in place),
//     SiLU, L2 norm of q and k (q also scaled by D^-1/2), decay α = exp(g_min·σ(e^A·(f+dt))),
//     β = σ(b) -> a small fp32 workspace.
//  2. state, the memory-bound part: every fp32 state row is read once and written once. A warp
//     owns 8 rows [V index] of one head, all loaded up front (8 x 16 B per lane in flight);
//     per row: s *= α; u = β(v - s·k); s += u k; o = s·q (MODEL.md §2.3 order).
// Splitting the head's rows over 2 blocks keeps B=1 from leaving most of the 132 SMs idle; the
// split is why the conv update lives in its own launch (no block may read a cache another rewrote).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kRowsPerWarp = 16;
constexpr int kWarps = 4;
constexpr int kRowsPerBlock = kRowsPerWarp * kWarps;

__global__ void kda_decode_prep_kernel(KdaDecodeArgs a, float* ws) {
  __shared__ float scratch[32];
  const int b = blockIdx.x, h = blockIdx.y, i = threadIdx.x, D = a.D, W = a.W;
  const int64_t P = int64_t(a.H) * D, C = 3 * P;
  const int64_t slot = a.slots[b];
  float out[3];
#pragma unroll
  for (int part = 0; part < 3; ++part) {
    const int64_t c = part * P + int64_t(h) * D + i;
    const float x = a.qkv[b * C + c];
    float acc = a.conv_w[c * W + W - 1] * x;
    float win[8];
    for (int j = 0; j < W - 1; ++j) {
      win[j] = a.conv_cache.get((slot * (W - 1) + j) * C + c);
      acc += a.conv_w[c * W + j] * win[j];
    }
    for (int j = 0; j + 1 < W - 1; ++j) a.conv_cache.set((slot * (W - 1) + j) * C + c, win[j + 1]);
    if (W > 1) a.conv_cache.set((slot * (W - 1) + W - 2) * C + c, x);
    out[part] = acc * sigmoidf(acc);
  }
  const float qn = rsqrtf(block_sum(out[0] * out[0], scratch) + 1e-6f) * rsqrtf(float(D));
  const float kn = rsqrtf(block_sum(out[1] * out[1], scratch) + 1e-6f);
  float* w = ws + (int64_t(b) * a.H + h) * 4 * D;
  w[i] = out[0] * qn;
  w[D + i] = out[1] * kn;
  w[2 * D + i] = out[2];
  const float g = a.g_min * sigmoidf(expf(a.a_log[h]) * (a.f[int64_t(b) * P + int64_t(h) * D + i] + a.dt_bias[h * D + i]));
  w[3 * D + i] = expf(g);
  if (i == 0) ws[int64_t(a.B) * a.H * 4 * D + int64_t(b) * a.H + h] = sigmoidf(a.b[int64_t(b) * a.H + h]);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) kda_decode_state_kernel(const float* ws, const int32_t* slots,
                                                                       float* state, FOut o, int B, int H) {
  constexpr int NV = D / 32;  // consecutive K elements per lane
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.z, h = blockIdx.y;
  const int row0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
  const float* w = ws + (int64_t(b) * H + h) * 4 * D;
  const float beta = ws[int64_t(B) * H * 4 * D + int64_t(b) * H + h];
  float* S = state + (int64_t(slots[b]) * H + h) * D * D;
  float s[kRowsPerWarp][NV];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float* src = S + int64_t(row0 + r) * D + lane * NV;
    if constexpr (NV == 4) {
      const float4 v = __ldcs(reinterpret_cast<const float4*>(src));  // streamed: read once
      s[r][0] = v.x; s[r][1] = v.y; s[r][2] = v.z; s[r][3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < NV; ++e) s[r][e] = src[e];
    }
  }
  float q[NV], k[NV], al[NV];
#pragma unroll
  for (int e = 0; e < NV; ++e) {
    q[e] = w[lane * NV + e];
    k[e] = w[D + lane * NV + e];
    al[e] = w[3 * D + lane * NV + e];
  }
  float kv[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      s[r][e] *= al[e];
      acc += s[r][e] * k[e];
    }
    kv[r] = acc;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) kv[r] = warp_sum(kv[r]);
  float ov[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float u = beta * (w[2 * D + row0 + r] - kv[r]);
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      s[r][e] += k[e] * u;
      acc += s[r][e] * q[e];
    }
    ov[r] = acc;
    float* dst = S + int64_t(row0 + r) * D + lane * NV;
    if constexpr (NV == 4) {
      __stcs(reinterpret_cast<float4*>(dst), make_float4(s[r][0], s[r][1], s[r][2], s[r][3]));
    } else {
#pragma unroll
      for (int e = 0; e < NV; ++e) dst[e] = s[r][e];
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) ov[r] = warp_sum(ov[r]);
  if (lane < kRowsPerWarp) {
    float mine = ov[0];
#pragma unroll
    for (int r = 1; r < kRowsPerWarp; ++r)
      if (lane == r) mine = ov[r];
    o.set((int64_t(b) * H + h) * D + row0 + lane, mine);
  }
}

}  // namespace

int64_t kda_decode_workspace_floats(int B, int H, int D) { return int64_t(B) * H * (4 * D + 1); }

void launch_kda_decode(const KdaDecodeArgs& a, float* work, cudaStream_t s) {
  if (a.B == 0) return;
  if (a.W < 1 || a.W > 8) throw Error("kda_decode: conv width " + std::to_string(a.W) + " not in 1..8");
  kda_decode_prep_kernel<<<dim3(a.B, a.H), a.D, 0, s>>>(a, work);
  K3_CUDA_LAUNCHED("kda_decode_prep_kernel");
  const dim3 grid(a.D / kRowsPerBlock, a.H, a.B);
  switch (a.D) {
    case 64: kda_decode_state_kernel<64><<<grid, kWarps * 32, 0, s>>>(work, a.slots, a.state, a.o, a.B, a.H); break;
    case 128: kda_decode_state_kernel<128><<<grid, kWarps * 32, 0, s>>>(work, a.slots, a.state, a.o, a.B, a.H); break;
    default: throw Error("kda_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
  K3_CUDA_LAUNCHED("kda_decode_state_kernel");
}

}  // namespace k3::cuda
