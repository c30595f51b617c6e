// The sampler's token mask (kernels/token_mask.h) against its slow reference: sampling a masked row of
// the whole vocabulary must pick exactly what sampling the allowed tokens alone picks (same seed, step
// and parameters), for greedy, top-k, top-p and plain draws, on random logits and random masks. Plus the
// errors (a row allowing nothing, rows out of order or outside the batch, a vocabulary mismatch) and
// unmasked rows left bit for bit alone.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/token_mask.h"
#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {

int32_t sample_one(Backend& be, const std::vector<float>& row, const ops::SamplingRow& params) {
  std::vector<int32_t> out;
  be.sample({.logits = Tensor::from_f32({1, int64_t(row.size())}, row), .rows = {params}, .out = &out});
  return out.at(0);
}

}  // namespace

TEST_CASE("masked sampling equals sampling the allowed tokens alone", "[sampling][token_mask]") {
  auto be = cpu_backend(2);
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int64_t B = 6, V = 203;  // not a multiple of 32: the last word is partial
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<float> x(B * V);
    for (float& v : x) v = nd(rng);
    if (trial % 5 == 0) x[7] = x[8];  // ties
    const Tensor logits = Tensor::from_f32({B, V}, x);
    TokenMask mask(V);
    std::vector<std::vector<int32_t>> allowed(B);
    for (int64_t b = 0; b < B; ++b) {
      if (b % 3 == 1) continue;  // unmasked rows
      const size_t k = mask.add_row(b);
      const double density = std::uniform_real_distribution<double>(0.005, 0.5)(rng);
      for (int32_t id = 0; id < V; ++id)
        if (std::bernoulli_distribution(density)(rng)) allowed[b].push_back(id);
      if (allowed[b].empty()) allowed[b].push_back(int32_t(rng() % V));
      for (int32_t id : allowed[b]) mask.allow(k, id);
    }
    const std::vector<float> before = x;
    apply_token_mask(logits, mask);
    std::vector<ops::SamplingRow> rows;
    for (int64_t b = 0; b < B; ++b) {
      ops::SamplingRow r{.temperature = trial % 4 == 0 ? 0.f : 0.3f + 0.4f * float(b), .top_k = trial % 3 == 0 ? int(b) * 7 : 0,
                         .top_p = trial % 2 == 0 ? 0.9f : 1.f, .seed = uint64_t(trial) * 31 + uint64_t(b), .step = uint64_t(trial)};
      rows.push_back(r);
    }
    std::vector<int32_t> got;
    be->sample({.logits = logits, .rows = rows, .out = &got});
    for (int64_t b = 0; b < B; ++b) {
      const float* row = logits.f32() + b * V;
      if (allowed[b].empty()) {  // unmasked: untouched, sampled as ever
        CHECK(std::memcmp(row, before.data() + b * V, V * sizeof(float)) == 0);
        continue;
      }
      // The reference: the allowed tokens' logits alone, sampled with the same parameters.
      std::vector<float> sub;
      for (int32_t id : allowed[b]) sub.push_back(before[b * V + id]);
      const int32_t want = allowed[b].at(sample_one(*be, sub, rows[b]));
      INFO("trial " << trial << " row " << b << " allowed " << allowed[b].size());
      CHECK(got[b] == want);
      ++checked;
    }
  }
  CHECK(checked >= 200);
}

TEST_CASE("token mask: bad masks are refused before any logit changes", "[token_mask]") {
  const Tensor logits = Tensor::from_f32({2, 40}, std::vector<float>(80, 1.f));
  TokenMask none(40);
  none.add_row(0);
  CHECK_THROWS_WITH(apply_token_mask(logits, none), Catch::Contains("row 0 allows no token"));
  TokenMask outside(40);
  outside.allow(outside.add_row(5), 3);
  CHECK_THROWS_WITH(apply_token_mask(logits, outside), Catch::Contains("outside the batch"));
  TokenMask vocab(41);
  vocab.allow(vocab.add_row(0), 3);
  CHECK_THROWS_WITH(apply_token_mask(logits, vocab), Catch::Contains("vocabulary of 41"));
  TokenMask order(40);
  order.add_row(1);
  CHECK_THROWS_WITH(order.add_row(0), Catch::Contains("ascending"));
  for (int64_t i = 0; i < 80; ++i) CHECK(logits.f32()[i] == 1.f);
  // An empty mask is a no-op; a full row mask changes nothing.
  apply_token_mask(logits, TokenMask(40));
  TokenMask all(40);
  const size_t k = all.add_row(1);
  for (int32_t id = 0; id < 40; ++id) all.allow(k, id);
  apply_token_mask(logits, all);
  for (int64_t i = 0; i < 80; ++i) CHECK(logits.f32()[i] == 1.f);
  // The word layout grammar engines fill: bit id % 32 of word id / 32.
  TokenMask w(40);
  const size_t r = w.add_row(0);
  w.row_bits(r)[1] = 1u << 3;  // id 35
  CHECK(w.allowed(r, 35));
  CHECK_FALSE(w.allowed(r, 3));
  apply_token_mask(logits, w);
  for (int64_t id = 0; id < 40; ++id) CHECK(std::isinf(logits.f32()[id]) == (id != 35));
}
