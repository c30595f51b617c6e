// KDA chunked prefill, scan on wgmma (sm_90a): one warpgroup per (sequence or job, head, 64 rows of
// V), chunks in order, the same jobs and results as kda_chunk_scan_kernel<64, ...> (kda_chunk.cu).
// Each chunk is four asynchronous products instead of per-warp mma.sync chains:
//   (a) V' = U − W Sᵀ and O = (Q⊙e^Γ) Sᵀ   m64n64, K = 128: A = W, Q⊙e^Γ [tok][k], B = S [v][k] (both K-major)
//   (b) O += M_qk V'                        m64n64, K = 64:  A = M_qk [tok][tok'] K-major, B = V' [tok'][v] MN-major
//   (c) S = Diag_k(e^{Γ_C}) S + V'ᵀ K_d     m64n64 x 2 (k halves), K = 64: A = V' read MN-major, B = K_d [tok][k] MN-major
// Every operand tile sits in shared memory as 128B-swizzle atoms (wg::op_offset); the state stays in
// the two fp32 accumulators of (c) for the whole sequence, with its bf16 copy rewritten each chunk
// for (a). Accumulator element d[4j + e] of warp w: row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
#pragma once
#include <type_traits>

#include "kernels/cuda/kda_chunk_layout.cuh"
#include "kernels/cuda/kda_chunk_scan_job.cuh"
#include "kernels/cuda/kda_chunk_scan_tma.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace k3::cuda::kda_chunk {

struct ScanWg {
  static constexpr int kThreads = 128;
  static constexpr int kOffW = 0;                        // [64 tok][128 k] op layout, 16 KiB
  static constexpr int kOffQ = kOffW + 16384;            // Q⊙e^Γ, same
  static constexpr int kOffKd = kOffQ + 16384;           // K⊙e^{Γ_C−Γ}, same
  static constexpr int kOffS = kOffKd + 16384;           // bf16 S [64 v][128 k], same
  static constexpr int kOffMq = kOffS + 16384;           // M_qk [64][64], 8 KiB
  static constexpr int kOffVp = kOffMq + 8192;           // V' [64 tok][64 v], 8 KiB
  static constexpr int kOffU = kOffVp + 8192;            // U [64 tok][64 v], op layout (the copy's box), 8 KiB
  static constexpr int kOffGc = kOffU + 8192;            // fp32 [128]
  static constexpr int kOffBar = kOffGc + kD * 4;        // two mbarriers
  static constexpr int kSmem = kOffBar + 16 + 1024;      // + alignment slack (atoms on 1024 bytes)
  // A checkpoint's fp32 state [64][128] is staged in two 16 KiB halves: rows 0-31 in the K_d buffer,
  // rows 32-63 in M_qk and V' together (kda_chunk_scan_tma.cuh).
  static constexpr int ckpt_half(int half) { return half == 0 ? kOffKd : kOffMq; }
};
static_assert(ScanWg::kOffVp == ScanWg::kOffMq + 8192 && ScanWg::kOffMq % 1024 == 0, "M_qk and V' hold 32 state rows");

__global__ void __launch_bounds__(ScanWg::kThreads, 2)
    kda_chunk_scan_wg_kernel(KdaArgs a, const int32_t* chunk_table, const int32_t* seq_chunk0, void* work,
                             const KdaScanJob* jobs, float* carry,
                             const __grid_constant__ KdaScanMaps maps) {
  pdl_enter();
  constexpr int VT = 64;
  extern __shared__ __align__(1024) unsigned char smraw_wg[];
  unsigned char* sm = scan_wg_smem(smraw_wg);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const wg::DescBase desc(sbase);
  float* Gc = reinterpret_cast<float*>(sm + ScanWg::kOffGc);
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int v0 = vt * VT;
  const ScanBlockJob job = scan_block_job(a, seq_chunk0, jobs, carry, n, h, v0);
  const int c_begin = job.c_begin, c_end = job.c_end, seq = job.seq;
  const bool write_o = job.write_o, zero_u = job.zero_u;

  ScanWgTma<ScanWg, VT> fetch{sbase, &maps, work, H, h, v0, write_o, zero_u};
  fetch.init(tid);

  // The state: S[b][4j + e] = S[v][k], v = 16 warp + g + 8 (e >> 1), k = 64 b + 8 j + 2 t + (e & 1).
  // each_pair(f) calls f(&S[b][4j + 2hf], v, k) for each of this thread's 32 pairs (k, k + 1).
  float S[2][32];
  auto each_pair = [&](auto&& f) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) f(&S[b][4 * j + 2 * hf], 16 * warp + g + 8 * hf, 64 * b + 8 * j + 2 * t);
  };
  each_pair([&](float* x, int r, int col) {
    x[0] = scan_init_value(job, v0, r, col);
    x[1] = scan_init_value(job, v0, r, col + 1);
  });
  auto store_sb = [&] {
    each_pair([&](const float* x, int r, int col) {
      *reinterpret_cast<uint32_t*>(sm + ScanWg::kOffS + wg::op_offset(r, col >> 3) + (col & 7) * 2) = pack_bf16(x[0], x[1]);
    });
    wg::fence_proxy_async();
  };
  auto store_state = [&](float* dst) {
    each_pair([&](const float* x, int r, int col) {
      *reinterpret_cast<float2*>(dst + r * kD + col) = make_float2(x[0], x[1]);
    });
  };
  // Two groups of bulk copies a chunk, each on its mbarrier: W, Q⊙e^Γ, U (read by (a)) and K_d, M_qk,
  // e^{Γ_C} (read by (b), (c)).
  // Each is waited for only where it is first read, so the second one lands while (a) runs.
  store_sb();
  fetch.first(tid, c_begin, c_end);

  // The chunk loop with write_o as a constant: a wgmma group that runs only when O is written
  // would make ptxas serialize every wgmma of the kernel (C7514) once the two groups of a
  // product overlap.
  auto chunks = [&](auto write_o_c) {
    constexpr bool kO = decltype(write_o_c)::value;
    // The chunk table's entries one chunk ahead: their global loads stay off the per-chunk chain.
    ChunkAhead ahead = ChunkAhead::first(chunk_table, c_begin, c_end);
    for (int c = c_begin; c < c_end; ++c) {
      const auto [t0, len, ck, has_next] = scan_chunk<kO>(ahead, a, seq, chunk_table, c, c_end);
      fetch.wait_wuq();  // this chunk's W, Q⊙e^Γ, U (its K_d group may still be in flight)
      __syncthreads();   // and every thread's bf16 state copy

      // (a) V' = U − W Sᵀ, O = (Q⊙e^Γ) Sᵀ.
      float Va[32], Oa[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        const uint32_t off = uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32);
        const uint64_t ds = desc.at(ScanWg::kOffS + off);
        wg::mma_m64n64<0>(Va, desc.at(ScanWg::kOffW + off), ds, ks > 0);
      }
      wg::commit();
      if constexpr (kO) {
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) {
          const uint32_t off = uint32_t((ks >> 2) * 8 * wg::kAtomBytes + (ks & 3) * 32);
          wg::mma_m64n64<0>(Oa, desc.at(ScanWg::kOffQ + off), desc.at(ScanWg::kOffS + off), ks > 0);
        }
      }
      wg::commit();
      wg::wait<1>();  // W Sᵀ is done; (Q⊙e^Γ) Sᵀ may still run while V' is formed
#pragma unroll
      for (int i = 0; i < 32; ++i) wg::reg_fence(Va[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * warp + g + 8 * hf, col = 8 * j + 2 * t;
          const float2 u = zero_u ? make_float2(0.f, 0.f)
                                  : bf2_to_f2(u_pair<VT>(sm + ScanWg::kOffU, r, col));
          *reinterpret_cast<uint32_t*>(sm + ScanWg::kOffVp + wg::op_offset(r, col >> 3) + (col & 7) * 2) =
              pack_bf16(u.x - Va[4 * j + 2 * hf], u.y - Va[4 * j + 2 * hf + 1]);
        }
      wg::wait<0>();  // (Q⊙e^Γ) Sᵀ: its reads end before the next chunk's copies overwrite Q⊙e^Γ
#pragma unroll
      for (int i = 0; i < 32; ++i) wg::reg_fence(Oa[i]);
      wg::fence_proxy_async();
      __syncthreads();  // V' complete; W, U, Q⊙e^Γ and the bf16 state are no longer read this chunk
      if (tid == 0 && has_next) fetch.wuq(c + 1);
      fetch.wait_kmg();  // this chunk's K_d, M_qk, e^{Γ_C} (the next chunk's W group may be in flight)

      // (c) S = Diag_k(e^{Γ_C}) S + V'ᵀ K_d, then (b) O += M_qk V' as a second group: the bf16 copy of
      // the new state is written while (b) runs.
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 d = *reinterpret_cast<const float2*>(Gc + 64 * b + 8 * j + 2 * t);
          S[b][4 * j] *= d.x;
          S[b][4 * j + 1] *= d.y;
          S[b][4 * j + 2] *= d.x;
          S[b][4 * j + 3] *= d.y;
        }
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        const uint64_t dv = desc.at(ScanWg::kOffVp + 2 * kk * wg::kAtomBytes);
#pragma unroll
        for (int b = 0; b < 2; ++b)
          wg::mma_m64n64_ab<1, 1>(S[b], dv, desc.at(ScanWg::kOffKd + (8 * b + 2 * kk) * wg::kAtomBytes));
      }
      wg::commit();
      if constexpr (kO) {
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk)
          wg::mma_m64n64<1>(Oa, desc.at(ScanWg::kOffMq + kk * 32),
                            desc.at(ScanWg::kOffVp + 2 * kk * wg::kAtomBytes));
      }
      wg::commit();
      wg::wait<1>();
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int i = 0; i < 32; ++i) wg::reg_fence(S[b][i]);
      store_sb();  // (a) of this chunk, its only reader, ended before the barrier above
      wg::wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) wg::reg_fence(Oa[i]);
      if constexpr (kO) store_o_rows<8>(a, t0, len, h, v0, Oa, warp, g, t);  // rows < len to the output
      __syncthreads();  // K_d, M_qk, V' are free
      if (ck >= 0) {  // the state through the free K_d, M_qk and V' buffers to its checkpoint slot
        each_pair([&](const float* x, int r, int col) {
          *reinterpret_cast<float2*>(sm + ckpt_stage_offset<ScanWg>(r, col)) = make_float2(x[0], x[1]);
        });
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
