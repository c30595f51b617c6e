// GEMM on the CPU: y = alpha * x @ w^T + beta * y with our own fixed-order kernel.
//
// Why not OpenBLAS: OpenBLAS 0.3.21 sgemm is not row-independent (row m of a batched product
// differs in the last bits from the same row computed alone; tests/kernels/test_gemm.cpp shows the
// probe), and the model must give a request the same logits alone or batched. Here every output
// element is one dot product over K split into kLanes interleaved partial sums (lane l takes
// k = l mod kLanes, in increasing k) combined in a fixed tree, then the K % kLanes tail; so it
// depends only on its own x row, w row and K. The tiles and blocks below only change which outputs
// share a load, never the order of any lane's additions.
#include <algorithm>
#include <string>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {
namespace {

constexpr int kLanes = 8;
// Register tile: kTileRows x kTileCols outputs share each pass over K (12 accumulators + 3 x
// vectors + 1 product fill the 16 AVX2 registers; w is read as a memory operand). The switch in
// gemm_block names the row counts 1..kTileRows.
constexpr int kTileRows = 3;
constexpr int kTileCols = 4;
// Cache blocks. One parallel work item = kBlockRows x kBlockCols outputs; inside it the column
// tiles are the outer loop, so a tile's kTileCols w rows (32 KiB at K = 2048) are read from memory
// once and then from L1/L2 while all row tiles of the item pass over them, and the item's x rows
// (504 KiB at K = 2048) come from L2/L3. Blocking K as well (running sums kept between K blocks)
// and packing the panels were both measured slower on this kernel (docs/PERF.md), so the whole of
// K is one pass and a tile's sums never leave the registers.
constexpr int64_t kBlockRows = 63;  // a multiple of kTileRows
constexpr int64_t kBlockCols = 64;  // a multiple of kTileCols

// Eight lanes as one GCC vector: AVX2 registers in the avx2 clone, two SSE halves in the baseline
// one. Element-wise mul then add (no contraction), so each lane rounds as the scalar definition.
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float))));
// Always inlined into the clones, so a vector never crosses a call (-Wpsabi warns that the baseline
// ISA would pass one differently; no call exists to disagree about). Up to the end of the clones.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
__attribute__((always_inline)) inline Lanes load_lanes(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// out[r][c] = dot(x[r], w[c]) for an R x kTileCols tile, by the definition above. R < kTileRows
// only for the last rows of a block, so a single row (decode) does not pay for three.
template <int R>
__attribute__((always_inline)) inline void dot_tile(const float* const* xr, const float* const* wr, int64_t K,
                                                    float (*out)[kTileCols]) {
  Lanes a[R][kTileCols];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTileCols; ++c) a[r][c] = Lanes{};
  const int64_t k_main = K - K % kLanes;
  for (int64_t k = 0; k < k_main; k += kLanes) {
    Lanes xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load_lanes(xr[r] + k);
    for (int c = 0; c < kTileCols; ++c) {
      const Lanes wv = load_lanes(wr[c] + k);
      for (int r = 0; r < R; ++r) a[r][c] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTileCols; ++c) {
      const Lanes v = a[r][c];
      float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
      for (int64_t k = k_main; k < K; ++k) s += xr[r][k] * wr[c][k];
      out[r][c] = s;
    }
}

// One parallel work item: outputs [m0, m1) x [n0, n1). Compiled for AVX2 and for the baseline ISA
// (picked at load time); without FMA contraction both round identically.
__attribute__((target_clones("avx2", "default"), flatten)) void gemm_block(
    const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t m0, int64_t m1, int64_t n0,
    int64_t n1, float alpha, float beta) {
  float out[kTileRows][kTileCols];
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int C = static_cast<int>(std::min<int64_t>(kTileCols, n1 - n));
    // Columns past n1 in the last tile repeat the last w row: computed, never written.
    const float* wr[kTileCols];
    for (int j = 0; j < kTileCols; ++j) wr[j] = w + (n + std::min(j, C - 1)) * K;
    for (int64_t m = m0; m < m1; m += kTileRows) {
      const int R = static_cast<int>(std::min<int64_t>(kTileRows, m1 - m));
      const float* xr[kTileRows];
      for (int i = 0; i < R; ++i) xr[i] = x + (m + i) * K;
      switch (R) {
        case 3: dot_tile<3>(xr, wr, K, out); break;
        case 2: dot_tile<2>(xr, wr, K, out); break;
        default: dot_tile<1>(xr, wr, K, out); break;
      }
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) {
          float* yv = y + (m + i) * N + n + j;
          const float v = alpha == 1.f ? out[i][j] : alpha * out[i][j];
          // beta == 0 never reads y (it may hold NaN).
          *yv = beta == 0.f ? v : v + beta * *yv;
        }
    }
  }
}
#pragma GCC diagnostic pop

}  // namespace

void gemm_rows(ThreadPool& pool, const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K,
               float alpha, float beta) {
  if (M == 0 || N == 0) return;
  const int64_t row_blocks = (M + kBlockRows - 1) / kBlockRows;
  const int64_t col_blocks = (N + kBlockCols - 1) / kBlockCols;
  // Work items over output tiles only (never over K), so an element's sum is one thread's.
  pool.parallel_for(row_blocks * col_blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t m_begin = (b / col_blocks) * kBlockRows, n_begin = (b % col_blocks) * kBlockCols;
      gemm_block(x, w, y, N, K, m_begin, std::min(M, m_begin + kBlockRows), n_begin,
                 std::min(N, n_begin + kBlockCols), alpha, beta);
    }
  });
}

void gemm(ThreadPool& pool, const ops::GemmParams& p) {
  check_tensor("gemm", "x", p.x, DType::F32, {kAny, kAny});
  const int64_t M = p.x.dim(0), K = p.x.dim(1);
  check_tensor("gemm", "w", p.w, DType::F32, {kAny, K});
  const int64_t N = p.w.dim(0);
  check_tensor("gemm", "y", p.y, DType::F32, {M, N});
  check_arg(p.y.data() != p.x.data() && p.y.data() != p.w.data(), "gemm", "y must not alias x or w");
  gemm_rows(pool, p.x.f32(), p.w.f32(), p.y.f32(), M, N, K, p.alpha, p.beta);
}

}  // namespace k3::cpu
