// The chunked KDA kernel in batch-invariant mode (the serving default): one scan form for every grid and
// no split scan, so a sequence's outputs, state and checkpoints are the same bits whether it runs alone,
// beside forty others (a grid the default rule would give another form), or cut in two calls at a
// multiple of 64 tokens. And row ranges (ops::KdaParams::seq_rows) on both KDA kernels: a range gives
// the bits of its rows run as a call of their own, and rows outside every range are not written. And
// the fused decode kernel in that mode: a decode step through it gives the bits of the separate steps
// (conv, norms, gate, recurrence) that the same token takes as a prompt row.
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "engine/kda_heads.h"
#include "engine/model_weights.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"

using namespace k3;
using namespace k3::cudatest;

namespace {

constexpr int64_t D = 128, H = 16;

struct Inputs {
  Tensor q, k, v, g, beta;  // host, [T, H, D] / [T, H]
};

Inputs make_inputs(std::mt19937& rng, int64_t T) {
  Inputs in;
  in.q = randn({T, H, D}, rng), in.k = randn({T, H, D}, rng), in.v = randn({T, H, D}, rng);
  normalise_heads(in.q, 1.f / std::sqrt(float(D)));
  normalise_heads(in.k, 1.f);
  in.g = uniform({T, H, D}, rng, -1.f, -0.001f, false);
  in.beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
  return in;
}

Inputs rows_of(const Inputs& a, int64_t b, int64_t e) {
  return {a.q.slice_rows(b, e).clone(), a.k.slice_rows(b, e).clone(), a.v.slice_rows(b, e).clone(),
          a.g.slice_rows(b, e).clone(), a.beta.slice_rows(b, e).clone()};
}

// Host rows of several inputs, one after another.
Inputs concat(const std::vector<Inputs>& parts) {
  auto cat = [&](auto get) {
    std::vector<Tensor> ts;
    for (const Inputs& p : parts) ts.push_back(get(p));
    int64_t rows = 0;
    for (const Tensor& t : ts) rows += t.dim(0);
    Shape sh = ts[0].shape();
    sh[0] = rows;
    Tensor out = Tensor::zeros(sh);
    int64_t at = 0;
    for (const Tensor& t : ts) {
      std::memcpy(out.f32() + at, t.f32(), size_t(t.numel()) * 4);
      at += t.numel();
    }
    return out;
  };
  return {cat([](const Inputs& p) { return p.q; }), cat([](const Inputs& p) { return p.k; }),
          cat([](const Inputs& p) { return p.v; }), cat([](const Inputs& p) { return p.g; }),
          cat([](const Inputs& p) { return p.beta; })};
}

struct Out {
  Tensor o, state, ck;  // host
};

// One kda_chunk (or kda_recurrent) call on the GPU over `lens`; sequence n in state slot n, states from
// state0 (host [N, H, D, D]); checkpoints every 64 tokens into slots n·M + j when M > 0.
Out run(Backend& g, bool chunked, const Inputs& in, const std::vector<int32_t>& lens, const Tensor& state0,
        int64_t M, const std::vector<int32_t>& seq_rows = {}) {
  const int64_t N = int64_t(lens.size()), T = in.q.dim(0);
  std::vector<int32_t> slot_ids(static_cast<size_t>(N)), table(static_cast<size_t>(N * std::max<int64_t>(M, 1)));
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  Tensor state = g.from_host(state0, DType::F32), o = poisoned(g, {T, H, D}, DType::BF16);
  Tensor ck = poisoned(g, {std::max<int64_t>(N * M, 1), H, D, D}, DType::F32);
  ops::KdaParams p{.q = g.from_host(in.q, DType::BF16), .k = g.from_host(in.k, DType::BF16),
                   .v = g.from_host(in.v, DType::BF16), .g = g.from_host(in.g, DType::F32),
                   .beta = g.from_host(in.beta, DType::F32), .state = state,
                   .slots = g.from_host(ints(slot_ids), DType::I32), .cu_seqlens = g.from_host(cu_of(lens), DType::I32),
                   .o = o};
  if (!seq_rows.empty()) p.seq_rows = g.from_host(Tensor::from_i32({N, 2}, seq_rows), DType::I32);
  if (M > 0) {
    p.checkpoints = ck;
    p.checkpoint_slots = g.from_host(Tensor::from_i32({N, M}, table), DType::I32);
    p.checkpoint_interval = 64;
  }
  if (chunked) g.kda_chunk(p);
  else g.kda_recurrent(p);
  return {g.to_host(o), g.to_host(state), g.to_host(ck)};
}

// Host f32 tensors (Backend::to_host widens bf16): n floats from each offset, bit for bit.
bool same_bytes(const Tensor& a, int64_t a_off, const Tensor& b, int64_t b_off, int64_t n) {
  return std::memcmp(a.f32() + a_off, b.f32() + b_off, size_t(n) * 4) == 0;
}

bool all_nan(const Tensor& a, int64_t off, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(a.f32()[off + i])) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda kda_chunk in batch-invariant mode: a sequence's bits do not depend on the call around it",
          "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  g.set_batch_invariant(true);
  std::mt19937 rng(83);
  const int64_t L = 640, M = L / 64, per = H * D * D;
  const Inputs a = make_inputs(rng, L);
  const Tensor s0 = randn({1, H, D, D}, rng, 0.1f, false);
  const Out alone = run(g, true, a, {int32_t(L)}, s0, M);

  // Beside 40 others of 128 tokens: 41 x 16 heads is a wide grid (the default rule would pick 64-row
  // wgmma blocks there, and mma.sync blocks for the sequence alone).
  std::vector<Inputs> parts{a};
  std::vector<int32_t> lens{int32_t(L)};
  for (int i = 0; i < 40; ++i) {
    parts.push_back(make_inputs(rng, 128));
    lens.push_back(128);
  }
  Tensor s_many = randn({41, H, D, D}, rng, 0.1f, false);
  std::memcpy(s_many.f32(), s0.f32(), size_t(per) * 4);
  const Out many = run(g, true, concat(parts), lens, s_many, M);
  CHECK(same_bytes(many.o, 0, alone.o, 0, L * H * D));
  CHECK(same_bytes(many.state, 0, alone.state, 0, per));
  CHECK(same_bytes(many.ck, 0, alone.ck, 0, M * per));

  // Cut in two calls at 256 tokens: the second starts from the first's state.
  const Out first = run(g, true, rows_of(a, 0, 256), {256}, s0, 4);
  const Out second = run(g, true, rows_of(a, 256, L), {int32_t(L - 256)}, first.state, M - 4);
  CHECK(same_bytes(first.o, 0, alone.o, 0, 256 * H * D));
  CHECK(same_bytes(second.o, 0, alone.o, 256 * H * D, (L - 256) * H * D));
  CHECK(same_bytes(second.state, 0, alone.state, 0, per));
  CHECK(same_bytes(first.ck, 0, alone.ck, 0, 4 * per));
  CHECK(same_bytes(second.ck, 0, alone.ck, 4 * per, (M - 4) * per));

  // And it is the KDA recurrence's math (the CPU's, in fp32).
  Tensor ref_state = s0.clone(), ref_o = Tensor::zeros({L, H, D});
  bk.cpu->kda_recurrent({.q = a.q, .k = a.k, .v = a.v, .g = a.g, .beta = a.beta, .state = ref_state,
                         .slots = ints({0}), .cu_seqlens = cu_of({int32_t(L)}), .o = ref_o});
  expect_close(g, g.from_host(alone.o, DType::BF16), ref_o, tol("kda_out"), "invariant-mode o vs cpu");
  expect_close(g, g.from_host(alone.state, DType::F32), ref_state, tol("kda_state"), "invariant-mode state vs cpu");
  g.set_batch_invariant(false);
}

TEST_CASE("cuda kda row ranges: a range gives its rows' bits as a call of its own, nothing outside is written",
          "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(84);
  const std::vector<int32_t> lens{300, 0, 200};
  // [20, 276) of the first sequence, nothing of the empty one, [64, 200) of the third.
  const std::vector<int32_t> rows{20, 276, 300, 300, 364, 500};
  const Inputs in = make_inputs(rng, 500);
  const Tensor s0 = randn({3, H, D, D}, rng, 0.1f, false);
  const int64_t per = H * D * D, row = H * D;
  for (const bool invariant : {false, true}) {
    g.set_batch_invariant(invariant);
    for (const bool chunked : {true, false}) {
      INFO((chunked ? "kda_chunk" : "kda_recurrent") << (invariant ? ", batch-invariant" : ""));
      const Out got = run(g, chunked, in, lens, s0, 4, rows);
      // Sequence 0's range and sequence 2's rows as calls of their own.
      Tensor s_first = Tensor::zeros({1, H, D, D}), s_third = Tensor::zeros({1, H, D, D});
      std::memcpy(s_first.f32(), s0.f32(), size_t(per) * 4);
      std::memcpy(s_third.f32(), s0.f32() + 2 * per, size_t(per) * 4);
      const Out first = run(g, chunked, rows_of(in, 20, 276), {256}, s_first, 4);
      const Out third = run(g, chunked, rows_of(in, 364, 500), {136}, s_third, 4);
      CHECK(same_bytes(got.o, 20 * row, first.o, 0, 256 * row));
      CHECK(same_bytes(got.o, 364 * row, third.o, 0, 136 * row));
      CHECK(same_bytes(got.state, 0, first.state, 0, per));
      CHECK(same_bytes(got.state, 2 * per, third.state, 0, per));
      CHECK(same_bytes(got.state, per, s0, per, per));   // the empty sequence's state is as it was
      CHECK(same_bytes(got.ck, 0, first.ck, 0, 4 * per));
      CHECK(same_bytes(got.ck, 8 * per, third.ck, 0, 2 * per));
      // Rows outside every range keep their poison (poisoned() fills NaN).
      CHECK(all_nan(got.o, 0, 20 * row));
      CHECK(all_nan(got.o, 276 * row, 24 * row));
      CHECK(all_nan(got.o, 300 * row, 64 * row));
    }
  }
  g.set_batch_invariant(false);
  // A range outside its sequence is refused by name.
  CHECK_THROWS_WITH(run(g, true, in, lens, s0, 0, {0, 301, 300, 300, 300, 500}), Catch::Contains("seq_rows[0]"));
  CHECK_THROWS_WITH(run(g, false, in, lens, s0, 0, {0, 300, 300, 300, 299, 500}), Catch::Contains("seq_rows[2]"));
}

TEST_CASE("cuda kda_decode in batch-invariant mode gives the separate steps' bits", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  auto* cb = dynamic_cast<cuda::CudaBackend*>(bk.gpu.get());
  REQUIRE(cb != nullptr);
  g.set_batch_invariant(true);
  std::mt19937 rng(85);
  for (const int64_t hd : {int64_t(64), int64_t(128)})
    for (const KdaGateForm form : {KdaGateForm::LowerBoundedSigmoid, KdaGateForm::Softplus})
      for (const int64_t B : {int64_t(1), int64_t(7), int64_t(40)}) {
        const int64_t heads = 4, W = 4, P = heads * hd, slots = B + 3;
        INFO("D=" << hd << (form == KdaGateForm::Softplus ? " softplus" : " bounded sigmoid") << " B=" << B);
        ModelConfig cfg;
        cfg.kda.num_heads = int(heads);
        cfg.kda.head_dim = int(hd);
        cfg.kda.short_conv_kernel_size = int(W);
        cfg.kda.gate_form = form;
        LayerWeights lw;
        lw.conv_w = g.from_host(randn({3 * P, W}, rng, 0.5f, false), DType::F32);
        lw.a_log = g.from_host(randn({heads}, rng, 0.3f, false), DType::F32);
        lw.dt_bias = g.from_host(randn({P}, rng, 0.3f, false), DType::F32);
        const Tensor qkv = g.from_host(randn({B, 3 * P}, rng), DType::BF16);
        const Tensor f = g.from_host(randn({B, P}, rng), DType::BF16), blog = g.from_host(randn({B, heads}, rng), DType::BF16);
        const Tensor cache0 = randn({slots, W - 1, 3 * P}, rng), state0 = randn({slots, heads, hd, hd}, rng, 0.1f, false);
        std::vector<int32_t> ids(static_cast<size_t>(slots));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(static_cast<size_t>(B));
        const Tensor slot_t = g.from_host(ints(ids), DType::I32);
        struct Got {
          Tensor o, state, cache;
        };
        auto step = [&](bool fused) {
          cb->set_kda_decode_matches_steps(fused);
          REQUIRE(kda_takes_fused_decode(g, heads, hd) == fused);
          Tensor cache = g.from_host(cache0, DType::BF16), state = g.from_host(state0, DType::F32);
          Tensor o = poisoned(g, {B, heads, hd}, DType::BF16);
          run_kda_heads(g, {.cfg = cfg, .lw = lw, .heads = heads, .qkv = qkv, .f = f, .blog = blog, .conv_cache = cache,
                            .state = state, .slots = slot_t, .conv_slots = slot_t, .single_token_decode = true, .o = o,
                            .alloc = [&g](Shape sh, DType t) { return g.alloc(sh, t); }});
          return Got{g.to_host(o), g.to_host(state), g.to_host(cache)};
        };
        const Got steps = step(false), fused = step(true);
        CHECK(same_bytes(fused.o, 0, steps.o, 0, B * P));
        CHECK(same_bytes(fused.state, 0, steps.state, 0, slots * heads * hd * hd));
        CHECK(same_bytes(fused.cache, 0, steps.cache, 0, slots * (W - 1) * 3 * P));
      }
  cb->set_kda_decode_matches_steps(false);
  g.set_batch_invariant(false);
}
