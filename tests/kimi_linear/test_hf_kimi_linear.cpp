// Hugging Face Kimi Linear checkpoints against the `transformers` package's own KimiLinearForCausalLM:
// tiny random models built and saved by transformers (q_lora_rank null and set, two layer schedules,
// 1 and 2 dense layers, one of them sharded with model.safetensors.index.json) are loaded as they are;
// every position's logits of 8 prompts x 64 tokens match transformers' within 1e-4 of the logits' scale
// (fp32), in one batched prefill and along an incremental decode; k3-generate's 32 greedy tokens equal
// transformers' greedy tokens. The same holds for k3-genweights' kimi-linear-tiny loaded by transformers
// with from_pretrained (the generator writes the Hugging Face layout).
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "common/config/config.h"
#include "common/model/weights.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "tests/support/generate_reference.h"
#include "tests/support/hf_kimi_linear.h"

using namespace k3;
using k3::test::HfKimiLinearModel;
using k3::test::HfKimiLinearModels;

namespace {

constexpr double kTol = 1e-4;

// max |a-b| / max(1, max|b|) over one row: relative to the logits' scale.
double rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 1;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return num / den;
}

// k3-genweights' kimi-linear-tiny, f32, in a temp dir that lives as long as the process.
std::string genweights_dir() {
  static const k3::test::TempDir dir("genweights-kimi-linear");
  const std::string out = dir.path() + "/genweights-kimi-linear-tiny";
  static const int rc = k3::test::run_command(std::string(K3_BIN_DIR) + "/k3-genweights --preset kimi-linear-tiny "
                                              "--dtype f32 --seed 5 --quiet --out '" + out + "'").exit_code;
  REQUIRE(rc == 0);
  return out;
}

const HfKimiLinearModels& hf_models() {
  // Built once per test process (imports torch: slow).
  static const HfKimiLinearModels models("", {genweights_dir()});
  return models;
}

struct Loaded {
  ModelConfig cfg;
  WeightStore weights;
  std::unique_ptr<Backend> backend = make_cpu_backend({.threads = 2});
  std::unique_ptr<Model> model;
  std::unique_ptr<CachePools> caches;
  explicit Loaded(const std::string& dir) {
    cfg = load_model_config(dir + "/config.json").value();
    weights = load_weights(dir, cfg).value();
    model = Model::create(*backend, cfg, weights).value();
    caches = std::make_unique<CachePools>(*backend, cfg, 0, cfg.num_hidden_layers,
                                          CacheOptions{.max_seqs = 8, .page_size = 16, .num_pages = 64});
  }
};

}  // namespace

TEST_CASE("transformers' Kimi Linear directories load with the family's variants", "[kimi_linear]") {
  const HfKimiLinearModels& hf = hf_models();
  if (!hf.available()) {
    WARN("skipped: " << hf.skip_reason());
    return;
  }
  REQUIRE(hf.models().size() == 3);
  for (const HfKimiLinearModel& m : hf.models()) {
    INFO(m.name);
    const ModelConfig cfg = load_model_config(m.dir + "/config.json").value();
    CHECK(cfg.is_kimi_linear());
    CHECK(cfg.kda.gate_form == KdaGateForm::Softplus);
    CHECK_FALSE(cfg.uses_attn_res());
    CHECK_FALSE(cfg.uses_latent_moe());
    CHECK_FALSE(cfg.mla_use_output_gate);
    CHECK_FALSE(cfg.kda.use_full_rank_gate);
    CHECK(cfg.uses_silu());
    if (m.name == "genweights-kimi-linear-tiny") {
      CHECK(cfg.num_hidden_layers == 8);
      CHECK(cfg.kda.full_attn_layers == std::vector<int>{4, 8});
    } else if (m.name == "qnull_dense1") {
      CHECK(cfg.q_lora_rank == 0);
      CHECK(cfg.first_k_dense_replace == 1);
      CHECK(cfg.kda.full_attn_layers == std::vector<int>{4});
    } else {
      CHECK(cfg.q_lora_rank == 24);
      CHECK(cfg.first_k_dense_replace == 2);
      CHECK(cfg.layer_kind(0) == LayerKind::Mla);
      CHECK(cfg.layer_kind(3) == LayerKind::Mla);
      CHECK(cfg.layer_kind(1) == LayerKind::Kda);
    }
    CHECK(load_weights(m.dir, cfg).is_ok());
  }
}

TEST_CASE("Kimi Linear logits equal transformers' for 8 prompts x 64 positions (batched prefill)", "[kimi_linear]") {
  const HfKimiLinearModels& hf = hf_models();
  if (!hf.available()) {
    WARN("skipped: " << hf.skip_reason());
    return;
  }
  for (const HfKimiLinearModel& m : hf.models()) {
    INFO(m.name);
    Loaded k(m.dir);
    const auto& prompts = m.oracle.at("prompts");
    const int64_t P = static_cast<int64_t>(prompts.size()), T = static_cast<int64_t>(prompts.at(0).size()),
                  V = k.cfg.vocab_size;
    REQUIRE(P == 8);
    REQUIRE(T == 64);
    // All 8 prompts in one forward: batching must not change any row.
    std::vector<SeqCache> seqs;
    std::vector<BatchItem> batch;
    std::vector<int32_t> ids;
    for (int64_t p = 0; p < P; ++p) {
      seqs.push_back(k.caches->open().value());
      REQUIRE(k.caches->reserve(seqs.back(), T).is_ok());
      for (int64_t t = 0; t < T; ++t) ids.push_back(prompts.at(p).at(t).get<int32_t>());
    }
    for (SeqCache& s : seqs) batch.push_back({.seq = &s, .num_new = T});
    Activations act = k.model->embed(ids);
    k.model->forward(batch, act, *k.caches);
    std::vector<int32_t> rows(P * T);
    std::iota(rows.begin(), rows.end(), 0);
    Tensor logits = k.model->logits(act, rows);
    double worst = 0;
    for (int64_t r = 0; r < P * T; ++r)
      worst = std::max(worst, rel_diff(logits.f32() + r * V, m.logits.data() + r * V, V));
    INFO("max relative logit difference " << worst);
    CHECK(worst <= kTol);
    for (SeqCache& s : seqs) k.caches->close(s);
  }
}

TEST_CASE("Kimi Linear decode steps equal transformers' logits (prefill 40, then one token at a time)",
          "[kimi_linear]") {
  const HfKimiLinearModels& hf = hf_models();
  if (!hf.available()) {
    WARN("skipped: " << hf.skip_reason());
    return;
  }
  for (const HfKimiLinearModel& m : hf.models()) {
    INFO(m.name);
    Loaded k(m.dir);
    const int64_t V = k.cfg.vocab_size, T = 64, T0 = 40;
    const auto& prompt = m.oracle.at("prompts").at(2);
    SeqCache s = k.caches->open().value();
    REQUIRE(k.caches->reserve(s, T).is_ok());
    double worst = 0;
    for (int64_t pos = 0; pos < T;) {
      const int64_t n = pos == 0 ? T0 : 1;
      std::vector<int32_t> ids;
      for (int64_t t = pos; t < pos + n; ++t) ids.push_back(prompt.at(t).get<int32_t>());
      BatchItem item{.seq = &s, .num_new = n};
      Activations act = k.model->embed(ids);
      k.model->forward(std::span<const BatchItem>(&item, 1), act, *k.caches);
      const int32_t last = static_cast<int32_t>(n - 1);
      Tensor logits = k.model->logits(act, std::span<const int32_t>(&last, 1));
      s.num_tokens += n;
      pos += n;
      worst = std::max(worst, rel_diff(logits.f32(), m.logits.data() + (2 * T + pos - 1) * V, V));
    }
    INFO("max relative logit difference " << worst);
    CHECK(worst <= kTol);
    k.caches->close(s);
  }
}

TEST_CASE("k3-generate on a transformers-saved Kimi Linear directory: 32 greedy tokens equal transformers'",
          "[kimi_linear]") {
  const HfKimiLinearModels& hf = hf_models();
  if (!hf.available()) {
    WARN("skipped: " << hf.skip_reason());
    return;
  }
  for (const HfKimiLinearModel& m : hf.models()) {
    for (size_t i = 0; i < m.oracle.at("gen_prompts").size(); ++i) {
      INFO(m.name << " prompt " << i);
      const auto prompt = m.oracle.at("gen_prompts").at(i).get<std::vector<int32_t>>();
      const auto want = m.oracle.at("greedy").at(i).get<std::vector<int32_t>>();
      CHECK(k3::test::k3_generate_tokens(m.dir, prompt, 32) == want);
    }
  }
}
