// KDA chunked prefill (MODEL.md §2.4, chunk C = 64, K = V = 128), two launches:
//
//  prep (one block per (chunk, head), all chunks in parallel): Γ = cumsum(g) inside the chunk;
//    M_kk, M_qk on 16-row tiles with the tile's first row n as the exponent reference,
//    exp(Γ_r − Γ_s) = exp(Γ_r − Γ_n)·exp(Γ_n − Γ_s): the left factor is ≤ 1 and the right one
//    ≤ e^{75} because the lower-bounded gate (g ≥ −5) limits a 16-token tile to 80 nats, so
//    every tile is a dense tensor-core product (tf32 in, fp32 accumulate);
//    T = (I + M_kk)^{-1} by forward substitution (fp32), Tβ = T·Diag(β);
//    W = Tβ (K⊙e^Γ), U = Tβ V (tensor cores); Q⊙e^Γ, K⊙e^{Γ_C−Γ}, M_qk, e^{Γ_C} -> workspace.
//  scan (one block per (sequence, head, 32 rows of V), chunks in order, state tile in shared
//    memory): V' = U − W Sᵀ; O = (Q⊙e^Γ) Sᵀ + M_qk V'; S = Diag(e^{Γ_C}) S + V'ᵀ (K⊙e^{Γ_C−Γ}),
//    all tensor-core products. Rows past a sequence's end are zero-filled, so they add nothing.
#include <mma.h>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace k3::cuda {
namespace {

using namespace nvcuda;

constexpr int kC = 64;      // chunk
constexpr int kD = 128;     // K = V
constexpr int kLdD = 132;   // padded leading dim of [*, 128] shared arrays (16 B multiple, no bank aliasing)
constexpr int kLdC = 68;    // padded leading dim of [*, 64]
constexpr int kVTile = 32;  // state rows per scan block
constexpr int kLdV = 36;
constexpr int kThreads = 256;

// Workspace per (chunk, head), in floats.
constexpr int64_t kOffW = 0, kOffU = kOffW + kC * kD, kOffQg = kOffU + kC * kD, kOffKd = kOffQg + kC * kD,
                  kOffMq = kOffKd + kC * kD, kOffGc = kOffMq + kC * kC, kWorkPer = kOffGc + kD;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragAc = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

template <class F>
__device__ __forceinline__ void to_tf32(F& f) {
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

// 64 token rows x 128 of one head -> fp32 shared rows (pitch kLdD); rows >= len become zeros.
// bf16 input: 16-byte loads, all issued before the first use (4 per thread in flight).
__device__ __forceinline__ void stage_rows(float* dst, FIn src, int64_t row0, int64_t tok_stride, int len) {
  if (src.bf16) {
    constexpr int kPer = kC * (kD / 8) / kThreads;  // 4
    const auto* p = static_cast<const __nv_bfloat16*>(src.p);
    uint4 v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int idx = threadIdx.x + j * kThreads, r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
      v[j] = r < len ? *reinterpret_cast<const uint4*>(p + row0 + r * tok_stride + c8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int idx = threadIdx.x + j * kThreads, r = idx / (kD / 8), c8 = (idx % (kD / 8)) * 8;
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
      float* d = dst + r * kLdD + c8;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h2[e]);
        d[2 * e] = f.x;
        d[2 * e + 1] = f.y;
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kC * kD; idx += kThreads) {
      const int r = idx / kD, i = idx % kD;
      dst[r * kLdD + i] = r < len ? src[row0 + r * tok_stride + i] : 0.f;
    }
  }
}

__global__ void __launch_bounds__(kThreads) kda_chunk_prep_kernel(KdaArgs a, const int32_t* chunk_table, float* work) {
  extern __shared__ __align__(128) float sm[];
  float* Gam = sm;                  // [64][132]
  float* Kc = Gam + kC * kLdD;      // [64][132]
  float* Qc = Kc + kC * kLdD;       // [64][132]
  float* Bf = Qc + kC * kLdD;       // [64][132]
  float* Al = Bf + kC * kLdD;       // [32][132]
  float* Mk = Al + 32 * kLdD;       // [64][68]
  float* Mq = Mk + kC * kLdC;       // [64][68]
  float* Tm = Mq + kC * kLdC;       // [64][68]
  float* beta = Tm + kC * kLdC;     // [64]
  const int c = blockIdx.x, h = blockIdx.y, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int t0 = chunk_table[4 * c], len = chunk_table[4 * c + 1];
  float* wk = work + (int64_t(c) * H + h) * kWorkPer;

  const int64_t row0 = (int64_t(t0) * H + h) * kD, tok_stride = int64_t(H) * kD;
  // g (fp32) streams straight into shared memory; rows past the end are zero-filled.
  for (int idx = tid; idx < kC * (kD / 4); idx += kThreads) {
    const int r = idx / (kD / 4), c4 = (idx % (kD / 4)) * 4;
    cp_async16(Gam + r * kLdD + c4, a.g + row0 + (r < len ? r : 0) * tok_stride + c4, r < len);
  }
  cp_async_commit();
  stage_rows(Kc, a.k, row0, tok_stride, len);
  stage_rows(Qc, a.q, row0, tok_stride, len);
  if (tid < kC) beta[tid] = tid < len ? a.beta[(int64_t(t0) + tid) * H + h] : 0.f;
  cp_async_wait<0>();
  __syncthreads();
  if (tid < kD) {
    float run = 0.f;
    for (int r = 0; r < kC; ++r) {
      run += Gam[r * kLdD + tid];
      Gam[r * kLdD + tid] = run;
    }
  }
  __syncthreads();
  const int last = len > 0 ? len - 1 : 0;
  for (int idx = tid; idx < kC * kD; idx += kThreads) {
    const int r = idx / kD, i = idx % kD;
    const float gr = Gam[r * kLdD + i];
    wk[kOffQg + idx] = Qc[r * kLdD + i] * __expf(gr);
    wk[kOffKd + idx] = Kc[r * kLdD + i] * __expf(Gam[last * kLdD + i] - gr);
  }
  if (tid < kD) wk[kOffGc + tid] = __expf(Gam[last * kLdD + tid]);

  for (int R = 0; R < 4; ++R) {
    const int n = 16 * R;
    for (int idx = tid; idx < 16 * kD; idx += kThreads) {
      const int r = n + idx / kD, i = idx % kD;
      const float f = __expf(Gam[r * kLdD + i] - Gam[n * kLdD + i]);
      Al[(idx / kD) * kLdD + i] = Kc[r * kLdD + i] * f;
      Al[(16 + idx / kD) * kLdD + i] = Qc[r * kLdD + i] * f;
    }
    for (int idx = tid; idx < (n + 16) * kD; idx += kThreads) {
      const int s = idx / kD, i = idx % kD;
      Bf[s * kLdD + i] = Kc[s * kLdD + i] * __expf(Gam[n * kLdD + i] - Gam[s * kLdD + i]);
    }
    __syncthreads();
    if (warp < 2 * (R + 1)) {
      const int which = warp / (R + 1), ct = warp % (R + 1);
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < kD; kk += 8) {
        FragA fa;
        FragBc fb;
        wmma::load_matrix_sync(fa, Al + which * 16 * kLdD + kk, kLdD);
        wmma::load_matrix_sync(fb, Bf + ct * 16 * kLdD + kk, kLdD);
        to_tf32(fa);
        to_tf32(fb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync((which ? Mq : Mk) + n * kLdC + ct * 16, acc, kLdC, wmma::mem_row_major);
    }
    __syncthreads();
  }
  // Strictly lower β_r-scaled M_kk; M_qk keeps its diagonal; T starts as the identity.
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int r = idx / kC, s = idx % kC;
    // Entries with s > r of a 16-row stripe were never computed; the masks never read them.
    Mk[r * kLdC + s] = (s < r) ? beta[r] * Mk[r * kLdC + s] : 0.f;
    const float mq = (s <= r) ? Mq[r * kLdC + s] : 0.f;
    wk[kOffMq + idx] = mq;
    Tm[r * kLdC + s] = (r == s) ? 1.f : 0.f;
  }
  __syncthreads();
  // Column c of T solves (I + M) x = e_c by forward substitution. Columns are independent: four
  // lanes of one warp own a column and split each row's dot product, so the 63-step chain needs
  // only warp-level synchronisation.
  {
    const int c = tid >> 2, q4 = tid & 3;
    for (int r = 1; r < kC; ++r) {
      float part = 0.f;
      if (c < r) {
#pragma unroll 4
        for (int s = c + q4; s < r; s += 4) part += Mk[r * kLdC + s] * Tm[s * kLdC + c];
      }
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (c < r && q4 == 0) Tm[r * kLdC + c] = -part;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) Tm[(idx / kC) * kLdC + idx % kC] *= beta[idx % kC];
  for (int idx = tid; idx < kC * kD; idx += kThreads) {
    const int s = idx / kD, i = idx % kD;
    Bf[s * kLdD + i] = Kc[s * kLdD + i] * __expf(Gam[s * kLdD + i]);
  }
  __syncthreads();
  // W = Tβ · (K⊙e^Γ), then U = Tβ · V; each warp owns one 16-row stripe half (4 output tiles).
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      __syncthreads();
      stage_rows(Bf, a.v, row0, tok_stride, len);
      __syncthreads();
    }
    const int rt = warp / 2, ct0 = (warp % 2) * 4;
    FragC acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[j], 0.f);
    for (int kk = 0; kk < kC; kk += 8) {
      FragA fa;
      wmma::load_matrix_sync(fa, Tm + rt * 16 * kLdC + kk, kLdC);
      to_tf32(fa);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        FragBr fb;
        wmma::load_matrix_sync(fb, Bf + kk * kLdD + (ct0 + j) * 16, kLdD);
        to_tf32(fb);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
    float* dst = wk + (pass == 0 ? kOffW : kOffU);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wmma::store_matrix_sync(dst + rt * 16 * kD + (ct0 + j) * 16, acc[j], kD, wmma::mem_row_major);
  }
}

__global__ void __launch_bounds__(kThreads) kda_chunk_scan_kernel(KdaArgs a, const int32_t* chunk_table,
                                                                  const int32_t* seq_chunk0, const float* work) {
  extern __shared__ __align__(128) float sm[];
  float* S = sm;                     // [32][132]  state rows [v0, v0+32) x K
  float* Wt = S + kVTile * kLdD;     // [64][132]
  float* Qg = Wt + kC * kLdD;        // [64][132]
  float* KdBuf = Qg + kC * kLdD;     // [2][64][132]  double buffer
  float* Mq = KdBuf + 2 * kC * kLdD; // [64][68]
  float* Vp = Mq + kC * kLdC;        // [64][36]  V' tile
  float* Ob = Vp + kC * kLdV;        // [64][36]  O tile
  float* Us = Ob + kC * kLdV;        // [64][36]  U tile
  float* gCBuf = Us + kC * kLdV;     // [2][128]
  const int vt = blockIdx.x, h = blockIdx.y, n = blockIdx.z, H = a.H, tid = threadIdx.x, warp = tid >> 5;
  const int v0 = vt * kVTile;
  float* state = a.state + (int64_t(a.slots[n]) * H + h) * kD * kD + int64_t(v0) * kD;
  const int c_begin = seq_chunk0[n], c_end = seq_chunk0[n + 1];
  auto chunk_work = [&](int c) { return work + (int64_t(c) * H + h) * kWorkPer; };
  // Every input of chunk c+1 is fetched while chunk c computes, each as soon as its last reader
  // in chunk c is done (K⊙e^{Γ_C-Γ} and e^{Γ_C} are double-buffered), so the wait at the top of
  // the loop rarely waits.
  auto fetch_u = [&](const float* wk) {
    for (int idx = tid; idx < kC * (kVTile / 4); idx += kThreads) {
      const int r = idx / (kVTile / 4), c4 = (idx % (kVTile / 4)) * 4;
      cp_async16(Us + r * kLdV + c4, wk + kOffU + r * kD + v0 + c4);
    }
  };
  auto fetch_kd_gc = [&](const float* wk, int b) {
    cp_async_rows<kThreads>(KdBuf + b * kC * kLdD, kLdD, wk + kOffKd, kC, kD);
    if (tid < kD / 4) cp_async16(gCBuf + b * kD + 4 * tid, wk + kOffGc + 4 * tid);
  };
  cp_async_rows<kThreads>(S, kLdD, state, kVTile, kD);
  if (c_begin < c_end) {
    const float* wk = chunk_work(c_begin);
    cp_async_rows<kThreads>(Wt, kLdD, wk + kOffW, kC, kD);
    cp_async_rows<kThreads>(Qg, kLdD, wk + kOffQg, kC, kD);
    cp_async_rows<kThreads>(Mq, kLdC, wk + kOffMq, kC, kC);
    fetch_u(wk);
    fetch_kd_gc(wk, 0);
  }
  cp_async_commit();
  for (int c = c_begin; c < c_end; ++c) {
    const int t0 = chunk_table[4 * c], len = chunk_table[4 * c + 1];
    const int buf = (c - c_begin) & 1;
    const float* Kd = KdBuf + buf * kC * kLdD;
    const float* gC = gCBuf + buf * kD;
    const bool has_next = c + 1 < c_end;
    const float* wn = has_next ? chunk_work(c + 1) : nullptr;
    if (has_next) fetch_kd_gc(wn, buf ^ 1);  // the other buffer's readers finished last chunk
    cp_async_commit();
    cp_async_wait<1>();  // everything but the group just issued
    __syncthreads();
    const int rt = warp / 2, ct = warp % 2;
    {  // V' = U − W Sᵀ
      FragC acc, ws;
      wmma::load_matrix_sync(acc, Us + rt * 16 * kLdV + ct * 16, kLdV, wmma::mem_row_major);
      wmma::fill_fragment(ws, 0.f);
      for (int kk = 0; kk < kD; kk += 8) {
        FragA fa;
        FragBc fb;
        wmma::load_matrix_sync(fa, Wt + rt * 16 * kLdD + kk, kLdD);
        wmma::load_matrix_sync(fb, S + ct * 16 * kLdD + kk, kLdD);
        to_tf32(fa);
        to_tf32(fb);
        wmma::mma_sync(ws, fa, fb, ws);
      }
#pragma unroll
      for (int i = 0; i < acc.num_elements; ++i) acc.x[i] -= ws.x[i];
      wmma::store_matrix_sync(Vp + rt * 16 * kLdV + ct * 16, acc, kLdV, wmma::mem_row_major);
    }
    __syncthreads();
    if (has_next) {
      cp_async_rows<kThreads>(Wt, kLdD, wn + kOffW, kC, kD);
      fetch_u(wn);
    }
    cp_async_commit();
    {  // O = (Q⊙e^Γ) Sᵀ + M_qk V'
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < kD; kk += 8) {
        FragA fa;
        FragBc fb;
        wmma::load_matrix_sync(fa, Qg + rt * 16 * kLdD + kk, kLdD);
        wmma::load_matrix_sync(fb, S + ct * 16 * kLdD + kk, kLdD);
        to_tf32(fa);
        to_tf32(fb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      for (int kk = 0; kk < kC; kk += 8) {
        FragA fa;
        FragBr fb;
        wmma::load_matrix_sync(fa, Mq + rt * 16 * kLdC + kk, kLdC);
        wmma::load_matrix_sync(fb, Vp + kk * kLdV + ct * 16, kLdV);
        to_tf32(fa);
        to_tf32(fb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(Ob + rt * 16 * kLdV + ct * 16, acc, kLdV, wmma::mem_row_major);
    }
    __syncthreads();
    if (has_next) {
      cp_async_rows<kThreads>(Qg, kLdD, wn + kOffQg, kC, kD);
      cp_async_rows<kThreads>(Mq, kLdC, wn + kOffMq, kC, kC);
    }
    cp_async_commit();
    for (int idx = tid; idx < kC * kVTile; idx += kThreads) {
      const int r = idx / kVTile, j = idx % kVTile;
      if (r < len) a.o.set(((int64_t(t0) + r) * H + h) * kD + v0 + j, Ob[r * kLdV + j]);
    }
    for (int idx = tid; idx < kVTile * kD; idx += kThreads) S[(idx / kD) * kLdD + idx % kD] *= gC[idx % kD];
    __syncthreads();
    {  // S += V'ᵀ (K⊙e^{Γ_C−Γ})
      const int srt = warp / 4, sct0 = (warp % 4) * 2;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        FragC acc;
        float* tile = S + srt * 16 * kLdD + (sct0 + j) * 16;
        wmma::load_matrix_sync(acc, tile, kLdD, wmma::mem_row_major);
        for (int kk = 0; kk < kC; kk += 8) {
          FragAc fa;
          FragBr fb;
          wmma::load_matrix_sync(fa, Vp + srt * 16 + kk * kLdV, kLdV);
          wmma::load_matrix_sync(fb, Kd + kk * kLdD + (sct0 + j) * 16, kLdD);
          to_tf32(fa);
          to_tf32(fb);
          wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(tile, acc, kLdD, wmma::mem_row_major);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = tid; idx < kVTile * kD; idx += kThreads) state[idx] = S[(idx / kD) * kLdD + idx % kD];
}

constexpr size_t kPrepSmem = (4 * kC * kLdD + 32 * kLdD + 3 * kC * kLdC + kC) * sizeof(float);
constexpr size_t kScanSmem = (kVTile * kLdD + 4 * kC * kLdD + kC * kLdC + 3 * kC * kLdV + 2 * kD) * sizeof(float);

}  // namespace

int64_t kda_chunk_workspace_floats(int64_t num_chunks, int H) { return num_chunks * H * kWorkPer; }

void launch_kda_chunk(const KdaArgs& a, const int32_t* chunk_table, const int32_t* seq_chunk0, int num_chunks,
                      float* work, cudaStream_t s) {
  if (a.K != kD || a.V != kD) throw Error("kda_chunk: the chunked kernel needs K = V = 128");
  if (a.N == 0 || a.H == 0) return;
  if (num_chunks > 0) {
    K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPrepSmem)));
    kda_chunk_prep_kernel<<<dim3(num_chunks, a.H), kThreads, kPrepSmem, s>>>(a, chunk_table, work);
    K3_CUDA_LAUNCHED("kda_chunk_prep_kernel");
  }
  K3_CUDA_OK(cudaFuncSetAttribute(kda_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kScanSmem)));
  kda_chunk_scan_kernel<<<dim3(kD / kVTile, a.H, a.N), kThreads, kScanSmem, s>>>(a, chunk_table, seq_chunk0, work);
  K3_CUDA_LAUNCHED("kda_chunk_scan_kernel");
}

}  // namespace k3::cuda
