// The kimi_linear config.json: the released layout and transformers' save_pretrained layout both parse
// into the same config (1-based layer lists, q_lora_rank null, the family's fixed variants), and every
// field we do not implement is refused with its name.
#include <catch2/catch.hpp>

#include <functional>
#include <nlohmann/json.hpp>

#include "common/config/config.h"

using namespace k3;
using Json = nlohmann::json;

namespace {

Json tiny_json() { return Json::parse(model_config_to_json(preset_config("kimi-linear-tiny").value())); }

std::string error_of(const Json& j) {
  auto r = parse_model_config(j.dump());
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

// What transformers' KimiLinearConfig.save_pretrained wrote for a 4-layer model (transformers 5.24).
const char* kTransformersSaved = R"({
  "architectures": ["KimiLinearForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "first_k_dense_replace": 1, "head_dim": 8,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
  "kv_lora_rank": 32,
  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
  "linear_attn_config": {"full_attn_layers": [4], "head_dim": 16, "kda_layers": [1, 2, 3], "num_heads": 4,
                         "short_conv_kernel_size": 4},
  "linear_conv_kernel_dim": 4, "linear_head_dim": 16, "linear_num_heads": 4,
  "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "model_max_length": 1048576,
  "model_type": "kimi_linear", "moe_intermediate_size": 32, "moe_renormalize": true, "num_attention_heads": 4,
  "num_expert_group": 1, "num_experts": 8, "num_experts_per_token": 2, "num_hidden_layers": 4,
  "num_key_value_heads": 4, "num_shared_experts": 1, "output_router_logits": false, "pad_token_id": 0,
  "pretraining_tp": 1, "q_lora_rank": null, "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "rms_norm_eps": 1e-05, "routed_scaling_factor": 2.446, "tie_word_embeddings": false, "topk_group": 1,
  "transformers_version": "5.24.0", "use_cache": true, "v_head_dim": 16, "vocab_size": 300
})";

}  // namespace

TEST_CASE("a transformers-saved kimi_linear config.json parses with the family's variants", "[config]") {
  auto cfg = parse_model_config(kTransformersSaved);
  REQUIRE(cfg.is_ok());
  CHECK(cfg->is_kimi_linear());
  CHECK(cfg->q_lora_rank == 0);
  CHECK_FALSE(cfg->uses_q_lora());
  CHECK(cfg->kda.gate_form == KdaGateForm::Softplus);
  CHECK_FALSE(cfg->kda.use_full_rank_gate);
  CHECK_FALSE(cfg->mla_use_output_gate);
  CHECK_FALSE(cfg->uses_attn_res());
  CHECK(cfg->num_blocks() == 0);
  CHECK_FALSE(cfg->starts_block(0));
  CHECK_FALSE(cfg->uses_latent_moe());
  CHECK(cfg->uses_silu());
  CHECK(cfg->layer_kind(3) == LayerKind::Mla);
  CHECK(cfg->layer_kind(0) == LayerKind::Kda);
  CHECK(cfg->first_k_dense_replace == 1);
  CHECK(cfg->max_position_embeddings == 1048576);
  CHECK(cfg->routed_scaling_factor == Approx(2.446f));
  // Written back in the released layout, it parses to the same text again.
  const std::string text = model_config_to_json(*cfg);
  auto back = parse_model_config(text);
  REQUIRE(back.is_ok());
  CHECK(model_config_to_json(*back) == text);
  CHECK(Json::parse(text).at("q_lora_rank").is_null());
}

TEST_CASE("kimi_linear schedule and dense count may come from layer_types / mlp_layer_types alone", "[config]") {
  Json j = Json::parse(kTransformersSaved);
  j["linear_attn_config"].erase("kda_layers");
  j["linear_attn_config"].erase("full_attn_layers");
  j.erase("first_k_dense_replace");
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "full_attention"};
  j["mlp_layer_types"] = {"dense", "dense", "sparse", "sparse"};
  j["q_lora_rank"] = 16;
  j["num_key_value_heads"] = nullptr;
  auto cfg = parse_model_config(j.dump());
  REQUIRE(cfg.is_ok());
  CHECK(cfg->kda.full_attn_layers == std::vector<int>{1, 4});
  CHECK(cfg->kda.kda_layers == std::vector<int>{2, 3});
  CHECK(cfg->first_k_dense_replace == 2);
  CHECK(cfg->q_lora_rank == 16);
  CHECK(cfg->num_key_value_heads == 4);
}

TEST_CASE("kimi_linear fields we do not implement are refused by name", "[config]") {
  struct Case {
    const char* what;
    std::function<void(Json&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"unknown key", [](Json& j) { j["rope_fancy"] = 1; }, "rope_fancy"},
      {"K3-only key", [](Json& j) { j["attn_res_block_size"] = 4; }, "attn_res_block_size"},
      {"K3 gate bound", [](Json& j) { j["linear_attn_config"]["gate_lower_bound"] = -5.0; },
       "linear_attn_config.gate_lower_bound"},
      {"attention bias", [](Json& j) { j["attention_bias"] = true; }, "attention_bias"},
      {"activation", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"no renormalisation", [](Json& j) { j["moe_renormalize"] = false; }, "moe_renormalize"},
      {"softmax router", [](Json& j) { j["moe_router_activation_func"] = "softmax"; }, "moe_router_activation_func"},
      {"expert groups", [](Json& j) { j["num_expert_group"] = 8; }, "num_expert_group"},
      {"topk groups", [](Json& j) { j["topk_group"] = 2; }, "topk_group"},
      {"rotary MLA", [](Json& j) { j["mla_use_nope"] = false; }, "mla_use_nope"},
      {"MTP", [](Json& j) { j["num_nextn_predict_layers"] = 1; }, "num_nextn_predict_layers"},
      {"tied head", [](Json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings"},
      {"moe frequency", [](Json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq"},
      {"GQA", [](Json& j) { j["num_key_value_heads"] = 1; }, "num_key_value_heads"},
      {"dense count missing", [](Json& j) { j.erase("first_k_dense_replace"); }, "first_k_dense_replace"},
      {"no schedule", [](Json& j) { j.erase("linear_attn_config"); }, "layer schedule"},
      {"layer_types contradicts",
       [](Json& j) { j["layer_types"] = Json(std::vector<std::string>(8, "linear_attention")); }, "layer_types"},
      {"layer_types value", [](Json& j) { j["layer_types"] = {"mamba"}; }, "layer_types[0]"},
      {"mlp_layer_types order",
       [](Json& j) { j["mlp_layer_types"] = {"sparse", "dense", "sparse", "sparse", "sparse", "sparse", "sparse", "sparse"}; },
       "mlp_layer_types"},
      {"flat head dim", [](Json& j) { j["linear_head_dim"] = 32; }, "linear_head_dim"},
      {"0-based layer list", [](Json& j) { j["linear_attn_config"]["kda_layers"] = {0, 1, 2, 4, 5, 6}; },
       "layer 0 is out of range"},
      {"q lora negative", [](Json& j) { j["q_lora_rank"] = -1; }, "q_lora_rank"},
      {"wrong type", [](Json& j) { j["hidden_size"] = "64"; }, "hidden_size must be an integer"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Json j = tiny_json();
    c.mutate(j);
    REQUIRE_THAT(error_of(j), Catch::Contains(c.expect));
  }
}

TEST_CASE("the kimi-linear-48b preset has the released model's schedule", "[config]") {
  const ModelConfig c = preset_config("kimi-linear-48b").value();
  CHECK(c.num_hidden_layers == 27);
  CHECK(c.kda.full_attn_layers == std::vector<int>{4, 8, 12, 16, 20, 24, 27});
  CHECK(c.num_kda_layers() == 20);
  CHECK(c.first_k_dense_replace == 1);
  CHECK(c.q_lora_rank == 0);
}
