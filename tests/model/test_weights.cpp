#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/io/safetensors.h"
#include "common/io/safetensors_writer.h"
#include "common/model/weights.h"
#include "common/model/weights_init.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny() { return preset_config("k3-tiny").value(); }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Writes `w` (optionally with one tensor dropped or replaced) as <dir>/model.safetensors.
void write_model(const ScratchDir& dir, const WeightStore& w, const std::string& drop = "",
                 const std::string& replace = "", Tensor replacement = {}) {
  std::vector<std::pair<std::string, Tensor>> list;
  for (const auto& [name, t] : w.all()) {
    if (name == drop) continue;
    list.emplace_back(name, name == replace ? replacement : t);
  }
  REQUIRE(write_safetensors(dir.file("model.safetensors"), list).is_ok());
}

std::string load_error(const ScratchDir& dir, const ModelConfig& cfg) {
  auto r = load_weights(dir.str(), cfg);
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

double rms(const Tensor& t) {
  Tensor f = t.to_f32();
  double s = 0;
  for (int64_t i = 0; i < f.numel(); ++i) s += double(f.f32()[i]) * f.f32()[i];
  return std::sqrt(s / f.numel());
}

}  // namespace

TEST_CASE("random k3-tiny weights write, load back and compare identical") {
  const ModelConfig cfg = tiny();
  for (DType dtype : {DType::BF16, DType::F32}) {
    INFO(dtype_name(dtype));
    ScratchDir dir("weights_test");
    WeightStore w = random_weights(cfg, 42, dtype);
    REQUIRE(w.all().size() == expected_tensors(cfg).size());
    write_model(dir, w);
    auto loaded = load_weights(dir.str(), cfg);
    REQUIRE(loaded.is_ok());
    REQUIRE(loaded->all().size() == w.all().size());
    for (const auto& [name, t] : w.all()) {
      INFO(name);
      REQUIRE(same_bytes(loaded->get(name), t));
    }
  }
}

TEST_CASE("random weights follow the schema: shapes, F32-only tensors, matrix dtype") {
  const ModelConfig cfg = tiny();
  WeightStore w = random_weights(cfg, 1, DType::BF16);
  for (const TensorSpec& s : expected_tensors(cfg)) {
    INFO(s.name);
    const Tensor& t = w.get(s.name);
    REQUIRE(t.shape() == s.shape);
    REQUIRE(t.dtype() == (s.f32_only ? DType::F32 : DType::BF16));
  }
  // F32-only set is exactly: conv taps, A_log, dt_bias, router correction bias.
  for (const TensorSpec& s : expected_tensors(cfg)) {
    const bool f32 = s.name.find("_conv1d.") != std::string::npos || s.name.ends_with(".A_log") ||
                     s.name.ends_with(".dt_bias") || s.name.ends_with(".e_score_correction_bias");
    INFO(s.name);
    REQUIRE(s.f32_only == f32);
  }
  REQUIRE_THROWS_WITH(w.get("model.layers.99.input_layernorm.weight"),
                      Catch::Contains("model.layers.99.input_layernorm.weight"));
}

TEST_CASE("random weights are deterministic per (seed, tensor name), independent of the rest") {
  const ModelConfig cfg = tiny();
  WeightStore a = random_weights(cfg, 7, DType::F32);
  WeightStore b = random_weights(cfg, 7, DType::F32);
  WeightStore c = random_weights(cfg, 8, DType::F32);
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  REQUIRE(same_bytes(a.get(q), b.get(q)));
  REQUIRE_FALSE(same_bytes(a.get(q), c.get(q)));
  // Two tensors of the same shape and rule must still differ (seeded by name).
  REQUIRE_FALSE(same_bytes(a.get(q), a.get("model.layers.1.self_attn.k_proj.weight")));
  // A stage generating only layers [4, 8) gets the same values.
  for (const TensorSpec& s : expected_tensors(cfg, 4, 8)) {
    INFO(s.name);
    REQUIRE(same_bytes(random_tensor(cfg, s, 7, DType::F32), a.get(s.name)));
  }
  // BF16 weights are the rounded F32 ones.
  WeightStore h = random_weights(cfg, 7, DType::BF16);
  const Tensor& hf = h.get(q);
  for (int64_t i = 0; i < hf.numel(); ++i)
    REQUIRE(hf.ptr<uint16_t>()[i] == f32_to_bf16(a.get(q).f32()[i]));
}

TEST_CASE("random weights use the documented scales") {
  const ModelConfig cfg = preset_config("k3-tiny").value();
  WeightStore w = random_weights(cfg, 3, DType::F32);
  const double d = cfg.hidden_size, P = cfg.kda_proj_dim(), out = 1.0 / std::sqrt(2.0 * cfg.attn_res_block_size);
  auto near = [](double got, double want) { return std::fabs(got - want) <= 0.1 * want; };
  CHECK(near(rms(w.get("model.embed_tokens.weight")), 1.0));
  CHECK(near(rms(w.get("lm_head.weight")), 1.0 / std::sqrt(d)));
  CHECK(near(rms(w.get("model.layers.1.self_attn.q_proj.weight")), 1.0 / std::sqrt(d)));
  CHECK(near(rms(w.get("model.layers.1.self_attn.o_proj.weight")), out / std::sqrt(P)));
  CHECK(near(rms(w.get("model.layers.0.mlp.down_proj.weight")), out / std::sqrt(cfg.intermediate_size)));
  CHECK(near(rms(w.get("model.layers.1.mlp.experts.0.w2.weight")), 1.0 / std::sqrt(cfg.moe_intermediate_size)));
  CHECK(rms(w.get("model.layers.2.self_attn.A_log")) == 0.0);
  for (const char* norm : {"model.norm.weight", "model.layers.3.self_attn.kv_a_layernorm.weight",
                           "model.layers.2.self_attn.o_norm.weight", "model.layers.5.mlp.routed_expert_norm.weight",
                           "model.layers.5.mlp_res_norm.weight"}) {
    const Tensor& t = w.get(norm);
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(t.f32()[i] == 1.f);
  }
  // dt_bias = softplus^-1(dt), dt in [1e-3, 1e-1].
  const Tensor& dt = w.get("model.layers.0.self_attn.dt_bias");
  auto softplus = [](double x) { return std::log1p(std::exp(x)); };
  for (int64_t i = 0; i < dt.numel(); ++i) {
    const double v = softplus(dt.f32()[i]);
    REQUIRE(v >= 1e-3 * 0.999);
    REQUIRE(v <= 1e-1 * 1.001);
  }
  // AttnRes pseudo-queries are small but non-zero, so the mixing is not uniform.
  const double res = rms(w.get("model.layers.4.self_attention_res_proj.weight"));
  CHECK(res > 0.0);
  CHECK(near(res, 0.5 / std::sqrt(d)));
}

TEST_CASE("load_weights names a missing tensor") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  const std::string victim = "model.layers.3.self_attn.kv_b_proj.weight";
  write_model(dir, random_weights(cfg, 1, DType::BF16), victim);
  REQUIRE_THAT(load_error(dir, cfg), Catch::Contains(victim) && Catch::Contains("missing"));
}

TEST_CASE("load_weights names a misshapen tensor with expected and actual shape") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  const std::string victim = "model.layers.1.mlp.experts.5.w3.weight";
  write_model(dir, random_weights(cfg, 1, DType::BF16), "", victim, Tensor::zeros({32, 31}, DType::BF16));
  REQUIRE_THAT(load_error(dir, cfg),
               Catch::Contains(victim) && Catch::Contains("[32, 32]") && Catch::Contains("[32, 31]"));
}

TEST_CASE("load_weights names an F32-only tensor stored in another dtype") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  const std::string victim = "model.layers.2.self_attn.dt_bias";
  write_model(dir, random_weights(cfg, 1, DType::BF16), "", victim, Tensor::zeros({64}, DType::BF16));
  REQUIRE_THAT(load_error(dir, cfg), Catch::Contains(victim) && Catch::Contains("F32") && Catch::Contains("BF16"));
}

TEST_CASE("load_weights refuses integer matrices") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  const std::string victim = "lm_head.weight";
  write_model(dir, random_weights(cfg, 1, DType::BF16), "", victim,
              Tensor::zeros({cfg.vocab_size, cfg.hidden_size}, DType::I32));
  REQUIRE_THAT(load_error(dir, cfg), Catch::Contains(victim) && Catch::Contains("I32"));
}

TEST_CASE("A_log stored longer than the head count is accepted and narrowed (as in the K3 release)") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  const std::string name = "model.layers.0.self_attn.A_log";
  std::vector<float> vals(16);
  for (int i = 0; i < 16; ++i) vals[i] = 0.5f * i;
  write_model(dir, random_weights(cfg, 1, DType::BF16), "", name, Tensor::from_f32({16}, vals));
  auto w = load_weights(dir.str(), cfg);
  REQUIRE(w.is_ok());
  const Tensor& a = w->get(name);
  REQUIRE(a.shape() == Shape{cfg.kda.num_heads});
  for (int i = 0; i < cfg.kda.num_heads; ++i) REQUIRE(a.f32()[i] == vals[i]);
  // Shorter than the head count is still an error.
  write_model(dir, random_weights(cfg, 1, DType::BF16), "", name, Tensor::from_f32({2}, {vals.data(), 2}));
  REQUIRE_THAT(load_error(dir, cfg), Catch::Contains(name));
}

TEST_CASE("expected_tensors for a layer range holds only that range's tensors") {
  const ModelConfig cfg = tiny();
  auto names_of = [&](int b, int e) {
    std::set<std::string> s;
    for (const auto& t : expected_tensors(cfg, b, e)) s.insert(t.name);
    return s;
  };
  const auto mid = names_of(2, 5);
  for (const auto& n : mid) {
    INFO(n);
    REQUIRE((n.starts_with("model.layers.2.") || n.starts_with("model.layers.3.") || n.starts_with("model.layers.4.")));
  }
  REQUIRE(mid.count("model.layers.3.self_attn.q_a_proj.weight"));  // layer 3 is MLA
  REQUIRE(mid.count("model.layers.2.self_attn.f_a_proj.weight"));  // layer 2 is KDA
  REQUIRE_FALSE(mid.count("model.layers.3.self_attn.f_a_proj.weight"));

  const auto first = names_of(0, 2);
  REQUIRE(first.count("model.embed_tokens.weight"));
  REQUIRE_FALSE(first.count("lm_head.weight"));
  REQUIRE(first.count("model.layers.0.mlp.gate_proj.weight"));        // dense layer 0
  REQUIRE_FALSE(first.count("model.layers.0.mlp.gate.weight"));
  REQUIRE(first.count("model.layers.1.mlp.experts.7.w2.weight"));     // MoE layer 1
  REQUIRE(first.count("model.layers.1.mlp.shared_experts.down_proj.weight"));

  const auto last = names_of(6, 8);
  for (const char* n : {"lm_head.weight", "model.norm.weight", "model.output_attn_res_proj.weight",
                        "model.output_attn_res_norm.weight"})
    REQUIRE(last.count(n));
  REQUIRE_FALSE(last.count("model.embed_tokens.weight"));

  // The ranges partition the whole model.
  std::set<std::string> all = names_of(0, 8), joined = first;
  for (const auto& s : {names_of(2, 6), last}) joined.insert(s.begin(), s.end());
  REQUIRE(joined == all);
  REQUIRE(all.size() == expected_tensors(cfg).size());
  REQUIRE_THROWS_WITH(expected_tensors(cfg, 3, 3), Catch::Contains("[3, 3)"));
  REQUIRE_THROWS(expected_tensors(cfg, 0, 9));
}

TEST_CASE("no shared-expert tensors when num_shared_experts is 0") {
  ModelConfig cfg = tiny();
  cfg.num_shared_experts = 0;
  for (const auto& t : expected_tensors(cfg)) REQUIRE(t.name.find("shared_experts") == std::string::npos);
}

TEST_CASE("load_weights for a layer range reads only that range, from sharded files") {
  const ModelConfig cfg = tiny();
  ScratchDir dir("weights_test");
  WeightStore w = random_weights(cfg, 5, DType::BF16);
  // Two shards: layers < 4 (+ embedding) and the rest.
  std::vector<std::pair<std::string, Tensor>> s1, s2;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, t] : w.all()) {
    const bool early = name == "model.embed_tokens.weight" || name.starts_with("model.layers.0.") ||
                       name.starts_with("model.layers.1.") || name.starts_with("model.layers.2.") ||
                       name.starts_with("model.layers.3.");
    (early ? s1 : s2).emplace_back(name, t);
    map[name] = early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  REQUIRE(write_safetensors(dir.file("model-00001-of-00002.safetensors"), s1).is_ok());
  REQUIRE(write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2).is_ok());
  std::ofstream(dir.file("model.safetensors.index.json")) << nlohmann::json{{"weight_map", map}}.dump();

  auto stage = load_weights(dir.str(), cfg, 4, 8);
  REQUIRE(stage.is_ok());
  REQUIRE(stage->all().size() == expected_tensors(cfg, 4, 8).size());
  REQUIRE_FALSE(stage->has("model.embed_tokens.weight"));
  REQUIRE(same_bytes(stage->get("lm_head.weight"), w.get("lm_head.weight")));
  auto whole = load_weights(dir.str(), cfg);
  REQUIRE(whole.is_ok());
  REQUIRE(whole->all().size() == w.all().size());
  REQUIRE_FALSE(load_weights(dir.str(), cfg, 5, 4).is_ok());
}
