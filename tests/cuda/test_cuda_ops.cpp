// CUDA backend vs the CPU reference: GEMM, norms, element-wise ops, routing, MoE, data movement.
// Tolerances and their reasons: tests/cuda/tolerances.h.
#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"

using namespace k3;
using namespace k3::cudatest;

TEST_CASE("cuda gemm matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  std::mt19937 rng(11);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 64, 128}, {37, 96, 200}, {256, 512, 1024}};
  for (auto [M, N, K] : shapes) {
    for (bool f32_out : {false, true}) {
      Tensor x = randn({M, K}, rng), w = randn({N, K}, rng, 0.05f);
      Tensor y = Tensor::zeros({M, N});
      bk.cpu->gemm({.x = x, .w = w, .y = y});
      Tensor gy = poisoned(*bk.gpu, {M, N}, f32_out ? DType::F32 : DType::BF16);
      bk.gpu->gemm({.x = bk.gpu->from_host(x, DType::BF16), .w = bk.gpu->from_host(w, DType::BF16), .y = gy});
      expect_close(*bk.gpu, gy, y, tol(f32_out ? "gemm_f32" : "gemm"),
                   "gemm M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
    }
  }
}

TEST_CASE("cuda head_gemm matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  std::mt19937 rng(12);
  const int64_t M = 3, H = 5, K = 64, N = 48;
  Tensor x = randn({M, H, K}, rng), w = randn({H, N, K}, rng, 0.1f);
  Tensor y = Tensor::zeros({M, H, N});
  bk.cpu->head_gemm({.x = x, .w = w, .y = y});
  Tensor gy = poisoned(*bk.gpu, {M, H, N}, DType::F32);
  bk.gpu->head_gemm({.x = bk.gpu->from_host(x, DType::BF16), .w = bk.gpu->from_host(w, DType::BF16), .y = gy});
  expect_close(*bk.gpu, gy, y, tol("gemm_f32"), "head_gemm");
}

TEST_CASE("cuda norms and element-wise ops match cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(13);
  for (auto [M, D] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {33, 7168}, {5, 100}}) {
    const std::string tag = " M=" + std::to_string(M) + " D=" + std::to_string(D);
    Tensor x = randn({M, D}, rng, 2.f), w = randn({D}, rng), u = randn({M, D}, rng, 10.f);
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->rmsnorm({.x = x, .w = w, .y = y, .eps = 1e-5f});
      Tensor gy = poisoned(g, {M, D}, DType::BF16);
      g.rmsnorm({.x = g.from_host(x, DType::BF16), .w = g.from_host(w, DType::F32), .y = gy, .eps = 1e-5f});
      expect_close(g, gy, y, tol("rowwise_bf16"), "rmsnorm" + tag);
    }
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->l2norm({.x = x, .y = y, .eps = 1e-6f, .scale = 0.5f});
      Tensor gy = poisoned(g, {M, D}, DType::BF16);
      g.l2norm({.x = g.from_host(x, DType::BF16), .y = gy, .eps = 1e-6f, .scale = 0.5f});
      expect_close(g, gy, y, tol("rowwise_bf16"), "l2norm" + tag);
    }
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->situ({.g = x, .u = u, .y = y});
      Tensor gy = poisoned(g, {M, D}, DType::BF16);
      g.situ({.g = g.from_host(x, DType::BF16), .u = g.from_host(u, DType::BF16), .y = gy});
      expect_close(g, gy, y, tol("rowwise_bf16"), "situ" + tag);
    }
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->add({.a = x, .b = u, .y = y});
      Tensor gy = poisoned(g, {M, D}, DType::BF16);
      g.add({.a = g.from_host(x, DType::BF16), .b = g.from_host(u, DType::BF16), .y = gy});
      expect_close(g, gy, y, tol("rowwise_bf16"), "add" + tag);
    }
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->sigmoid_mul({.x = x, .gate = u, .y = y});
      Tensor gy = poisoned(g, {M, D}, DType::BF16);
      g.sigmoid_mul({.x = g.from_host(x, DType::BF16), .gate = g.from_host(u, DType::BF16), .y = gy});
      expect_close(g, gy, y, tol("rowwise_bf16"), "sigmoid_mul" + tag);
    }
    {
      Tensor y = Tensor::zeros({M, D});
      bk.cpu->sigmoid(x, y);
      Tensor gy = poisoned(g, {M, D}, DType::F32);
      Tensor gx = g.from_host(x, DType::BF16);
      g.sigmoid(gx, gy);
      expect_close(g, gy, y, tol("f32_math"), "sigmoid" + tag);
    }
  }
}

TEST_CASE("cuda embedding, copy_cols, scatter_rows are exact", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(14);
  Tensor table = randn({50, 24}, rng);
  Tensor ids = ints({3, 0, 49, 3, 17});
  Tensor y = Tensor::zeros({5, 24});
  bk.cpu->embedding({.table = table, .ids = ids, .y = y});
  Tensor gy = poisoned(g, {5, 24}, DType::BF16);
  g.embedding({.table = g.from_host(table, DType::BF16), .ids = g.from_host(ids, DType::I32), .y = gy});
  expect_close(g, gy, y, tol("exact"), "embedding");

  Tensor src = randn({4, 10}, rng);
  Tensor dst = randn({8, 12}, rng);
  Tensor gdst = g.from_host(dst, DType::BF16);
  ops::CopyColsParams cc{.src = src, .dst = dst, .src_col = 2, .dst_col = 5, .ncols = 6, .src_row_repeat = 2};
  bk.cpu->copy_cols(cc);
  cc.src = g.from_host(src, DType::BF16);
  cc.dst = gdst;
  g.copy_cols(cc);
  expect_close(g, gdst, dst, tol("exact"), "copy_cols");

  Tensor rows = randn({3, 16}, rng);
  Tensor pool = randn({10, 16}, rng);
  Tensor gpool = g.from_host(pool, DType::BF16);
  Tensor rid = ints({7, 0, 4});
  bk.cpu->scatter_rows({.src = rows, .ids = rid, .dst = pool});
  g.scatter_rows({.src = g.from_host(rows, DType::BF16), .ids = g.from_host(rid, DType::I32), .dst = gpool});
  expect_close(g, gpool, pool, tol("exact"), "scatter_rows");
}

TEST_CASE("cuda attnres_mix matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(15);
  for (int m : {1, 3, 9}) {
    const int64_t M = 7, D = 256;
    std::vector<Tensor> cands, gc;
    for (int j = 0; j < m; ++j) {
      cands.push_back(randn({M, D}, rng, 1.f + j));
      gc.push_back(g.from_host(cands.back(), DType::BF16));
    }
    Tensor q = randn({D}, rng, 0.2f, false);
    Tensor y = Tensor::zeros({M, D});
    bk.cpu->attnres_mix({.candidates = cands, .query = q, .y = y});
    Tensor gy = poisoned(g, {M, D}, DType::F32);
    g.attnres_mix({.candidates = gc, .query = g.from_host(q, DType::F32), .y = gy});
    expect_close(g, gy, y, 1e-4, "attnres_mix m=" + std::to_string(m));
  }
}

TEST_CASE("cuda router_topk matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(16);
  for (auto [M, E, k] : std::vector<std::array<int, 3>>{{1, 64, 8}, {9, 896, 16}}) {
    Tensor logits = randn({M, E}, rng, 2.f, false), bias = randn({E}, rng, 0.1f, false);
    Tensor ids = Tensor::zeros({M, k}, DType::I32), w = Tensor::zeros({M, k});
    bk.cpu->router_topk({.logits = logits, .bias = bias, .ids = ids, .weights = w, .k = k, .scale = 2.5f});
    Tensor gids = g.alloc({M, k}, DType::I32), gw = poisoned(g, {M, k}, DType::F32);
    g.router_topk({.logits = g.from_host(logits, DType::F32), .bias = g.from_host(bias, DType::F32), .ids = gids,
                   .weights = gw, .k = k, .scale = 2.5f});
    Tensor hid = g.to_host(gids);
    for (int64_t i = 0; i < ids.numel(); ++i) CHECK(hid.i32()[i] == ids.i32()[i]);
    expect_close(g, gw, w, tol("f32_math"), "router weights E=" + std::to_string(E));
  }
}

TEST_CASE("cuda moe_experts matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(17);
  // bf16 weights take the grouped-GEMM path (segments of 1..many tiles, F and Dl not multiples of
  // the 64 tile, an expert nobody picks) when batch invariance is on or the pairs are many, the
  // per-row decode kernel (moe_gemv.cu) for <= 32 pairs otherwise; f32 weights the simple kernel.
  struct Shape { int64_t M, k, E, F, Dl; DType wdt; };
  for (const bool invariant : {false, true})
  for (const Shape sh : {Shape{3, 2, 4, 64, 96, DType::BF16}, Shape{300, 4, 8, 80, 96, DType::BF16},
                         Shape{1, 4, 32, 512, 1024, DType::BF16}, Shape{5, 2, 3, 40, 24, DType::BF16},
                         Shape{3, 2, 4, 64, 96, DType::F32}}) {
    const int64_t M = sh.M, k = sh.k, E = sh.E, F = sh.F, Dl = sh.Dl;
    Tensor z = randn({M, Dl}, rng), w1 = randn({E, F, Dl}, rng, 0.1f), w3 = randn({E, F, Dl}, rng, 0.1f),
           w2 = randn({E, Dl, F}, rng, 0.1f);
    std::vector<int32_t> idv;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < k; ++j) idv.push_back(int32_t((m * 7 + j * 3 + (m % 5)) % std::max<int64_t>(E - 1, 1)));
    Tensor ids = Tensor::from_i32({M, k}, idv);
    Tensor wt = uniform({M, k}, rng, 0.1f, 1.f, false);
    for (const ops::GluAct act : {ops::GluAct::Situ, ops::GluAct::Silu}) {
      Tensor y = Tensor::zeros({M, Dl});
      bk.cpu->moe_experts({.z = z, .ids = ids, .weights = wt, .w1 = w1, .w3 = w3, .w2 = w2, .y = y, .act = act});
      Tensor gy = poisoned(g, {M, Dl}, DType::BF16);
      g.set_batch_invariant(invariant);
      g.moe_experts({.z = g.from_host(z, DType::BF16), .ids = g.from_host(ids, DType::I32),
                     .weights = g.from_host(wt, DType::F32), .w1 = g.from_host(w1, sh.wdt),
                     .w3 = g.from_host(w3, sh.wdt), .w2 = g.from_host(w2, sh.wdt), .y = gy, .act = act});
      expect_close(g, gy, y, tol("moe"), "moe_experts M=" + std::to_string(M) + " E=" + std::to_string(E) +
                                             " F=" + std::to_string(F) + " " + dtype_name(sh.wdt) +
                                             (act == ops::GluAct::Silu ? " silu" : " situ") +
                                             (invariant ? " (batch-invariant)" : ""));
      g.set_batch_invariant(false);
    }
  }
}

// The grouped GEMMs' two forms (wide 64 x 64 tiles with 32-column K steps, and narrow 64 x 32 tiles with
// 64-column K steps in a deeper ring) must give the same bits: the form is picked by the grid, so a
// batch that changes the grid must not change a row. Shapes: a decode step of k3-small's routed experts
// (one token, 4 of 32), a K that is not a multiple of either K step (F = 80, Dl = 200: blocks of 16 past
// K skipped alike), unaligned rows (Dl = 100: the element-wise copies), many pairs, and each act.
TEST_CASE("cuda moe_experts grouped GEMM: the narrow and the wide form give the same bits", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  auto& g = *bk.gpu;
  std::mt19937 rng(19);
  struct Shape { int64_t M, k, E, F, Dl; };
  g.set_batch_invariant(true);  // the grouped path for every batch
  for (const Shape sh : {Shape{1, 4, 32, 512, 1024}, Shape{3, 2, 4, 80, 200}, Shape{5, 2, 3, 40, 100},
                         Shape{300, 4, 8, 80, 96}, Shape{64, 8, 16, 256, 512}}) {
    const int64_t M = sh.M, k = sh.k, E = sh.E, F = sh.F, Dl = sh.Dl;
    Tensor z = randn({M, Dl}, rng), w1 = randn({E, F, Dl}, rng, 0.1f), w3 = randn({E, F, Dl}, rng, 0.1f),
           w2 = randn({E, Dl, F}, rng, 0.1f);
    std::vector<int32_t> idv;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < k; ++j) idv.push_back(int32_t((m * 5 + j * 3 + (m % 7)) % E));
    const Tensor gz = g.from_host(z, DType::BF16), gids = g.from_host(Tensor::from_i32({M, k}, idv), DType::I32),
                 gwt = g.from_host(uniform({M, k}, rng, 0.1f, 1.f, false), DType::F32),
                 g1 = g.from_host(w1, DType::BF16), g3 = g.from_host(w3, DType::BF16), g2 = g.from_host(w2, DType::BF16);
    for (const ops::GluAct act : {ops::GluAct::Situ, ops::GluAct::Silu}) {
      Tensor ys[2];
      for (int form : {1, 2}) {
        cb->set_moe_grouped_form(form);
        Tensor gy = poisoned(g, {M, Dl}, DType::F32);
        g.moe_experts({.z = gz, .ids = gids, .weights = gwt, .w1 = g1, .w3 = g3, .w2 = g2, .y = gy, .act = act});
        ys[form - 1] = g.to_host(gy);
      }
      INFO("M=" << M << " k=" << k << " E=" << E << " F=" << F << " Dl=" << Dl
                << (act == ops::GluAct::Silu ? " silu" : " situ"));
      CHECK(std::memcmp(ys[0].data(), ys[1].data(), ys[0].nbytes()) == 0);
      CHECK(std::isfinite(ys[1].f32()[0]));
    }
  }
  cb->set_moe_grouped_form(0);
  g.set_batch_invariant(false);
  REQUIRE_THROWS_WITH(cb->set_moe_grouped_form(3), Catch::Matchers::Contains("form 3 not in 0..2"));
}

// The rule needs no GPU: a decode step of k3-small (4 tiles x 8 column tiles of W1/W3 = 32 blocks on
// 132 SMs) goes narrow; a batch of 64 (36 tiles) stays wide; forms 1 and 2 hold the choice.
TEST_CASE("moe grouped GEMM form: narrow where the wide grid would leave SMs idle", "[cuda]") {
  CHECK(cuda::moe_grouped_narrow(4, 512, 132, 0));
  CHECK(cuda::moe_grouped_narrow(4, 1024, 132, 0));
  CHECK_FALSE(cuda::moe_grouped_narrow(36, 512, 132, 0));
  CHECK_FALSE(cuda::moe_grouped_narrow(4, 512, 132, 1));
  CHECK(cuda::moe_grouped_narrow(36, 512, 132, 2));
}

TEST_CASE("cuda sample (greedy on the device, seeded rows on the host) matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(18);
  // Vocab of K3 size and a small one; ties (a repeated maximum) must pick the lowest id.
  for (const int64_t V : {int64_t(1000), int64_t(163840)}) {
    Tensor logits = randn({6, V}, rng, 1.f, false);
    logits.f32()[1 * V + 7] = logits.f32()[1 * V + 900] = 50.f;
    std::vector<ops::SamplingRow> rows(6);
    rows[3] = {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 5, .step = 2};
    rows[4] = {.temperature = 1.2f, .top_k = 40, .top_p = 1.f, .seed = 6, .step = 9};
    std::vector<int32_t> a, b;
    bk.cpu->sample({.logits = logits, .rows = rows, .out = &a});
    g.sample({.logits = g.from_host(logits, DType::F32), .rows = rows, .out = &b});
    INFO("V=" << V);
    CHECK(a == b);
    CHECK(b[1] == 7);
  }
}

// Programmatic dependent launch (kernels/cuda/pdl.cuh): a kernel may be placed before the one ahead
// of it in the stream ends, and must still see all of its writes (and not overwrite what it still
// reads). 400 dependent element-wise adds over 16M elements (many waves each), each reading the
// buffer the one before wrote and writing the buffer it read, eagerly and then twice as a graph:
// every element ends at exactly its count.
TEST_CASE("cuda programmatic launches: a chain of dependent kernels sees every write before it", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  const int64_t M = 4096, D = 4096;
  constexpr int kSteps = 400;
  Tensor host_one = Tensor::zeros({M, D});
  for (int64_t i = 0; i < host_one.numel(); ++i) host_one.f32()[i] = 1.f;
  Tensor one = bk.gpu->from_host(host_one, DType::F32);
  Tensor a = bk.gpu->alloc({M, D}, DType::F32), b = bk.gpu->alloc({M, D}, DType::F32);
  auto chain = [&] {
    for (int i = 0; i < kSteps; i += 2) {
      bk.gpu->add({.a = a, .b = one, .y = b});
      bk.gpu->add({.a = b, .b = one, .y = a});
    }
  };
  auto expect_all = [&](float want, const char* what) {
    const Tensor got = bk.gpu->to_host(a);
    int64_t wrong = 0;
    for (int64_t i = 0; i < got.numel(); ++i) wrong += got.f32()[i] != want;
    INFO(what << ": " << wrong << " of " << got.numel() << " elements are not " << want);
    CHECK(wrong == 0);
  };
  chain();
  expect_all(float(kSteps), "eager");
  auto graph = bk.gpu->capture(chain, true);
  REQUIRE(graph != nullptr);
  graph->launch();
  graph->launch();
  expect_all(float(3 * kSteps), "replayed twice");
}
