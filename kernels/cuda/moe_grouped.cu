// LatentMoE routed experts as grouped GEMMs (bf16 operands, fp32 accumulate on the tensor cores):
//   1. route: the M*k (token, expert) pairs are placed by expert into 64-row tiles, each tile owned
//      by one expert (a segment is padded to a whole tile), all on the device: no host round-trip;
//   2. one grouped GEMM for W1 and W3 together (A rows gathered from z on load), SiTU in the epilogue,
//      h stored bf16;
//   3. one grouped GEMM for W2, fp32 out;
//   4. combine: y[m] = sum_j weights[m,j] * out[pair (m,j)], in j order.
// A row's result depends only on its own inputs (the K loop order is fixed), so where a pair lands
// inside its expert's segment (atomics pick it) never changes a value.
// Two forms of the GEMM launches, with the same bits: every output element is one chain of wmma
// 16x16x16 products over the K blocks of 16 in increasing order, whatever the tile's width, the K
// step staged at once or the depth of the ring. Wide (64 x 64 tiles, 32-column K steps, 4 stages)
// where the grid fills the GPU; narrow and deep (64 x 32 tiles, 64-column K steps, 6 stages) where
// it would not (decode: a few pairs, so a few tiles): twice the blocks, each with over three times
// the weight bytes in flight, since a small grid's speed is the bytes its blocks keep in flight.
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/align.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/reduce.cuh"

namespace k3::cuda {
namespace {

using namespace nvcuda;
constexpr int kTile = 64;   // rows of a tile: a segment of one expert's pairs
constexpr int kMaxExperts = 4096;

// A GEMM form: TN output columns a block, KS columns of K a ring stage, NS stages (NS - 1 in flight).
template <int TN, int KS, int NS>
struct MoeForm {
  static constexpr int kTn = TN, kKs = KS, kStages = NS;
  static constexpr int kLd = KS + 8;    // bf16 smem row pitch (16-byte multiple, shifts banks)
  static constexpr int kCLd = TN + 4;   // fp32 epilogue pitch
  // Warps: 4, each FM x 2 wmma tiles of 16 x 16 (64 x 64: 2 x 2 warps of 32 x 32; 64 x 32: 4 x 1 of 16 x 32).
  static constexpr int kFm = TN == 64 ? 2 : 1;
  static constexpr int kChunksA = kTile * (KS / 8) / 128;   // 8-element chunks per thread, A
  static constexpr int kChunksB = TN * (KS / 8) / 128;      // and each weight operand
  static_assert((TN == 64 || TN == 32) && KS % 16 == 0 && kChunksA >= 1 && kChunksB >= 1);
  static_assert(kTile * (KS / 8) % 128 == 0 && TN * (KS / 8) % 128 == 0);
  static size_t smem(bool dual) {
    const size_t ring = size_t(NS) * (kTile + TN * (dual ? 2 : 1)) * kLd * 2;
    const size_t epi = size_t(kTile) * kCLd * 4 * (dual ? 2 : 1);
    return std::max(ring, epi);
  }
};
using MoeWide = MoeForm<64, 32, 4>;
using MoeNarrow = MoeForm<32, 64, 6>;

// One block: counts per expert, tile ownership, and each pair's row.
__global__ void moe_route_kernel(const int32_t* ids, int P, int E, int tiles_max, int32_t* tile_expert,
                                 int32_t* row_token, int32_t* pos_of, int k) {
  pdl_enter();
  extern __shared__ int smem_i[];
  int* count = smem_i;       // [E]
  int* cursor = count + E;   // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  for (int r = threadIdx.x; r < tiles_max * kTile; r += blockDim.x) row_token[r] = -1;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int tile = 0;
    for (int e = 0; e < E; ++e) {
      cursor[e] = tile * kTile;
      const int n = (count[e] + kTile - 1) / kTile;
      for (int t = 0; t < n; ++t) tile_expert[tile + t] = e;
      tile += n;
    }
    for (int t = tile; t < tiles_max; ++t) tile_expert[t] = -1;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = ids[p];
    if (e < 0 || e >= E) {
      pos_of[p] = -1;
      continue;
    }
    const int r = atomicAdd(&cursor[e], 1);
    pos_of[p] = r;
    row_token[r] = p / k;
  }
}

// 8 bf16 from row `src` at column k0 into smem, zero past K (or for a null row). vec: K % 8 == 0 and the
// operands 16-byte aligned, so the copy is one cp.async that stays in flight (zero-filled where there is
// nothing to read); otherwise a synchronous element copy.
__device__ __forceinline__ void load8(__nv_bfloat16* dst, const __nv_bfloat16* src, const __nv_bfloat16* any_valid,
                                      int k0, int K, bool vec) {
  if (vec) {
    const bool ok = src != nullptr && k0 + 8 <= K;
    cp_async16(dst, ok ? src + k0 : any_valid, ok);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = (src != nullptr && k0 + i < K) ? src[k0 + i] : __float2bfloat16(0.f);
}

// out tile (t, blockIdx.y) = A[rows of tile t] @ W_e[n0 .. n0+TN-1]^T over K; DUAL: two weights (W1, W3),
// SiTU(g, u) -> bf16 h [rows, N]; else fp32 out [rows, N]. The K steps stream through a ring of
// Form::kStages stages, all but one of them in flight while one is multiplied; every output element
// still sums its K blocks of 16 in order (blocks wholly past K are skipped, so the chain is the same
// for every K step size), so the ring changes when bytes arrive, never a value.
template <bool DUAL, class Form>
__global__ void __launch_bounds__(128) moe_gemm_kernel(const __nv_bfloat16* a_src, const int32_t* row_token,
                                                       const int32_t* tile_expert, const __nv_bfloat16* w_a,
                                                       const __nv_bfloat16* w_b, void* out, int N, int K, float beta,
                                                       float beta_linear, bool silu, bool vec) {
  pdl_enter();
  constexpr int TN = Form::kTn, KS = Form::kKs, NS = Form::kStages, kLd = Form::kLd, kCLd = Form::kCLd;
  constexpr int FM = Form::kFm, kChunksA = Form::kChunksA, kChunksB = Form::kChunksB;
  const int t = blockIdx.x, n0 = blockIdx.y * TN;
  const int e = tile_expert[t];
  if (e < 0) return;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kStageElems = (kTile + TN * (DUAL ? 2 : 1)) * kLd;   // A, B (and B2) of one K step
  auto* ring = reinterpret_cast<__nv_bfloat16*>(smem);
  const int r0 = t * kTile;
  const __nv_bfloat16* wa = w_a + int64_t(e) * N * K;
  const __nv_bfloat16* wb = DUAL ? w_b + int64_t(e) * N * K : nullptr;
  const int warp = threadIdx.x >> 5;
  const int wm = TN == 64 ? (warp >> 1) * 32 : warp * 16, wn = TN == 64 ? (warp & 1) * 32 : 0;

  // Each thread's rows are the same at every K step: resolve them once.
  const __nv_bfloat16* arow[kChunksA];
  const __nv_bfloat16* brow[kChunksB];
  const __nv_bfloat16* b2row[kChunksB];
#pragma unroll
  for (int i = 0; i < kChunksA; ++i) {
    const int row = (threadIdx.x + i * 128) / (KS / 8);
    if (row_token != nullptr) {
      const int tok = row_token[r0 + row];
      arow[i] = tok >= 0 ? a_src + int64_t(tok) * K : nullptr;
    } else {
      arow[i] = a_src + int64_t(r0 + row) * K;
    }
  }
#pragma unroll
  for (int i = 0; i < kChunksB; ++i) {
    const int row = (threadIdx.x + i * 128) / (KS / 8);
    const bool n_ok = n0 + row < N;
    brow[i] = n_ok ? wa + int64_t(n0 + row) * K : nullptr;
    b2row[i] = DUAL && n_ok ? wb + int64_t(n0 + row) * K : nullptr;
  }
  auto load_step = [&](int stage, int k0) {
    __nv_bfloat16* As = ring + stage * kStageElems;
    __nv_bfloat16* Bs = As + kTile * kLd;
#pragma unroll
    for (int i = 0; i < kChunksA; ++i) {
      const int c = threadIdx.x + i * 128, row = c / (KS / 8), kc = (c % (KS / 8)) * 8;
      load8(As + row * kLd + kc, arow[i], wa, k0 + kc, K, vec);
    }
#pragma unroll
    for (int i = 0; i < kChunksB; ++i) {
      const int c = threadIdx.x + i * 128, row = c / (KS / 8), kc = (c % (KS / 8)) * 8;
      load8(Bs + row * kLd + kc, brow[i], wa, k0 + kc, K, vec);
      if (DUAL) load8(Bs + TN * kLd + row * kLd + kc, b2row[i], wa, k0 + kc, K, vec);
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][2], acc2[FM][2];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::fill_fragment(acc[i][j], 0.f);
      if (DUAL) wmma::fill_fragment(acc2[i][j], 0.f);
    }

  const int steps = (K + KS - 1) / KS;
#pragma unroll
  for (int st = 0; st < NS - 1; ++st) {
    if (st < steps) load_step(st, st * KS);
    cp_async_commit();
  }
  for (int it = 0; it < steps; ++it) {
    cp_async_wait<NS - 2>();
    __syncthreads();   // step `it` is in; every warp is done with the stage the next load overwrites
    const int next = it + NS - 1;
    if (next < steps) load_step(next % NS, next * KS);
    cp_async_commit();
    const __nv_bfloat16* As = ring + (it % NS) * kStageElems;
    const __nv_bfloat16* Bs = As + kTile * kLd;
    const __nv_bfloat16* Bs2 = Bs + TN * kLd;
    const int kk_end = min(KS, K - it * KS);  // blocks of 16 that start before K
#pragma unroll
    for (int kk = 0; kk < KS; kk += 16) {
      if (kk >= kk_end) break;
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[FM];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * kLd + kk, kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // W rows are output columns: W [n][k] row-major is B = W^T column-major with ld kLd.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, Bs + (wn + 16 * j) * kLd + kk, kLd);
#pragma unroll
        for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
        if (DUAL) {
          wmma::load_matrix_sync(fb, Bs2 + (wn + 16 * j) * kLd + kk, kLd);
#pragma unroll
          for (int i = 0; i < FM; ++i) wmma::mma_sync(acc2[i][j], fa[i], fb, acc2[i][j]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // Epilogue through shared memory (reusing the operand tiles' space and beyond).
  auto* Cs = reinterpret_cast<float*>(smem);          // [64][kCLd]
  auto* Cs2 = Cs + kTile * kCLd;                      // [64][kCLd] (DUAL)
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(Cs + (wm + 16 * i) * kCLd + wn + 16 * j, acc[i][j], kCLd, wmma::mem_row_major);
      if (DUAL) wmma::store_matrix_sync(Cs2 + (wm + 16 * i) * kCLd + wn + 16 * j, acc2[i][j], kCLd, wmma::mem_row_major);
    }
  __syncthreads();
  for (int c = threadIdx.x; c < kTile * TN; c += blockDim.x) {
    const int row = c / TN, col = c % TN;
    if (n0 + col >= N) continue;
    const int64_t o = int64_t(r0 + row) * N + n0 + col;
    if (DUAL) {
      const float g = Cs[row * kCLd + col], u = Cs2[row * kCLd + col];
      const float h = glu_act(silu, g, u, beta, beta_linear);
      static_cast<__nv_bfloat16*>(out)[o] = __float2bfloat16(h);
    } else {
      static_cast<float*>(out)[o] = Cs[row * kCLd + col];
    }
  }
}

__global__ void moe_combine_kernel(const float* out, const int32_t* pos_of, const float* weights, FOut y, int k,
                                   int Dl) {
  pdl_enter();
  const int64_t m = blockIdx.x;
  for (int d = threadIdx.x; d < Dl; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int r = pos_of[m * k + j];
      if (r >= 0) acc += weights[m * k + j] * out[int64_t(r) * Dl + d];
    }
    y.set(m * Dl + d, acc);
  }
}

// The workspace carved into the five arrays of one launch, each aligned to 256 bytes.
struct MoeWorkspace {
  int tiles_max = 0;
  int64_t rows = 0;
  size_t bytes = 0;
  size_t off[5] = {};
  explicit MoeWorkspace(const MoeArgs& a) {
    const int P = a.M * a.k;
    tiles_max = P / kTile + std::min(a.E, P);
    rows = int64_t(tiles_max) * kTile;
    const size_t sizes[5] = {size_t(tiles_max) * 4, size_t(rows) * 4, size_t(std::max(P, 1)) * 4,
                             size_t(rows) * a.F * sizeof(__nv_bfloat16), size_t(rows) * a.Dl * sizeof(float)};
    for (int i = 0; i < 5; ++i) {
      off[i] = bytes;
      bytes += (sizes[i] + 255) / 256 * 256;
    }
  }
};

// One grouped GEMM in the given form (the same bits in either).
template <bool DUAL>
void launch_gemm(bool narrow, int tiles_max, const __nv_bfloat16* a_src, const int32_t* row_token,
                 const int32_t* tile_expert, const __nv_bfloat16* w_a, const __nv_bfloat16* w_b, void* out, int N, int K,
                 float beta, float beta_linear, bool silu, bool vec, cudaStream_t s) {
  auto go = [&](auto form) {
    using Form = decltype(form);
    auto* kern = moe_gemm_kernel<DUAL, Form>;
    const size_t smem = Form::smem(DUAL);
    K3_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_pdl(DUAL ? "moe_gemm_kernel<w1,w3>" : "moe_gemm_kernel<w2>", kern,
               dim3(tiles_max, (N + Form::kTn - 1) / Form::kTn), 128, smem, s, a_src, row_token, tile_expert, w_a, w_b,
               out, N, K, beta, beta_linear, silu, vec);
  };
  if (narrow) go(MoeNarrow{});
  else go(MoeWide{});
}

}  // namespace

bool moe_grouped_supported(const MoeArgs& a) {
  return a.z.bf16 && a.w1.bf16 && a.w3.bf16 && a.w2.bf16 && a.E <= kMaxExperts;
}

size_t moe_grouped_workspace_bytes(const MoeArgs& a) { return MoeWorkspace(a).bytes; }

bool moe_grouped_narrow(int tiles_max, int N, int num_sms, int form) {
  if (form == 1) return false;
  if (form == 2) return true;
  return int64_t(tiles_max) * ((N + kTile - 1) / kTile) < std::max(num_sms, 1);
}

void launch_moe_grouped(const MoeArgs& a, void* workspace, int num_sms, int form, cudaStream_t s) {
  if (form < 0 || form > 2) throw Error("moe_experts: grouped GEMM form " + std::to_string(form) + " not in 0..2");
  if (a.M == 0) return;
  const int P = a.M * a.k;
  const MoeWorkspace ws(a);
  const int tiles_max = ws.tiles_max;
  char* base = static_cast<char*>(workspace);
  auto* tile_expert = reinterpret_cast<int32_t*>(base + ws.off[0]);
  auto* row_token = reinterpret_cast<int32_t*>(base + ws.off[1]);
  auto* pos_of = reinterpret_cast<int32_t*>(base + ws.off[2]);
  auto* h = reinterpret_cast<__nv_bfloat16*>(base + ws.off[3]);
  auto* out = reinterpret_cast<float*>(base + ws.off[4]);

  launch_pdl("moe_route_kernel", moe_route_kernel, 1, 1024, 2 * a.E * sizeof(int), s, a.ids, P, a.E, tiles_max,
             tile_expert, row_token, pos_of, a.k);

  const auto* z = static_cast<const __nv_bfloat16*>(a.z.p);
  // 16-byte copies where every row starts 16-byte aligned (a property of the shapes and buffers, the
  // same for every call of a model: the path never depends on the batch).
  const bool vec1 = a.Dl % 8 == 0 && aligned16(z) && aligned16(a.w1.p) && aligned16(a.w3.p);
  const bool vec2 = a.F % 8 == 0 && aligned16(h) && aligned16(a.w2.p);
  launch_gemm<true>(moe_grouped_narrow(tiles_max, a.F, num_sms, form), tiles_max, z, row_token, tile_expert,
                    static_cast<const __nv_bfloat16*>(a.w1.p), static_cast<const __nv_bfloat16*>(a.w3.p), h, a.F, a.Dl,
                    a.beta, a.beta_linear, a.silu, vec1, s);
  launch_gemm<false>(moe_grouped_narrow(tiles_max, a.Dl, num_sms, form), tiles_max, h, nullptr, tile_expert,
                     static_cast<const __nv_bfloat16*>(a.w2.p), nullptr, out, a.Dl, a.F, 0.f, 0.f, false, vec2, s);
  launch_pdl("moe_combine_kernel", moe_combine_kernel, a.M, 256, 0, s, out, pos_of, a.weights, a.y, a.k, a.Dl);
}

}  // namespace k3::cuda
