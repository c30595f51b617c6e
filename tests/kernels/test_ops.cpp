// The smaller ops against direct formulas: norms, element-wise, embedding, short conv (incl. cache
// carry across pieces), AttnRes mix, SiTU, router, MoE experts.
#include <catch2/catch.hpp>

#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

TEST_CASE("rmsnorm and l2norm follow their formulas; empty rmsnorm weight means no scale") {
  std::mt19937 rng(31);
  auto be = cpu_backend(2);
  Tensor x = randn({3, 7}, rng), w = randn({7}, rng), y = Tensor::zeros({3, 7}), y2 = Tensor::zeros({3, 7});
  be->rmsnorm({.x = x, .w = w, .y = y, .eps = 1e-5f});
  be->rmsnorm({.x = x, .w = Tensor(), .y = y2, .eps = 1e-5f});
  Tensor l2 = Tensor::zeros({3, 7});
  be->l2norm({.x = x, .y = l2, .eps = 1e-6f, .scale = 0.5f});
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 7; ++i) ss += double(x.f32()[r * 7 + i]) * x.f32()[r * 7 + i];
    for (int i = 0; i < 7; ++i) {
      const double xi = x.f32()[r * 7 + i];
      CHECK(y.f32()[r * 7 + i] == Approx(w.f32()[i] * xi / std::sqrt(ss / 7 + 1e-5)).epsilon(1e-6));
      CHECK(y2.f32()[r * 7 + i] == Approx(xi / std::sqrt(ss / 7 + 1e-5)).epsilon(1e-6));
      CHECK(l2.f32()[r * 7 + i] == Approx(0.5 * xi / std::sqrt(ss + 1e-6)).epsilon(1e-6));
    }
  }
  // In place (y aliases x).
  Tensor xin = x.clone();
  be->rmsnorm({.x = xin, .w = w, .y = xin, .eps = 1e-5f});
  CHECK(bitwise_equal(xin, y));
}

TEST_CASE("add, sigmoid_mul, sigmoid, embedding") {
  std::mt19937 rng(32);
  auto be = cpu_backend(2);
  Tensor a = randn({4, 5}, rng), b = randn({4, 5}, rng), y = Tensor::zeros({4, 5}), z = Tensor::zeros({4, 5});
  be->add({.a = a, .b = b, .y = y});
  be->sigmoid_mul({.x = a, .gate = b, .y = z});
  Tensor s = Tensor::zeros({20});
  be->sigmoid(a, s);
  for (int i = 0; i < 20; ++i) {
    CHECK(y.f32()[i] == a.f32()[i] + b.f32()[i]);
    CHECK(z.f32()[i] == Approx(a.f32()[i] / (1 + std::exp(-double(b.f32()[i])))).epsilon(1e-6));
    CHECK(s.f32()[i] == Approx(1 / (1 + std::exp(-double(a.f32()[i])))).epsilon(1e-6));
  }
  Tensor table = randn({6, 3}, rng), e = Tensor::zeros({3, 3});
  be->embedding({.table = table, .ids = i32({3}, {5, 0, 5}), .y = e});
  CHECK(std::memcmp(e.f32(), table.f32() + 15, 12) == 0);
  CHECK(std::memcmp(e.f32() + 3, table.f32(), 12) == 0);
  CHECK_THROWS_WITH(be->embedding({.table = table, .ids = i32({1}, {6}), .y = Tensor::zeros({1, 3})}),
                    Catch::Contains("embedding") && Catch::Contains("ids[0] = 6"));
}

namespace {
// Direct definition: xbar = [cache ; x], y_t[c] = SiLU(sum_j w[c,j] xbar[t+j][c]).
Tensor conv_reference(const Tensor& x, const Tensor& w, const Tensor& cache_rows) {
  const int64_t T = x.dim(0), C = x.dim(1), W = w.dim(1);
  Tensor y = Tensor::zeros({T, C});
  auto xbar = [&](int64_t r, int64_t c) -> double {
    return r < W - 1 ? cache_rows.f32()[r * C + c] : x.f32()[(r - (W - 1)) * C + c];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < W; ++j) acc += w.f32()[c * W + j] * xbar(t + j, c);
      y.f32()[t * C + c] = float(acc / (1 + std::exp(-acc)));
    }
  return y;
}
}  // namespace

TEST_CASE("short_conv matches its definition and carries the cache across pieces") {
  std::mt19937 rng(33);
  auto be = cpu_backend(2);
  const int64_t C = 37, W = 4;
  Tensor w = randn({C, W}, rng, 0.5f);
  for (int64_t T : {1, 2, 3, 4, 11}) {
    Tensor x = randn({T, C}, rng), cache = randn({3, W - 1, C}, rng);
    Tensor start = cache.slice_rows(1, 2).reshape({W - 1, C}).clone();
    Tensor y = Tensor::zeros({T, C});
    Tensor c1 = cache.clone();
    be->short_conv({.x = x, .w = w, .cache = c1, .slots = i32({1}, {1}), .cu_seqlens = i32({2}, {0, int32_t(T)}), .y = y});
    INFO("T=" << T);
    CHECK(rel_err(y, conv_reference(x, w, start)) < 1e-5);
    // New cache = last W-1 rows of [old cache ; x]; other slots untouched.
    for (int64_t r = 0; r < W - 1; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t src = T + r;
        const float want = src < W - 1 ? start.f32()[src * C + c] : x.f32()[(src - (W - 1)) * C + c];
        CHECK(c1.f32()[(1 * (W - 1) + r) * C + c] == want);
      }
    CHECK(std::memcmp(c1.f32(), cache.f32(), (W - 1) * C * 4) == 0);

    // The same sequence fed in pieces of 1, 2, ... rows gives the same outputs and final cache.
    Tensor c2 = cache.clone(), y2 = Tensor::zeros({T, C});
    for (int64_t b = 0, piece = 1; b < T; b += piece, ++piece) {
      const int64_t e = std::min(T, b + piece);
      be->short_conv({.x = x.slice_rows(b, e), .w = w, .cache = c2, .slots = i32({1}, {1}),
                      .cu_seqlens = i32({2}, {0, int32_t(e - b)}), .y = y2.slice_rows(b, e)});
    }
    CHECK(bitwise_equal(y2, y));
    CHECK(bitwise_equal(c2, c1));
  }
}

TEST_CASE("short_conv varlen batch equals per-sequence calls") {
  std::mt19937 rng(34);
  auto be = cpu_backend(3);
  const int64_t C = 9, W = 3;
  Tensor w = randn({C, W}, rng), x = randn({7, C}, rng), cache = randn({4, W - 1, C}, rng);
  Tensor cb = cache.clone(), yb = Tensor::zeros({7, C});
  be->short_conv({.x = x, .w = w, .cache = cb, .slots = i32({3}, {3, 0, 2}), .cu_seqlens = i32({4}, {0, 1, 1, 7}), .y = yb});
  Tensor cs = cache.clone(), ys = Tensor::zeros({7, C});
  for (auto [slot, b, e] : {std::tuple{3, 0, 1}, {0, 1, 1}, {2, 1, 7}})
    be->short_conv({.x = x.slice_rows(b, e), .w = w, .cache = cs, .slots = i32({1}, {slot}),
                    .cu_seqlens = i32({2}, {0, e - b}), .y = ys.slice_rows(b, e)});
  CHECK(bitwise_equal(yb, ys));
  CHECK(bitwise_equal(cb, cs));
  CHECK_THROWS_WITH(be->short_conv({.x = x, .w = w, .cache = cb, .slots = i32({2}, {1, 1}),
                                    .cu_seqlens = i32({3}, {0, 3, 7}), .y = yb}),
                    Catch::Contains("short_conv") && Catch::Contains("slot 1 is used by two sequences"));
}

TEST_CASE("attnres_mix: formula, and a zero query gives the mean of the candidates") {
  std::mt19937 rng(35);
  auto be = cpu_backend(2);
  const int64_t M = 3, D = 8;
  std::vector<Tensor> cand = {randn({M, D}, rng), randn({M, D}, rng, 3.f), randn({M, D}, rng, 0.2f)};
  Tensor y = Tensor::zeros({M, D});
  be->attnres_mix({.candidates = cand, .query = Tensor::zeros({D}), .y = y, .eps = 1e-5f});
  for (int64_t i = 0; i < M * D; ++i)
    CHECK(y.f32()[i] == Approx((cand[0].f32()[i] + cand[1].f32()[i] + cand[2].f32()[i]) / 3.0).margin(1e-6));
  Tensor q = randn({D}, rng);
  be->attnres_mix({.candidates = cand, .query = q, .y = y, .eps = 1e-5f});
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> l;
    for (auto& c : cand) {
      double ss = 0, dot = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(c.f32()[m * D + i]) * c.f32()[m * D + i], dot += double(q.f32()[i]) * c.f32()[m * D + i];
      l.push_back(dot / std::sqrt(ss / D + 1e-5));
    }
    double mx = *std::max_element(l.begin(), l.end()), den = 0;
    for (double v : l) den += std::exp(v - mx);
    for (int64_t i = 0; i < D; ++i) {
      double ref = 0;
      for (size_t j = 0; j < cand.size(); ++j) ref += std::exp(l[j] - mx) / den * cand[j].f32()[m * D + i];
      CHECK(y.f32()[m * D + i] == Approx(ref).margin(1e-5));
    }
  }
  // Single candidate: the mix is that candidate.
  Tensor y1 = Tensor::zeros({M, D});
  be->attnres_mix({.candidates = {cand[1]}, .query = q, .y = y1, .eps = 1e-5f});
  CHECK(rel_err(y1, cand[1]) < 1e-6);
}

TEST_CASE("situ matches its formula and is close to SiLU(g) * u for small inputs") {
  auto be = cpu_backend(2);
  std::mt19937 rng(36);
  Tensor g = randn({4, 16}, rng, 6.f), u = randn({4, 16}, rng, 40.f), y = Tensor::zeros({4, 16});
  be->situ({.g = g, .u = u, .y = y, .beta = 4.f, .beta_linear = 25.f});
  for (int i = 0; i < 64; ++i) {
    const double gi = g.f32()[i], ui = u.f32()[i];
    CHECK(y.f32()[i] == Approx(4 * std::tanh(gi / 4) / (1 + std::exp(-gi)) * 25 * std::tanh(ui / 25)).epsilon(1e-5).margin(1e-6));
    CHECK(std::fabs(y.f32()[i]) <= 4.f * 25.f);  // saturates
  }
  Tensor gs = randn({2, 32}, rng, 0.05f), us = randn({2, 32}, rng, 0.05f), ys = Tensor::zeros({2, 32});
  be->situ({.g = gs, .u = us, .y = ys});
  for (int i = 0; i < 64; ++i) {
    const double gi = gs.f32()[i], ui = us.f32()[i];
    const double silu_mul = gi / (1 + std::exp(-gi)) * ui;
    CHECK(ys.f32()[i] == Approx(silu_mul).epsilon(1e-3).margin(1e-7));
  }
}

TEST_CASE("router_topk selects by s + bias but weights by the unbiased s, renormalised and scaled") {
  auto be = cpu_backend(1);
  // s = sigmoid(logits): expert 0 has the largest s, but the bias moves expert 3 into the top 2.
  Tensor logits = Tensor::from_f32({2, 4}, std::vector<float>{2.f, 1.f, 0.f, -1.f, 0.f, 0.f, 0.f, 0.f});
  Tensor bias = Tensor::from_f32({4}, std::vector<float>{0.f, 0.f, 0.f, 0.9f});
  Tensor ids = Tensor::zeros({2, 2}, DType::I32), w = Tensor::zeros({2, 2});
  be->router_topk({.logits = logits, .bias = bias, .ids = ids, .weights = w, .k = 2, .scale = 2.5f});
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  // Row 0: keys s+b = {0.881, 0.731, 0.5, 0.269+0.9=1.169} -> picks 3 then 0.
  CHECK(ids.i32()[0] == 3);
  CHECK(ids.i32()[1] == 0);
  const double sum = sig(-1) + sig(2);
  CHECK(w.f32()[0] == Approx(2.5 * sig(-1) / sum).epsilon(1e-6));
  CHECK(w.f32()[1] == Approx(2.5 * sig(2) / sum).epsilon(1e-6));
  // Row 1: experts 0..2 tie on s + b = 0.5; the bias lifts 3; the tie breaks to the lower id.
  CHECK(ids.i32()[2] == 3);
  CHECK(ids.i32()[3] == 0);
  CHECK(w.f32()[2] == Approx(1.25).epsilon(1e-6));
  CHECK(w.f32()[3] == Approx(1.25).epsilon(1e-6));
}

TEST_CASE("moe_experts equals a naive per-row loop, and a row's result does not depend on the batch") {
  const bool silu = GENERATE(false, true);  // K3's SiTU experts, Kimi Linear's SiLU experts
  const ops::GluAct act = silu ? ops::GluAct::Silu : ops::GluAct::Situ;
  INFO((silu ? "silu" : "situ"));
  std::mt19937 rng(37);
  auto be = cpu_backend(2);
  const int64_t M = 9, Dl = 12, F = 10, E = 5, k = 3;
  Tensor z = randn({M, Dl}, rng), w1 = randn({E, F, Dl}, rng, 0.3f), w3 = randn({E, F, Dl}, rng, 0.3f),
         w2 = randn({E, Dl, F}, rng, 0.3f), weights = uniform({M, k}, rng, 0.f, 1.f);
  std::vector<int32_t> idv;
  std::uniform_int_distribution<int> pick(0, E - 1);
  for (int64_t i = 0; i < M * k; ++i) idv.push_back(pick(rng));
  Tensor ids = i32({M, k}, idv), y = Tensor::zeros({M, Dl});
  be->moe_experts({.z = z, .ids = ids, .weights = weights, .w1 = w1, .w3 = w3, .w2 = w2, .y = y, .act = act});
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> ref(Dl, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int e = idv[m * k + j];
      std::vector<double> a(F);
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < Dl; ++i) {
          g += double(w1.f32()[(e * F + f) * Dl + i]) * z.f32()[m * Dl + i];
          u += double(w3.f32()[(e * F + f) * Dl + i]) * z.f32()[m * Dl + i];
        }
        a[f] = silu ? g / (1 + std::exp(-g)) * u : 4 * std::tanh(g / 4) / (1 + std::exp(-g)) * 25 * std::tanh(u / 25);
      }
      for (int64_t i = 0; i < Dl; ++i) {
        double h = 0;
        for (int64_t f = 0; f < F; ++f) h += w2.f32()[(e * Dl + i) * F + f] * a[f];
        ref[i] += weights.f32()[m * k + j] * h;
      }
    }
    for (int64_t i = 0; i < Dl; ++i) CHECK(y.f32()[m * Dl + i] == Approx(ref[i]).margin(1e-5));
    // Alone in a batch of one: bitwise the same row.
    Tensor y1 = Tensor::zeros({1, Dl});
    be->moe_experts({.z = z.slice_rows(m, m + 1), .ids = ids.slice_rows(m, m + 1),
                     .weights = weights.slice_rows(m, m + 1), .w1 = w1, .w3 = w3, .w2 = w2, .y = y1, .act = act});
    CHECK(std::memcmp(y1.f32(), y.f32() + m * Dl, Dl * 4) == 0);
  }
}

TEST_CASE("cpu backend memory: alloc is zeroed, from_host widens BF16/F16, to_host and copy are deep") {
  auto be = cpu_backend(2);
  CHECK(be->kind() == BackendKind::Cpu);
  CHECK(be->compute_dtype() == DType::F32);
  Tensor a = be->alloc({3, 4}, DType::F32);
  CHECK(max_abs(a) == 0.f);
  CHECK(be->alloc({2}, DType::I32).i32()[1] == 0);
  Tensor b16 = Tensor::zeros({3}, DType::BF16), f16 = Tensor::zeros({3}, DType::F16);
  const float vals[3] = {1.5f, -2.25f, 1e-3f};
  for (int i = 0; i < 3; ++i) b16.ptr<uint16_t>()[i] = f32_to_bf16(vals[i]), f16.ptr<uint16_t>()[i] = f32_to_f16(vals[i]);
  Tensor fb = be->from_host(b16, DType::F32), ff = be->from_host(f16, DType::F32);
  REQUIRE(fb.dtype() == DType::F32);
  for (int i = 0; i < 3; ++i) {
    CHECK(fb.f32()[i] == bf16_to_f32(b16.ptr<uint16_t>()[i]));
    CHECK(ff.f32()[i] == f16_to_f32(f16.ptr<uint16_t>()[i]));
  }
  Tensor host = Tensor::from_f32({2}, std::vector<float>{1.f, 2.f});
  Tensor dev = be->from_host(host, DType::F32);
  host.f32()[0] = 9.f;
  CHECK(dev.f32()[0] == 1.f);
  Tensor back = be->to_host(dev);
  dev.f32()[1] = 7.f;
  CHECK(back.f32()[1] == 2.f);
  Tensor dst = be->alloc({2}, DType::F32);
  be->copy(dev, dst);
  CHECK(dst.f32()[1] == 7.f);
  Tensor wrong = be->alloc({3}, DType::F32);
  CHECK_THROWS(be->copy(dev, wrong));
  CHECK_THROWS_WITH(be->from_host(Tensor::zeros({1}, DType::I32), DType::F32), Catch::Contains("cannot convert I32 to F32"));
  CHECK(be->supports("kda_chunk", {}).empty());
  CHECK_THAT(be->supports("flash_attn", {}), Catch::Contains("unknown op 'flash_attn'"));
}
