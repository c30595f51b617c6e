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
// V'ᵀ and the bf16 copy of S are written transposed from the accumulators (2-byte stores).
// Accumulator element d[4j + e] of warp w: row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
#pragma once
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::kda_chunk {

struct ScanWg32 {
  static constexpr int kThreads = 128, kRows = 32;
  static constexpr int kLdU = 40;                        // bf16 pitch of the [64][32] U slice (threads only)
  static constexpr int kOffW = 0;                        // [64 tok][128 k] op layout, 16 KiB
  static constexpr int kOffQ = kOffW + 16384;            // Q⊙e^Γ, same
  static constexpr int kOffKd = kOffQ + 16384;           // K⊙e^{Γ_C−Γ}, same
  static constexpr int kOffS = kOffKd + 16384;           // bf16 S [32 v][128 k], 32-row op layout, 8 KiB
  static constexpr int kOffMq = kOffS + 8192;            // M_qk [64][64], 8 KiB
  static constexpr int kOffVt = kOffMq + 8192;           // V'ᵀ [32 v][64 tok], 32-row op layout, 4 KiB
  static constexpr int kOffU = kOffVt + 4096;            // [64][40] bf16
  static constexpr int kOffGc = kOffU + kC * kLdU * 2;   // fp32 [128]
  static constexpr int kSmem = kOffGc + kD * 4 + 1024;   // + alignment slack (atoms on 1024 bytes)
  // Byte offset of 16-byte chunk `chunk` of row `row` of a 32-row operand: the 4 atoms of one
  // 64-element column block consecutive (8-row group stride 1024), column blocks 4096 apart.
  static __device__ __forceinline__ uint32_t off32(int row, int chunk) {
    return uint32_t(((chunk >> 3) * 4 + (row >> 3)) * wg::kAtomBytes) + wg::sw128_offset(row & 7, chunk & 7);
  }
};
static_assert(3 * (ScanWg32::kSmem + 1024) <= 228 * 1024, "three blocks per SM");

__global__ void __launch_bounds__(ScanWg32::kThreads, 3)
    kda_chunk_scan_wg32_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                               const KdaScanJob* jobs, float* carry) {
  constexpr int VT = ScanWg32::kRows, kThreads = ScanWg32::kThreads;
  extern __shared__ __align__(1024) unsigned char smraw_wg32[];
  unsigned char* sm = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smraw_wg32) + 1023) & ~uintptr_t(1023));
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  bf16* Us = reinterpret_cast<bf16*>(sm + ScanWg32::kOffU);
  float* Gc = reinterpret_cast<float*>(sm + ScanWg32::kOffGc);
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int v0 = vt * VT;
  KdaScanJob job;
  if (jobs != nullptr) {
    job = jobs[n];
  } else {
    job.c_begin = seq_chunk0[n];
    job.c_end = seq_chunk0[n + 1];
    job.seq = n;
  }
  const int c_begin = job.c_begin, c_end = job.c_end, seq = job.seq;
  const bool write_o = (job.flags & KdaScanJob::kWriteO) != 0, zero_u = (job.flags & KdaScanJob::kZeroU) != 0;
  auto state_at = [&](int which, int slot) -> float* {
    if (which == KdaScanJob::kToSeq) return a.state + (int64_t(a.slots[seq]) * H + h) * kD * kD + int64_t(v0) * kD;
    if (which == KdaScanJob::kToCarry) return carry + (int64_t(slot) * H + h) * kD * kD + int64_t(v0) * kD;
    return nullptr;
  };
  const float* init = job.init == KdaScanJob::kFromSeq     ? state_at(KdaScanJob::kToSeq, 0)
                      : job.init == KdaScanJob::kFromCarry ? state_at(KdaScanJob::kToCarry, job.in_slot)
                                                           : nullptr;
  float* final_state = state_at(job.out, job.out_slot);

  // [64][128] bf16 rows -> 64-row op layout.
  auto rows128 = [&](int off, const bf16* src) {
    for (int idx = tid; idx < kC * 16; idx += kThreads)
      cp_async16(sm + off + wg::op_offset(idx >> 4, idx & 15), src + (idx >> 4) * kD + (idx & 15) * 8);
  };
  auto fetch_wuq = [&](int c) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(ScanWg32::kOffW, wk + kOffW);
    if (write_o) rows128(ScanWg32::kOffQ, wk + kOffQg);
    if (zero_u) return;
    for (int idx = tid; idx < kC * (VT / 8); idx += kThreads) {
      const int r = idx / (VT / 8), c8 = (idx % (VT / 8)) * 8;
      cp_async16(Us + r * ScanWg32::kLdU + c8, wk + kOffU + r * kD + v0 + c8);
    }
  };
  auto fetch_kmg = [&](int c) {
    const bf16* wk = work_tiles(work, c, H, h);
    rows128(ScanWg32::kOffKd, wk + kOffKd);
    for (int idx = tid; write_o && idx < kC * 8; idx += kThreads)
      cp_async16(sm + ScanWg32::kOffMq + wg::op_offset(idx >> 3, idx & 7), wk + kOffMq + (idx >> 3) * kC + (idx & 7) * 8);
    const float* gc = work_gc(work, c, H, h);
    if (tid < kD / 4) cp_async16(Gc + 4 * tid, gc + 4 * tid);
  };

  // The state, transposed: ST[b][4j + e] = S[v][k], k = 64 b + 16 warp + g + 8 (e >> 1),
  // v = 8 j + 2 t + (e & 1) (rows of V relative to v0).
  float ST[2][16];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 64 * b + 16 * warp + g + 8 * (e >> 1), v = 8 * j + 2 * t + (e & 1);
        ST[b][4 * j + e] = init != nullptr                        ? init[v * kD + k]
                           : job.init == KdaScanJob::kIdentity ? (v0 + v == k ? 1.f : 0.f)
                                                               : 0.f;
      }
  auto store_sb = [&] {  // bf16 S [v][k] from the transposed accumulators
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 64 * b + 16 * warp + g + 8 * (e >> 1), v = 8 * j + 2 * t + (e & 1);
          *reinterpret_cast<bf16*>(sm + ScanWg32::kOffS + ScanWg32::off32(v, k >> 3) + (k & 7) * 2) =
              __float2bfloat16_rn(ST[b][4 * j + e]);
        }
    wg::fence_proxy_async();
  };
  auto store_state = [&](float* dst, bool streaming) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 64 * b + 16 * warp + g + 8 * (e >> 1), v = 8 * j + 2 * t + (e & 1);
          if (streaming) __stcs(dst + v * kD + k, ST[b][4 * j + e]);
          else dst[v * kD + k] = ST[b][4 * j + e];
        }
  };
  // Two cp.async groups a chunk, as in the 64-row scan: W, Q⊙e^Γ, U, then K_d, M_qk, e^{Γ_C}.
  store_sb();
  if (c_begin < c_end) fetch_wuq(c_begin);
  cp_async_commit();
  if (c_begin < c_end) fetch_kmg(c_begin);
  cp_async_commit();

  int next_t0 = 0, next_len = 0, next_idx = 0;
  auto read_table = [&](int cc) {
    next_t0 = chunk_table[4 * cc];
    next_len = chunk_table[4 * cc + 1];
    next_idx = chunk_table[4 * cc + 3];
  };
  if (c_begin < c_end) read_table(c_begin);
  for (int c = c_begin; c < c_end; ++c) {
    const int t0 = next_t0, len = next_len;
    const int ck = write_o ? kda_ckpt_slot(a, seq, 64 * next_idx + len) : -1;
    const bool has_next = c + 1 < c_end;
    if (has_next) read_table(c + 1);
    cp_async_wait<1>();
    wg::fence_proxy_async();
    __syncthreads();

    // (a) V' = U − W Sᵀ, O = (Q⊙e^Γ) Sᵀ.
    float Va[16], Oa[16];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const uint32_t off_a = uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32);
      const uint64_t ds = wg::make_desc(sbase + ScanWg32::kOffS + uint32_t((ks >> 2) * 4 * wg::kAtomBytes + (ks & 3) * 32));
      wg::mma_m64n32<0, 0>(Va, wg::make_desc(sbase + ScanWg32::kOffW + off_a), ds, ks > 0);
      if (write_o) wg::mma_m64n32<0, 0>(Oa, wg::make_desc(sbase + ScanWg32::kOffQ + off_a), ds, ks > 0);
    }
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      wg::reg_fence(Va[i]);
      wg::reg_fence(Oa[i]);
    }
    // V'ᵀ [v][tok] (bf16) from the [tok][v] accumulators.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * warp + g + 8 * hf, v = 8 * j + 2 * t;
        const float2 u = zero_u ? make_float2(0.f, 0.f)
                                : bf2_to_f2(*reinterpret_cast<const uint32_t*>(Us + r * ScanWg32::kLdU + v));
        unsigned char* col = sm + ScanWg32::kOffVt + (r & 7) * 2;
        *reinterpret_cast<bf16*>(col + ScanWg32::off32(v, r >> 3)) = __float2bfloat16_rn(u.x - Va[4 * j + 2 * hf]);
        *reinterpret_cast<bf16*>(col + ScanWg32::off32(v + 1, r >> 3)) = __float2bfloat16_rn(u.y - Va[4 * j + 2 * hf + 1]);
      }
    wg::fence_proxy_async();
    __syncthreads();  // V'ᵀ complete; W, U, Q⊙e^Γ and the bf16 state are no longer read this chunk
    if (has_next) fetch_wuq(c + 1);
    cp_async_commit();
    cp_async_wait<1>();  // this chunk's K_d, M_qk, e^{Γ_C}
    wg::fence_proxy_async();
    __syncthreads();

    // (b) O += M_qk V' and (c) Sᵀ = Diag(e^{Γ_C}) Sᵀ + K_dᵀ V', under one wait.
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
    if (write_o) {
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk)
        wg::mma_m64n32<0, 0>(Oa, wg::make_desc(sbase + ScanWg32::kOffMq + kk * 32),
                             wg::make_desc(sbase + ScanWg32::kOffVt + kk * 32));
    }
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      const uint64_t dv = wg::make_desc(sbase + ScanWg32::kOffVt + kk * 32);
#pragma unroll
      for (int b = 0; b < 2; ++b)
        wg::mma_m64n32<1, 0>(ST[b], wg::make_desc(sbase + ScanWg32::kOffKd + (8 * b + 2 * kk) * wg::kAtomBytes), dv);
    }
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) wg::reg_fence(Oa[i]);
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 16; ++i) wg::reg_fence(ST[b][i]);
    if (write_o) {  // rows < len to the output
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * warp + g + 8 * hf, col = v0 + 8 * j + 2 * t;
          if (r < len) {
            const int64_t o = ((int64_t(t0) + r) * H + h) * kD + col;
            const float x0 = Oa[4 * j + 2 * hf], x1 = Oa[4 * j + 2 * hf + 1];
            if (a.o.bf16) *reinterpret_cast<uint32_t*>(static_cast<bf16*>(a.o.p) + o) = pack_bf16(x0, x1);
            else *reinterpret_cast<float2*>(static_cast<float*>(a.o.p) + o) = make_float2(x0, x1);
          }
        }
    }
    __syncthreads();  // every row has left (a): the bf16 state may be rewritten; K_d, M_qk, V'ᵀ free
    store_sb();
    if (has_next) fetch_kmg(c + 1);
    cp_async_commit();
    if (ck >= 0) store_state(a.ckpt + (int64_t(ck) * H + h) * kD * kD + int64_t(v0) * kD, true);
  }
  cp_async_wait<0>();
  if (final_state != nullptr) store_state(final_state, false);
}

}  // namespace k3::cuda::kda_chunk
