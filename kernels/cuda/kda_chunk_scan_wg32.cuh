// KDA chunked prefill, scan on wgmma with 32 rows of V per block (sm_90a): the jobs and results of
// kda_chunk_scan_wg_kernel (kda_chunk_scan_wg.cuh), in blocks half as wide. The 64-row scan holds
// the state in 128 accumulator registers and 92 KB of shared memory, two blocks per SM, and at
// T = 8192, H = 96 its 192 blocks are 0.73 of a wave, each waiting on its own chain of loads and
// products. Here a block holds a quarter of a head's state: 64 accumulator registers, 75 KB, three
// blocks per SM, 384 blocks at that shape. wgmma's M is 64, so the state is kept transposed:
//   (a) V' = U − W Sᵀ, O = (Q⊙e^Γ) Sᵀ   m64n32, K = 128: A = W, Q⊙e^Γ [tok][k], B = S [v][k] (K-major)
//   (b) O += M_qk V'                    m64n32, K = 64:  A = M_qk K-major, B = V'ᵀ [v][tok] K-major
//   (c) Sᵀ = Diag(e^{Γ_C}) Sᵀ + K_dᵀ V'  m64n32 x 2 (k halves), K = 64: A = K_d [tok][k] read MN-major,
//                                        B = V'ᵀ K-major
// V'ᵀ and the bf16 copy of S are written transposed from the accumulators (stmatrix.trans).
// Accumulator element d[4j + e] of warp w: row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
#pragma once
#include <type_traits>

#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_scan_job.cuh"
#include "kernels/cuda/kda_chunk_scan_tma.cuh"
#include "kernels/cuda/kda_chunk_scan_wg.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::kda_chunk {

struct ScanWg32 {
  static constexpr int kThreads = 128, kRows = 32;
  static constexpr int kOffW = 0;                        // [64 tok][128 k] op layout, 16 KiB
  static constexpr int kOffQ = kOffW + 16384;            // Q⊙e^Γ, same
  static constexpr int kOffKd = kOffQ + 16384;           // K⊙e^{Γ_C−Γ}, same
  static constexpr int kOffS = kOffKd + 16384;           // bf16 S [32 v][128 k], 32-row op layout, 8 KiB
  static constexpr int kOffMq = kOffS + 8192;            // M_qk [64][64], 8 KiB
  static constexpr int kOffVt = kOffMq + 8192;           // V'ᵀ [32 v][64 tok], 32-row op layout, 4 KiB
  static constexpr int kOffU = kOffVt + 4096;            // U [64 tok][32 v] row-major (the copy's box), 4 KiB
  static constexpr int kOffGc = kOffU + 4096;            // fp32 [128]
  static constexpr int kOffBar = kOffGc + kD * 4;        // two mbarriers
  static constexpr int kSmem = kOffBar + 16 + 1024;      // + alignment slack (atoms on 1024 bytes)
  // A checkpoint's fp32 state [32][128] is staged in the K_d buffer (kda_chunk_scan_tma.cuh).
  static constexpr int ckpt_half(int) { return kOffKd; }
  // Byte offset of 16-byte chunk `chunk` of row `row` of a 32-row operand: the 4 atoms of one
  // 64-element column block consecutive (8-row group stride 1024), column blocks 4096 apart.
  static __device__ __forceinline__ uint32_t off32(int row, int chunk) {
    return uint32_t(((chunk >> 3) * 4 + (row >> 3)) * wg::kAtomBytes) + wg::sw128_offset(row & 7, chunk & 7);
  }
  // f(ST[b][4j + e], v, k) for every element a thread holds of its warpgroup's transposed state:
  // ST[b][4j + e] = S[v][k], k = 64 b + 16 warp + g + 8 (e >> 1), v = 8 j + 2 t + (e & 1).
  template <class F>
  static __device__ __forceinline__ void each_state_elem(float (&ST)[2][16], int warp, int lane, F&& f) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(ST[b][4 * j + e], 8 * j + 2 * t + (e & 1), 64 * b + 16 * warp + g + 8 * (e >> 1));
  }
  // The bf16 copy S [v][k] (32-row layout at shared address s) of a warpgroup's transposed state
  // ST[b][4j + e] (the kernel's comment), in four transposed matrix stores where 2-byte stores took
  // 32: fragment (b, e >> 1, j) is rows k = 64 b + 16 warp + 8 (e >> 1) + 0..7 by columns
  // v = 8 j .. 8 j + 7, and its transpose is 8 rows v of one 16-byte chunk, 8 b + 2 warp + (e >> 1).
  static __device__ __forceinline__ void store_state_bf16(uint32_t s, const float (&ST)[2][16], int warp, int lane) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int eh = 0; eh < 2; ++eh) {
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] = pack_bf16(ST[b][4 * j + 2 * eh], ST[b][4 * j + 2 * eh + 1]);
        stmatrix_x4_trans(s + off32(lane, 8 * b + 2 * warp + eh), r);
      }
  }
  // V'ᵀ [v][tok] (32-row layout at shared address s) from the [tok][v] accumulators Va of W Sᵀ and
  // the block's U slice (u(r, v): the pair at columns v, v + 1 of row r): fragment (j, hf) is rows
  // tok = 16 warp + 8 hf + 0..7 by columns v = 8 j .. 8 j + 7; its transpose, chunk 2 warp + hf.
  template <class UPair>
  static __device__ __forceinline__ void store_vt(uint32_t s, const float (&Va)[16], bool zero_u, UPair&& u,
                                                  int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      uint32_t r[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 uu = zero_u ? make_float2(0.f, 0.f) : bf2_to_f2(u(16 * warp + g + 8 * hf, 8 * j + 2 * t));
        r[j] = pack_bf16(uu.x - Va[4 * j + 2 * hf], uu.y - Va[4 * j + 2 * hf + 1]);
      }
      stmatrix_x4_trans(s + off32(lane, 2 * warp + hf), r);
    }
  }
};
static_assert(3 * (ScanWg32::kSmem + 1024) <= 228 * 1024, "three blocks per SM");

// One warpgroup's products of a chunk on its 32 rows of the state, shared by this scan and the
// head-per-block scan (kda_chunk_scan_head.cuh): byte offsets, from the descriptor base, of the
// chunk's W, Q⊙e^Γ, K_d and M_qk tiles and of the warpgroup's bf16 S and V'ᵀ.
struct Wg32Tiles {
  uint32_t w, q, kd, mq, s, vt;
};

// (a) W Sᵀ into Va (first group) and, with output, (Q⊙e^Γ) Sᵀ into Oa (second group); issued, not
// waited for.
template <bool kO>
__device__ __forceinline__ void wg32_issue_a(const wg::DescBase& desc, const Wg32Tiles& o, float (&Va)[16],
                                             float (&Oa)[16]) {
  // acc = (the 64 x 128 operand at `a`) Sᵀ, over the 128 state rows in k16 steps.
  const auto times_st = [&](float (&acc)[16], uint32_t a) {
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const uint32_t off_a = uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32);
      const uint64_t ds = desc.at(o.s + uint32_t((ks >> 2) * 4 * wg::kAtomBytes + (ks & 3) * 32));
      wg::mma_m64n32<0, 0>(acc, desc.at(a + off_a), ds, ks > 0);
    }
  };
  wg::fence();
  times_st(Va, o.w);
  wg::commit();
  if constexpr (kO) times_st(Oa, o.q);
  wg::commit();
}

// (c) Sᵀ = Diag(e^{Γ_C}) Sᵀ + K_dᵀ V' (first group), then, with output, (b) O += M_qk V' (second
// group); issued, not waited for. Gc: the chunk's e^{Γ_C} [128].
template <bool kO>
__device__ __forceinline__ void wg32_issue_cb(const wg::DescBase& desc, const Wg32Tiles& o, const float* Gc,
                                              float (&ST)[2][16], float (&Oa)[16], int warp, int g) {
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float d = Gc[64 * b + 16 * warp + g + 8 * hf];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ST[b][4 * j + 2 * hf] *= d;
        ST[b][4 * j + 2 * hf + 1] *= d;
      }
    }
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    const uint64_t dv = desc.at(o.vt + kk * 32);
#pragma unroll
    for (int b = 0; b < 2; ++b) wg::mma_m64n32<1, 0>(ST[b], desc.at(o.kd + (8 * b + 2 * kk) * wg::kAtomBytes), dv);
  }
  wg::commit();
  if constexpr (kO) {
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wg::mma_m64n32<0, 0>(Oa, desc.at(o.mq + kk * 32), desc.at(o.vt + kk * 32));
  }
  wg::commit();
}

// After wg32_issue_cb: once (c) is done, the new state's bf16 copy to s (the chunk's (a), its only
// reader, ended before the caller's barrier), while (b) may still run; then, with output, rows < len
// of O [64 tok][32 v] to columns v0.. of head h.
template <bool kO>
__device__ __forceinline__ void wg32_finish_cb(uint32_t s, float (&ST)[2][16], float (&Oa)[16], const KdaArgs& a,
                                               int t0, int len, int h, int v0, int warp, int lane) {
  wg::wait<1>();
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int i = 0; i < 16; ++i) wg::reg_fence(ST[b][i]);
  ScanWg32::store_state_bf16(s, ST, warp, lane);
  wg::fence_proxy_async();
  wg::wait<0>();
#pragma unroll
  for (int i = 0; i < 16; ++i) wg::reg_fence(Oa[i]);
  if constexpr (kO) store_o_rows<4>(a, t0, len, h, v0, Oa, warp, lane >> 2, lane & 3);
}

__global__ void __launch_bounds__(ScanWg32::kThreads, 3)
    kda_chunk_scan_wg32_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                               const KdaScanJob* jobs, float* carry,
                             const __grid_constant__ KdaScanMaps maps) {
  pdl_enter();
  constexpr int VT = ScanWg32::kRows;
  extern __shared__ __align__(1024) unsigned char smraw_wg32[];
  unsigned char* sm = scan_wg_smem(smraw_wg32);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const wg::DescBase desc(sbase);
  constexpr Wg32Tiles kTiles{ScanWg32::kOffW,  ScanWg32::kOffQ, ScanWg32::kOffKd,
                             ScanWg32::kOffMq, ScanWg32::kOffS, ScanWg32::kOffVt};
  float* Gc = reinterpret_cast<float*>(sm + ScanWg32::kOffGc);
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int lane = tid & 31, g = lane >> 2;
  const int v0 = vt * VT;
  const ScanBlockJob job = scan_block_job(a, seq_chunk0, jobs, carry, n, h, v0);
  const int c_begin = job.c_begin, c_end = job.c_end, seq = job.seq;
  const bool write_o = job.write_o, zero_u = job.zero_u;

  ScanWgTma<ScanWg32, VT> fetch{sbase, &maps, work, H, h, v0, write_o, zero_u};
  fetch.init(tid);

  // The state, transposed (ScanWg32::each_state_elem; rows of V relative to v0).
  float ST[2][16];
  auto each_elem = [&](auto&& f) { ScanWg32::each_state_elem(ST, warp, lane, f); };
  each_elem([&](float& x, int v, int k) { x = scan_init_value(job, v0, v, k); });
  auto store_sb = [&] {  // bf16 S [v][k] from the transposed accumulators
    ScanWg32::store_state_bf16(sbase + ScanWg32::kOffS, ST, warp, lane);
    wg::fence_proxy_async();
  };
  auto store_state = [&](float* dst) { each_elem([&](float x, int v, int k) { dst[v * kD + k] = x; }); };
  // Two groups of bulk copies a chunk, as in the 64-row scan: W, Q⊙e^Γ, U, then K_d, M_qk, e^{Γ_C}.
  store_sb();
  fetch.first(tid, c_begin, c_end);

  // The chunk loop with write_o as a constant: a wgmma group that runs only when O is written
  // would make ptxas serialize every wgmma of the kernel (C7514) once the two groups of a
  // product overlap.
  auto chunks = [&](auto write_o_c) {
    constexpr bool kO = decltype(write_o_c)::value;
    ChunkAhead ahead = ChunkAhead::first(chunk_table, c_begin, c_end);
    for (int c = c_begin; c < c_end; ++c) {
      const auto [t0, len, ck, has_next] = scan_chunk<kO>(ahead, a, seq, chunk_table, c, c_end);
      fetch.wait_wuq();  // this chunk's W, Q⊙e^Γ, U (its K_d group may still be in flight)
      __syncthreads();   // and every thread's bf16 state copy

      // (a) V' = U − W Sᵀ, O = (Q⊙e^Γ) Sᵀ.
      float Va[16], Oa[16];
      wg32_issue_a<kO>(desc, kTiles, Va, Oa);
      wg::wait<1>();  // W Sᵀ is done; (Q⊙e^Γ) Sᵀ may still run while V' is formed
#pragma unroll
      for (int i = 0; i < 16; ++i) wg::reg_fence(Va[i]);
      // V'ᵀ [v][tok] (bf16) from the [tok][v] accumulators.
      ScanWg32::store_vt(sbase + ScanWg32::kOffVt, Va, zero_u,
                         [&](int r, int v) { return u_pair<VT>(sm + ScanWg32::kOffU, r, v); }, warp, lane);
      wg::wait<0>();  // (Q⊙e^Γ) Sᵀ: its reads end before the next chunk's copies overwrite Q⊙e^Γ
#pragma unroll
      for (int i = 0; i < 16; ++i) wg::reg_fence(Oa[i]);
      wg::fence_proxy_async();
      __syncthreads();  // V'ᵀ complete; W, U, Q⊙e^Γ and the bf16 state are no longer read this chunk
      if (tid == 0 && has_next) fetch.wuq(c + 1);
      fetch.wait_kmg();  // this chunk's K_d, M_qk, e^{Γ_C} (the next chunk's W group may be in flight)

      // (c) Sᵀ = Diag(e^{Γ_C}) Sᵀ + K_dᵀ V', then (b) O += M_qk V' as a second group: the bf16 copy of
      // the new state is written while (b) runs.
      wg32_issue_cb<kO>(desc, kTiles, Gc, ST, Oa, warp, g);
      wg32_finish_cb<kO>(sbase + ScanWg32::kOffS, ST, Oa, a, t0, len, h, v0, warp, lane);
      __syncthreads();  // K_d, M_qk, V'ᵀ are free
      if (ck >= 0) {  // the state through the free K_d buffer to its checkpoint slot, in one bulk store
        each_elem([&](float x, int v, int k) { *reinterpret_cast<float*>(sm + ckpt_stage_offset<ScanWg32>(v, k)) = x; });
        wg::fence_proxy_async();
        __syncthreads();
        if (tid == 0) fetch.ckpt(ck);
      }
      if (tid == 0 && has_next) fetch.kmg(c + 1);
    }
  };
  if (write_o) chunks(std::true_type{});
  else chunks(std::false_type{});
  if (job.final_state != nullptr) store_state(job.final_state);
}

}  // namespace k3::cuda::kda_chunk
