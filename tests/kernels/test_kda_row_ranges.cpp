// KDA row ranges (ops::KdaParams::seq_rows): kda_recurrent and kda_chunk given a range of each
// sequence's rows compute exactly what they compute on those rows alone, as a call of their own; rows
// outside every range keep their output untouched; checkpoints count from the range's first row; and a
// range outside its sequence is refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/kernels/kda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {

struct Ranged {
  bool chunked;
  int chunk;
};

// The op under test.
void run(Backend& be, Ranged r, const ops::KdaParams& p) {
  if (r.chunked) be.kda_chunk(p);
  else be.kda_recurrent(p);
}

}  // namespace

TEST_CASE("kda row ranges compute each range as a call of its own") {
  auto be = cpu_backend(3);
  std::mt19937 rng(41);
  const std::vector<int32_t> lens = {70, 0, 33, 96};
  const std::vector<int32_t> from = {5, 0, 0, 32}, to = {70, 0, 20, 96};
  for (const Ranged r : {Ranged{false, 0}, Ranged{true, 16}}) {
    CAPTURE(r.chunked);
    KdaCase c = make_case(rng, lens, {1, 3, 0, 2}, 4, 2, 16, 8, true, -5.f, 0.f);
    const int64_t N = int64_t(lens.size()), per = c.H * c.V * c.K, I = 16;
    std::vector<int32_t> rows;
    for (int64_t n = 0, t = 0; n < N; t += lens[size_t(n)], ++n) {
      rows.push_back(int32_t(t + from[size_t(n)]));
      rows.push_back(int32_t(t + to[size_t(n)]));
    }
    // Ranged: one call, NaN outputs and checkpoints wherever nothing may be written.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor s_ranged = c.state.clone(), o_ranged = Tensor::zeros({c.T, c.H, c.V});
    std::fill(o_ranged.f32(), o_ranged.f32() + o_ranged.numel(), nan);
    const int64_t M = 6;
    Tensor ck_ranged = Tensor::zeros({N * M, c.H, c.V, c.K});
    std::fill(ck_ranged.f32(), ck_ranged.f32() + ck_ranged.numel(), nan);
    std::vector<int32_t> table(size_t(N * M));
    for (int64_t i = 0; i < N * M; ++i) table[size_t(i)] = int32_t(i);
    ops::KdaParams p = params(c, s_ranged, o_ranged, r.chunk);
    p.seq_rows = i32({N, 2}, rows);
    p.checkpoints = ck_ranged;
    p.checkpoint_slots = i32({N, M}, table);
    p.checkpoint_interval = int(I);
    run(*be, r, p);

    for (int64_t n = 0, t0 = 0; n < N; t0 += lens[size_t(n)], ++n) {
      CAPTURE(n);
      const int64_t b = t0 + from[size_t(n)], e = t0 + to[size_t(n)], L = e - b;
      // The same rows as a call of their own, from the same state.
      KdaCase one = c;
      one.q = c.q.slice_rows(b, e), one.k = c.k.slice_rows(b, e), one.v = c.v.slice_rows(b, e);
      one.g = c.g.slice_rows(b, e), one.beta = c.beta.slice_rows(b, e);
      one.cu = i32({2}, {0, int32_t(L)});
      one.slots = i32({1}, {0});
      Tensor s = Tensor::zeros({1, c.H, c.V, c.K}), o = Tensor::zeros({L, c.H, c.V});
      std::memcpy(s.f32(), c.state.f32() + int64_t(c.slots.i32()[n]) * per, size_t(per) * 4);
      Tensor ck = Tensor::zeros({M, c.H, c.V, c.K});
      ops::KdaParams q = params(one, s, o, r.chunk);
      q.checkpoints = ck;
      q.checkpoint_slots = i32({1, M}, {0, 1, 2, 3, 4, 5});
      q.checkpoint_interval = int(I);
      run(*be, r, q);
      CHECK(std::memcmp(s_ranged.f32() + int64_t(c.slots.i32()[n]) * per, s.f32(), size_t(per) * 4) == 0);
      const int64_t orow = c.H * c.V;
      for (int64_t t = t0; t < t0 + lens[size_t(n)]; ++t) {
        const float* got = o_ranged.f32() + t * orow;
        if (t >= b && t < e) {
          CHECK(std::memcmp(got, o.f32() + (t - b) * orow, size_t(orow) * 4) == 0);
        } else {
          for (int64_t i = 0; i < orow; ++i) REQUIRE(std::isnan(got[i]));
        }
      }
      // Checkpoint j holds the state after (j+1)·I rows of the range, as the call of its own wrote it.
      for (int64_t j = 0; j < M; ++j) {
        const float* got = ck_ranged.f32() + (n * M + j) * per;
        if ((j + 1) * I <= L) CHECK(std::memcmp(got, ck.f32() + j * per, size_t(per) * 4) == 0);
        else CHECK(std::isnan(got[0]));
      }
    }
  }
}

TEST_CASE("kda row ranges outside their sequence are refused by name") {
  auto be = cpu_backend(1);
  std::mt19937 rng(42);
  KdaCase c = make_case(rng, {10, 6}, {0, 1}, 2, 1, 8, 8, false, -1.f, 0.f);
  Tensor s = c.state.clone(), o = Tensor::zeros({c.T, c.H, c.V});
  for (const std::vector<int32_t>& rows :
       {std::vector<int32_t>{0, 11, 10, 16}, std::vector<int32_t>{3, 2, 10, 16}, std::vector<int32_t>{0, 10, 9, 16}}) {
    ops::KdaParams p = params(c, s, o, 4);
    p.seq_rows = i32({2, 2}, rows);
    CHECK_THROWS_WITH(be->kda_recurrent(p), Catch::Contains("seq_rows["));
    CHECK_THROWS_WITH(be->kda_chunk(p), Catch::Contains("seq_rows["));
  }
  ops::KdaParams p = params(c, s, o, 4);
  p.seq_rows = i32({3, 2}, {0, 1, 2, 3, 4, 5});
  CHECK_THROWS_WITH(be->kda_recurrent(p), Catch::Contains("seq_rows"));
}
