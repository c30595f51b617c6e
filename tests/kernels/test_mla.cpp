// MLA: causal prefill against a double reference; absorbed paged decode against the materialised
// prefill of the last token; LSE merge of split key sets against the whole, empty partitions included.
#include <catch2/catch.hpp>

#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

TEST_CASE("mla_prefill equals a double-precision causal softmax with a past offset") {
  std::mt19937 rng(21);
  auto be = cpu_backend(2);
  const int64_t T = 5, past = 3, S = past + T, H = 2, Dqk = 6, Dv = 4;
  Tensor q = randn({T, H, Dqk}, rng), k = randn({S, H, Dqk}, rng), v = randn({S, H, Dv}, rng);
  Tensor o = Tensor::zeros({T, H, Dv}), lse = Tensor::zeros({T, H});
  const float scale = 1.f / std::sqrt(float(Dqk));
  be->mla_prefill({.q = q, .k = k, .v = v, .o = o, .lse = lse, .past = past, .scale = scale});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s;
      for (int64_t j = 0; j <= past + t; ++j) {
        double a = 0;
        for (int64_t i = 0; i < Dqk; ++i) a += double(q.f32()[(t * H + h) * Dqk + i]) * k.f32()[(j * H + h) * Dqk + i];
        s.push_back(a * scale);
      }
      double m = *std::max_element(s.begin(), s.end()), d = 0;
      for (double x : s) d += std::exp(x - m);
      CHECK(lse.f32()[t * H + h] == Approx(m + std::log(d)).margin(1e-5));
      for (int64_t c = 0; c < Dv; ++c) {
        double acc = 0;
        for (size_t j = 0; j < s.size(); ++j) acc += std::exp(s[j] - m) / d * v.f32()[(j * H + h) * Dv + c];
        CHECK(o.f32()[(t * H + h) * Dv + c] == Approx(acc).margin(1e-5));
      }
    }
}

namespace {

// A small MLA setup: per-token latents c [S, R] and shared rope keys kr [S, Dr], kv_b weights.
struct MlaSetup {
  int64_t H = 3, R = 8, Dn = 4, Dr = 2, Dv = 5, page = 4;
  Tensor wkvb;  // [H * (Dn + Dv), R]
  float scale() const { return 1.f / std::sqrt(float(Dn + Dr)); }
  float wuk(int64_t h, int64_t n, int64_t r) const { return wkvb.f32()[(h * (Dn + Dv) + n) * R + r]; }
  float wuv(int64_t h, int64_t n, int64_t r) const { return wkvb.f32()[(h * (Dn + Dv) + Dn + n) * R + r]; }
};

// Paged cache holding `c`/`kr` rows [0, len) of each request through a shuffled block table; every
// unused page and row is NaN so a bad read shows.
struct Paged {
  Tensor cache, table, lens;
};

Paged page_in(const MlaSetup& m, const std::vector<Tensor>& c, const std::vector<Tensor>& kr,
              const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t max_pages, std::mt19937& rng) {
  const int64_t B = ranges.size(), num_pages = B * max_pages + 3;
  Paged p;
  p.cache = filled({num_pages, m.page, m.R + m.Dr}, std::nanf(""));
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(B * max_pages, -1), lens(B);
  int next = 0;
  for (int64_t b = 0; b < B; ++b) {
    auto [begin, end] = ranges[b];
    lens[b] = int32_t(end - begin);
    for (int64_t pg = 0; pg < (lens[b] + m.page - 1) / m.page; ++pg) table[b * max_pages + pg] = ids[next++];
    for (int64_t t = 0; t < lens[b]; ++t) {
      float* row = p.cache.f32() + (table[b * max_pages + t / m.page] * m.page + t % m.page) * (m.R + m.Dr);
      std::memcpy(row, c[b].f32() + (begin + t) * m.R, m.R * 4);
      std::memcpy(row + m.R, kr[b].f32() + (begin + t) * m.Dr, m.Dr * 4);
    }
  }
  p.table = i32({B, max_pages}, table);
  p.lens = i32({B}, lens);
  return p;
}

}  // namespace

TEST_CASE("absorbed mla_decode equals materialised mla_prefill of the last token; lse_merge of splits equals the whole") {
  std::mt19937 rng(22);
  auto be = cpu_backend(2);
  MlaSetup m;
  m.wkvb = randn({m.H * (m.Dn + m.Dv), m.R}, rng, 0.5f);
  const std::vector<int64_t> seq = {10, 1, 7};  // tokens per request (the query is the last one)
  const int64_t B = seq.size();
  std::vector<Tensor> c, kr, qn, qr;
  for (int64_t b = 0; b < B; ++b) {
    c.push_back(randn({seq[b], m.R}, rng));
    kr.push_back(randn({seq[b], m.Dr}, rng));
    qn.push_back(randn({m.H, m.Dn}, rng));
    qr.push_back(randn({m.H, m.Dr}, rng));
  }
  // Absorbed queries: q_lat[h] = W^UK_h^T q^N_h.
  Tensor q_lat = Tensor::zeros({B, m.H, m.R}), q_rope = Tensor::zeros({B, m.H, m.Dr});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < m.H; ++h) {
      for (int64_t r = 0; r < m.R; ++r) {
        float acc = 0;
        for (int64_t n = 0; n < m.Dn; ++n) acc += m.wuk(h, n, r) * qn[b].f32()[h * m.Dn + n];
        q_lat.f32()[(b * m.H + h) * m.R + r] = acc;
      }
      std::memcpy(q_rope.f32() + (b * m.H + h) * m.Dr, qr[b].f32() + h * m.Dr, m.Dr * 4);
    }
  auto decode = [&](const std::vector<std::pair<int64_t, int64_t>>& ranges, Tensor& o, Tensor& lse) {
    Paged p = page_in(m, c, kr, ranges, 4, rng);
    be->mla_decode({.q_lat = q_lat, .q_rope = q_rope, .kv_cache = p.cache, .block_table = p.table,
                    .seq_lens = p.lens, .o = o, .lse = lse, .scale = m.scale()});
  };
  Tensor o_full = Tensor::zeros({B, m.H, m.R}), lse_full = Tensor::zeros({B, m.H});
  decode({{0, 10}, {0, 1}, {0, 7}}, o_full, lse_full);

  for (int64_t b = 0; b < B; ++b) {
    // Materialise k = [W^UK c | kr], v = W^UV c for every cached token and run the prefill of the last one.
    const int64_t S = seq[b], Dqk = m.Dn + m.Dr;
    Tensor k = Tensor::zeros({S, m.H, Dqk}), v = Tensor::zeros({S, m.H, m.Dv}), q = Tensor::zeros({1, m.H, Dqk});
    for (int64_t t = 0; t < S; ++t)
      for (int64_t h = 0; h < m.H; ++h) {
        for (int64_t n = 0; n < m.Dn; ++n) {
          float acc = 0;
          for (int64_t r = 0; r < m.R; ++r) acc += m.wuk(h, n, r) * c[b].f32()[t * m.R + r];
          k.f32()[(t * m.H + h) * Dqk + n] = acc;
        }
        std::memcpy(k.f32() + (t * m.H + h) * Dqk + m.Dn, kr[b].f32() + t * m.Dr, m.Dr * 4);
        for (int64_t n = 0; n < m.Dv; ++n) {
          float acc = 0;
          for (int64_t r = 0; r < m.R; ++r) acc += m.wuv(h, n, r) * c[b].f32()[t * m.R + r];
          v.f32()[(t * m.H + h) * m.Dv + n] = acc;
        }
      }
    for (int64_t h = 0; h < m.H; ++h) {
      std::memcpy(q.f32() + h * Dqk, qn[b].f32() + h * m.Dn, m.Dn * 4);
      std::memcpy(q.f32() + h * Dqk + m.Dn, qr[b].f32() + h * m.Dr, m.Dr * 4);
    }
    Tensor o = Tensor::zeros({1, m.H, m.Dv}), lse = Tensor::zeros({1, m.H});
    be->mla_prefill({.q = q, .k = k, .v = v, .o = o, .lse = lse, .past = S - 1, .scale = m.scale()});
    for (int64_t h = 0; h < m.H; ++h) {
      CHECK(lse_full.f32()[b * m.H + h] == Approx(lse.f32()[h]).margin(1e-5));
      for (int64_t n = 0; n < m.Dv; ++n) {  // o_h = W^UV_h o_lat
        float acc = 0;
        for (int64_t r = 0; r < m.R; ++r) acc += m.wuv(h, n, r) * o_full.f32()[(b * m.H + h) * m.R + r];
        CHECK(acc == Approx(o.f32()[h * m.Dv + n]).margin(1e-5));
      }
    }
  }

  SECTION("two halves merged equal the whole (one half empty for some requests)") {
    for (std::vector<int64_t> split : {std::vector<int64_t>{4, 0, 3}, {8, 1, 0}, {0, 0, 7}}) {
      std::vector<std::pair<int64_t, int64_t>> lo, hi;
      for (int64_t b = 0; b < B; ++b) lo.push_back({0, split[b]}), hi.push_back({split[b], seq[b]});
      Tensor o_parts = Tensor::zeros({2, B, m.H, m.R}), lse_parts = Tensor::zeros({2, B, m.H});
      Tensor o0 = o_parts.slice_rows(0, 1).reshape({B, m.H, m.R}), l0 = lse_parts.slice_rows(0, 1).reshape({B, m.H});
      Tensor o1 = o_parts.slice_rows(1, 2).reshape({B, m.H, m.R}), l1 = lse_parts.slice_rows(1, 2).reshape({B, m.H});
      decode(lo, o0, l0);
      decode(hi, o1, l1);
      Tensor o = Tensor::zeros({B, m.H, m.R}), lse = Tensor::zeros({B, m.H});
      be->lse_merge({.o_parts = o_parts, .lse_parts = lse_parts, .o = o, .lse = lse});
      CHECK(max_abs_diff(o, o_full) <= 1e-5 * std::max(1.f, max_abs(o_full)));
      CHECK(max_abs_diff(lse, lse_full) <= 1e-5 * std::max(1.f, max_abs(lse_full)));
    }
  }
}

TEST_CASE("mla_decode with seq_len 0 gives o = 0, lse = -inf") {
  auto be = cpu_backend(1);
  Tensor q_lat = filled({1, 2, 4}, 1.f), q_rope = filled({1, 2, 2}, 1.f);
  Tensor cache = filled({2, 4, 6}, std::nanf("")), table = i32({1, 1}, {-7}), lens = i32({1}, {0});
  Tensor o = filled({1, 2, 4}, std::nanf("")), lse = Tensor::zeros({1, 2});
  be->mla_decode({.q_lat = q_lat, .q_rope = q_rope, .kv_cache = cache, .block_table = table, .seq_lens = lens,
                  .o = o, .lse = lse, .scale = 0.5f});
  for (int i = 0; i < 8; ++i) CHECK(o.f32()[i] == 0.f);
  CHECK(lse.f32()[0] == kNegInf);
  CHECK(lse.f32()[1] == kNegInf);
}

TEST_CASE("lse_merge: all partitions empty gives o = 0, lse = -inf; NaN in empty parts is ignored") {
  auto be = cpu_backend(2);
  Tensor o_parts = filled({3, 2, 1, 4}, std::nanf("")), lse_parts = filled({3, 2, 1}, kNegInf);
  // Row 1: only partition 2 has keys.
  lse_parts.f32()[2 * 2 + 1] = 0.7f;
  for (int c = 0; c < 4; ++c) o_parts.f32()[((2 * 2 + 1) * 1) * 4 + c] = float(c);
  Tensor o = Tensor::zeros({2, 1, 4}), lse = Tensor::zeros({2, 1});
  be->lse_merge({.o_parts = o_parts, .lse_parts = lse_parts, .o = o, .lse = lse});
  for (int c = 0; c < 4; ++c) {
    CHECK(o.f32()[c] == 0.f);
    CHECK(o.f32()[4 + c] == float(c));
  }
  CHECK(lse.f32()[0] == kNegInf);
  CHECK(lse.f32()[1] == 0.7f);
}
