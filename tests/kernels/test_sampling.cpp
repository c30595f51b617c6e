// Sampling: greedy ties, top-k/top-p edge cases, reproducible counter-based draws independent of the
// batch, and the empirical distribution of many draws against the intended distribution.
#include <catch2/catch.hpp>
#include <set>

#include "tests/kernels/kernel_test_util.h"

using namespace k3;
using namespace k3::test;

namespace {
std::vector<int32_t> run(Backend& be, const Tensor& logits, const std::vector<ops::SamplingRow>& rows) {
  std::vector<int32_t> out;
  be.sample({.logits = logits, .rows = rows, .out = &out});
  return out;
}

// A row of V logits, normal with sigma 2 (ties improbable).
std::vector<float> random_logits(std::mt19937& rng, int64_t V) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> row(static_cast<size_t>(V));
  for (float& x : row) x = nd(rng);
  return row;
}

// Chi-square statistic of `counts` against probabilities `p` (cells with p = 0 must have no counts).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      REQUIRE(counts[i] == 0);
      continue;
    }
    const double e = n * p[i];
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}
}  // namespace

TEST_CASE("greedy is argmax with ties to the lowest id; top_k = 1 and tiny top_p equal greedy") {
  auto be = cpu_backend(2);
  Tensor logits = Tensor::from_f32({3, 5}, std::vector<float>{0, 3, 1, 3, 2, -1, -1, -1, -1, -1, 5, 0, 0, 7, 7});
  auto greedy = run(*be, logits, {{}, {}, {}});
  CHECK(greedy == std::vector<int32_t>{1, 0, 3});
  for (uint64_t seed = 0; seed < 20; ++seed) {
    ops::SamplingRow k1{.temperature = 1.3f, .top_k = 1, .seed = seed, .step = seed * 7};
    ops::SamplingRow p0{.temperature = 0.8f, .top_p = 1e-4f, .seed = seed, .step = 3};
    CHECK(run(*be, logits, {k1, k1, k1}) == greedy);
    CHECK(run(*be, logits, {p0, p0, p0}) == greedy);
  }
}

TEST_CASE("seeded draws are reproducible and do not depend on the other rows of the batch") {
  std::mt19937 rng(41);
  auto be = cpu_backend(3);
  Tensor logits = randn({4, 50}, rng);
  std::vector<ops::SamplingRow> rows;
  for (int b = 0; b < 4; ++b) rows.push_back({.temperature = 1.f, .top_k = 20, .top_p = 0.9f, .seed = 100u + b, .step = 5});
  auto a = run(*be, logits, rows), again = run(*be, logits, rows);
  CHECK(a == again);
  for (int b = 0; b < 4; ++b) CHECK(run(*be, logits.slice_rows(b, b + 1), {rows[b]})[0] == a[b]);
  // Different steps draw different numbers: over 64 steps a flat row must not repeat one token.
  Tensor flat = Tensor::zeros({1, 50});
  std::set<int32_t> seen;
  for (uint64_t step = 0; step < 64; ++step) seen.insert(run(*be, flat, {{.temperature = 1.f, .seed = 9, .step = step}})[0]);
  CHECK(seen.size() > 20);
}

TEST_CASE("empirical distribution of draws matches softmax(logits / T), after top_k and top_p") {
  auto be = cpu_backend(2);
  const std::vector<float> lv = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f};
  Tensor logits = Tensor::from_f32({1, 6}, lv);
  const int n = 20000;
  auto draw = [&](ops::SamplingRow row) {
    std::vector<int> counts(6, 0);
    for (int s = 0; s < n; ++s) {
      row.step = s;
      counts[run(*be, logits, {row})[0]]++;
    }
    return counts;
  };
  auto softmax_over = [&](float t, std::vector<int> keep) {
    std::vector<double> p(6, 0.0);
    double z = 0;
    for (int i : keep) z += p[i] = std::exp(lv[i] / t);
    for (double& x : p) x /= z;
    return p;
  };
  // chi-square, 5 (resp. 2, 1) degrees of freedom: 99.99th percentiles are about 25.7 (18.4, 15.1).
  CHECK(chi_square(draw({.temperature = 0.7f, .seed = 1}), softmax_over(0.7f, {0, 1, 2, 3, 4, 5}), n) < 25.7);
  CHECK(chi_square(draw({.temperature = 1.5f, .top_k = 3, .seed = 2}), softmax_over(1.5f, {3, 0, 1}), n) < 18.4);
  // T = 1: p = {.209, .094, .047, .569, .077, .0038}: sorted 3, 0, 1, ...; prefix masses .569, .778,
  // .872, so top_p 0.8 keeps {3, 0, 1} and top_p 0.7 keeps {3, 0}.
  CHECK(chi_square(draw({.temperature = 1.f, .top_p = 0.8f, .seed = 3}), softmax_over(1.f, {3, 0, 1}), n) < 18.4);
  CHECK(chi_square(draw({.temperature = 1.f, .top_p = 0.7f, .seed = 4}), softmax_over(1.f, {3, 0}), n) < 15.1);
}

TEST_CASE("sample validates its rows") {
  auto be = cpu_backend(1);
  Tensor logits = Tensor::zeros({2, 3});
  std::vector<int32_t> out;
  CHECK_THROWS_WITH(be->sample({.logits = logits, .rows = {{}}, .out = &out}),
                    Catch::Contains("sample") && Catch::Contains("rows: expected 2"));
  CHECK_THROWS_WITH(be->sample({.logits = logits, .rows = {{}, {.temperature = 1.f, .top_p = 0.f}}, .out = &out}),
                    Catch::Contains("rows[1].top_p"));
}

// The penalties, OpenAI's: token t's logit minus frequency_penalty x (times t was generated) plus
// presence_penalty once it was. On random rows a penalized row draws exactly what the unpenalized row of
// the penalized logits (computed here, the slow reference) draws, greedy and sampled alike; the
// prompt's tokens do not count (only `generated`); and out-of-range penalties are refused by name.
TEST_CASE("presence and frequency penalties: the draw of the penalized logits, generated tokens only") {
  auto be = cpu_backend(2);
  std::mt19937 rng(23);
  constexpr int64_t V = 50;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> row = random_logits(rng, V);
    std::vector<int32_t> generated;
    for (int i = 0, n = 1 + trial % 12; i < n; ++i) generated.push_back(static_cast<int32_t>(rng() % 8));  // repeats
    const float presence = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
    const float frequency = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
    std::vector<float> adjusted = row;
    std::vector<int> count(V, 0);
    for (int32_t t : generated) ++count[t];
    for (int64_t t = 0; t < V; ++t)
      if (count[t] > 0) adjusted[t] -= frequency * static_cast<float>(count[t]) + presence;
    for (const float temperature : {0.f, 0.9f}) {
      const ops::SamplingRow plain{.temperature = temperature, .top_k = 20, .top_p = 0.95f, .seed = uint64_t(trial),
                                   .step = 4};
      ops::SamplingRow penalized = plain;
      penalized.presence_penalty = presence;
      penalized.frequency_penalty = frequency;
      penalized.generated = generated;
      INFO("trial " << trial << ", temperature " << temperature);
      CHECK(run(*be, Tensor::from_f32({1, V}, row), {penalized}) == run(*be, Tensor::from_f32({1, V}, adjusted), {plain}));
    }
  }
  // A large frequency penalty keeps greedy off the token it repeated; nothing generated: no change.
  Tensor peaked = Tensor::from_f32({1, 4}, std::vector<float>{0.f, 5.f, 4.f, 0.f});
  const std::vector<int32_t> twice = {1, 1};
  CHECK(run(*be, peaked, {{.frequency_penalty = 1.f, .generated = twice}}) == std::vector<int32_t>{2});
  CHECK(run(*be, peaked, {{.presence_penalty = 2.f}}) == std::vector<int32_t>{1});
  std::vector<int32_t> out;
  CHECK_THROWS_WITH(be->sample({.logits = peaked, .rows = {{.presence_penalty = 2.5f}}, .out = &out}),
                    Catch::Contains("rows[0].presence_penalty"));
  CHECK_THROWS_WITH(be->sample({.logits = peaked, .rows = {{.frequency_penalty = -3.f}}, .out = &out}),
                    Catch::Contains("rows[0].frequency_penalty"));
}

// OpenAI's logit_bias: each entry added to its token's logit before the penalties and the draw. On
// random rows a biased row draws what the unbiased row of the biased logits draws; +100 makes a token
// certain, -100 takes it away; tokens outside the vocabulary and biases outside [-100, 100] are refused.
TEST_CASE("logit_bias: the draw of the biased logits, before the penalties") {
  auto be = cpu_backend(2);
  std::mt19937 rng(29);
  constexpr int64_t V = 40;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> row = random_logits(rng, V);
    std::vector<ops::LogitBias> biases;
    for (int i = 0, n = 1 + trial % 5; i < n; ++i)
      biases.push_back({.token = static_cast<int32_t>(rng() % V), .bias = std::uniform_real_distribution<float>(-8.f, 8.f)(rng)});
    const std::vector<int32_t> generated = {3, 3, 5};
    std::vector<float> adjusted = row;
    for (const ops::LogitBias& b : biases) adjusted[b.token] += b.bias;
    adjusted[3] -= 0.5f * 2.f + 0.25f;
    adjusted[5] -= 0.5f * 1.f + 0.25f;
    for (const float temperature : {0.f, 1.1f}) {
      const ops::SamplingRow plain{.temperature = temperature, .seed = uint64_t(trial), .step = 2};
      ops::SamplingRow biased = plain;
      biased.logit_bias = biases;
      biased.presence_penalty = 0.25f;
      biased.frequency_penalty = 0.5f;
      biased.generated = generated;
      INFO("trial " << trial << ", temperature " << temperature);
      CHECK(run(*be, Tensor::from_f32({1, V}, row), {biased}) == run(*be, Tensor::from_f32({1, V}, adjusted), {plain}));
    }
  }
  Tensor flat = Tensor::from_f32({1, 4}, std::vector<float>{1.f, 2.f, 3.f, 4.f});
  const std::vector<ops::LogitBias> force = {{.token = 0, .bias = 100.f}}, ban = {{.token = 3, .bias = -100.f}};
  for (uint64_t seed = 0; seed < 10; ++seed)
    CHECK(run(*be, flat, {{.temperature = 1.f, .seed = seed, .logit_bias = force}}) == std::vector<int32_t>{0});
  CHECK(run(*be, flat, {{.logit_bias = ban}}) == std::vector<int32_t>{2});
  std::vector<int32_t> out;
  const std::vector<ops::LogitBias> outside = {{.token = 4, .bias = 1.f}}, too_big = {{.token = 1, .bias = 101.f}};
  CHECK_THROWS_WITH(be->sample({.logits = flat, .rows = {{.logit_bias = outside}}, .out = &out}),
                    Catch::Contains("rows[0].logit_bias: token 4"));
  CHECK_THROWS_WITH(be->sample({.logits = flat, .rows = {{.logit_bias = too_big}}, .out = &out}),
                    Catch::Contains("rows[0].logit_bias"));
}
