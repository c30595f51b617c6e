// KDA decode step for a batch of requests (one token each), ONE launch, one block per (request, head).
// The step is memory-bound: the 64 KiB fp32 state of a (request, head) is read once and written
// once, everything else is a few KiB. So the block first puts the copy of its state into shared
// memory in flight (the bulk copy engine, one mbarrier: no registers held, so three blocks' states
// travel per SM at once), and only then computes the small per-token part while the copy travels:
//   short-conv update of q/k/v (cache shifted in place), SiLU, L2 norm of q and k (q also scaled
//   by D^-1/2), decay α = exp(g_min·σ(e^A·(f+dt))), β = σ(b)  -> shared memory;
// then per state row [V index]: s *= α; u = β(v - s·k); s += u k; o = s·q (docs/MODEL.md §2.3 order),
// each row written back to global memory straight from registers: no shared-memory write-back and
// no bulk store to wait for, so the block ends (and frees its shared memory for the next one) as
// soon as its stores are issued. Measured on the H200 against the bulk store: 0.756 / 0.847 of copy
// bandwidth at B = 32 / 256 instead of 0.724 / 0.830, and 10.3 instead of 11.0 us at B = 1 against
// the per-lane cp.async copies small grids used to take (docs/PERF.md).
// One block owns all rows of its head, so the conv cache of a (request, head) has a single writer
// (an earlier two-launch version split rows over blocks and needed a separate conv launch).
#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kda_decode_conv.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

constexpr int kRowsPerWarp = 16;

// Bulk-copy-engine path (sm_90): the whole state moves between global and shared memory in a few
// cp.async.bulk operations tracked by one mbarrier, instead of 16 per-thread copies and stores.
__device__ __forceinline__ void bulk_init(uint64_t* bar) { mbar_init(smem_u32(bar)); }
__device__ __forceinline__ void bulk_load(float* smem, const float* gmem, unsigned bytes, uint64_t* bar) {
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  mbar_expect_tx(b, bytes);
  constexpr unsigned kPiece = 16384;
  for (unsigned off = 0; off < bytes; off += kPiece) {
    const unsigned n = bytes - off < kPiece ? bytes - off : kPiece;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(d + off),
                 "l"(reinterpret_cast<const char*>(gmem) + off), "r"(n), "r"(b)
                 : "memory");
  }
}
__device__ __forceinline__ void bulk_wait(uint64_t* bar) { mbar_wait(smem_u32(bar), 0); }
// Issues a store of `bytes` from shared to global memory as one bulk group of the calling thread.
__device__ __forceinline__ void bulk_store_issue(float* gmem, const float* smem, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(smem_u32(smem)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most `kPending` of the calling thread's latest bulk groups may still read shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// The state of item `item` (= request * H + head) of a launch.
template <int D>
__device__ __forceinline__ float* state_of(const KdaDecodeArgs& a, int item) {
  return a.state + (int64_t(a.slots[item / a.H]) * a.H + item % a.H) * D * D;
}

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
// `tid` is the thread's index among the 2D threads doing the prep; kBar = 0 syncs the whole block,
// another id syncs just those 2D threads (a named barrier).
template <int D, int kBar = 0>
__device__ __forceinline__ QkScale prep_shared(const KdaDecodeArgs& a, int b, int h, int64_t slot, ItemScratch<D>& sc,
                                               int tid = threadIdx.x) {
  const int lane = tid & 31, warp = tid >> 5, H = a.H;
  const int64_t P = int64_t(H) * D;
  float sq = 0.f, sk = 0.f;
  if (tid < D) {
    const ConvChannel cq = load_conv(a, b, slot, int64_t(h) * D + tid);
    const ConvChannel ck = load_conv(a, b, slot, P + int64_t(h) * D + tid);
    const float qx = finish_conv(a, slot, int64_t(h) * D + tid, cq);
    const float kx = finish_conv(a, slot, P + int64_t(h) * D + tid, ck);
    sc.qv[tid] = qx;
    sc.kv[tid] = kx;
    sq = qx * qx;
    sk = kx * kx;
  } else {
    const int i = tid - D;
    const ConvChannel cv = load_conv(a, b, slot, 2 * P + int64_t(h) * D + i);
    const float f = a.f[int64_t(b) * P + int64_t(h) * D + i], dt = a.dt_bias[h * D + i], a_log = a.a_log[h];
    const float b_logit = a.b[int64_t(b) * H + h];
    sc.vv[i] = finish_conv(a, slot, 2 * P + int64_t(h) * D + i, cv);
    sc.al[i] = expf(kda_log_decay(a.softplus, a_log, f + dt, a.g_min));
    if (i == 0) sc.beta = sigmoidf(b_logit);
  }
  sq = warp_sum(sq);
  sk = warp_sum(sk);
  if (lane == 0) {
    sc.red[0][warp] = sq;
    sc.red[1][warp] = sk;
  }
  if constexpr (kBar == 0) __syncthreads();
  else asm volatile("bar.sync %0, %1;\n" ::"n"(kBar), "n"(2 * D) : "memory");
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
    alpha[e] = sc.al[lane * NV + e];
  }
}

// The recurrence step on a warp's kRowsPerWarp state rows from row0, read from `st` (shared memory) and
// written to `dst_base` (the same shared rows when kToSmem, else the global state); o of item (b, h).
template <int D, bool kToSmem>
__device__ __forceinline__ void update_rows(const KdaDecodeArgs& a, int b, int h, float* st, float* dst_base,
                                            const ItemScratch<D>& sc, const float (&q)[D / 32],
                                            const float (&k)[D / 32], const float (&alpha)[D / 32], int row0,
                                            int lane) {
  constexpr int NV = D / 32;
  const float beta = sc.beta;
  // Two passes over the rows (shared memory is cheap to re-read): s·k for all the rows first so
  // their warp reductions overlap, then the update, the store and s·q.
  float kvr[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float* x = st + (row0 + r) * D + lane * NV;
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) acc += x[e] * alpha[e] * k[e];
    kvr[r] = acc;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) kvr[r] = warp_sum(kvr[r]);
  float ov[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float* x = st + (row0 + r) * D + lane * NV;
    const float u = beta * (sc.vv[row0 + r] - kvr[r]);
    float v[NV];
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      v[e] = x[e] * alpha[e] + k[e] * u;
      acc += v[e] * q[e];
    }
    ov[r] = acc;
    float* dst = dst_base + (row0 + r) * D + lane * NV;
    if constexpr (NV == 4) {
      if constexpr (kToSmem) *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      else __stcs(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
    } else {
      if constexpr (kToSmem) *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
      else __stcs(reinterpret_cast<float2*>(dst), make_float2(v[0], v[1]));
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) ov[r] = warp_sum(ov[r]);
  if (lane < kRowsPerWarp) {
    float mine = ov[0];
#pragma unroll
    for (int r = 1; r < kRowsPerWarp; ++r)
      if (lane == r) mine = ov[r];
    a.o.set((int64_t(b) * a.H + h) * D + row0 + lane, mine);
  }
}

template <int D>
__global__ void __launch_bounds__(D * 2, 3) kda_decode_kernel(KdaDecodeArgs a) {
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
    bulk_load(st, S, D * D * 4, &bar);
  }
  float q[NV], k[NV], alpha[NV];
  prep_item<D>(a, b, h, a.conv_slots[b], sc, q, k, alpha);
  bulk_wait(&bar);  // the barrier's init is ordered by prep_item's __syncthreads
  update_rows<D, false>(a, b, h, st, S, sc, q, k, alpha, warp * kRowsPerWarp, lane);
}

// Persistent form: gridDim.x blocks (as many as fit at once) walk the (request, head) items with a
// ring of kRing state buffers in shared memory, so the copy engine always has the next items'
// states coming in and the last ones going out while the warps update the current one (the
// one-block-per-item form leaves each SM's copy engine idle while all its blocks compute, and its
// last wave half empty). The n-th item of a block uses buffer n mod kRing; loads run kAhead items
// ahead. kAhead = 2 keeps two loads in flight but must wait at each item for the store just issued
// to leave shared memory (its buffer is the next load's); kAhead = 1 lets that store drain for a
// whole item. Thread 0 issues every copy (bulk groups and mbarrier arrivals are per thread).
constexpr int kRing = 3;
template <int D, int kAhead>
__global__ void __launch_bounds__(D * 2, 1) kda_decode_ring_kernel(KdaDecodeArgs a) {
  static_assert(kAhead >= 1 && kAhead < kRing, "a buffer for the current item, kAhead loading");
  constexpr int NV = D / 32, kStateBytes = D * D * 4;
  extern __shared__ __align__(16) float ring[];  // [kRing][D][D]
  __shared__ __align__(16) ItemScratch<D> sc;
  __shared__ uint64_t bars[kRing];
  const int tid = threadIdx.x;
  const int items = a.B * a.H;
  if (tid == 0) {
    for (int r = 0; r < kRing; ++r) mbar_init(smem_u32(&bars[r]));
    for (int j = 0; j < kAhead; ++j) {  // the first kAhead items' loads in flight
      const int item = blockIdx.x + j * gridDim.x;
      if (item < items) bulk_load(ring + j * D * D, state_of<D>(a, item), kStateBytes, &bars[j]);
    }
  }
  int n = 0;  // items this block has done
  for (int item = blockIdx.x; item < items; item += gridDim.x, ++n) {
    const int buf = n % kRing;
    float* st = ring + buf * D * D;
    if (tid == 0) {  // the load kAhead items ahead goes where item n + kAhead - kRing was stored from
      const int ahead = item + kAhead * gridDim.x;
      if (ahead < items) {
        // Stores are one bulk group per item: the kRing - kAhead - 1 latest may still be reading.
        bulk_wait_read<kRing - kAhead - 1>();
        const int nb = (n + kAhead) % kRing;
        bulk_load(ring + nb * D * D, state_of<D>(a, ahead), kStateBytes, &bars[nb]);
      }
    }
    const int b = item / a.H, h = item % a.H;
    float q[NV], k[NV], alpha[NV];
    prep_item<D>(a, b, h, a.conv_slots[b], sc, q, k, alpha);  // its barrier also orders the mbarrier inits
    mbar_wait(smem_u32(&bars[buf]), uint32_t(n / kRing) & 1u);
    update_rows<D, true>(a, b, h, st, st, sc, q, k, alpha, (tid >> 5) * kRowsPerWarp, tid & 31);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // our stores -> the copy engine
    __syncthreads();  // every row is written; sc may be overwritten by the next item's prep
    if (tid == 0) bulk_store_issue(state_of<D>(a, item), st, kStateBytes);
  }
  if (tid == 0) bulk_wait_read<0>();  // shared memory outlives the reads
}

// Pipelined persistent form: one block per SM of two groups of 2D threads. The prep group runs up
// to two items ahead, writing each item's normalised q, k, decays, v and β into one of two scratch
// slots; the update group takes them in order, updating each state in one of three shared-memory
// buffers that one of its threads fills and drains with bulk copies (the load of item n + 2 goes
// out as soon as item n is stored). So the copy engine, the prep's latency chain and the row update
// overlap, where the ring form above ran prep and update one after the other in every block.
// Named barriers between the groups (ids 3/4: slot s full, 5/6: slot s free; 1 and 2 are each
// group's own) carry the hand-over; bar.arrive/bar.sync order the shared-memory writes before them.
// Measured on the H200 it is slower than one block per item (0.66 / 0.72 of copy bandwidth at B = 32
// / 256 against 0.74 / 0.85, docs/PERF.md): one block per SM keeps about one and a half 64 KiB loads
// in flight, where three resident per-item blocks keep three. Kept as a switch, off.
template <int D>
__global__ void __launch_bounds__(D * 4, 1) kda_decode_pipelined_kernel(KdaDecodeArgs a) {
  constexpr int NV = D / 32, kGroup = 2 * D, kBlock = 4 * D, kStateBytes = D * D * 4;
  extern __shared__ __align__(16) float bufs[];  // [3][D][D]
  __shared__ __align__(16) ItemScratch<D> sc[2];
  __shared__ uint64_t bars[3];
  const int items = a.B * a.H;
  const bool prep_group = threadIdx.x < kGroup;
  const int gtid = threadIdx.x - (prep_group ? 0 : kGroup);
  const bool copier = !prep_group && gtid == 0;  // issues every bulk copy (bulk groups are per thread)
  if (prep_group) {
    int n = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++n) {
      const int s = n & 1, b = item / a.H, h = item % a.H;
      if (n >= 2) {  // the update group is done with item n - 2's slot
        if (s == 0) asm volatile("bar.sync 5, %0;\n" ::"n"(kBlock) : "memory");
        else asm volatile("bar.sync 6, %0;\n" ::"n"(kBlock) : "memory");
      }
      const QkScale nrm = prep_shared<D, 1>(a, b, h, a.conv_slots[b], sc[s], gtid);
      if (gtid < D) {  // each thread scales the q/k channel it wrote (sc.red is all others read)
        sc[s].qv[gtid] *= nrm.q;
        sc[s].kv[gtid] *= nrm.k;
      }
      if (s == 0) asm volatile("bar.arrive 3, %0;\n" ::"n"(kBlock) : "memory");
      else asm volatile("bar.arrive 4, %0;\n" ::"n"(kBlock) : "memory");
    }
    return;
  }
  if (copier) {
    for (int r = 0; r < 3; ++r) mbar_init(smem_u32(&bars[r]));
    for (int j = 0; j < 2; ++j) {
      const int item = blockIdx.x + j * gridDim.x;
      if (item < items) bulk_load(bufs + j * D * D, state_of<D>(a, item), kStateBytes, &bars[j]);
    }
  }
  asm volatile("bar.sync 2, %0;\n" ::"n"(kGroup) : "memory");  // the mbarriers are initialised
  int n = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x, ++n) {
    const int s = n & 1, buf = n % 3, b = item / a.H, h = item % a.H;
    float* st = bufs + buf * D * D;
    if (s == 0) asm volatile("bar.sync 3, %0;\n" ::"n"(kBlock) : "memory");
    else asm volatile("bar.sync 4, %0;\n" ::"n"(kBlock) : "memory");
    mbar_wait(smem_u32(&bars[buf]), uint32_t(n / 3) & 1u);
    const int lane = gtid & 31;
    float q[NV], k[NV], alpha[NV];
#pragma unroll
    for (int e = 0; e < NV; ++e) {
      q[e] = sc[s].qv[lane * NV + e];
      k[e] = sc[s].kv[lane * NV + e];
      alpha[e] = sc[s].al[lane * NV + e];
    }
    update_rows<D, true>(a, b, h, st, st, sc[s], q, k, alpha, (gtid >> 5) * kRowsPerWarp, lane);
    if (item + 2 * gridDim.x < items) {  // the prep group will wait for this slot
      if (s == 0) asm volatile("bar.arrive 5, %0;\n" ::"n"(kBlock) : "memory");
      else asm volatile("bar.arrive 6, %0;\n" ::"n"(kBlock) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // our stores -> the copy engine
    asm volatile("bar.sync 2, %0;\n" ::"n"(kGroup) : "memory");     // every row of this item is written
    if (copier) {
      bulk_store_issue(state_of<D>(a, item), st, kStateBytes);
      const int ahead = item + 2 * gridDim.x;
      if (ahead < items) {  // its buffer held item n - 1: that store must have left shared memory
        bulk_wait_read<1>();
        const int nb = (n + 2) % 3;
        bulk_load(bufs + nb * D * D, state_of<D>(a, ahead), kStateBytes, &bars[nb]);
      }
    }
  }
  if (copier) bulk_wait_read<0>();  // shared memory outlives the reads
}

// Launches a persistent kernel with as many blocks as fit on the device at once (at most one per item).
void launch_persistent(void (*kern)(KdaDecodeArgs), const KdaDecodeArgs& a, int threads, int smem, cudaStream_t s) {
  K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int dev = 0, sms = 0, per_sm = 0;
  K3_CUDA_OK(cudaGetDevice(&dev));
  K3_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  K3_CUDA_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
  const int64_t items = int64_t(a.B) * a.H;
  const int grid = int(std::min<int64_t>(items, int64_t(std::max(1, sms)) * std::max(1, per_sm)));
  kern<<<grid, threads, smem, s>>>(a);
}

template <int D>
void launch_pipelined(const KdaDecodeArgs& a, cudaStream_t s) {
  launch_persistent(kda_decode_pipelined_kernel<D>, a, D * 4, 3 * D * D * 4, s);
}

template <int D>
void launch_per_item(const KdaDecodeArgs& a, dim3 grid, cudaStream_t s) {
  constexpr int kSmem = D * D * 4;
  K3_CUDA_OK(cudaFuncSetAttribute(kda_decode_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kda_decode_kernel<D><<<grid, D * 2, kSmem, s>>>(a);
}

template <int D>
void launch_ring(const KdaDecodeArgs& a, cudaStream_t s) {
  if (a.ring_ahead != 1 && a.ring_ahead != 2)
    throw Error("kda_decode: ring_ahead " + std::to_string(a.ring_ahead) + " not in {0, 1, 2}");
  launch_persistent(a.ring_ahead == 1 ? kda_decode_ring_kernel<D, 1> : kda_decode_ring_kernel<D, 2>, a, D * 2,
                    kRing * D * D * 4, s);
}

template <int D>
void launch_for(const KdaDecodeArgs& a, dim3 grid, cudaStream_t s) {
  if (a.pipelined) launch_pipelined<D>(a, s);
  else if (a.ring_ahead > 0) launch_ring<D>(a, s);
  else launch_per_item<D>(a, grid, s);
}

}  // namespace

void launch_kda_decode(const KdaDecodeArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  if (a.W < 1 || a.W > kMaxW) throw Error("kda_decode: conv width " + std::to_string(a.W) + " not in 1..8");
  const dim3 grid(a.H, a.B);
  switch (a.D) {
    case 64: launch_for<64>(a, grid, s); break;
    case 128: launch_for<128>(a, grid, s); break;
    default: throw Error("kda_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
  K3_CUDA_LAUNCHED("kda_decode_kernel");
}

}  // namespace k3::cuda
