// KDA: the token recurrence against the matrix form of docs/MODEL.md §2.3 (double), the chunked WY form
// against the recurrence, the fused decode step against its unfused composition, and the gate.
//
// Error measures: outputs: max|o_chunk - o_rec| / max|o_rec| over the whole output tensor;
// state: ||S_chunk - S_rec||_F / ||S_rec||_F for every (slot, head) matrix of the batch.
#include <catch2/catch.hpp>
#include <numeric>

#include "tests/kernels/kda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;


TEST_CASE("kda_recurrent equals the matrix recurrence S_t = (I - b k k^T) Diag(a) S + b k v^T in double") {
  std::mt19937 rng(11);
  auto be = cpu_backend(2);
  KdaCase c = make_case(rng, {9, 4}, {1, 0}, 2, 2, 5, 3, true, -5.f, 0.f);
  Tensor state = c.state.clone(), o = Tensor::zeros({c.T, c.H, c.V});
  be->kda_recurrent(params(c, state, o));
  const int64_t K = c.K, V = c.V, H = c.H;
  for (int n = 0; n < 2; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int slot = c.slots.i32()[n];
      std::vector<double> S(K * V);  // S[i][j], i over k, j over v
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) S[i * V + j] = c.state.f32()[((slot * H + h) * V + j) * K + i];
      for (int t = c.cu.i32()[n]; t < c.cu.i32()[n + 1]; ++t) {
        const float* k = c.k.f32() + (t * H + h) * K;
        const float* q = c.q.f32() + (t * H + h) * K;
        const float* v = c.v.f32() + (t * H + h) * V;
        const float* g = c.g.f32() + (t * H + h) * K;
        const double b = c.beta.f32()[t * H + h];
        std::vector<double> DS(K * V), next(K * V);
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) DS[i * V + j] = std::exp(double(g[i])) * S[i * V + j];
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) {
            double kkDS = 0;
            for (int64_t l = 0; l < K; ++l) kkDS += double(k[i]) * k[l] * DS[l * V + j];
            next[i * V + j] = DS[i * V + j] - b * kkDS + b * k[i] * v[j];
          }
        S = next;
        for (int64_t j = 0; j < V; ++j) {
          double oj = 0;
          for (int64_t i = 0; i < K; ++i) oj += S[i * V + j] * q[i];
          CHECK(o.f32()[(t * H + h) * V + j] == Approx(oj).margin(1e-5));
        }
      }
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j)
          CHECK(state.f32()[((slot * H + h) * V + j) * K + i] == Approx(S[i * V + j]).margin(1e-5));
    }
}

TEST_CASE("kda_chunk equals kda_recurrent (outputs and final state)") {
  auto be = cpu_backend(2);
  double worst_o = 0, worst_s = 0;
  for (int T : {1, 63, 64, 65, 300})
    for (int C : {16, 32, 64})
      for (bool random_state : {false, true})
        for (auto [g_lo, g_hi] : {std::pair{-5.f, 0.f}, {-0.05f, 0.f}}) {
          std::mt19937 rng(T * 1000 + C * 10 + random_state);
          KdaCase c = make_case(rng, {T}, {1}, 2, 2, 16, 12, random_state, g_lo, g_hi);
          Tensor s_rec = c.state.clone(), o_rec = Tensor::zeros({c.T, c.H, c.V});
          Tensor s_chk = c.state.clone(), o_chk = Tensor::zeros({c.T, c.H, c.V});
          be->kda_recurrent(params(c, s_rec, o_rec));
          be->kda_chunk(params(c, s_chk, o_chk, C));
          INFO("T=" << T << " C=" << C << " random_state=" << random_state << " g in [" << g_lo << ", " << g_hi << "]");
          const double eo = rel_err(o_chk, o_rec), es = worst_state_err(s_chk, s_rec, 2 * c.H, c.V * c.K);
          worst_o = std::max(worst_o, eo), worst_s = std::max(worst_s, es);
          CHECK(eo <= 1e-5);
          CHECK(es <= 1e-5);
          // The untouched slot keeps its bytes.
          CHECK(std::memcmp(s_chk.f32(), c.state.f32(), c.H * c.V * c.K * 4) == 0);
        }
  WARN("kda_chunk vs kda_recurrent, worst over all cases: output " << worst_o << ", state " << worst_s);
}

TEST_CASE("kda_chunk equals kda_recurrent at model head sizes (K = V = 64, 128), T = 300") {
  auto be = cpu_backend(2);
  for (int K : {64, 128})
  for (auto [g_lo, g_hi] : {std::pair{-5.f, 0.f}, {-0.005f, 0.f}})
  for (bool rs : {false, true}) {
    std::mt19937 rng(K + rs);
    KdaCase c = make_case(rng, {300}, {0}, 1, 2, K, K, rs, g_lo, g_hi);
    Tensor s_rec = c.state.clone(), o_rec = Tensor::zeros({c.T, c.H, c.V});
    Tensor s_chk = c.state.clone(), o_chk = Tensor::zeros({c.T, c.H, c.V});
    be->kda_recurrent(params(c, s_rec, o_rec));
    be->kda_chunk(params(c, s_chk, o_chk, 64));
    INFO("K=" << K << " g_lo=" << g_lo << " random_state=" << rs);
    CHECK(rel_err(o_chk, o_rec) <= 1e-5);
    CHECK(worst_state_err(s_chk, s_rec, c.H, c.V * c.K) <= 1e-5);
  }
}

TEST_CASE("kda_chunk on a varlen batch with distinct slots equals kda_recurrent") {
  auto be = cpu_backend(3);
  std::mt19937 rng(12);
  for (int C : {16, 64}) {
    KdaCase c = make_case(rng, {70, 1, 0, 129, 16}, {3, 0, 5, 1, 4}, 6, 3, 32, 16, true, -5.f, 0.f);
    Tensor s_rec = c.state.clone(), o_rec = Tensor::zeros({c.T, c.H, c.V});
    Tensor s_chk = c.state.clone(), o_chk = Tensor::zeros({c.T, c.H, c.V});
    be->kda_recurrent(params(c, s_rec, o_rec));
    be->kda_chunk(params(c, s_chk, o_chk, C));
    CHECK(rel_err(o_chk, o_rec) <= 1e-5);
    CHECK(worst_state_err(s_chk, s_rec, 6 * c.H, c.V * c.K) <= 1e-5);
    // A zero-length sequence leaves its slot exactly as it was; slot 2 is not in the batch.
    for (int slot : {5, 2})
      CHECK(std::memcmp(s_chk.f32() + slot * c.H * c.V * c.K, c.state.f32() + slot * c.H * c.V * c.K,
                        c.H * c.V * c.K * 4) == 0);
  }
}

TEST_CASE("kda_chunk over two calls (prefix then rest) equals one call") {
  auto be = cpu_backend(2);
  std::mt19937 rng(13);
  KdaCase c = make_case(rng, {100}, {0}, 1, 2, 16, 16, true, -5.f, 0.f);
  Tensor s_one = c.state.clone(), o_one = Tensor::zeros({c.T, c.H, c.V});
  be->kda_chunk(params(c, s_one, o_one, 32));
  Tensor s_two = c.state.clone(), o_two = Tensor::zeros({c.T, c.H, c.V});
  for (auto [b, e] : {std::pair{0, 37}, {37, 100}}) {
    KdaCase part = c;
    part.q = c.q.slice_rows(b, e), part.k = c.k.slice_rows(b, e), part.v = c.v.slice_rows(b, e);
    part.g = c.g.slice_rows(b, e), part.beta = c.beta.slice_rows(b, e);
    part.cu = i32({2}, {0, e - b});
    be->kda_chunk(params(part, s_two, o_two.slice_rows(b, e), 32));
  }
  CHECK(rel_err(o_two, o_one) <= 1e-5);
  CHECK(worst_state_err(s_two, s_one, c.H, c.V * c.K) <= 1e-5);
}

TEST_CASE("kda_gate is g_min * sigmoid(exp(A_log[h]) * (f + dt_bias)) using the first `heads` A_log values") {
  auto be = cpu_backend(2);
  std::mt19937 rng(14);
  const int64_t T = 5, H = 3, D = 4;
  Tensor f = randn({T, H * D}, rng, 3.f), a_log = randn({8}, rng), dt = randn({H * D}, rng);
  Tensor g = Tensor::zeros({T, H, D});
  be->kda_gate({.f = f, .a_log = a_log, .dt_bias = dt, .g = g, .heads = H, .g_min = -5.f});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) {
        const double x = std::exp(double(a_log.f32()[h])) * (f.f32()[t * H * D + h * D + i] + dt.f32()[h * D + i]);
        const double ref = -5.0 / (1.0 + std::exp(-x));
        const float got = g.f32()[(t * H + h) * D + i];
        CHECK(got == Approx(ref).epsilon(1e-6));
        CHECK(got < 0.f);
        CHECK(got > -5.f);
      }
}

TEST_CASE("kda_gate's softplus form is -exp(A_log[h]) * softplus(f + dt_bias), unbounded below") {
  auto be = cpu_backend(2);
  std::mt19937 rng(16);
  const int64_t T = 5, H = 3, D = 4;
  Tensor f = randn({T, H * D}, rng, 15.f), a_log = randn({H}, rng), dt = randn({H * D}, rng);
  Tensor g = Tensor::zeros({T, H, D});
  be->kda_gate({.f = f, .a_log = a_log, .dt_bias = dt, .g = g, .heads = H, .form = ops::GateForm::Softplus});
  bool below_k3_bound = false;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) {
        const double x = double(f.f32()[t * H * D + h * D + i]) + dt.f32()[h * D + i];
        const double ref = -std::exp(double(a_log.f32()[h])) * std::log1p(std::exp(x));
        const float got = g.f32()[(t * H + h) * D + i];
        CHECK(got == Approx(ref).epsilon(1e-5));
        CHECK(got < 0.f);
        below_k3_bound |= got < -5.f;
      }
  CHECK(below_k3_bound);  // the inputs reach past K3's lower bound: nothing clamps them
}

TEST_CASE("kda_decode equals conv + l2norm + gate + sigmoid + one recurrence step, over two steps") {
  auto be = cpu_backend(2);
  std::mt19937 rng(15);
  const int64_t B = 3, H = 2, D = 8, W = 4, P = H * D, C = 3 * P, slots_n = 4;
  Tensor conv_w = randn({C, W}, rng, 0.5f), a_log = randn({5}, rng, 0.3f), dt = randn({P}, rng);
  Tensor cache0 = randn({slots_n, W - 1, C}, rng), state0 = randn({slots_n, H, D, D}, rng, 0.3f);
  Tensor slots = i32({B}, {2, 0, 3});
  Tensor cache_f = cache0.clone(), state_f = cache0.clone();
  state_f = state0.clone();
  Tensor cache_r = cache0.clone(), state_r = state0.clone();
  for (int step = 0; step < 2; ++step) {
    Tensor qkv = randn({B, C}, rng), f = randn({B, P}, rng), b = randn({B, H}, rng);
    Tensor o_f = Tensor::zeros({B, H, D});
    be->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = cache_f, .f = f, .a_log = a_log, .dt_bias = dt,
                    .b = b, .state = state_f, .slots = slots, .o = o_f, .heads = H, .g_min = -5.f});
    // Reference composition.
    Tensor cu = i32({B + 1}, {0, 1, 2, 3}), conv = Tensor::zeros({B, C});
    be->short_conv({.x = qkv, .w = conv_w, .cache = cache_r, .slots = slots, .cu_seqlens = cu, .y = conv});
    Tensor q = Tensor::zeros({B * H, D}), k = Tensor::zeros({B * H, D}), v = Tensor::zeros({B, H, D});
    for (int64_t r = 0; r < B; ++r) {
      std::memcpy(q.f32() + r * P, conv.f32() + r * C, P * 4);
      std::memcpy(k.f32() + r * P, conv.f32() + r * C + P, P * 4);
      std::memcpy(v.f32() + r * P, conv.f32() + r * C + 2 * P, P * 4);
    }
    be->l2norm({.x = q, .y = q, .eps = 1e-6f, .scale = 1.f / std::sqrt(float(D))});
    be->l2norm({.x = k, .y = k, .eps = 1e-6f, .scale = 1.f});
    Tensor g = Tensor::zeros({B, H, D}), beta = Tensor::zeros({B, H});
    be->kda_gate({.f = f, .a_log = a_log, .dt_bias = dt, .g = g, .heads = H, .g_min = -5.f});
    be->sigmoid(b, beta);
    Tensor o_r = Tensor::zeros({B, H, D});
    be->kda_recurrent({.q = q.reshape({B, H, D}), .k = k.reshape({B, H, D}), .v = v, .g = g, .beta = beta,
                       .state = state_r, .slots = slots, .cu_seqlens = cu, .o = o_r});
    INFO("step " << step);
    CHECK(rel_err(o_f, o_r) <= 1e-6);
    CHECK(rel_err(state_f, state_r) <= 1e-6);
    CHECK(bitwise_equal(cache_f, cache_r));
  }
}

// A unified cache region lays conv windows and states out at different strides, so a request's conv row
// and state row differ (ops.h KdaDecodeParams::conv_slots). The same requests at other rows must give the
// bits of the call with one slot per request (conv_slots empty), and leave the other rows alone.
TEST_CASE("kda_decode with conv_slots apart from the state rows equals the call with one slot per request") {
  auto be = cpu_backend(2);
  std::mt19937 rng(17);
  const int64_t B = 3, H = 2, D = 8, W = 4, P = H * D, C = 3 * P, slots_n = 4, conv_n = 6;
  const std::vector<int32_t> slot_ids{2, 0, 3}, state_ids{1, 3, 0}, conv_ids{5, 1, 4};
  Tensor conv_w = randn({C, W}, rng, 0.5f), a_log = randn({H}, rng, 0.3f), dt = randn({P}, rng);
  Tensor cache_a = randn({slots_n, W - 1, C}, rng), state_a = randn({slots_n, H, D, D}, rng, 0.3f);
  // The same requests' windows and states at their own rows of differently sized pools.
  Tensor cache_b = randn({conv_n, W - 1, C}, rng), state_b = randn({slots_n, H, D, D}, rng, 0.3f);
  for (int64_t i = 0; i < B; ++i) {
    Tensor cb = cache_b.slice_rows(conv_ids[i], conv_ids[i] + 1), sb = state_b.slice_rows(state_ids[i], state_ids[i] + 1);
    be->copy(cache_a.slice_rows(slot_ids[i], slot_ids[i] + 1), cb);
    be->copy(state_a.slice_rows(slot_ids[i], slot_ids[i] + 1), sb);
  }
  const Tensor cache_b0 = cache_b.clone();
  Tensor cache_c = cache_a.clone(), state_c = state_a.clone();   // conv_slots given equal to slots
  Tensor slots = i32({B}, slot_ids);
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    Tensor qkv = randn({B, C}, rng), f = randn({B, P}, rng), b = randn({B, H}, rng);
    Tensor o_a = Tensor::zeros({B, H, D}), o_b = Tensor::zeros({B, H, D}), o_c = Tensor::zeros({B, H, D});
    be->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = cache_a, .f = f, .a_log = a_log, .dt_bias = dt,
                    .b = b, .state = state_a, .slots = slots, .o = o_a, .heads = H, .g_min = -5.f});
    be->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = cache_b, .f = f, .a_log = a_log, .dt_bias = dt,
                    .b = b, .state = state_b, .slots = i32({B}, state_ids), .conv_slots = i32({B}, conv_ids), .o = o_b,
                    .heads = H, .g_min = -5.f});
    be->kda_decode({.qkv = qkv, .conv_w = conv_w, .conv_cache = cache_c, .f = f, .a_log = a_log, .dt_bias = dt,
                    .b = b, .state = state_c, .slots = slots, .conv_slots = slots, .o = o_c, .heads = H, .g_min = -5.f});
    CHECK(bitwise_equal(o_a, o_b));
    CHECK(bitwise_equal(o_a, o_c));
    CHECK(bitwise_equal(cache_a, cache_c));
    CHECK(bitwise_equal(state_a, state_c));
    for (int64_t i = 0; i < B; ++i) {
      CHECK(bitwise_equal(cache_a.slice_rows(slot_ids[i], slot_ids[i] + 1), cache_b.slice_rows(conv_ids[i], conv_ids[i] + 1)));
      CHECK(bitwise_equal(state_a.slice_rows(slot_ids[i], slot_ids[i] + 1), state_b.slice_rows(state_ids[i], state_ids[i] + 1)));
    }
  }
  for (int64_t r : {0, 2, 3})   // conv rows no request names are untouched
    CHECK(bitwise_equal(cache_b.slice_rows(r, r + 1), cache_b0.slice_rows(r, r + 1)));
}

TEST_CASE("kda_decode rejects a state row outside the state pool when conv_slots are given apart") {
  auto be = cpu_backend(1);
  std::mt19937 rng(18);
  const int64_t B = 1, H = 1, D = 4, W = 4, P = H * D, C = 3 * P;
  Tensor cache = randn({6, W - 1, C}, rng), state = randn({2, H, D, D}, rng);
  Tensor o = Tensor::zeros({B, H, D});
  CHECK_THROWS(be->kda_decode({.qkv = randn({B, C}, rng), .conv_w = randn({C, W}, rng), .conv_cache = cache,
                               .f = randn({B, P}, rng), .a_log = randn({H}, rng), .dt_bias = randn({P}, rng),
                               .b = randn({B, H}, rng), .state = state, .slots = i32({B}, {5}),
                               .conv_slots = i32({B}, {5}), .o = o, .heads = H, .g_min = -5.f}));
}

namespace {

// The unfused KDA prefill path of docs/MODEL.md §8.1 (K2-K6) for one sequence in `slot`:
// short_conv on q|k|v, per-head L2 norms, gate, sigmoid(b), kda_chunk. Returns o [T, H, D].
Tensor kda_prefill(Backend& be, const Tensor& qkv, const Tensor& f, const Tensor& b, const Tensor& conv_w,
                   const Tensor& a_log, const Tensor& dt, Tensor& cache, Tensor& state, int slot, int64_t H, int chunk) {
  const int64_t T = qkv.dim(0), C = qkv.dim(1), P = C / 3, D = P / H;
  Tensor slots = i32({1}, {slot}), cu = i32({2}, {0, int32_t(T)});
  Tensor conv = Tensor::zeros({T, C});
  be.short_conv({.x = qkv, .w = conv_w, .cache = cache, .slots = slots, .cu_seqlens = cu, .y = conv});
  Tensor q = Tensor::zeros({T * H, D}), k = Tensor::zeros({T * H, D}), v = Tensor::zeros({T, H, D});
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(q.f32() + t * P, conv.f32() + t * C, P * 4);
    std::memcpy(k.f32() + t * P, conv.f32() + t * C + P, P * 4);
    std::memcpy(v.f32() + t * P, conv.f32() + t * C + 2 * P, P * 4);
  }
  be.l2norm({.x = q, .y = q, .eps = 1e-6f, .scale = 1.f / std::sqrt(float(D))});
  be.l2norm({.x = k, .y = k, .eps = 1e-6f, .scale = 1.f});
  Tensor g = Tensor::zeros({T, H, D}), beta = Tensor::zeros({T, H}), o = Tensor::zeros({T, H, D});
  be.kda_gate({.f = f, .a_log = a_log, .dt_bias = dt, .g = g, .heads = int(H), .g_min = -5.f});
  be.sigmoid(b, beta);
  be.kda_chunk({.q = q.reshape({T, H, D}), .k = k.reshape({T, H, D}), .v = v, .g = g, .beta = beta, .state = state,
                .slots = slots, .cu_seqlens = cu, .o = o, .chunk_size = chunk});
  return o;
}

}  // namespace

TEST_CASE("T-token prefill then one kda_decode step equals a (T+1)-token prefill (conv cache and state carry)") {
  auto be = cpu_backend(2);
  std::mt19937 rng(16);
  const int64_t H = 2, D = 16, P = H * D, C = 3 * P, W = 4;
  Tensor conv_w = randn({C, W}, rng, 0.5f), a_log = randn({H}, rng, 0.3f), dt = randn({P}, rng);
  for (int64_t T : {1, 2, 70}) {
    Tensor qkv = randn({T + 1, C}, rng), f = randn({T + 1, P}, rng), b = randn({T + 1, H}, rng);
    Tensor cache_full = Tensor::zeros({2, W - 1, C}), state_full = Tensor::zeros({2, H, D, D});
    Tensor o_full = kda_prefill(*be, qkv, f, b, conv_w, a_log, dt, cache_full, state_full, 1, H, 32);

    Tensor cache = Tensor::zeros({2, W - 1, C}), state = Tensor::zeros({2, H, D, D});
    kda_prefill(*be, qkv.slice_rows(0, T), f.slice_rows(0, T), b.slice_rows(0, T), conv_w, a_log, dt, cache, state, 1, H, 32);
    Tensor o = Tensor::zeros({1, H, D});
    be->kda_decode({.qkv = qkv.slice_rows(T, T + 1), .conv_w = conv_w, .conv_cache = cache, .f = f.slice_rows(T, T + 1),
                    .a_log = a_log, .dt_bias = dt, .b = b.slice_rows(T, T + 1), .state = state, .slots = i32({1}, {1}),
                    .o = o, .heads = H});
    INFO("T=" << T);
    CHECK(rel_err(o, o_full.slice_rows(T, T + 1)) <= 1e-5);
    CHECK(rel_err(state, state_full) <= 1e-5);
    CHECK(bitwise_equal(cache, cache_full));
  }
}
