// Shared set-up for the model tests: a preset config with random F32 weights on the CPU backend.
#pragma once
#include <memory>
#include <random>

#include "common/config/config.h"
#include "engine/engine.h"
#include "common/model/weights.h"
#include "kernels/backend.h"

namespace k3::test {

inline ModelConfig tiny_config(const std::string& preset = "k3-tiny", int vocab = 512) {
  ModelConfig cfg = preset_config(preset).value();
  cfg.vocab_size = vocab;
  cfg.eos_token_ids.clear();
  return cfg;
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// max |a-b| / max(1, max|b|): relative to the logits' scale, so near-zero entries don't inflate it.
inline double rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 1;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / den;
}

inline EngineOptions engine_options(int chunk = 0, int max_seqs = 8) {
  EngineOptions o;
  o.cache.max_seqs = max_seqs;
  o.cache.page_size = 16;
  o.cache.num_pages = 512;
  o.prefill_chunk = chunk;
  return o;
}

}  // namespace k3::test
