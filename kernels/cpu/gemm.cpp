// GEMM on the CPU: y = alpha * x @ w^T + beta * y with our own fixed-order kernel.
//
// Why not OpenBLAS: OpenBLAS 0.3.21 sgemm is not row-independent (row m of a batched product
// differs in the last bits from the same row computed alone; tests/kernels/test_gemm.cpp shows the
// probe), and the model must give a request the same logits alone or batched. Here every output
// element is one dot product over K split into kLanes interleaved partial sums combined in a fixed
// tree, so it depends only on its own x row, w row and K; the register tiles below only share
// loads between elements, never arithmetic.
#include <algorithm>
#include <string>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {
namespace {

constexpr int kLanes = 8;
constexpr int64_t kBlockRows = 16;  // parallel work item: kBlockRows x kBlockCols outputs
constexpr int64_t kBlockCols = 64;

// Eight lanes as one GCC vector: AVX2 registers in the avx2 clone, two SSE halves in the baseline
// one. Element-wise mul then add (no contraction), so each lane rounds as the scalar loop did; the
// compiler did not keep the scalar form's acc[r][c][l] in registers (this form is ~1.6x faster).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float))));
// Always inlined into the clones, so a vector never crosses a call (-Wpsabi warns that the baseline
// ISA would pass one differently; no call exists to disagree about). Up to the end of dot_tile.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
__attribute__((always_inline)) inline Lanes load_lanes(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// out[r][c] = dot(x[r], w[c]) for an R x C register tile.
template <int R, int C>
inline void dot_tile(const float* const* xr, const float* const* wr, int64_t K, float (*out)[4]) {
  Lanes acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = Lanes{};
  const int64_t k_main = K - K % kLanes;
  for (int64_t k = 0; k < k_main; k += kLanes) {
    Lanes xv[R], wv[C];
    for (int r = 0; r < R; ++r) xv[r] = load_lanes(xr[r] + k);
    for (int c = 0; c < C; ++c) wv[c] = load_lanes(wr[c] + k);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] += xv[r] * wv[c];
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const Lanes a = acc[r][c];
      float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      for (int64_t k = k_main; k < K; ++k) s += xr[r][k] * wr[c][k];
      out[r][c] = s;
    }
}
#pragma GCC diagnostic pop

template <int R>
void dot_rows(const float* const* xr, const float* w, int64_t n0, int64_t n1, int64_t K, float* const* yr,
              float alpha, float beta) {
  float out[2][4];
  for (int64_t n = n0; n < n1; n += 4) {
    const int C = static_cast<int>(std::min<int64_t>(4, n1 - n));
    const float* wr[4] = {w + n * K, w + (n + std::min(1, C - 1)) * K, w + (n + std::min(2, C - 1)) * K,
                          w + (n + std::min(3, C - 1)) * K};
    switch (C) {
      case 4: dot_tile<R, 4>(xr, wr, K, out); break;
      case 3: dot_tile<R, 3>(xr, wr, K, out); break;
      case 2: dot_tile<R, 2>(xr, wr, K, out); break;
      default: dot_tile<R, 1>(xr, wr, K, out); break;
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        float v = alpha == 1.f ? out[r][c] : alpha * out[r][c];
        // beta == 0 never reads y (it may hold NaN).
        yr[r][n + c] = beta == 0.f ? v : v + beta * yr[r][n + c];
      }
  }
}

// One parallel work item: outputs [m_begin, m_end) x [n_begin, n_end). Compiled for AVX2 and for
// the baseline ISA (picked at load time); without FMA contraction both round identically.
__attribute__((target_clones("avx2", "default"), flatten)) void gemm_block(
    const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t m_begin, int64_t m_end,
    int64_t n_begin, int64_t n_end, float alpha, float beta) {
  int64_t m = m_begin;
  for (; m + 2 <= m_end; m += 2) {
    const float* xr[2] = {x + m * K, x + (m + 1) * K};
    float* yr[2] = {y + m * N, y + (m + 1) * N};
    dot_rows<2>(xr, w, n_begin, n_end, K, yr, alpha, beta);
  }
  if (m < m_end) {
    const float* xr[1] = {x + m * K};
    float* yr[1] = {y + m * N};
    dot_rows<1>(xr, w, n_begin, n_end, K, yr, alpha, beta);
  }
}

}  // namespace

void gemm_rows(ThreadPool& pool, const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K,
               float alpha, float beta) {
  if (M == 0 || N == 0) return;
  const int64_t row_blocks = (M + kBlockRows - 1) / kBlockRows;
  const int64_t col_blocks = (N + kBlockCols - 1) / kBlockCols;
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
