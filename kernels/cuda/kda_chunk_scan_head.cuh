// KDA chunked prefill, scan on wgmma with a whole head per block (sm_90a): the jobs and results of
// the 32-row scan (kda_chunk_scan_wg32.cuh), its four blocks of one head folded into one block of
// four warpgroups. Each warpgroup runs the 32-row scan's products on its own quarter of the state;
// the tiles every quarter reads (W, Q⊙e^Γ, K_d, M_qk, e^{Γ_C}) arrive once per chunk instead of
// four times, with the whole of U, into one of two stages, so that a chunk's copies are issued a
// chunk before it is scanned. The profile of the 32-row scan at T = 8192, H = 96 that led here: L2
// throughput at 82 % of its peak (the four blocks of a head each reading the same 56 KiB a chunk)
// and most of each chunk spent waiting on copies issued only half a chunk ahead.
// What it gives: L2 throughput falls to 51 %, and an SM scans a chunk of one 32-row quarter in 10 %
// less time than with three 32-row blocks; but one block a head leaves SMs idle (96 of 132 at
// H = 96), so without checkpoints the 32-row blocks stay faster. Where a checkpoint follows every
// chunk it is the faster form (kda_scan_form.cpp says by how much).
// The warpgroups do not wait for each other: each counts its release of a stage, and the last of
// the four to release it refills it with the chunk two ahead, so that one warpgroup's products
// overlap another's stores (in lockstep, with one block barrier a chunk, the four issued their
// products at the same moments and the head took 1222 µs where four 32-row blocks take 1110).
// A checkpoint does not make them meet either: each warpgroup writes its quarter of the fp32 state
// with streaming stores from its accumulators. Staging the state in the released stage for bulk
// stores (the block meeting twice a chunk) measured the same on the H200: at a checkpoint after every
// chunk the cost is the bytes, 805 MB at T = 8192, H = 96, not how they leave (docs/PERF.md).
#pragma once
#include <type_traits>

#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_scan_job.cuh"
#include "kernels/cuda/kda_chunk_scan_tma.cuh"
#include "kernels/cuda/kda_chunk_scan_wg32.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::kda_chunk {

struct ScanHead {
  static constexpr int kWgs = 4, kThreads = 128 * kWgs, kRows = 32;
  // A stage: W, Q⊙e^Γ, K_d, U [64 tok][128] in the op layout (two 64-column boxes each), M_qk [64][64].
  static constexpr int kStW = 0, kStQ = 16384, kStKd = 32768, kStU = 49152, kStMq = 65536, kStage = 73728;
  // Per warpgroup, after the two stages: its bf16 S [32 v][128 k] and V'ᵀ [32 v][64 tok] (32-row op layout).
  static constexpr int kOffWg = 2 * kStage, kWgS = 0, kWgVt = 8192, kWgBytes = 12288;
  static constexpr int kOffGc = kOffWg + kWgs * kWgBytes;  // fp32 e^{Γ_C} [2 stages][128]
  static constexpr int kOffBar = kOffGc + 2 * kD * 4;      // one mbarrier a stage
  static constexpr int kOffCnt = kOffBar + 16;             // releases of each stage (u32 [2])
  static constexpr int kSmem = kOffCnt + 8 + 1024;         // + alignment slack (atoms on 1024 bytes)
};
static_assert(ScanHead::kSmem <= 227 * 1024, "one block per SM");
static_assert(ScanHead::kStage % 1024 == 0 && ScanHead::kOffWg % 1024 == 0 && ScanHead::kWgBytes % 1024 == 0);

// The copies of one chunk into a stage (one thread issues them).
struct ScanHeadTma {
  uint32_t sbase;
  const KdaScanMaps* maps;
  void* work;
  int H, h;
  bool write_o, zero_u;
  __device__ __forceinline__ uint32_t bar(int s) const { return sbase + ScanHead::kOffBar + 8 * s; }
  __device__ __forceinline__ void init(int tid) const {
    if (tid == 0) {
      mbar_init(bar(0));
      mbar_init(bar(1));
    }
    __syncthreads();
  }
  __device__ __forceinline__ void load(int c, int s) const {
    const int t = c * H + h, row = t * kTileRows128;
    const uint32_t st = sbase + uint32_t(s * ScanHead::kStage);
    const uint32_t bytes = 2 * 16384u + uint32_t(kD * 4) + (write_o ? 16384u + 8192u : 0u) + (zero_u ? 0u : 16384u);
    mbar_expect_tx(bar(s), bytes);
    for (int kh = 0; kh < 2; ++kh) {
      tma_load_2d(st + ScanHead::kStW + kh * 8192, &maps->tiles, 64 * kh, row, bar(s));
      tma_load_2d(st + ScanHead::kStKd + kh * 8192, &maps->tiles, 64 * kh, row + 192, bar(s));
      if (write_o) tma_load_2d(st + ScanHead::kStQ + kh * 8192, &maps->tiles, 64 * kh, row + 128, bar(s));
      if (!zero_u) tma_load_2d(st + ScanHead::kStU + kh * 8192, &maps->tiles, 64 * kh, row + 64, bar(s));
    }
    if (write_o) tma_load_2d(st + ScanHead::kStMq, &maps->mq, 0, t * kTileRows64 + 512, bar(s));
    bulk_load(sbase + ScanHead::kOffGc + s * kD * 4, work_gc(work, c, H, h), kD * 4, bar(s));
  }
};

// Warpgroup w's 128 threads only (ids 1..4; 0 is __syncthreads).
__device__ __forceinline__ void scan_head_wg_sync(int w) { bar_sync<128>(1 + w); }

__global__ void __launch_bounds__(ScanHead::kThreads, 1)
    kda_chunk_scan_head_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                               const KdaScanJob* jobs, float* carry, const __grid_constant__ KdaScanMaps maps) {
  pdl_enter();
  using L = ScanWg32;  // the 32-row operand layout of S and V'ᵀ
  extern __shared__ __align__(1024) unsigned char smraw_head[];
  unsigned char* sm = scan_wg_smem(smraw_head);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const int h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x;
  const int wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2;
  const int v0 = 32 * wgi;
  const ScanBlockJob job = scan_block_job(a, seq_chunk0, jobs, carry, n, h, v0);
  const int c_begin = job.c_begin, c_end = job.c_end, seq = job.seq;
  const bool write_o = job.write_o, zero_u = job.zero_u;
  const uint32_t wbase = uint32_t(ScanHead::kOffWg + wgi * ScanHead::kWgBytes);
  const uint32_t sS = sbase + wbase + ScanHead::kWgS, sVt = sbase + wbase + ScanHead::kWgVt;
  const uint32_t oS = wbase + ScanHead::kWgS, oVt = wbase + ScanHead::kWgVt;  // the same as offsets
  const wg::DescBase desc(sbase);
  uint32_t* const cnt = reinterpret_cast<uint32_t*>(sm + ScanHead::kOffCnt);

  ScanHeadTma fetch{sbase, &maps, work, H, h, write_o, zero_u};
  if (tid == 0) cnt[0] = cnt[1] = 0;
  fetch.init(tid);  // its block barrier also orders the counters' zeroing

  // This warpgroup's quarter of the state, transposed as in the 32-row scan (rows relative to v0).
  float ST[2][16];
  auto each_elem = [&](auto&& f) { L::each_state_elem(ST, warp, lane, f); };
  each_elem([&](float& x, int v, int k) { x = scan_init_value(job, v0, v, k); });
  auto store_sb = [&] {
    L::store_state_bf16(sS, ST, warp, lane);
    wg::fence_proxy_async();
  };
  store_sb();
  if (tid == 0) {
    if (c_begin < c_end) fetch.load(c_begin, 0);
    if (c_begin + 1 < c_end) fetch.load(c_begin + 1, 1);
  }

  auto chunks = [&](auto write_o_c) {
    constexpr bool kO = decltype(write_o_c)::value;
    ChunkAhead ahead = ChunkAhead::first(chunk_table, c_begin, c_end);
    for (int c = c_begin; c < c_end; ++c) {
      const int i = c - c_begin, s = i & 1;
      const auto [t0, len, ck, has_next] = scan_chunk<kO>(ahead, a, seq, chunk_table, c, c_end);
      const uint32_t so = uint32_t(s * ScanHead::kStage);
      const unsigned char* Us = sm + s * ScanHead::kStage + ScanHead::kStU;
      const float* Gc = reinterpret_cast<const float*>(sm + ScanHead::kOffGc + s * kD * 4);
      mbar_wait(fetch.bar(s), (i >> 1) & 1);  // this chunk's stage
      scan_head_wg_sync(wgi);                  // and every thread's bf16 state copy

      const Wg32Tiles tiles{so + ScanHead::kStW,  so + ScanHead::kStQ, so + ScanHead::kStKd,
                            so + ScanHead::kStMq, oS,                  oVt};

      // (a) V' = U − W Sᵀ, O = (Q⊙e^Γ) Sᵀ.
      float Va[16], Oa[16];
      wg32_issue_a<kO>(desc, tiles, Va, Oa);
      wg::wait<1>();
#pragma unroll
      for (int i2 = 0; i2 < 16; ++i2) wg::reg_fence(Va[i2]);
      // V'ᵀ [v][tok] (bf16) from the [tok][v] accumulators; U columns v0 + v of the stage's [64][128].
      L::store_vt(sVt, Va, zero_u,
                  [&](int r, int v) { return u_pair<64>(Us + ((v0 + v) >> 6) * 8192, r, (v0 + v) & 63); }, warp, lane);
      wg::wait<0>();
#pragma unroll
      for (int i2 = 0; i2 < 16; ++i2) wg::reg_fence(Oa[i2]);
      wg::fence_proxy_async();
      scan_head_wg_sync(wgi);  // V'ᵀ complete; this warpgroup's bf16 state is no longer read this chunk

      // (c) Sᵀ = Diag(e^{Γ_C}) Sᵀ + K_dᵀ V', then (b) O += M_qk V' as a second group.
      wg32_issue_cb<kO>(desc, tiles, Gc, ST, Oa, warp, g);
      wg32_finish_cb<kO>(sS, ST, Oa, a, t0, len, h, v0, warp, lane);
      if (ck >= 0) {
        // Each warpgroup writes its quarter of the checkpoint straight from its accumulators
        // (streaming stores: nothing here reads them back). No meet of the block and no staging.
        float* dst = a.ckpt + (int64_t(ck) * H + h) * kD * kD + int64_t(v0) * kD;
        each_elem([&](float x, int v, int k) { __stcs(dst + v * kD + k, x); });
      }
      // This warpgroup's reads of the stage are over (its products waited for, its loads used);
      // the fourth warpgroup to say so refills it.
      scan_head_wg_sync(wgi);
      if ((tid & 127) == 0) {
        __threadfence_block();
        if (atomicAdd(cnt + s, 1u) % 4 == 3 && c + 2 < c_end) {
          __threadfence_block();
          fetch.load(c + 2, s);
        }
      }
    }
  };
  if (write_o) chunks(std::true_type{});
  else chunks(std::false_type{});
  if (job.final_state != nullptr) each_elem([&](float x, int v, int k) { job.final_state[v * kD + k] = x; });
}

}  // namespace k3::cuda::kda_chunk
