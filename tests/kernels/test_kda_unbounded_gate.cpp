// kda_chunk against the per-token recurrence with Kimi Linear's unbounded softplus gate,
// g = -exp(A_log) * softplus(f + dt_bias): gates from ~0 down to -1e5, single very negative gates
// followed by tiny ones (where a chunk form that subtracts cumulative sums loses its precision), and
// whole chunks of them (where one that forms e^{-Γ} overflows). The chunk form must stay finite and
// equal the recurrence as closely as it does for K3's bounded gate.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "tests/kernels/kda_test_util.h"
#include "tests/kernels/softplus_gates.h"

using namespace k3;
using namespace k3::test;

TEST_CASE("kda_chunk equals kda_recurrent with unbounded softplus gates, very negative ones included") {
  auto be = cpu_backend(2);
  double worst_o = 0, worst_s = 0;
  for (int T : {1, 17, 64, 65, 200})
    for (int C : {16, 64})
      for (int64_t D : {16, 64})
        for (bool spikes : {false, true}) {
          std::mt19937 rng(T * 100 + C + D + spikes);
          KdaCase c = make_case(rng, {T}, {0}, 1, 2, D, D, /*random_state=*/true, -1.f, 0.f);
          softplus_like_gates(c.g, rng, c.T, c.H * c.K, spikes);
          Tensor s_rec = c.state.clone(), o_rec = Tensor::zeros({c.T, c.H, c.V});
          Tensor s_chk = c.state.clone(), o_chk = Tensor::zeros({c.T, c.H, c.V});
          be->kda_recurrent(params(c, s_rec, o_rec));
          be->kda_chunk(params(c, s_chk, o_chk, C));
          INFO("T=" << T << " C=" << C << " D=" << D << " spikes=" << spikes);
          bool finite = true;
          for (int64_t i = 0; i < o_chk.numel(); ++i) finite = finite && std::isfinite(o_chk.f32()[i]);
          for (int64_t i = 0; i < s_chk.numel(); ++i) finite = finite && std::isfinite(s_chk.f32()[i]);
          REQUIRE(finite);
          const double eo = rel_err(o_chk, o_rec), es = worst_state_err(s_chk, s_rec, c.H, c.V * c.K);
          worst_o = std::max(worst_o, eo), worst_s = std::max(worst_s, es);
          CHECK(eo <= 1e-5);
          CHECK(es <= 1e-5);
        }
  WARN("kda_chunk vs kda_recurrent, softplus gates, worst: output " << worst_o << ", state " << worst_s);
}

TEST_CASE("kda_chunk with a whole chunk of gates at -1e4 decays the state to exactly what the recurrence leaves") {
  auto be = cpu_backend(1);
  std::mt19937 rng(5);
  KdaCase c = make_case(rng, {128}, {0}, 1, 1, 16, 16, /*random_state=*/true, -1.f, 0.f);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 0; i < c.K; ++i) c.g.f32()[t * c.K + i] = t < 64 ? -1e4f : -0.01f;
  Tensor s_rec = c.state.clone(), o_rec = Tensor::zeros({c.T, c.H, c.V});
  Tensor s_chk = c.state.clone(), o_chk = Tensor::zeros({c.T, c.H, c.V});
  be->kda_recurrent(params(c, s_rec, o_rec));
  be->kda_chunk(params(c, s_chk, o_chk, 64));
  CHECK(rel_err(o_chk, o_rec) <= 1e-5);
  CHECK(worst_state_err(s_chk, s_rec, c.H, c.V * c.K) <= 1e-5);
}
