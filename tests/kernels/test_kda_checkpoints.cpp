// KDA state checkpoints (ops::KdaParams::checkpoint_*): every checkpoint kda_recurrent and
// kda_chunk write equals the state the token recurrence reaches when run on that sequence's prefix
// alone, from the same initial state; slots that must not be written (entry -1, past the table's
// width, past the sequence's end) keep their poison; outputs and final states do not change; bad
// tables are refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/kernels/kda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {

// The recurrence over the first `done` tokens of sequence n alone, from its initial state.
Tensor prefix_state(Backend& be, const KdaCase& c, const std::vector<int32_t>& lens, int n, int done) {
  int32_t t0 = 0;
  for (int i = 0; i < n; ++i) t0 += lens[i];
  KdaCase one = c;
  one.q = c.q.slice_rows(t0, t0 + done), one.k = c.k.slice_rows(t0, t0 + done), one.v = c.v.slice_rows(t0, t0 + done);
  one.g = c.g.slice_rows(t0, t0 + done), one.beta = c.beta.slice_rows(t0, t0 + done);
  one.cu = i32({2}, {0, done});
  one.slots = i32({1}, {0});
  const int64_t per = c.H * c.V * c.K;
  Tensor s = Tensor::zeros({1, c.H, c.V, c.K});
  std::memcpy(s.f32(), c.state.f32() + int64_t(c.slots.i32()[n]) * per, size_t(per) * 4);
  be.kda_recurrent(params(one, s, Tensor::zeros({done, c.H, c.V})));
  return s;
}

bool all_nan(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(p[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("kda checkpoints equal the recurrence's state at every multiple of the interval") {
  auto be = cpu_backend(3);
  std::mt19937 rng(31);
  const std::vector<int32_t> lens = {70, 0, 33, 96, 16};
  struct Run { bool chunked; int chunk, interval; };
  for (const Run r : {Run{false, 0, 24}, Run{false, 0, 1}, Run{true, 16, 32}, Run{true, 16, 16}, Run{true, 8, 24}}) {
    CAPTURE(r.chunked, r.chunk, r.interval);
    KdaCase c = make_case(rng, lens, {1, 3, 0, 2, 4}, 5, 2, 16, 8, true, -5.f, 0.f);
    const int64_t N = int64_t(lens.size()), M = 3, per = c.H * c.V * c.K;
    // Sequence n's j-th checkpoint -> slot M·n + j, except one entry left out on purpose.
    std::vector<int32_t> table(size_t(N * M));
    for (int64_t i = 0; i < N * M; ++i) table[size_t(i)] = int32_t(i);
    table[1] = -1;
    Tensor ckpt = Tensor::zeros({N * M, c.H, c.V, c.K});
    std::fill(ckpt.f32(), ckpt.f32() + ckpt.numel(), std::numeric_limits<float>::quiet_NaN());
    Tensor s_with = c.state.clone(), o_with = Tensor::zeros({c.T, c.H, c.V});
    Tensor s_without = c.state.clone(), o_without = Tensor::zeros({c.T, c.H, c.V});
    ops::KdaParams with = params(c, s_with, o_with, r.chunk);
    with.checkpoints = ckpt;
    with.checkpoint_slots = i32({N, M}, table);
    with.checkpoint_interval = r.interval;
    const ops::KdaParams without = params(c, s_without, o_without, r.chunk);
    if (r.chunked) {
      be->kda_chunk(with);
      be->kda_chunk(without);
    } else {
      be->kda_recurrent(with);
      be->kda_recurrent(without);
    }
    CHECK(std::memcmp(o_with.f32(), o_without.f32(), size_t(o_with.numel()) * 4) == 0);
    CHECK(std::memcmp(s_with.f32(), s_without.f32(), size_t(s_with.numel()) * 4) == 0);
    int written = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < M; ++j) {
        const int done = int((j + 1) * r.interval);
        const float* got = ckpt.f32() + (n * M + j) * per;
        CAPTURE(n, j, done);
        if (table[size_t(n * M + j)] < 0 || done > lens[size_t(n)]) {
          CHECK(all_nan(got, per));
          continue;
        }
        Tensor ref = prefix_state(*be, c, lens, int(n), done);
        Tensor got_t = Tensor::zeros({1, c.H, c.V, c.K});
        std::memcpy(got_t.f32(), got, size_t(per) * 4);
        CHECK(worst_state_err(got_t, ref, c.H, c.V * c.K) <= 1e-5);
        ++written;
      }
    CHECK(written > 0);
  }
}

TEST_CASE("kda checkpoints: bad intervals and tables are refused by name") {
  auto be = cpu_backend(1);
  std::mt19937 rng(32);
  KdaCase c = make_case(rng, {40, 8}, {0, 1}, 2, 2, 4, 4, true, -5.f, 0.f);
  Tensor ckpt = Tensor::zeros({3, 2, 4, 4});
  auto run = [&](bool chunked, int interval, Tensor table, Tensor cks) {
    ops::KdaParams p = params(c, c.state.clone(), Tensor::zeros({c.T, c.H, c.V}), 16);
    p.checkpoints = cks;
    p.checkpoint_slots = table;
    p.checkpoint_interval = interval;
    chunked ? be->kda_chunk(p) : be->kda_recurrent(p);
  };
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(run(true, 24, i32({2, 1}, {0, 1}), ckpt),
                    Contains("kda_chunk: checkpoint_interval must be a positive multiple of 16, got 24"));
  CHECK_THROWS_WITH(run(false, -4, i32({2, 1}, {0, 1}), ckpt),
                    Contains("kda_recurrent: checkpoint_interval must be a positive multiple of 1, got -4"));
  CHECK_THROWS_WITH(run(true, 16, i32({2, 2}, {0, 1, 2, 3}), ckpt),
                    Contains("kda_chunk: checkpoint_slots[1, 1] = 3 is outside [0, 3)"));
  CHECK_THROWS_WITH(run(true, 16, i32({2, 2}, {0, 2, -1, 2}), ckpt),
                    Contains("kda_chunk: checkpoint_slots: slot 2 appears twice"));
  CHECK_THROWS_WITH(run(true, 16, i32({3, 1}, {0, 1, 2}), ckpt), Contains("kda_chunk: checkpoint_slots"));
  CHECK_THROWS_WITH(run(false, 8, i32({2, 1}, {0, 1}), Tensor::zeros({3, 2, 4, 5})),
                    Contains("kda_recurrent: checkpoints"));
  CHECK_NOTHROW(run(true, 16, i32({2, 3}, {0, 1, -1, 2, -1, -1}), ckpt));
}
