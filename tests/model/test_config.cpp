#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/config/config.h"

using namespace k3;
using Json = nlohmann::json;

namespace {

Json preset_json(const std::string& name) { return Json::parse(model_config_to_json(preset_config(name).value())); }

// Parses `j` and returns the error message (the parse must fail).
std::string error_of(const Json& j) {
  auto r = parse_model_config(j.dump());
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("every preset validates and survives a JSON round trip unchanged") {
  for (const std::string& name : preset_names()) {
    INFO(name);
    auto cfg = preset_config(name);
    REQUIRE(cfg.is_ok());
    REQUIRE(validate(*cfg).is_ok());
    const std::string text = model_config_to_json(*cfg);
    auto back = parse_model_config(text);
    REQUIRE(back.is_ok());
    REQUIRE(model_config_to_json(*back) == text);
    REQUIRE(same_bits(back->rms_norm_eps, cfg->rms_norm_eps));
    REQUIRE(same_bits(back->kda.gate_lower_bound, cfg->kda.gate_lower_bound));
    REQUIRE(same_bits(back->activation_situ_beta, cfg->activation_situ_beta));
    REQUIRE(back->kda.kda_layers == cfg->kda.kda_layers);
    REQUIRE(back->kda.full_attn_layers == cfg->kda.full_attn_layers);
    REQUIRE(back->hidden_size == cfg->hidden_size);
    REQUIRE(back->max_position_embeddings == cfg->max_position_embeddings);
  }
  REQUIRE_FALSE(preset_config("k4").is_ok());
  REQUIRE_THAT(preset_config("k4").status().message(), Catch::Contains("'k4'"));
}

TEST_CASE("round trip keeps token ids, floats and flags") {
  ModelConfig cfg = preset_config("k3-tiny").value();
  cfg.bos_token_id = 3;
  cfg.eos_token_ids = {5, 7};
  cfg.rms_norm_eps = 1e-6f;
  cfg.routed_scaling_factor = 2.446f;
  cfg.kda.gate_lower_bound = -3.3f;
  cfg.moe_renormalize = false;
  auto back = parse_model_config(model_config_to_json(cfg));
  REQUIRE(back.is_ok());
  REQUIRE(back->bos_token_id == 3);
  REQUIRE(back->eos_token_ids == std::vector<int>{5, 7});
  REQUIRE(same_bits(back->rms_norm_eps, 1e-6f));
  REQUIRE(same_bits(back->routed_scaling_factor, 2.446f));
  REQUIRE(same_bits(back->kda.gate_lower_bound, -3.3f));
  REQUIRE_FALSE(back->moe_renormalize);
  // Floats are written as their shortest decimal form.
  REQUIRE_THAT(model_config_to_json(cfg), Catch::Contains("\"rms_norm_eps\": 1e-06"));
}

TEST_CASE("the k3 preset has the released dimensions and layer pattern") {
  ModelConfig c = preset_config("k3").value();
  REQUIRE(c.num_kda_layers() == 69);
  REQUIRE(c.num_mla_layers() == 24);
  REQUIRE(c.mla_cache_width() == 576);
  REQUIRE(c.kda_proj_dim() == 12288);
  REQUIRE(c.num_blocks() == 8);
  std::vector<int> mla;
  for (int l = 4; l <= 92; l += 4) mla.push_back(l);
  mla.push_back(93);
  REQUIRE(c.kda.full_attn_layers == mla);
  REQUIRE(c.layer_kind(0) == LayerKind::Kda);
  REQUIRE(c.layer_kind(3) == LayerKind::Mla);
  REQUIRE(c.layer_kind(91) == LayerKind::Mla);
  REQUIRE(c.layer_kind(92) == LayerKind::Mla);
  REQUIRE(c.is_dense_ffn(0));
  REQUIRE_FALSE(c.is_dense_ffn(1));

  ModelConfig tiny = preset_config("k3-tiny").value();
  REQUIRE(tiny.kda.full_attn_layers == std::vector<int>{4, 8});
  REQUIRE(tiny.kda.kda_layers == std::vector<int>{1, 2, 3, 5, 6, 7});
  REQUIRE(tiny.starts_block(4));
  REQUIRE_FALSE(tiny.starts_block(5));
  ModelConfig tiny93 = preset_config("k3-tiny-93").value();
  REQUIRE(tiny93.num_blocks() == 8);
  REQUIRE(tiny93.kda.full_attn_layers == c.kda.full_attn_layers);
}

TEST_CASE("accepted input forms: text_config wrapper, HF metadata keys, scalar eos") {
  Json j = preset_json("k3-tiny");
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = "4.57.0";
  j["auto_map"] = {{"AutoConfig", "configuration_kimi_k3.KimiK3Config"}};
  j["eos_token_id"] = 9;
  j["bos_token_id"] = nullptr;
  Json wrapped = {{"model_type", "kimi_k3_vl"}, {"vision_config", {{"anything", 1}}}, {"text_config", j}};
  auto cfg = parse_model_config(wrapped.dump());
  REQUIRE(cfg.is_ok());
  REQUIRE(cfg->eos_token_ids == std::vector<int>{9});
  REQUIRE(cfg->bos_token_id == -1);
  REQUIRE(cfg->hidden_size == 64);
  // Errors inside the wrapper name the full path.
  wrapped["text_config"]["linear_attn_config"]["head_dimm"] = 16;
  REQUIRE_THAT(error_of(wrapped), Catch::Contains("text_config.linear_attn_config.head_dimm"));
}

TEST_CASE("each validation rule fails with a message naming the field") {
  struct Case {
    const char* what;
    std::function<void(Json&)> mutate;
    const char* expect;  // substring of the error
  };
  const std::vector<Case> cases = {
      {"unknown top-level key", [](Json& j) { j["hiden_size"] = 64; }, "hiden_size"},
      {"unknown KDA key", [](Json& j) { j["linear_attn_config"]["num_head"] = 4; }, "linear_attn_config.num_head"},
      {"wrong type", [](Json& j) { j["hidden_size"] = "64"; }, "hidden_size must be an integer"},
      {"model type", [](Json& j) { j["model_type"] = "kimi_k4"; }, "model_type"},
      {"non-positive dim", [](Json& j) { j["hidden_size"] = 0; }, "hidden_size must be > 0"},
      {"KDA head dim", [](Json& j) { j["linear_attn_config"]["head_dim"] = -1; }, "linear_attn_config.head_dim"},
      {"vocab", [](Json& j) { j["vocab_size"] = 0; }, "vocab_size"},
      {"eps", [](Json& j) { j["rms_norm_eps"] = 0.0; }, "rms_norm_eps"},
      {"layers listed twice",
       [](Json& j) { j["linear_attn_config"]["kda_layers"] = {1, 1, 2, 3, 5, 6, 7}; }, "listed twice"},
      {"layer lists overlap",
       [](Json& j) { j["linear_attn_config"]["full_attn_layers"] = {3, 4, 8}; }, "must be disjoint"},
      {"layer missing", [](Json& j) { j["linear_attn_config"]["full_attn_layers"] = {4}; }, "layer 8 (1-based)"},
      {"layer out of range (0-based by mistake)",
       [](Json& j) { j["linear_attn_config"]["kda_layers"] = {0, 1, 2, 4, 5, 6}; }, "layer 0 is out of range"},
      {"gate lower bound", [](Json& j) { j["linear_attn_config"]["gate_lower_bound"] = -6.0; },
       "linear_attn_config.gate_lower_bound must be in [-5, 0)"},
      {"gate lower bound zero", [](Json& j) { j["linear_attn_config"]["gate_lower_bound"] = 0.0; },
       "linear_attn_config.gate_lower_bound"},
      {"conv kernel", [](Json& j) { j["linear_attn_config"]["short_conv_kernel_size"] = 0; },
       "linear_attn_config.short_conv_kernel_size"},
      {"low-rank gate", [](Json& j) { j["linear_attn_config"]["use_full_rank_gate"] = false; },
       "linear_attn_config.use_full_rank_gate"},
      {"kv heads", [](Json& j) { j["num_key_value_heads"] = 1; }, "num_key_value_heads must equal"},
      {"q lora", [](Json& j) { j["q_lora_rank"] = 0; }, "q_lora_rank"},
      {"kv lora", [](Json& j) { j["kv_lora_rank"] = 0; }, "kv_lora_rank"},
      {"v dim", [](Json& j) { j["v_head_dim"] = 0; }, "v_head_dim"},
      {"rope dim", [](Json& j) { j["qk_rope_head_dim"] = 0; }, "qk_rope_head_dim"},
      {"nope", [](Json& j) { j["mla_use_nope"] = false; }, "mla_use_nope"},
      {"mla gate", [](Json& j) { j["mla_use_output_gate"] = false; }, "mla_use_output_gate"},
      {"top-k > E", [](Json& j) { j["num_experts_per_token"] = 9; }, "num_experts_per_token"},
      {"shared < 0", [](Json& j) { j["num_shared_experts"] = -1; }, "num_shared_experts"},
      {"dense count", [](Json& j) { j["first_k_dense_replace"] = 9; }, "first_k_dense_replace"},
      {"moe freq", [](Json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq"},
      {"block size", [](Json& j) { j["attn_res_block_size"] = 0; }, "attn_res_block_size"},
      {"block size too big", [](Json& j) { j["attn_res_block_size"] = 9; }, "attn_res_block_size"},
      {"activation", [](Json& j) { j["hidden_act"] = "silu"; }, "hidden_act"},
      {"router", [](Json& j) { j["moe_router_activation_func"] = "softmax"; }, "moe_router_activation_func"},
      {"expert groups", [](Json& j) { j["num_expert_group"] = 8; }, "num_expert_group"},
      {"topk groups", [](Json& j) { j["topk_group"] = 4; }, "topk_group"},
      {"eos outside vocab", [](Json& j) { j["eos_token_id"] = {1, 512}; }, "eos_token_id"},
      {"bos outside vocab", [](Json& j) { j["bos_token_id"] = 600; }, "bos_token_id"},
      {"tied head", [](Json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings"},
      {"mtp", [](Json& j) { j["num_nextn_predict_layers"] = 1; }, "num_nextn_predict_layers"},
      {"latent norm", [](Json& j) { j["latent_moe_use_norm"] = false; }, "latent_moe_use_norm"},
      {"no KDA block", [](Json& j) { j.erase("linear_attn_config"); }, "linear_attn_config is required"},
      {"max positions", [](Json& j) { j["max_position_embeddings"] = 0; }, "max_position_embeddings"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Json j = preset_json("k3-tiny");
    c.mutate(j);
    REQUIRE_THAT(error_of(j), Catch::Contains(c.expect));
  }
  REQUIRE_THAT(error_of(Json::array()), Catch::Contains("JSON object"));
  REQUIRE_FALSE(parse_model_config("{not json").is_ok());
}

TEST_CASE("an all-dense model does not need MoE fields") {
  Json j = preset_json("k3-tiny");
  j["first_k_dense_replace"] = 8;
  j["num_experts"] = 0;
  j["num_experts_per_token"] = 0;
  REQUIRE(parse_model_config(j.dump()).is_ok());
}

TEST_CASE("load_model_config names the file in its errors") {
  auto r = load_model_config("/nonexistent/k3/config.json");
  REQUIRE_FALSE(r.is_ok());
  REQUIRE_THAT(r.status().message(), Catch::Contains("/nonexistent/k3/config.json"));
}
