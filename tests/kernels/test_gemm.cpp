// GEMM: correctness against a double reference, and row independence (a row's result is bitwise
// the same alone or inside any batch), which is why the CPU backend does not call OpenBLAS.
#include <cblas.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {
Tensor naive_gemm(const Tensor& x, const Tensor& w, float alpha, float beta, const Tensor& y0) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  Tensor y = Tensor::zeros({M, N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(x.f32()[m * K + k]) * w.f32()[n * K + k];
      y.f32()[m * N + n] = float(alpha * acc + (beta != 0 ? beta * y0.f32()[m * N + n] : 0.0));
    }
  return y;
}

// The kernel's arithmetic contract, written as plain scalar code: 8 interleaved fp32 partial sums
// over K (lane l takes k = l mod 8), combined in a fixed tree, then the tail. Every tile shape and
// vector form of kernels/cpu/gemm.cpp must round exactly like this.
float lane_dot(const float* x, const float* w, int64_t K) {
  float acc[8] = {};
  const int64_t k_main = K - K % 8;
  for (int64_t k = 0; k < k_main; k += 8)
    for (int l = 0; l < 8; ++l) {
      const float p = x[k + l] * w[k + l];
      acc[l] = acc[l] + p;
    }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t k = k_main; k < K; ++k) {
    const float p = x[k] * w[k];
    s = s + p;
  }
  return s;
}

bool equals_lane_dot(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float want = lane_dot(x.f32() + m * K, w.f32() + n * K, K);
      if (std::memcmp(&want, y.f32() + m * N + n, sizeof(float)) != 0) return false;
    }
  return true;
}
}  // namespace

TEST_CASE("gemm rounds every element as the 8-lane scalar definition, bitwise") {
  std::mt19937 rng(10);
  auto be = cpu_backend(2);
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, {2, 4, 8}, {3, 5, 7}, {17, 33, 65}, {5, 130, 257}, {33, 70, 129}}) {
    Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N});
    be->gemm({.x = x, .w = w, .y = y});
    INFO("M=" << M << " N=" << N << " K=" << K);
    REQUIRE(equals_lane_dot(x, w, y));
  }
}

// The CPU GEMM's single-thread rate at a transformer shape (opt-in: cpu_test_gemm "[perf]").
TEST_CASE("gemm rate, one thread, M=256 N=K=2048", "[.][perf]") {
  std::mt19937 rng(11);
  auto be = cpu_backend(1);
  const int64_t M = 256, N = 2048, K = 2048;
  Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N});
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    be->gemm({.x = x, .w = w, .y = y});
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("CPU GEMM M=%lld N=%lld K=%lld, 1 thread: %.2f GFLOP/s (best of 3)\n", (long long)M, (long long)N,
              (long long)K, 2.0 * M * N * K / best / 1e9);
  REQUIRE(equals_lane_dot(x.slice_rows(0, 2), w, y.slice_rows(0, 2)));
}

TEST_CASE("gemm matches a double-precision reference, alpha/beta included") {
  std::mt19937 rng(7);
  auto be = cpu_backend(2);
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 10, 128}, {5, 130, 9}}) {
    Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y0 = randn({M, N}, rng);
    for (auto [alpha, beta] : {std::pair{1.f, 0.f}, {0.5f, 0.f}, {2.f, 1.f}, {1.f, -0.25f}}) {
      Tensor y = y0.clone();
      be->gemm({.x = x, .w = w, .y = y, .alpha = alpha, .beta = beta});
      Tensor ref = naive_gemm(x, w, alpha, beta, y0);
      INFO("M=" << M << " N=" << N << " K=" << K << " alpha=" << alpha << " beta=" << beta);
      CHECK(rel_err(y, ref) < 1e-5);
    }
  }
}

TEST_CASE("gemm with beta 0 never reads y (NaN-safe)") {
  std::mt19937 rng(8);
  auto be = cpu_backend(1);
  Tensor x = randn({4, 8}, rng), w = randn({3, 8}, rng);
  Tensor y = filled({4, 3}, std::nanf(""));
  be->gemm({.x = x, .w = w, .y = y});
  for (int64_t i = 0; i < y.numel(); ++i) CHECK(std::isfinite(y.f32()[i]));
}

TEST_CASE("gemm is row-independent: batch rows equal single-row products bitwise") {
  std::mt19937 rng(9);
  auto be = cpu_backend(3);
  for (int M : {1, 2, 3, 7, 64})
    for (int K : {1, 5, 16, 17, 100, 257})
      for (int N : {1, 4, 7, 65, 130}) {
        Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N});
        be->gemm({.x = x, .w = w, .y = y});
        for (int m = 0; m < M; ++m) {
          Tensor row = x.slice_rows(m, m + 1), r = Tensor::zeros({1, N});
          be->gemm({.x = row, .w = w, .y = r});
          INFO("M=" << M << " K=" << K << " N=" << N << " row " << m);
          REQUIRE(std::memcmp(r.f32(), y.f32() + m * N, N * sizeof(float)) == 0);
        }
      }
}

// Not an assertion on our code: records whether this machine's OpenBLAS would have been usable.
// (On the development host, OpenBLAS 0.3.21 with core "Prescott", it is NOT row-independent.)
TEST_CASE("probe: OpenBLAS sgemm row independence (informational)") {
  std::mt19937 rng(10);
  int mismatches = 0, cases = 0;
  for (int M : {2, 3, 7, 64})
    for (int K : {16, 100})
      for (int N : {5, 16}) {
        Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N}), r = Tensor::zeros({1, N});
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, x.f32(), K, w.f32(), K, 0.f, y.f32(), N);
        for (int m = 0; m < M; ++m) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N, K, 1.f, x.f32() + m * K, K, w.f32(), K, 0.f,
                      r.f32(), N);
          ++cases;
          if (std::memcmp(r.f32(), y.f32() + m * N, N * sizeof(float)) != 0) ++mismatches;
        }
      }
  WARN("OpenBLAS sgemm: " << mismatches << " of " << cases << " rows differ bitwise between batched and single-row calls");
  SUCCEED();
}
