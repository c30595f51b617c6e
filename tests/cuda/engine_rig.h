// Teacher-forced logits of the whole model on one backend, for the engine-level GPU tests: N prompts
// of P tokens each, the first `prefill` positions of all prompts in one batched forward, then the
// remaining positions one token per prompt per step (batched decode). Every position's logits are
// kept, so two backends can be compared position by position.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/model.h"

namespace k3::cudatest {

// k3-tiny with the real K3 head shapes (KDA D = 128, MLA r_kv = 512, d_r = 64, d_n = d_v = 128), so
// the GPU runs its fast kernels (chunked KDA, fused KDA decode, tensor-core MLA decode) at small width.
// Every expert routed (k = E): bf16 rounding then cannot flip a token's expert set at near ties, so two
// paths' logits differ by rounding alone and can be bounded.
inline ModelConfig dense_routing(ModelConfig c) {
  c.num_experts_per_token = c.num_experts;
  return c;
}

inline ModelConfig tiny_with_k3_heads() {
  ModelConfig c = with_k3_head_shapes(preset_config("k3-tiny").value());
  c.kda.num_heads = 2;
  c.num_attention_heads = c.num_key_value_heads = 16;
  REQUIRE(validate(c).is_ok());
  return c;
}

// kimi-linear-tiny with Kimi-Linear-48B's head shapes (KDA D = 128, MLA latent 512 + rope 64): its
// softplus-gated KDA prefill takes the CUDA chunked kernel's unbounded-gate variant (D = 16 would
// take the token recurrence).
inline ModelConfig kimi_linear_tiny_with_48b_heads() {
  ModelConfig c = preset_config("kimi-linear-tiny").value();
  c.hidden_size = 256;
  c.kda.num_heads = 2;
  c.kda.head_dim = 128;
  c.num_attention_heads = c.num_key_value_heads = 16;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.moe_intermediate_size = 128;
  c.intermediate_size = 512;
  REQUIRE(validate(c).is_ok());
  return c;
}

struct ForcedLogits {
  int64_t prompts = 0, positions = 0, vocab = 0;
  std::vector<float> v;  // [prompts, positions, vocab]
  const float* row(int64_t n, int64_t pos) const { return v.data() + (n * positions + pos) * vocab; }
};

inline std::vector<std::vector<int32_t>> random_prompts(int n, int len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(len));
  for (auto& p : out)
    for (auto& t : p) t = d(rng);
  return out;
}

// Runs `prompts` teacher-forced through a fresh model and caches on `be`.
inline ForcedLogits teacher_forced(Backend& be, const ModelConfig& cfg, const WeightStore& weights,
                                   const std::vector<std::vector<int32_t>>& prompts, int prefill) {
  const int n = static_cast<int>(prompts.size());
  const int len = static_cast<int>(prompts.at(0).size());
  auto model = Model::create(be, cfg, weights).value();
  const int page = 16;
  CachePools pools(be, cfg, 0, cfg.num_hidden_layers,
                   {.max_seqs = n, .page_size = page, .num_pages = n * ((len + page - 1) / page) + 1});
  std::vector<SeqCache> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back(pools.open().value());
  ForcedLogits out{.prompts = n, .positions = len, .vocab = cfg.vocab_size};
  out.v.assign(size_t(n) * len * cfg.vocab_size, std::nanf(""));

  // One forward over items that each bring `count` tokens from position `from`.
  auto step = [&](int from, int count) {
    std::vector<BatchItem> batch;
    std::vector<int32_t> ids, rows;
    for (int i = 0; i < n; ++i) {
      REQUIRE(pools.reserve(seqs[i], count).is_ok());
      batch.push_back({.seq = &seqs[i], .num_new = count});
      ids.insert(ids.end(), prompts[i].begin() + from, prompts[i].begin() + from + count);
    }
    for (int32_t r = 0; r < n * count; ++r) rows.push_back(r);
    Activations act = model->embed(ids);
    model->forward(batch, act, pools);
    Tensor lg = model->logits(act, rows);
    for (int i = 0; i < n; ++i) {
      seqs[i].num_tokens += count;
      for (int t = 0; t < count; ++t)
        std::copy(lg.f32() + (int64_t(i) * count + t) * cfg.vocab_size,
                  lg.f32() + (int64_t(i) * count + t + 1) * cfg.vocab_size,
                  out.v.begin() + (int64_t(i) * len + from + t) * cfg.vocab_size);
    }
  };
  step(0, prefill);
  for (int pos = prefill; pos < len; ++pos) step(pos, 1);
  for (auto& s : seqs) pools.close(s);
  return out;
}

// Top two entries of a row (largest first, lowest id on ties).
inline std::pair<int32_t, int32_t> top2(const float* row, int64_t vocab) {
  int32_t a = 0, b = -1;
  for (int32_t i = 1; i < vocab; ++i) {
    if (row[i] > row[a]) {
      b = a;
      a = i;
    } else if (b < 0 || row[i] > row[b]) {
      b = i;
    }
  }
  return {a, b};
}

struct Agreement {
  double max_abs_err = 0, logit_scale = 0;  // max |got - ref|, max |ref|
  int64_t positions = 0, decided = 0, agree = 0, nonfinite = 0;
};

// The error bound is the measured max |got - ref|; a position is decided when the reference's top-1
// beats its top-2 by more than that bound, and then the top-1 tokens must agree.
inline Agreement compare(const ForcedLogits& got, const ForcedLogits& ref) {
  Agreement a;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    if (!std::isfinite(got.v[i])) {
      ++a.nonfinite;
      continue;
    }
    a.max_abs_err = std::max(a.max_abs_err, double(std::fabs(got.v[i] - ref.v[i])));
    a.logit_scale = std::max(a.logit_scale, double(std::fabs(ref.v[i])));
  }
  for (int64_t n = 0; n < ref.prompts; ++n)
    for (int64_t p = 0; p < ref.positions; ++p) {
      ++a.positions;
      const float* r = ref.row(n, p);
      auto [t1, t2] = top2(r, ref.vocab);
      if (double(r[t1]) - double(r[t2]) <= a.max_abs_err) continue;
      ++a.decided;
      if (top2(got.row(n, p), got.vocab).first == t1) ++a.agree;
    }
  return a;
}

}  // namespace k3::cudatest
