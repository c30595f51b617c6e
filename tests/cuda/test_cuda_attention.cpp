// CUDA backend vs the CPU reference: short conv and KDA (gate, recurrence, chunked prefill for the
// bounded and the unbounded gate, decode step). Edge sizes: T = 1, T not a multiple of 64,
// sequences of length 0. (MLA and the LSE merge: test_cuda_mla.cpp.)
#include <algorithm>
#include <array>
#include <numeric>

#include "kernels/cuda/cuda_backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/tolerances.h"
#include "tests/kernels/softplus_gates.h"

using namespace k3;
using namespace k3::cudatest;

TEST_CASE("cuda short_conv matches cpu (varlen, empty sequence, cache update)", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(21);
  const std::vector<int32_t> lens = {5, 0, 70, 1, 2};
  const int64_t T = std::accumulate(lens.begin(), lens.end(), 0), C = 96, W = 4, slots_n = 7;
  Tensor x = randn({T, C}, rng), w = randn({C, W}, rng, 0.5f, false), cache = randn({slots_n, W - 1, C}, rng);
  Tensor slots = ints({6, 0, 3, 2, 5}), cu = cu_of(lens);
  Tensor gcache = g.from_host(cache, DType::BF16);
  Tensor y = Tensor::zeros({T, C});
  bk.cpu->short_conv({.x = x, .w = w, .cache = cache, .slots = slots, .cu_seqlens = cu, .y = y});
  Tensor gy = poisoned(g, {T, C}, DType::BF16);
  g.short_conv({.x = g.from_host(x, DType::BF16), .w = g.from_host(w, DType::F32), .cache = gcache,
                .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32), .y = gy});
  expect_close(g, gy, y, tol("short_conv"), "short_conv y");
  expect_close(g, gcache, cache, tol("short_conv"), "short_conv cache");
}

TEST_CASE("cuda kda_gate matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(22);
  const int64_t T = 13, H = 3, D = 128;
  Tensor f = randn({T, H * D}, rng, 2.f), a_log = randn({128}, rng, 0.5f, false), dt = randn({H * D}, rng, 0.5f, false);
  for (const ops::GateForm form : {ops::GateForm::LowerBoundedSigmoid, ops::GateForm::Softplus}) {
    Tensor out = Tensor::zeros({T, H, D});
    bk.cpu->kda_gate({.f = f, .a_log = a_log, .dt_bias = dt, .g = out, .heads = int(H), .g_min = -5.f, .form = form});
    Tensor gout = poisoned(g, {T, H, D}, DType::F32);
    g.kda_gate({.f = g.from_host(f, DType::BF16), .a_log = g.from_host(a_log, DType::F32),
                .dt_bias = g.from_host(dt, DType::F32), .g = gout, .heads = int(H), .g_min = -5.f, .form = form});
    expect_close(g, gout, out, tol("f32_math"), form == ops::GateForm::Softplus ? "kda_gate softplus" : "kda_gate");
  }
}

TEST_CASE("cuda kda chunked and recurrent match the cpu recurrence", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(23);
  // The head counts pick each scan shape of kda_chunk.cu on a 132-SM H200: 4·H·N scan blocks of
  // 32 rows <= 132 -> <32,4,3>, 160 -> <32,4,2>, 288 -> the wide grid (wgmma, 32-row blocks by default).
  struct Batch { std::vector<int32_t> lens; int64_t H; };
  const std::vector<Batch> batches = {{{1}, 2}, {{64}, 2}, {{100, 0, 129, 1}, 2}, {{300}, 2}, {{200}, 40},
                                      {{130, 70}, 36}};
  for (const auto& [lens, H] : batches) {
    const int64_t T = std::accumulate(lens.begin(), lens.end(), 0), D = 128;
    const int64_t N = int64_t(lens.size()), num_slots = N + 2;
    std::string tag = "H=" + std::to_string(H) + " lens=";
    for (int32_t l : lens) tag += std::to_string(l) + ",";
    Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
    normalise_heads(q, 1.f / std::sqrt(float(D)));
    normalise_heads(k, 1.f);
    Tensor gate = uniform({T, H, D}, rng, -5.f, -0.001f, false);
    Tensor beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
    Tensor state0 = randn({num_slots, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> slot_of(N);
    for (int64_t n = 0; n < N; ++n) slot_of[n] = int32_t(num_slots - 1 - n);
    Tensor slots = ints(slot_of), cu = cu_of(lens);
    Tensor ref_state = state0.clone();
    Tensor ref_o = Tensor::zeros({T, H, D});
    bk.cpu->kda_recurrent({.q = q, .k = k, .v = v, .g = gate, .beta = beta, .state = ref_state, .slots = slots,
                           .cu_seqlens = cu, .o = ref_o});
    for (bool chunked : {false, true}) {
      Tensor gstate = g.from_host(state0, DType::F32);
      Tensor go = poisoned(g, {T, H, D}, DType::BF16);
      ops::KdaParams p{.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16),
                       .v = g.from_host(v, DType::BF16), .g = g.from_host(gate, DType::F32),
                       .beta = g.from_host(beta, DType::F32), .state = gstate,
                       .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32), .o = go};
      if (chunked) g.kda_chunk(p);
      else g.kda_recurrent(p);
      const std::string name = std::string(chunked ? "kda_chunk " : "kda_recurrent ") + tag;
      expect_close(g, go, ref_o, tol(chunked ? "kda_out" : "kda_recurrent"), name + " o");
      expect_close(g, gstate, ref_state, tol(chunked ? "kda_state" : "kda_recurrent"), name + " state");
    }
  }
}

TEST_CASE("cuda kda_chunk with the unbounded softplus gate matches the cpu recurrence (gates down to -1e5)",
          "[cuda][kda_unbounded]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(26);
  // bounded_gate = false selects the run-sum variant of the chunked kernel's prep launch. Lengths at
  // and around the 16-row tiles and the 64-token chunk, varlen batches with empty and one-token
  // sequences; H = 40 and (2 x H = 36) also take the other two scan shapes (see the test above).
  // Gates: softplus-like over many magnitudes (Mixed), with a -1e4 spike every 23 tokens followed
  // by tiny gates (Spikes), a whole chunk at -1e4 then tiny ones (Wall), and K3's range (-5, 0)
  // through the same variant (Bounded).
  enum class Gates { Mixed, Spikes, Wall, Bounded };
  struct Case { std::vector<int32_t> lens; int64_t H; Gates gates; };
  const std::vector<Case> cases = {
      {{1}, 2, Gates::Mixed},        {{15}, 2, Gates::Spikes},    {{16}, 2, Gates::Mixed},
      {{17}, 2, Gates::Spikes},      {{63}, 2, Gates::Mixed},     {{64}, 2, Gates::Spikes},
      {{65}, 2, Gates::Mixed},       {{300}, 2, Gates::Spikes},   {{300}, 2, Gates::Mixed},
      {{192}, 2, Gates::Wall},       {{300}, 2, Gates::Bounded},  {{100, 0, 129, 1, 17, 64}, 2, Gates::Spikes},
      {{200}, 40, Gates::Mixed},     {{130, 70}, 36, Gates::Spikes}};
  double worst_o = 0, worst_s = 0;
  for (const auto& [lens, H, gates] : cases) {
    const int64_t T = std::accumulate(lens.begin(), lens.end(), 0), D = 128;
    const int64_t N = int64_t(lens.size()), num_slots = N + 1;
    std::string tag = "H=" + std::to_string(H) + " gates=" + std::to_string(int(gates)) + " lens=";
    for (int32_t l : lens) tag += std::to_string(l) + ",";
    Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
    normalise_heads(q, 1.f / std::sqrt(float(D)));
    normalise_heads(k, 1.f);
    Tensor gate = uniform({T, H, D}, rng, -5.f, -0.001f, false);
    if (gates == Gates::Mixed || gates == Gates::Spikes)
      k3::test::softplus_like_gates(gate, rng, T, H * D, gates == Gates::Spikes);
    if (gates == Gates::Wall)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H * D; ++j) gate.f32()[t * H * D + j] = t >= 64 && t < 128 ? -1e4f : -0.01f;
    Tensor beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
    Tensor state0 = randn({num_slots, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> slot_of(N);
    for (int64_t n = 0; n < N; ++n) slot_of[n] = int32_t(num_slots - 1 - n);
    Tensor slots = ints(slot_of), cu = cu_of(lens);
    Tensor ref_state = state0.clone(), ref_o = Tensor::zeros({T, H, D});
    bk.cpu->kda_recurrent({.q = q, .k = k, .v = v, .g = gate, .beta = beta, .state = ref_state, .slots = slots,
                           .cu_seqlens = cu, .o = ref_o});
    Tensor gstate = g.from_host(state0, DType::F32), go = poisoned(g, {T, H, D}, DType::BF16);
    g.kda_chunk({.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16), .v = g.from_host(v, DType::BF16),
                 .g = g.from_host(gate, DType::F32), .beta = g.from_host(beta, DType::F32), .state = gstate,
                 .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32), .o = go,
                 .bounded_gate = false});
    expect_close(g, go, ref_o, tol("kda_out"), "kda_chunk unbounded " + tag + " o");
    expect_close(g, gstate, ref_state, tol("kda_state"), "kda_chunk unbounded " + tag + " state");
    worst_o = std::max(worst_o, compare(g.to_host(go), ref_o).rel);
    worst_s = std::max(worst_s, compare(g.to_host(gstate), ref_state).rel);
  }
  WARN("kda_chunk, unbounded gate, vs the cpu recurrence, worst rel err: o " << worst_o << ", state " << worst_s);
}

TEST_CASE("cuda kda checkpoints match the cpu recurrence's (chunked kernel and token fallback)", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(25);
  // D = 128 takes the chunked kernel (interval 64: every chunk; 256: every 4th); D = 32 the token
  // kernel behind kda_chunk. Lengths: past one and several intervals, empty, exactly one chunk.
  // `softplus`: Kimi Linear's unbounded gates (with -1e4 spikes), through the chunked kernel's variant.
  struct Case { int64_t D, H; int interval; bool chunked; bool softplus = false; };
  const std::vector<int32_t> lens = {300, 0, 64, 129, 520};
  for (const Case cs : {Case{128, 3, 64, true}, Case{128, 40, 256, true}, Case{128, 3, 64, false}, Case{32, 2, 64, true},
                        Case{128, 3, 64, true, true}}) {
    const int64_t D = cs.D, H = cs.H, T = std::accumulate(lens.begin(), lens.end(), 0), N = int64_t(lens.size());
    const std::string tag = "D=" + std::to_string(D) + " H=" + std::to_string(H) + " interval=" +
                            std::to_string(cs.interval) + (cs.chunked ? " kda_chunk" : " kda_recurrent") +
                            (cs.softplus ? " softplus" : "");
    Tensor q = randn({T, H, D}, rng), k = randn({T, H, D}, rng), v = randn({T, H, D}, rng);
    normalise_heads(q, 1.f / std::sqrt(float(D)));
    normalise_heads(k, 1.f);
    Tensor gate = uniform({T, H, D}, rng, -5.f, -0.001f, false);
    if (cs.softplus) k3::test::softplus_like_gates(gate, rng, T, H * D, /*spikes=*/true);
    Tensor beta = uniform({T, H}, rng, 0.05f, 0.95f, false);
    Tensor state0 = randn({N, H, D, D}, rng, 0.1f, false);
    // Every reachable checkpoint gets a slot (shuffled), so the poisoned tensor must be fully written;
    // the table is one column wider than needed (its -1 entries are past every sequence's end).
    CheckpointTable ct = checkpoint_table(lens, cs.interval, /*extra_cols=*/1);
    const int64_t num = ct.num;
    std::vector<int32_t> perm(static_cast<size_t>(num));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (auto& e : ct.slots) e = e < 0 ? e : perm[size_t(e)];
    Tensor tbl = Tensor::from_i32({N, ct.M}, ct.slots), slots = ints({4, 3, 2, 1, 0}), cu = cu_of(lens);
    Tensor ref_state = state0.clone(), ref_o = Tensor::zeros({T, H, D}), ref_ck = Tensor::zeros({num, H, D, D});
    bk.cpu->kda_recurrent({.q = q, .k = k, .v = v, .g = gate, .beta = beta, .state = ref_state, .slots = slots,
                           .cu_seqlens = cu, .o = ref_o, .checkpoints = ref_ck, .checkpoint_slots = tbl,
                           .checkpoint_interval = cs.interval});
    Tensor gstate = g.from_host(state0, DType::F32), go = poisoned(g, {T, H, D}, DType::BF16);
    Tensor gck = poisoned(g, {num, H, D, D}, DType::F32);
    ops::KdaParams p{.q = g.from_host(q, DType::BF16), .k = g.from_host(k, DType::BF16), .v = g.from_host(v, DType::BF16),
                     .g = g.from_host(gate, DType::F32), .beta = g.from_host(beta, DType::F32), .state = gstate,
                     .slots = g.from_host(slots, DType::I32), .cu_seqlens = g.from_host(cu, DType::I32), .o = go,
                     .checkpoints = gck, .checkpoint_slots = g.from_host(tbl, DType::I32),
                     .checkpoint_interval = cs.interval, .bounded_gate = !cs.softplus};
    if (cs.chunked) g.kda_chunk(p);
    else g.kda_recurrent(p);
    const bool fast = cs.chunked && D == 128;
    expect_close(g, gck, ref_ck, tol(fast ? "kda_state" : "kda_recurrent"), "checkpoints " + tag);
    expect_close(g, go, ref_o, tol(fast ? "kda_out" : "kda_recurrent"), "o " + tag);
    expect_close(g, gstate, ref_state, tol(fast ? "kda_state" : "kda_recurrent"), "state " + tag);
  }
  // Refused by name before any launch.
  Tensor z = g.from_host(Tensor::zeros({64, 1, 128}), DType::BF16), zf = g.from_host(Tensor::zeros({64, 1, 128}), DType::F32);
  ops::KdaParams bad{.q = z, .k = z, .v = z, .g = zf, .beta = g.from_host(Tensor::zeros({64, 1}), DType::F32),
                     .state = g.from_host(Tensor::zeros({1, 1, 128, 128}), DType::F32), .slots = g.from_host(ints({0}), DType::I32),
                     .cu_seqlens = g.from_host(ints({0, 64}), DType::I32), .o = poisoned(g, {64, 1, 128}, DType::BF16),
                     .checkpoints = g.from_host(Tensor::zeros({1, 1, 128, 128}), DType::F32),
                     .checkpoint_slots = Tensor::from_i32({1, 1}, std::vector<int32_t>{0}), .checkpoint_interval = 32};
  CHECK_THROWS_WITH(g.kda_chunk(bad), Catch::Matchers::Contains("checkpoint_interval must be a positive multiple of 64"));
  bad.checkpoint_interval = 64;
  bad.checkpoint_slots = Tensor::from_i32({1, 1}, std::vector<int32_t>{1});
  CHECK_THROWS_WITH(g.kda_chunk(bad), Catch::Matchers::Contains("checkpoint_slots entry 0 = 1 is outside [0, 1)"));
}

TEST_CASE("cuda kda_decode matches cpu (conv + gate + delta rule, per-request slots)", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(24);
  // (B, H) = (3, 2): fewer blocks than SMs; (40, 32): several waves of one block per item.
  for (auto [B, H, D] : std::vector<std::array<int64_t, 3>>{{3, 2, 64}, {3, 2, 128}, {40, 32, 64}, {40, 32, 128}}) {
    const int64_t W = 4, P = H * D, num_slots = B + 2;
    Tensor qkv = randn({B, 3 * P}, rng), conv_w = randn({3 * P, W}, rng, 0.5f, false);
    Tensor conv_cache = randn({num_slots, W - 1, 3 * P}, rng);
    Tensor f = randn({B, P}, rng), a_log = randn({H}, rng, 0.3f, false), dt = randn({P}, rng, 0.3f, false);
    Tensor b = randn({B, H}, rng);
    Tensor state = randn({num_slots, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> slot_ids(B);
    std::iota(slot_ids.begin(), slot_ids.end(), 0);
    std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
    for (auto& id : slot_ids) id = id == 1 ? int32_t(B + 1) : id;  // slot 1 stays unused
    Tensor slots = ints(slot_ids);
    Tensor gcache = g.from_host(conv_cache, DType::BF16), gstate = g.from_host(state, DType::F32);
    Tensor o = Tensor::zeros({B, H, D});
    bk.cpu->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = conv_cache, .f = f, .a_log = a_log,
                        .dt_bias = dt, .b = b, .state = state, .slots = slots, .o = o, .heads = int(H)});
    Tensor go = poisoned(g, {B, H, D}, DType::BF16);
    g.kda_decode({.qkv = g.from_host(qkv, DType::BF16), .conv_w = g.from_host(conv_w, DType::F32),
                  .conv_cache = gcache, .f = g.from_host(f, DType::BF16), .a_log = g.from_host(a_log, DType::F32),
                  .dt_bias = g.from_host(dt, DType::F32), .b = g.from_host(b, DType::BF16), .state = gstate,
                  .slots = g.from_host(slots, DType::I32), .o = go, .heads = int(H)});
    const std::string tag = " B=" + std::to_string(B) + " H=" + std::to_string(H) + " D=" + std::to_string(D);
    expect_close(g, go, o, tol("kda_decode"), "kda_decode o" + tag);
    expect_close(g, gstate, state, tol("kda_decode"), "kda_decode state" + tag);
    expect_close(g, gcache, conv_cache, tol("kda_decode"), "kda_decode conv cache" + tag);
  }
}

// A unified cache region (engine/cache_region.h) gives a request a conv row apart from its state row, in
// pools of different row counts: the kernel must read and write the conv window at conv_slots[b].
TEST_CASE("cuda kda_decode with conv rows apart from state rows matches cpu", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  auto& g = *bk.gpu;
  std::mt19937 rng(25);
  for (auto [B, H, D] : std::vector<std::array<int64_t, 3>>{{3, 2, 64}, {40, 32, 128}}) {
    const int64_t W = 4, P = H * D, state_rows = B + 2, conv_rows = 2 * B + 3;
    Tensor qkv = randn({B, 3 * P}, rng), conv_w = randn({3 * P, W}, rng, 0.5f, false);
    Tensor conv_cache = randn({conv_rows, W - 1, 3 * P}, rng);
    Tensor f = randn({B, P}, rng), a_log = randn({H}, rng, 0.3f, false), dt = randn({P}, rng, 0.3f, false);
    Tensor b = randn({B, H}, rng);
    Tensor state = randn({state_rows, H, D, D}, rng, 0.1f, false);
    std::vector<int32_t> state_ids(state_rows), conv_ids(conv_rows);
    std::iota(state_ids.begin(), state_ids.end(), 0);
    std::iota(conv_ids.begin(), conv_ids.end(), 0);
    std::shuffle(state_ids.begin(), state_ids.end(), rng);
    std::shuffle(conv_ids.begin(), conv_ids.end(), rng);
    state_ids.resize(B);
    conv_ids.resize(B);
    Tensor slots = ints(state_ids), conv_slots = ints(conv_ids);
    Tensor gcache = g.from_host(conv_cache, DType::BF16), gstate = g.from_host(state, DType::F32);
    Tensor o = Tensor::zeros({B, H, D});
    bk.cpu->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = conv_cache, .f = f, .a_log = a_log,
                        .dt_bias = dt, .b = b, .state = state, .slots = slots, .conv_slots = conv_slots, .o = o,
                        .heads = int(H)});
    Tensor go = poisoned(g, {B, H, D}, DType::BF16);
    g.kda_decode({.qkv = g.from_host(qkv, DType::BF16), .conv_w = g.from_host(conv_w, DType::F32),
                  .conv_cache = gcache, .f = g.from_host(f, DType::BF16), .a_log = g.from_host(a_log, DType::F32),
                  .dt_bias = g.from_host(dt, DType::F32), .b = g.from_host(b, DType::BF16), .state = gstate,
                  .slots = g.from_host(slots, DType::I32), .conv_slots = g.from_host(conv_slots, DType::I32), .o = go,
                  .heads = int(H)});
    const std::string tag = " B=" + std::to_string(B) + " H=" + std::to_string(H) + " D=" + std::to_string(D);
    expect_close(g, go, o, tol("kda_decode"), "kda_decode conv_slots o" + tag);
    expect_close(g, gstate, state, tol("kda_decode"), "kda_decode conv_slots state" + tag);
    expect_close(g, gcache, conv_cache, tol("kda_decode"), "kda_decode conv_slots conv cache" + tag);
  }
}
