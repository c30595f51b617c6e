// KDA decode step for a batch of requests (one token each), ONE launch, one block per (request, head).
// The step is memory-bound: the 64 KiB fp32 state of a (request, head) is read once and written
// once, everything else is a few KiB. So the block first puts the copy of its state into shared
// memory in flight (the bulk copy engine, one mbarrier: no registers held, so three blocks' states
// travel per SM at once), and only then computes the small per-token part while the copy travels:
//   short-conv update of q/k/v (cache shifted in place), SiLU, L2 norm of q and k (q also scaled
//   by D^-1/2), decay α = exp(g_min·σ(e^A·(f+dt))), β = σ(b)  -> shared memory (in batch-invariant
//   mode rounded and summed as the separate steps do: KdaDecodeArgs::as_steps);
// then per state row [V index]: s *= α; u = β(v - s·k); s += u k; o = s·q (docs/MODEL.md §2.3 order),
// each row written back to global memory straight from registers: no shared-memory write-back and
// no bulk store to wait for, so the block ends (and frees its shared memory for the next one) as
// soon as its stores are issued. Measured on the H200 against the bulk store: 0.756 / 0.847 of copy
// bandwidth at B = 32 / 256 instead of 0.724 / 0.830, and 10.3 instead of 11.0 us at B = 1 against
// the per-lane cp.async copies small grids used to take (docs/PERF.md).
// One block owns all rows of its head, so the conv cache of a (request, head) has a single writer
// (an earlier two-launch version split rows over blocks and needed a separate conv launch).
// Persistent blocks measured slower on the H200 in every form tried and were removed: a ring of
// state buffers, a prep group of threads running ahead of an update group, and a prep launch
// followed by blocks streaming half-item units through a ring of five slots (0.71 / 0.76 of copy
// bandwidth at B = 32 / 256 against 0.77 / 0.82 in the same call); so did L2 prefetch of the
// states of later items (docs/PERF.md).
#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kda_decode_conv.cuh"
#include "kernels/cuda/kda_rows.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kRowsPerWarp = 16;

// x as a bf16 tensor stores it and reads it back (round to nearest even, FOut's conversion).
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// Bulk-copy-engine path (sm_90): the whole state moves into shared memory in a few cp.async.bulk
// operations tracked by one mbarrier, instead of 16 per-thread copies.
__device__ __forceinline__ void bulk_init(uint64_t* bar) { mbar_init(smem_u32(bar)); }
// Copies `bytes` (a multiple of 16) into shared memory, counted on `bar`, in pieces the copy engine
// takes at once (mbarrier.cuh's bulk_load each).
__device__ __forceinline__ void bulk_load_state(float* smem, const float* gmem, unsigned bytes, uint64_t* bar) {
  const unsigned b = smem_u32(bar), d = smem_u32(smem);
  mbar_expect_tx(b, bytes);
  constexpr unsigned kPiece = 16384;
  for (unsigned off = 0; off < bytes; off += kPiece) {
    const unsigned n = bytes - off < kPiece ? bytes - off : kPiece;
    bulk_load(d + off, reinterpret_cast<const char*>(gmem) + off, n, b);
  }
}
__device__ __forceinline__ void bulk_wait(uint64_t* bar) { mbar_wait(smem_u32(bar), 0); }
// Shared-memory scratch of one item (request, head) besides its state.
template <int D>
struct ItemScratch {
  float qv[D], kv[D], vv[D], al[D];
  float red[2][2 * D / 32];
  float beta;
};

// Per-token part of item (b, h) while its state copy travels: threads [0, D) own q and k channel
// tid, threads [D, 2D) own v channel tid-D and its decay. Leaves the raw q/k, v, decays and β in
// `sc`, ends with a block barrier and returns the norms q and k are to be scaled by.
struct QkScale {
  float q, k;
};
template <int D>
__device__ __forceinline__ QkScale prep_shared(const KdaDecodeArgs& a, int b, int h, int64_t slot, ItemScratch<D>& sc) {
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, H = a.H;
  const int64_t P = int64_t(H) * D;
  float sq = 0.f, sk = 0.f;
  if (tid < D) {
    const ConvChannel cq = load_conv(a, b, slot, int64_t(h) * D + tid);
    const ConvChannel ck = load_conv(a, b, slot, P + int64_t(h) * D + tid);
    float qx = finish_conv(a, slot, int64_t(h) * D + tid, cq);
    float kx = finish_conv(a, slot, P + int64_t(h) * D + tid, ck);
    if (a.as_steps) {  // short_conv's output is stored in the compute dtype
      qx = bf16_round(qx);
      kx = bf16_round(kx);
    }
    sc.qv[tid] = qx;
    sc.kv[tid] = kx;
    sq = qx * qx;
    sk = kx * kx;
  } else {
    const int i = tid - D;
    const ConvChannel cv = load_conv(a, b, slot, 2 * P + int64_t(h) * D + i);
    const float f = a.f[int64_t(b) * P + int64_t(h) * D + i], dt = a.dt_bias[h * D + i], a_log = a.a_log[h];
    const float b_logit = a.b[int64_t(b) * H + h];
    const float vx = finish_conv(a, slot, 2 * P + int64_t(h) * D + i, cv);
    sc.vv[i] = a.as_steps ? bf16_round(vx) : vx;
    sc.al[i] = expf(kda_log_decay(a.softplus, a_log, f + dt, a.g_min));
    if (i == 0) sc.beta = sigmoidf(b_logit);
  }
  sq = warp_sum(sq);
  sk = warp_sum(sk);
  if (lane == 0) {
    sc.red[0][warp] = sq;
    sc.red[1][warp] = sk;
  }
  __syncthreads();
  if (a.as_steps) {
    // block_sum's order (l2norm's 128 threads, a warp per 32 elements): the warps' sums in lanes
    // 0..D/32-1 of a warp, zeros after them, added by the same butterfly; each warp gets the same sum.
    const float tq = warp_sum(lane < D / 32 ? sc.red[0][lane] : 0.f);
    const float tk = warp_sum(lane < D / 32 ? sc.red[1][lane] : 0.f);
    return {a.q_scale * rsqrtf(tq + 1e-6f), 1.f * rsqrtf(tk + 1e-6f)};
  }
  float tq = 0.f, tk = 0.f;
#pragma unroll
  for (int w = 0; w < D / 32; ++w) {  // the q/k warps are the first D/32
    tq += sc.red[0][w];
    tk += sc.red[1][w];
  }
  return {rsqrtf(tq + 1e-6f) * rsqrtf(float(D)), rsqrtf(tk + 1e-6f)};
}

// prep_shared, then this lane's q (normalised, scaled), k (normalised) and decays in registers.
template <int D>
__device__ __forceinline__ void prep_item(const KdaDecodeArgs& a, int b, int h, int64_t slot, ItemScratch<D>& sc,
                                          float (&q)[D / 32], float (&k)[D / 32], float (&alpha)[D / 32]) {
  constexpr int NV = D / 32;
  const int lane = threadIdx.x & 31;
  const QkScale n = prep_shared<D>(a, b, h, slot, sc);
#pragma unroll
  for (int e = 0; e < NV; ++e) {
    q[e] = sc.qv[lane * NV + e] * n.q;
    k[e] = sc.kv[lane * NV + e] * n.k;
    if (a.as_steps) {  // l2norm's output is stored in the compute dtype
      q[e] = bf16_round(q[e]);
      k[e] = bf16_round(k[e]);
    }
    alpha[e] = sc.al[lane * NV + e];
  }
}

// The recurrence step on a warp's kRowsPerWarp state rows: read from `st` (shared memory, the first of the
// rows), written to `dst` (the same rows of the global state) straight from registers; vv: the v of
// the first row; o of the first row at o_at.
template <int D>
__device__ __forceinline__ void update_rows(const float* st, float* dst, const float* vv, float beta, FOut o,
                                            int64_t o_at, const float (&q)[D / 32], const float (&k)[D / 32],
                                            const float (&alpha)[D / 32], int lane) {
  constexpr int NV = D / 32;
  auto elem = [&](int r, int e) { return st[r * D + lane * NV + e]; };
  auto put = [&](int r, const float (&v)[NV]) {
    float* d = dst + r * D + lane * NV;
    if constexpr (NV == 4) __stcs(reinterpret_cast<float4*>(d), make_float4(v[0], v[1], v[2], v[3]));
    else __stcs(reinterpret_cast<float2*>(d), make_float2(v[0], v[1]));
  };
  const float mine = kda_rows_step<NV, kRowsPerWarp>(elem, put, vv, beta, q, k, alpha, lane);
  if (lane < kRowsPerWarp) o.set(o_at + lane, mine);
}

template <int D>
__global__ void __launch_bounds__(D * 2, 3) kda_decode_kernel(KdaDecodeArgs a) {
  pdl_enter();
  constexpr int kThreads = D * 2;  // D/16 warps of 16 rows; 2*D threads also cover the 4 prep vectors
  constexpr int NV = D / 32;       // consecutive K elements per lane
  static_assert(kThreads / 32 * kRowsPerWarp == D, "one block covers the head's D rows");
  extern __shared__ __align__(16) float st[];  // [D][D] state of this (request, head)
  __shared__ __align__(16) ItemScratch<D> sc;
  __shared__ uint64_t bar;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.y, h = blockIdx.x, H = a.H;
  float* S = a.state + (int64_t(a.slots[b]) * H + h) * D * D;
  if (tid == 0) {
    bulk_init(&bar);
    bulk_load_state(st, S, D * D * 4, &bar);
  }
  float q[NV], k[NV], alpha[NV];
  prep_item<D>(a, b, h, a.conv_slots[b], sc, q, k, alpha);
  bulk_wait(&bar);  // the barrier's init is ordered by prep_item's __syncthreads
  const int row0 = warp * kRowsPerWarp;
  update_rows<D>(st + row0 * D, S + row0 * D, sc.vv + row0, sc.beta, a.o,
                 (int64_t(b) * H + h) * D + row0, q, k, alpha, lane);
}

template <int D>
void launch_per_item(const KdaDecodeArgs& a, dim3 grid, cudaStream_t s) {
  constexpr int kSmem = D * D * 4;
  K3_CUDA_OK(cudaFuncSetAttribute(kda_decode_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  launch_pdl("kda_decode_kernel", kda_decode_kernel<D>, grid, D * 2, kSmem, s, a);
}

}  // namespace

void launch_kda_decode(const KdaDecodeArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  if (a.W < 1 || a.W > kMaxW) throw Error("kda_decode: conv width " + std::to_string(a.W) + " not in 1..8");
  const dim3 grid(a.H, a.B);
  switch (a.D) {
    case 64: launch_per_item<64>(a, grid, s); break;
    case 128: launch_per_item<128>(a, grid, s); break;
    default: throw Error("kda_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
}

}  // namespace k3::cuda
