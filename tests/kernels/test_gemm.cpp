// GEMM: correctness against a double reference, and row independence (a row's result is bitwise
// the same alone or inside any batch), which is why the CPU backend does not call OpenBLAS.
#include <cblas.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <tuple>

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

// The fast kernel blocks rows and columns (63 x 64 outputs per work item, 3 x 4 register tiles, the
// K % 8 tail): the shapes cross every one of those edges, and random shapes fill in (K up to 4100).
TEST_CASE("gemm rounds every element as the 8-lane scalar definition, bitwise") {
  std::mt19937 rng(10);
  std::vector<std::tuple<int, int, int>> shapes = {{1, 1, 1},     {2, 4, 8},      {3, 5, 7},     {17, 33, 65},
                                                   {5, 130, 257}, {33, 70, 129},  {64, 65, 520}, {127, 3, 1031},
                                                   {1, 129, 768}, {4, 64, 256},   {63, 64, 1031}, {2, 1, 4100}, {12, 9, 2100}};
  std::uniform_int_distribution<int> small(1, 140), deep(1, 1100);
  for (int i = 0; i < 8; ++i) shapes.emplace_back(small(rng), small(rng), deep(rng));
  for (int threads : {1, 3}) {
    auto be = cpu_backend(threads);
    for (auto [M, N, K] : shapes) {
      Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N});
      be->gemm({.x = x, .w = w, .y = y});
      INFO("M=" << M << " N=" << N << " K=" << K << " threads=" << threads);
      REQUIRE(equals_lane_dot(x, w, y));
      // alpha and beta round after the dot product: v = alpha * s, then v + beta * y.
      Tensor y0 = randn({M, N}, rng), y2 = y0.clone();
      be->gemm({.x = x, .w = w, .y = y2, .alpha = 0.75f, .beta = -1.5f});
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const float v = 0.75f * lane_dot(x.f32() + m * K, w.f32() + n * K, K);
          const float want = v + -1.5f * y0.f32()[m * N + n];
          REQUIRE(std::memcmp(&want, y2.f32() + m * N + n, sizeof(float)) == 0);
        }
    }
  }
}

// The CPU GEMM's rate (opt-in: kernels_test_gemm "[perf]"). Best of 5 per shape. On a shared host
// the wall clock counts time the thread was descheduled, so the one-thread lines also give the rate
// by the thread's own CPU time (the kernel's speed when it has the core); with two threads only the
// wall rate means anything. Shapes: a prefill projection, an MoE expert (short M), a decode row.
namespace {
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
}  // namespace

TEST_CASE("gemm rate at transformer shapes, 1 and 2 threads", "[.][perf]") {
  std::mt19937 rng(11);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{256, 2048, 2048}, {32, 1024, 2048}, {1, 4096, 2048}}) {
    Tensor x = randn({M, K}, rng), w = randn({N, K}, rng), y = Tensor::zeros({M, N});
    const double flop = 2.0 * double(M) * double(N) * double(K);
    for (int threads : {1, 2}) {
      auto be = cpu_backend(threads);
      double best_wall = 1e30, best_cpu = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        const double c0 = thread_cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        be->gemm({.x = x, .w = w, .y = y});
        best_wall = std::min(best_wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        best_cpu = std::min(best_cpu, thread_cpu_seconds() - c0);
      }
      std::printf("CPU GEMM M=%lld N=%lld K=%lld, %d thread(s): %.2f GFLOP/s wall", (long long)M, (long long)N,
                  (long long)K, threads, flop / best_wall / 1e9);
      if (threads == 1) std::printf(", %.2f GFLOP/s by thread CPU time", flop / best_cpu / 1e9);
      std::printf(" (best of 5)\n");
      std::fflush(stdout);
      REQUIRE(equals_lane_dot(x.slice_rows(0, 1), w, y.slice_rows(0, 1)));
    }
  }
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
