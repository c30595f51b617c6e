#include "common/config/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/config/config_kimi_linear.h"
#include "common/config/field_reader.h"

namespace k3 {
namespace {

using config_detail::FieldReader;
using config_detail::float_json;
using config_detail::positive;
using Json = nlohmann::json;

// HF bookkeeping keys that say nothing about the model's math; accepted and dropped.
const std::set<std::string> kIgnoredKeys = {"architectures", "torch_dtype", "dtype", "transformers_version",
                                            "auto_map"};

Status parse_kda(const Json& obj, const std::string& prefix, KdaConfig& kda) {
  FieldReader r(obj, prefix + "linear_attn_config.");
  K3_TRY(r.read("num_heads", kda.num_heads));
  K3_TRY(r.read("head_dim", kda.head_dim));
  K3_TRY(r.read("short_conv_kernel_size", kda.short_conv_kernel_size));
  K3_TRY(r.read("gate_lower_bound", kda.gate_lower_bound));
  K3_TRY(r.read("use_full_rank_gate", kda.use_full_rank_gate));
  K3_TRY(r.read("kda_layers", kda.kda_layers));
  K3_TRY(r.read("full_attn_layers", kda.full_attn_layers));
  return r.finish();
}

Status parse_fields(const Json& obj, const std::string& prefix, ModelConfig& c) {
  FieldReader r(obj, prefix);
  for (const auto& k : kIgnoredKeys) r.ignore(k);
  K3_TRY(r.read("model_type", c.model_type));
  K3_TRY(r.read("hidden_size", c.hidden_size));
  K3_TRY(r.read("num_hidden_layers", c.num_hidden_layers));
  K3_TRY(r.read("vocab_size", c.vocab_size));
  K3_TRY(r.read("rms_norm_eps", c.rms_norm_eps));
  K3_TRY(r.read("tie_word_embeddings", c.tie_word_embeddings));
  K3_TRY(r.read("max_position_embeddings", c.max_position_embeddings));
  K3_TRY(r.read_optional_id("bos_token_id", c.bos_token_id));
  K3_TRY(r.read_int_or_list("eos_token_id", c.eos_token_ids));

  Status st;
  const Json* kda = r.take_object("linear_attn_config", st);
  K3_TRY(st);
  if (!kda) return invalid_argument("linear_attn_config is required (KDA heads and the layer pattern)");
  K3_TRY(parse_kda(*kda, prefix, c.kda));

  K3_TRY(r.read("num_attention_heads", c.num_attention_heads));
  K3_TRY(r.read("num_key_value_heads", c.num_key_value_heads));
  K3_TRY(r.read("q_lora_rank", c.q_lora_rank));
  K3_TRY(r.read("kv_lora_rank", c.kv_lora_rank));
  K3_TRY(r.read("qk_nope_head_dim", c.qk_nope_head_dim));
  K3_TRY(r.read("qk_rope_head_dim", c.qk_rope_head_dim));
  K3_TRY(r.read("v_head_dim", c.v_head_dim));
  K3_TRY(r.read("mla_use_nope", c.mla_use_nope));
  K3_TRY(r.read("mla_use_output_gate", c.mla_use_output_gate));

  K3_TRY(r.read("num_experts", c.num_experts));
  K3_TRY(r.read("num_experts_per_token", c.num_experts_per_token));
  K3_TRY(r.read("num_shared_experts", c.num_shared_experts));
  K3_TRY(r.read("moe_intermediate_size", c.moe_intermediate_size));
  K3_TRY(r.read("routed_expert_hidden_size", c.routed_expert_hidden_size));
  K3_TRY(r.read("latent_moe_use_norm", c.latent_moe_use_norm));
  K3_TRY(r.read("first_k_dense_replace", c.first_k_dense_replace));
  K3_TRY(r.read("moe_layer_freq", c.moe_layer_freq));
  K3_TRY(r.read("intermediate_size", c.intermediate_size));
  K3_TRY(r.read("moe_router_activation_func", c.moe_router_activation_func));
  K3_TRY(r.read("moe_renormalize", c.moe_renormalize));
  K3_TRY(r.read("routed_scaling_factor", c.routed_scaling_factor));
  K3_TRY(r.read("use_grouped_topk", c.use_grouped_topk));
  K3_TRY(r.read("num_expert_group", c.num_expert_group));
  K3_TRY(r.read("topk_group", c.topk_group));

  K3_TRY(r.read("hidden_act", c.hidden_act));
  K3_TRY(r.read("activation_situ_beta", c.activation_situ_beta));
  K3_TRY(r.read("activation_situ_linear_beta", c.activation_situ_linear_beta));
  K3_TRY(r.read("attn_res_block_size", c.attn_res_block_size));
  K3_TRY(r.read("num_nextn_predict_layers", c.num_nextn_predict_layers));
  return r.finish();
}

Status positive_finite(const std::string& field, float v) {
  if (std::isfinite(v) && v > 0) return Status::ok();
  return invalid_argument(field + " must be a finite number > 0 (got " + std::to_string(v) + ")");
}

Status must_equal(const std::string& field, const std::string& got, const std::string& want, const char* why) {
  if (got == want) return Status::ok();
  return unsupported(field + " must be \"" + want + "\" (got \"" + got + "\"): " + why);
}

Status must_be_true(const std::string& field, bool v, const char* why) {
  if (v) return Status::ok();
  return unsupported(field + " must be true: " + why);
}

Status validate_token_id(const std::string& field, int id, int vocab) {
  if (id >= 0 && id < vocab) return Status::ok();
  return invalid_argument(field + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")");
}

}  // namespace

// kda_layers and full_attn_layers are 1-based, disjoint, and together cover 1..L exactly once.
Status validate_layer_pattern(const ModelConfig& c) {
  const int L = c.num_hidden_layers;
  std::vector<int> owner(L + 1, 0);  // 0 = unassigned, 1 = KDA, 2 = MLA
  const std::pair<const char*, const std::vector<int>*> lists[] = {
      {"linear_attn_config.kda_layers", &c.kda.kda_layers},
      {"linear_attn_config.full_attn_layers", &c.kda.full_attn_layers}};
  for (int which = 0; which < 2; ++which) {
    const std::string field = lists[which].first;
    for (int layer : *lists[which].second) {
      if (layer < 1 || layer > L)
        return invalid_argument(field + ": layer " + std::to_string(layer) +
                                " is out of range (1-based, must be in [1, " + std::to_string(L) + "])");
      if (owner[layer] == which + 1)
        return invalid_argument(field + ": layer " + std::to_string(layer) + " is listed twice");
      if (owner[layer] != 0)
        return invalid_argument(field + ": layer " + std::to_string(layer) +
                                " is also in linear_attn_config.kda_layers (the lists must be disjoint)");
      owner[layer] = which + 1;
    }
  }
  for (int layer = 1; layer <= L; ++layer)
    if (owner[layer] == 0)
      return invalid_argument("linear_attn_config.kda_layers / full_attn_layers: layer " + std::to_string(layer) +
                              " (1-based) is in neither list (together they must cover 1.." + std::to_string(L) +
                              ")");
  return Status::ok();
}

Status validate_ffn_shape(const ModelConfig& c) {
  const int L = c.num_hidden_layers;
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > L)
    return invalid_argument("first_k_dense_replace must be in [0, num_hidden_layers=" + std::to_string(L) +
                            "] (got " + std::to_string(c.first_k_dense_replace) + ")");
  if (c.first_k_dense_replace > 0) K3_TRY(positive("intermediate_size", c.intermediate_size));
  if (c.first_k_dense_replace < L) {
    K3_TRY(positive("num_experts", c.num_experts));
    if (c.num_experts_per_token < 1 || c.num_experts_per_token > c.num_experts)
      return invalid_argument("num_experts_per_token must be in [1, num_experts=" + std::to_string(c.num_experts) +
                              "] (got " + std::to_string(c.num_experts_per_token) + ")");
    if (c.num_shared_experts < 0)
      return invalid_argument("num_shared_experts must be >= 0 (got " + std::to_string(c.num_shared_experts) + ")");
    K3_TRY(positive("moe_intermediate_size", c.moe_intermediate_size));
  }
  return Status::ok();
}

LayerKind ModelConfig::layer_kind(int layer) const {
  K3_CHECK(layer >= 0 && layer < num_hidden_layers, "layer " + std::to_string(layer) + " out of range");
  const int one_based = layer + 1;
  return std::find(kda.kda_layers.begin(), kda.kda_layers.end(), one_based) != kda.kda_layers.end()
             ? LayerKind::Kda
             : LayerKind::Mla;
}

int ModelConfig::num_kda_layers() const { return static_cast<int>(kda.kda_layers.size()); }
int ModelConfig::num_mla_layers() const { return static_cast<int>(kda.full_attn_layers.size()); }

void fill_k3_layer_pattern(ModelConfig& cfg) {
  const int L = cfg.num_hidden_layers;
  cfg.kda.kda_layers.clear();
  cfg.kda.full_attn_layers.clear();
  for (int l = 0; l < L; ++l) {
    const bool mla = (l + 1) % 4 == 0 || l == L - 1;
    (mla ? cfg.kda.full_attn_layers : cfg.kda.kda_layers).push_back(l + 1);
  }
}

Status validate(const ModelConfig& c) {
  if (c.is_kimi_linear()) return validate_kimi_linear(c);
  if (c.model_type != "kimi_k3")
    return unsupported("model_type must be \"kimi_k3\" or \"kimi_linear\" (got \"" + c.model_type +
                       "\"): the model families this server implements");
  if (c.kda.gate_form != KdaGateForm::LowerBoundedSigmoid)
    return unsupported("linear_attn_config: kimi_k3 uses the lower-bounded sigmoid gate");
  K3_TRY(positive("hidden_size", c.hidden_size));
  K3_TRY(positive("num_hidden_layers", c.num_hidden_layers));
  K3_TRY(positive("vocab_size", c.vocab_size));
  K3_TRY(positive_finite("rms_norm_eps", c.rms_norm_eps));
  K3_TRY(positive("max_position_embeddings", c.max_position_embeddings));
  if (c.tie_word_embeddings)
    return unsupported("tie_word_embeddings must be false: K3 has an untied lm_head.weight");

  // KDA
  K3_TRY(positive("linear_attn_config.num_heads", c.kda.num_heads));
  K3_TRY(positive("linear_attn_config.head_dim", c.kda.head_dim));
  if (c.kda.short_conv_kernel_size < 1)
    return invalid_argument("linear_attn_config.short_conv_kernel_size must be >= 1 (got " +
                            std::to_string(c.kda.short_conv_kernel_size) + ")");
  if (!(c.kda.gate_lower_bound >= -5.f && c.kda.gate_lower_bound < 0.f))
    return invalid_argument("linear_attn_config.gate_lower_bound must be in [-5, 0) (got " +
                            std::to_string(c.kda.gate_lower_bound) +
                            "): the lower-bounded safe gate is only exact in that range");
  K3_TRY(must_be_true("linear_attn_config.use_full_rank_gate", c.kda.use_full_rank_gate,
                      "only K3's full-rank output gate (g_proj [P, d]) is implemented"));
  K3_TRY(validate_layer_pattern(c));

  // MLA
  K3_TRY(positive("num_attention_heads", c.num_attention_heads));
  if (c.num_key_value_heads != c.num_attention_heads)
    return unsupported("num_key_value_heads must equal num_attention_heads (got " +
                       std::to_string(c.num_key_value_heads) + " vs " + std::to_string(c.num_attention_heads) +
                       "): MLA has one latent KV shared by all heads, not GQA");
  K3_TRY(positive("q_lora_rank", c.q_lora_rank));
  K3_TRY(positive("kv_lora_rank", c.kv_lora_rank));
  K3_TRY(positive("qk_nope_head_dim", c.qk_nope_head_dim));
  K3_TRY(positive("qk_rope_head_dim", c.qk_rope_head_dim));
  K3_TRY(positive("v_head_dim", c.v_head_dim));
  K3_TRY(must_be_true("mla_use_nope", c.mla_use_nope, "only NoPE MLA (no rotary embedding) is implemented"));
  K3_TRY(must_be_true("mla_use_output_gate", c.mla_use_output_gate, "only K3's gated MLA is implemented"));

  // FFN
  const int L = c.num_hidden_layers;
  K3_TRY(validate_ffn_shape(c));
  if (c.first_k_dense_replace < L) {
    K3_TRY(positive("routed_expert_hidden_size", c.routed_expert_hidden_size));
    K3_TRY(must_be_true("latent_moe_use_norm", c.latent_moe_use_norm,
                        "the latent MoE always applies routed_expert_norm before the up-projection"));
    if (c.moe_layer_freq != 1)
      return unsupported("moe_layer_freq must be 1 (got " + std::to_string(c.moe_layer_freq) +
                         "): every layer after first_k_dense_replace is MoE");
    K3_TRY(must_equal("moe_router_activation_func", c.moe_router_activation_func, "sigmoid",
                      "the router is DeepSeek-V3 noaux_tc style"));
    K3_TRY(positive_finite("routed_scaling_factor", c.routed_scaling_factor));
    if (c.num_expert_group != 1)
      return unsupported("num_expert_group must be 1 (got " + std::to_string(c.num_expert_group) +
                         "): grouped top-k is not supported (K3 uses one group)");
    if (c.topk_group != 1)
      return unsupported("topk_group must be 1 (got " + std::to_string(c.topk_group) +
                         "): grouped top-k is not supported (K3 uses one group)");
  }
  K3_TRY(must_equal("hidden_act", c.hidden_act, "situ", "every K3 MLP uses SiTU"));
  K3_TRY(positive_finite("activation_situ_beta", c.activation_situ_beta));
  K3_TRY(positive_finite("activation_situ_linear_beta", c.activation_situ_linear_beta));

  if (c.attn_res_block_size < 1 || c.attn_res_block_size > L)
    return invalid_argument("attn_res_block_size must be in [1, num_hidden_layers=" + std::to_string(L) +
                            "] (got " + std::to_string(c.attn_res_block_size) + ")");
  if (c.num_nextn_predict_layers != 0)
    return unsupported("num_nextn_predict_layers must be 0 (got " + std::to_string(c.num_nextn_predict_layers) +
                       "): MTP layers are not supported (K3 ships none)");

  if (c.bos_token_id != -1) K3_TRY(validate_token_id("bos_token_id", c.bos_token_id, c.vocab_size));
  for (int id : c.eos_token_ids) K3_TRY(validate_token_id("eos_token_id", id, c.vocab_size));
  return Status::ok();
}

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument("config: not valid JSON");
  if (!root.is_object()) return invalid_argument("config: the top level must be a JSON object");
  // A multimodal wrapper keeps the language model under "text_config"; the other top-level keys
  // describe other towers and are not ours to check.
  std::string prefix;
  if (root.contains("text_config")) {
    if (!root.at("text_config").is_object()) return invalid_argument("text_config must be an object");
    root = Json(root.at("text_config"));
    prefix = "text_config.";
  }
  ModelConfig cfg;
  const bool kimi_linear = root.contains("model_type") && root.at("model_type") == "kimi_linear";
  K3_TRY(kimi_linear ? parse_kimi_linear_fields(root, prefix, cfg) : parse_fields(root, prefix, cfg));
  K3_TRY(validate(cfg));
  return cfg;
}

std::string model_config_to_json(const ModelConfig& c) {
  if (c.is_kimi_linear()) return kimi_linear_config_to_json(c);
  Json j = Json::object();
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["vocab_size"] = c.vocab_size;
  j["rms_norm_eps"] = float_json(c.rms_norm_eps);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.bos_token_id != -1) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;

  Json kda = Json::object();
  kda["num_heads"] = c.kda.num_heads;
  kda["head_dim"] = c.kda.head_dim;
  kda["short_conv_kernel_size"] = c.kda.short_conv_kernel_size;
  kda["gate_lower_bound"] = float_json(c.kda.gate_lower_bound);
  kda["use_full_rank_gate"] = c.kda.use_full_rank_gate;
  kda["kda_layers"] = c.kda.kda_layers;
  kda["full_attn_layers"] = c.kda.full_attn_layers;
  j["linear_attn_config"] = kda;

  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["mla_use_nope"] = c.mla_use_nope;
  j["mla_use_output_gate"] = c.mla_use_output_gate;

  j["num_experts"] = c.num_experts;
  j["num_experts_per_token"] = c.num_experts_per_token;
  j["num_shared_experts"] = c.num_shared_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["routed_expert_hidden_size"] = c.routed_expert_hidden_size;
  j["latent_moe_use_norm"] = c.latent_moe_use_norm;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_router_activation_func"] = c.moe_router_activation_func;
  j["moe_renormalize"] = c.moe_renormalize;
  j["routed_scaling_factor"] = float_json(c.routed_scaling_factor);
  j["use_grouped_topk"] = c.use_grouped_topk;
  j["num_expert_group"] = c.num_expert_group;
  j["topk_group"] = c.topk_group;

  j["hidden_act"] = c.hidden_act;
  j["activation_situ_beta"] = float_json(c.activation_situ_beta);
  j["activation_situ_linear_beta"] = float_json(c.activation_situ_linear_beta);
  j["attn_res_block_size"] = c.attn_res_block_size;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  return j.dump(2) + "\n";
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("error reading config file '" + path + "'");
  auto cfg = parse_model_config(ss.str());
  if (!cfg.is_ok()) return Status(cfg.status().code(), path + ": " + cfg.status().message());
  return cfg;
}

}  // namespace k3
