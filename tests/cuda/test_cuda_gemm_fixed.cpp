// The fixed-order GEMM of batch-invariant mode (kernels/cuda/gemm_fixed.h): every row of the result
// is bitwise the row computed alone (M = 1), whatever M picks for the tile, the grid and the split,
// and close to an fp32 reference. Shapes include N and K that are no multiple of the tile, the K step
// or the part, K of several parts with a short last one (1096), and K that the wgmma form's TMA loads
// cannot take (60: rows 120 bytes apart), which run the mma.sync form.
#include <cstring>

#include "kernels/cuda/gemm_fixed.h"

#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

bool rows_equal(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb, int64_t n) {
  return std::memcmp(a.f32() + ra * n, b.f32() + rb * n, size_t(n) * sizeof(float)) == 0;
}

// ref[r, n] = alpha * sum_k x[r, k] w[n, k] + beta * y0[r, n], in double.
Tensor reference_rows(const Tensor& x, const Tensor& w, const Tensor& y0, const std::vector<int64_t>& rows,
                      float alpha, float beta) {
  const int64_t K = x.dim(1), N = w.dim(0);
  Tensor ref = Tensor::zeros({int64_t(rows.size()), N});
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x.f32()[rows[i] * K + k]) * w.f32()[n * K + k];
      ref.f32()[int64_t(i) * N + n] = float(alpha * s + beta * y0.f32()[rows[i] * N + n]);
    }
  return ref;
}

}  // namespace

TEST_CASE("fixed-order gemm plan: the form by K and pitches, the split by M", "[cuda][plan]") {
  using cuda::FixedGemmArgs;
  alignas(16) static const char base[64] = {};
  auto args = [&](int64_t M, int64_t N, int64_t K) {
    return FixedGemmArgs{.x = base, .w = base, .M = M, .N = N, .K = K, .ldx = K, .ldw = K, .ldy = N};
  };
  const cuda::FixedGemmPlan one = cuda::plan_gemm_fixed(args(1, 2048, 2048), 132);
  CHECK(one.wgmma);
  CHECK(one.parts == 4);
  CHECK(one.split);  // 32 tiles of 64 columns: a CTA per part gives 128
  CHECK(one.workspace_bytes == size_t(4) * 2048 * 4);
  const cuda::FixedGemmPlan big = cuda::plan_gemm_fixed(args(8192, 2048, 2048), 132);
  CHECK(big.wgmma);
  CHECK_FALSE(big.split);
  CHECK(big.warpgroups == 2);
  CHECK(big.block_n == 128);
  CHECK_FALSE(cuda::plan_gemm_fixed(args(1, 2048, 2048), 132).split == cuda::plan_gemm_fixed(args(1000, 2048, 2048), 132).split);
  // The form never follows M: K < 64, a pitch off the 16-byte grid or an unaligned base take mma.sync.
  for (const int64_t M : {1, 64, 65, 8192}) {
    CHECK_FALSE(cuda::plan_gemm_fixed(args(M, 130, 60), 132).wgmma);
    CHECK_FALSE(cuda::plan_gemm_fixed(args(M, 128, 32), 132).wgmma);
    CHECK(cuda::plan_gemm_fixed(args(M, 100, 200), 132).wgmma);
    FixedGemmArgs odd = args(M, 128, 128);
    odd.x = base + 2;
    CHECK_FALSE(cuda::plan_gemm_fixed(odd, 132).wgmma);
  }
}

TEST_CASE("fixed-order gemm: rows bitwise equal to the row alone, close to fp32", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  g.set_batch_invariant(true);
  std::mt19937 rng(41);
  const int64_t kMaxM = 1000;
  const std::vector<int64_t> Ms = {1, 3, 8, 64, 65, 257, kMaxM};
  const std::vector<int64_t> alone = {0, 1, 2, 7, 63, 64, 256, 999};
  struct Shape { int64_t N, K; };
  for (const Shape sh : {Shape{2048, 2048}, Shape{96, 576}, Shape{2048, 576}, Shape{100, 200}, Shape{300, 1096},
                         Shape{130, 60}})
    for (const bool scaled : {false, true})
      for (const DType out : {DType::F32, DType::BF16}) {
        const int64_t N = sh.N, K = sh.K;
        const float alpha = scaled ? 0.5f : 1.f, beta = scaled ? 0.75f : 0.f;
        const std::string tag = "N=" + std::to_string(N) + " K=" + std::to_string(K) + (scaled ? " alpha/beta" : "") +
                                " " + dtype_name(out);
        INFO(tag);
        Tensor x = randn({kMaxM, K}, rng), w = randn({N, K}, rng, 0.05f), y0 = randn({kMaxM, N}, rng);
        if (out == DType::BF16)
          for (int64_t i = 0; i < y0.numel(); ++i) y0.f32()[i] = round_bf16(y0.f32()[i]);
        const Tensor gx = g.from_host(x, DType::BF16), gw = g.from_host(w, DType::BF16);
        auto run = [&](int64_t r0, int64_t M) {
          Tensor gy = scaled ? g.from_host(y0.slice_rows(r0, r0 + M), out) : poisoned(g, {M, N}, out);
          g.gemm({.x = gx.slice_rows(r0, r0 + M), .w = gw, .y = gy, .alpha = alpha, .beta = beta});
          return g.to_host(gy);
        };
        const Tensor full = run(0, kMaxM);
        for (const int64_t M : Ms) {
          const Tensor part = run(0, M);
          int64_t differ = 0;
          for (int64_t r = 0; r < M; ++r) differ += !rows_equal(part, r, full, r, N);
          INFO("M=" << M);
          CHECK(differ == 0);
        }
        Tensor single = Tensor::zeros({int64_t(alone.size()), N});
        for (size_t i = 0; i < alone.size(); ++i) {
          const Tensor one = run(alone[i], 1);
          INFO("row " << alone[i] << " alone");
          CHECK(rows_equal(one, 0, full, alone[i], N));
          std::memcpy(single.f32() + int64_t(i) * N, one.f32(), size_t(N) * sizeof(float));
        }
        const Tensor ref = reference_rows(x, w, y0, alone, alpha, beta);
        const Err e = compare(single, ref);
        INFO("rel err " << e.rel);
        CHECK_FALSE(e.bad_nan);
        CHECK(e.rel <= tol(out == DType::F32 ? "gemm_f32" : "gemm"));
      }
}

TEST_CASE("fixed-order head_gemm (batched strides): rows bitwise equal alone, close to cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  g.set_batch_invariant(true);
  std::mt19937 rng(42);
  const int64_t H = 3, N = 96, K = 200, kMaxM = 70;
  Tensor x = randn({kMaxM, H, K}, rng), w = randn({H, N, K}, rng, 0.1f);
  const Tensor gx = g.from_host(x, DType::BF16), gw = g.from_host(w, DType::BF16);
  auto run = [&](int64_t r0, int64_t M) {
    Tensor gy = poisoned(g, {M, H, N}, DType::F32);
    g.head_gemm({.x = gx.slice_rows(r0, r0 + M), .w = gw, .y = gy});
    return g.to_host(gy);
  };
  const Tensor full = run(0, kMaxM);
  Tensor ref = Tensor::zeros({kMaxM, H, N});
  bk.cpu->head_gemm({.x = x, .w = w, .y = ref});
  const Err e = compare(full, ref);
  INFO("rel err " << e.rel);
  CHECK_FALSE(e.bad_nan);
  CHECK(e.rel <= tol("gemm_f32"));
  for (const int64_t M : {int64_t(1), int64_t(5), int64_t(17), int64_t(65)}) {
    const Tensor part = run(0, M);
    INFO("M=" << M);
    CHECK(std::memcmp(part.f32(), full.f32(), size_t(M * H * N) * sizeof(float)) == 0);
  }
  for (const int64_t r : {int64_t(0), int64_t(33), kMaxM - 1}) {
    const Tensor one = run(r, 1);
    INFO("row " << r << " alone");
    CHECK(std::memcmp(one.f32(), full.f32() + r * H * N, size_t(H * N) * sizeof(float)) == 0);
  }
}
