// KDA decode step with each item (request, head) split by state rows over a cluster of kSplit blocks.
// The state's rows (one per V index) are independent in the delta rule: row j needs only its own
// s_j, v_j and the item's q, k, decays and β. So a block takes D / kSplit rows, holds them in
// registers (no shared-memory copy: its loads go out before anything else and stay in flight while
// the per-token part computes), and writes them back from registers. Smaller blocks than one per
// item mean more of them per SM and a finer last wave, and every SM keeps state loads in flight
// while its other blocks compute and store.
// The price: every block of an item computes the item's q, k and decays (a few KiB, mostly L2 hits).
// The conv cache is updated in place, so the q/k channels every block reads may only be written once
// all of the item's blocks have read them: that is what the cluster is for (one cluster barrier,
// arrived at after the reads, waited for at the very end). The v channels have one reader, their
// rows' block, which writes them at once.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kda_decode_conv.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

template <int NV>
__device__ __forceinline__ void load_row(float (&x)[NV], const float* src) {
  if constexpr (NV == 4) {
    const float4 t = __ldcs(reinterpret_cast<const float4*>(src));
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  } else {
    const float2 t = __ldcs(reinterpret_cast<const float2*>(src));
    x[0] = t.x, x[1] = t.y;
  }
}
template <int NV>
__device__ __forceinline__ void store_row(float* dst, const float (&x)[NV]) {
  if constexpr (NV == 4) __stcs(reinterpret_cast<float4*>(dst), make_float4(x[0], x[1], x[2], x[3]));
  else __stcs(reinterpret_cast<float2*>(dst), make_float2(x[0], x[1]));
}

// D threads (D / 32 warps); block `rank` of its cluster owns state rows [rank * D / kSplit, ...),
// 32 / kSplit consecutive rows per warp; lane l holds K elements [l * NV, l * NV + NV) of each.
template <int D, int kSplit, int kWin>
__global__ void __launch_bounds__(D) kda_decode_rows_kernel(KdaDecodeArgs a) {
  constexpr int NV = D / 32, kRows = D / kSplit, kWarps = D / 32, kRowsPerWarp = kRows / kWarps;
  static_assert(kRowsPerWarp * kWarps == kRows && kRowsPerWarp >= 1, "rows divide over the warps");
  __shared__ float qs[D], ks[D], als[D], vs[kRows], red[2][kWarps];
  __shared__ float beta_s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = int(blockIdx.x) % kSplit, h = int(blockIdx.x) / kSplit, b = blockIdx.y, H = a.H;
  const int64_t slot = a.slots[b], cslot = a.conv_slots[b], P = int64_t(H) * D;
  const int row0 = rank * kRows + warp * kRowsPerWarp;
  float* S = a.state + (slot * H + h) * D * D;

  float x[kRowsPerWarp][NV];  // this warp's rows: every load in flight before the per-token part
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) load_row<NV>(x[r], S + (row0 + r) * D + lane * NV);

  // Per-token part: thread t owns q/k channel t and decay t, and (t < kRows) v channel rank*kRows + t.
  const ConvChannel<kWin> cq = load_conv<kWin>(a, b, cslot, int64_t(h) * D + tid);
  const ConvChannel<kWin> ck = load_conv<kWin>(a, b, cslot, P + int64_t(h) * D + tid);
  const int64_t vc = 2 * P + int64_t(h) * D + rank * kRows + tid;
  ConvChannel<kWin> cv;
  if (tid < kRows) cv = load_conv<kWin>(a, b, cslot, vc);
  const float f = a.f[int64_t(b) * P + int64_t(h) * D + tid], dt = a.dt_bias[h * D + tid], a_log = a.a_log[h];
  const float b_logit = a.b[int64_t(b) * H + h];
  const float qx = conv_out(a.W, cq), kx = conv_out(a.W, ck);
  // This thread has read its q/k windows (their values are used above): the cluster's blocks may
  // overwrite them once every thread of every block has arrived.
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  if (tid < kRows) {
    vs[tid] = conv_out(a.W, cv);
    conv_shift_store(a, cslot, vc, cv);
  }
  qs[tid] = qx;
  ks[tid] = kx;
  als[tid] = expf(kda_log_decay(a.softplus, a_log, f + dt, a.g_min));
  if (tid == 0) beta_s = sigmoidf(b_logit);
  const float sq = warp_sum(qx * qx), sk = warp_sum(kx * kx);
  if (lane == 0) {
    red[0][warp] = sq;
    red[1][warp] = sk;
  }
  __syncthreads();
  float tq = 0.f, tk = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    tq += red[0][w];
    tk += red[1][w];
  }
  const float nq = rsqrtf(tq + 1e-6f) * rsqrtf(float(D)), nk = rsqrtf(tk + 1e-6f), beta = beta_s;
  float q[NV], k[NV], al[NV];
#pragma unroll
  for (int e = 0; e < NV; ++e) {
    q[e] = qs[lane * NV + e] * nq;
    k[e] = ks[lane * NV + e] * nk;
    al[e] = als[lane * NV + e];
  }

  // Per row j (docs/MODEL.md §2.3): s *= α; u = β(v_j - s·k); s += u k; o_j = s·q. The s·k of all
  // rows first, so that their warp reductions overlap.
  float kv[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      x[r][e] *= al[e];
      acc += x[r][e] * k[e];
    }
    kv[r] = acc;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) kv[r] = warp_sum(kv[r]);
  float ov[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float u = beta * (vs[warp * kRowsPerWarp + r] - kv[r]);
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      x[r][e] += k[e] * u;
      acc += x[r][e] * q[e];
    }
    ov[r] = acc;
    store_row<NV>(S + (row0 + r) * D + lane * NV, x[r]);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) ov[r] = warp_sum(ov[r]);
  if (lane < kRowsPerWarp) {
    float mine = ov[0];
#pragma unroll
    for (int r = 1; r < kRowsPerWarp; ++r)
      if (lane == r) mine = ov[r];
    a.o.set((int64_t(b) * H + h) * D + row0 + lane, mine);
  }

  // Every block of the cluster has read the q/k windows: this block writes its share of them.
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
  if (tid / kRows == rank) {
    conv_shift_store(a, cslot, int64_t(h) * D + tid, cq);
    conv_shift_store(a, cslot, P + int64_t(h) * D + tid, ck);
  }
}

// The state rows are what a block holds in registers; the conv windows of its three channels come
// next, so widths up to 4 (K3's and Kimi Linear's) get arrays of 3.
template <int D, int kSplit>
void launch_split(const KdaDecodeArgs& a, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(a.H * kSplit), unsigned(a.B));
  cfg.blockDim = dim3(D);
  cfg.stream = s;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kSplit;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  if (a.W <= 4) K3_CUDA_OK(cudaLaunchKernelEx(&cfg, kda_decode_rows_kernel<D, kSplit, 3>, a));
  else K3_CUDA_OK(cudaLaunchKernelEx(&cfg, kda_decode_rows_kernel<D, kSplit, kMaxW - 1>, a));
}

template <int D>
void launch_for(const KdaDecodeArgs& a, cudaStream_t s) {
  switch (a.row_split) {
    case 2: launch_split<D, 2>(a, s); break;
    case 4: launch_split<D, 4>(a, s); break;
    case 8: launch_split<D, 8>(a, s); break;
    default: throw Error("kda_decode: row_split " + std::to_string(a.row_split) + " not in {2, 4, 8}");
  }
}

}  // namespace

void launch_kda_decode_rows(const KdaDecodeArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  if (a.W < 1 || a.W > kMaxW) throw Error("kda_decode: conv width " + std::to_string(a.W) + " not in 1..8");
  switch (a.D) {
    case 64: launch_for<64>(a, s); break;
    case 128: launch_for<128>(a, s); break;
    default: throw Error("kda_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
  K3_CUDA_LAUNCHED("kda_decode_rows_kernel");
}

}  // namespace k3::cuda
