// The kimi_linear config.json (docs/MODELS.md). Two writers exist: the released checkpoints
// (configuration_kimi.py: linear_attn_config with 1-based kda_layers / full_attn_layers, q_lora_rank
// null, model_max_length) and transformers' KimiLinearConfig.save_pretrained (which adds layer_types,
// mlp_layer_types and flattened linear_* keys). Both are read; keys that restate the schedule must agree
// with it, keys that change the math in ways we do not implement are refused by name, and keys with no
// effect on inference (initialisation, caching, RoPE settings of a NoPE model) are accepted and dropped.
#include "common/config/config_kimi_linear.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/config/field_reader.h"

namespace k3 {
namespace {

using config_detail::FieldReader;
using config_detail::float_json;
using config_detail::positive;
using Json = nlohmann::json;

// No effect on the forward pass of a NoPE, inference-only model; accepted and dropped.
const std::set<std::string> kIgnoredKeys = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "auto_map", "initializer_range",
    "use_cache", "pad_token_id", "output_router_logits", "attention_dropout", "pretraining_tp",
    // mla_use_nope must be true (checked), so no rotary embedding is ever applied: its settings are moot.
    "rope_theta", "rope_scaling", "rope_parameters",
    // transformers derives these from other keys (head_dim = qk_rope_head_dim, qk_head_dim = dn + dr).
    "head_dim", "qk_head_dim"};

Status refuse_unless(bool ok, const std::string& field, const std::string& why) {
  return ok ? Status::ok() : unsupported(field + ": " + why);
}

Status parse_linear_attn(const Json& obj, const std::string& prefix, KdaConfig& kda) {
  FieldReader r(obj, prefix + "linear_attn_config.");
  K3_TRY(r.read("num_heads", kda.num_heads));
  K3_TRY(r.read("head_dim", kda.head_dim));
  K3_TRY(r.read("short_conv_kernel_size", kda.short_conv_kernel_size));
  K3_TRY(r.read("kda_layers", kda.kda_layers));
  K3_TRY(r.read("full_attn_layers", kda.full_attn_layers));
  return r.finish("kimi_linear");
}

// A flattened key that restates a linear_attn_config value must agree with it; alone it sets it.
Status agree(const std::string& field, int flat, bool have_flat, int& value, const std::string& source) {
  if (!have_flat) return Status::ok();
  if (value == 0) {
    value = flat;
    return Status::ok();
  }
  if (flat == value) return Status::ok();
  return invalid_argument(field + " = " + std::to_string(flat) + " contradicts " + source + " = " +
                          std::to_string(value));
}

// transformers' layer_types: "linear_attention" (KDA) or "full_attention" (MLA), one per layer, 0-based.
Status schedule_from_layer_types(const std::string& field, const std::vector<std::string>& types, KdaConfig& kda) {
  std::vector<int> kda_layers, full_layers;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "linear_attention") kda_layers.push_back(static_cast<int>(i) + 1);
    else if (types[i] == "full_attention") full_layers.push_back(static_cast<int>(i) + 1);
    else
      return invalid_argument(field + "[" + std::to_string(i) + "] = \"" + types[i] +
                              "\" (expected \"linear_attention\" or \"full_attention\")");
  }
  if (kda.kda_layers.empty() && kda.full_attn_layers.empty()) {
    kda.kda_layers = kda_layers;
    kda.full_attn_layers = full_layers;
    return Status::ok();
  }
  std::vector<int> a = kda.kda_layers, b = kda.full_attn_layers;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != kda_layers || b != full_layers)
    return invalid_argument(field + " contradicts linear_attn_config.kda_layers / full_attn_layers");
  return Status::ok();
}

// transformers' mlp_layer_types: "dense" for the first first_k_dense_replace layers, then "sparse".
Status dense_count_from_mlp_types(const std::string& field, const std::vector<std::string>& types, bool have_k,
                                  int& first_k_dense) {
  int dense = 0;
  while (dense < static_cast<int>(types.size()) && types[dense] == "dense") ++dense;
  for (size_t i = dense; i < types.size(); ++i)
    if (types[i] != "sparse")
      return unsupported(field + "[" + std::to_string(i) + "] = \"" + types[i] +
                         "\": only dense layers followed by MoE layers are supported");
  if (!have_k) {
    first_k_dense = dense;
    return Status::ok();
  }
  if (dense != first_k_dense)
    return invalid_argument(field + " has " + std::to_string(dense) + " leading dense layers but first_k_dense_replace = " +
                            std::to_string(first_k_dense));
  return Status::ok();
}

}  // namespace

Status parse_kimi_linear_fields(const Json& obj, const std::string& prefix, ModelConfig& c) {
  FieldReader r(obj, prefix);
  for (const auto& k : kIgnoredKeys) r.ignore(k);
  // The variants this family fixes (docs/MODELS.md).
  c.kda.gate_form = KdaGateForm::Softplus;
  c.kda.use_full_rank_gate = false;
  c.mla_use_output_gate = false;
  c.attn_res_block_size = 0;
  c.routed_expert_hidden_size = 0;
  c.latent_moe_use_norm = false;
  c.hidden_act = "silu";
  c.first_k_dense_replace = -1;  // required: the two reference implementations default it differently
  c.num_key_value_heads = -1;    // null or absent: equal to num_attention_heads

  K3_TRY(r.read("model_type", c.model_type));
  K3_TRY(r.read("vocab_size", c.vocab_size));
  K3_TRY(r.read("hidden_size", c.hidden_size));
  K3_TRY(r.read("intermediate_size", c.intermediate_size));
  K3_TRY(r.read("num_hidden_layers", c.num_hidden_layers));
  K3_TRY(r.read("num_attention_heads", c.num_attention_heads));
  K3_TRY(r.read_nullable("num_key_value_heads", c.num_key_value_heads, -1));
  K3_TRY(r.read("hidden_act", c.hidden_act));
  K3_TRY(r.read("rms_norm_eps", c.rms_norm_eps));
  K3_TRY(r.read("tie_word_embeddings", c.tie_word_embeddings));
  K3_TRY(r.read_optional_id("bos_token_id", c.bos_token_id));
  K3_TRY(r.read_int_or_list("eos_token_id", c.eos_token_ids));
  K3_TRY(r.read("max_position_embeddings", c.max_position_embeddings));
  K3_TRY(r.read("model_max_length", c.max_position_embeddings));

  bool attention_bias = false;
  K3_TRY(r.read("attention_bias", attention_bias));
  K3_TRY(refuse_unless(!attention_bias, prefix + "attention_bias",
                       "must be false: the MLA projections of Kimi Linear have no bias"));

  Status st;
  if (const Json* la = r.take_object("linear_attn_config", st)) K3_TRY(parse_linear_attn(*la, prefix, c.kda));
  K3_TRY(st);
  int flat_head_dim = 0, flat_heads = 0, flat_conv = 0;
  const bool have_hd = r.has("linear_head_dim"), have_nh = r.has("linear_num_heads"),
             have_conv = r.has("linear_conv_kernel_dim");
  K3_TRY(r.read("linear_head_dim", flat_head_dim));
  K3_TRY(r.read("linear_num_heads", flat_heads));
  K3_TRY(r.read("linear_conv_kernel_dim", flat_conv));
  K3_TRY(agree(prefix + "linear_head_dim", flat_head_dim, have_hd, c.kda.head_dim, "linear_attn_config.head_dim"));
  K3_TRY(agree(prefix + "linear_num_heads", flat_heads, have_nh, c.kda.num_heads, "linear_attn_config.num_heads"));
  if (have_conv && flat_conv != c.kda.short_conv_kernel_size) {
    if (obj.contains("linear_attn_config") && obj["linear_attn_config"].contains("short_conv_kernel_size"))
      return invalid_argument(prefix + "linear_conv_kernel_dim contradicts linear_attn_config.short_conv_kernel_size");
    c.kda.short_conv_kernel_size = flat_conv;
  }
  std::vector<std::string> layer_types, mlp_types;
  const bool have_types = r.has("layer_types") && !obj.at("layer_types").is_null();
  const bool have_mlp_types = r.has("mlp_layer_types") && !obj.at("mlp_layer_types").is_null();
  if (have_types) K3_TRY(r.read("layer_types", layer_types));
  else r.ignore("layer_types");
  if (have_mlp_types) K3_TRY(r.read("mlp_layer_types", mlp_types));
  else r.ignore("mlp_layer_types");
  if (have_types) K3_TRY(schedule_from_layer_types(prefix + "layer_types", layer_types, c.kda));
  if (c.kda.kda_layers.empty() && c.kda.full_attn_layers.empty())
    return invalid_argument(prefix + "linear_attn_config.kda_layers / full_attn_layers (or layer_types) are required: "
                            "the layer schedule is not guessed");

  K3_TRY(r.read_nullable("q_lora_rank", c.q_lora_rank, 0));
  K3_TRY(r.read("kv_lora_rank", c.kv_lora_rank));
  K3_TRY(r.read("qk_nope_head_dim", c.qk_nope_head_dim));
  K3_TRY(r.read("qk_rope_head_dim", c.qk_rope_head_dim));
  K3_TRY(r.read("v_head_dim", c.v_head_dim));
  K3_TRY(r.read("mla_use_nope", c.mla_use_nope));

  K3_TRY(r.read("num_experts", c.num_experts));
  K3_TRY(r.read("num_experts_per_token", c.num_experts_per_token));
  K3_TRY(r.read("num_shared_experts", c.num_shared_experts));
  K3_TRY(r.read("moe_intermediate_size", c.moe_intermediate_size));
  K3_TRY(r.read("moe_renormalize", c.moe_renormalize));
  K3_TRY(r.read("moe_router_activation_func", c.moe_router_activation_func));
  K3_TRY(r.read("routed_scaling_factor", c.routed_scaling_factor));
  const bool have_k = r.has("first_k_dense_replace");
  K3_TRY(r.read("first_k_dense_replace", c.first_k_dense_replace));
  if (have_mlp_types)
    K3_TRY(dense_count_from_mlp_types(prefix + "mlp_layer_types", mlp_types, have_k, c.first_k_dense_replace));
  K3_TRY(r.read("moe_layer_freq", c.moe_layer_freq));
  K3_TRY(r.read("use_grouped_topk", c.use_grouped_topk));
  K3_TRY(r.read("num_expert_group", c.num_expert_group));
  K3_TRY(r.read("topk_group", c.topk_group));
  K3_TRY(r.read("num_nextn_predict_layers", c.num_nextn_predict_layers));

  if (c.first_k_dense_replace < 0)
    return invalid_argument(prefix + "first_k_dense_replace (or mlp_layer_types) is required for kimi_linear: the "
                            "released code defaults it to 0 and transformers to 1, so it is not guessed");
  if (c.num_key_value_heads < 0) c.num_key_value_heads = c.num_attention_heads;
  return r.finish("kimi_linear");
}

Status validate_kimi_linear(const ModelConfig& c) {
  K3_TRY(positive("hidden_size", c.hidden_size));
  K3_TRY(positive("num_hidden_layers", c.num_hidden_layers));
  K3_TRY(positive("vocab_size", c.vocab_size));
  if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0))
    return invalid_argument("rms_norm_eps must be a finite number > 0 (got " + std::to_string(c.rms_norm_eps) + ")");
  K3_TRY(positive("model_max_length", c.max_position_embeddings));
  K3_TRY(refuse_unless(!c.tie_word_embeddings, "tie_word_embeddings", "must be false: a tied lm_head is not supported"));
  K3_TRY(refuse_unless(c.hidden_act == "silu", "hidden_act",
                       "must be \"silu\" (got \"" + c.hidden_act + "\"): every Kimi Linear MLP is SiLU-gated"));
  // The variants the family fixes (set by the parser; a hand-built struct must keep them).
  K3_TRY(refuse_unless(c.kda.gate_form == KdaGateForm::Softplus && !c.kda.use_full_rank_gate &&
                           !c.mla_use_output_gate && c.attn_res_block_size == 0 && c.routed_expert_hidden_size == 0,
                       "model_type", "kimi_linear fixes the softplus gate, low-rank KDA output gate, ungated MLA, "
                                     "plain residual and full-width experts"));

  K3_TRY(positive("linear_attn_config.num_heads", c.kda.num_heads));
  K3_TRY(positive("linear_attn_config.head_dim", c.kda.head_dim));
  K3_TRY(positive("linear_attn_config.short_conv_kernel_size", c.kda.short_conv_kernel_size));
  K3_TRY(validate_layer_pattern(c));

  K3_TRY(positive("num_attention_heads", c.num_attention_heads));
  if (c.num_key_value_heads != c.num_attention_heads)
    return unsupported("num_key_value_heads must equal num_attention_heads (got " +
                       std::to_string(c.num_key_value_heads) + " vs " + std::to_string(c.num_attention_heads) +
                       "): MLA has one latent KV shared by all heads, not GQA");
  if (c.q_lora_rank < 0)
    return invalid_argument("q_lora_rank must be null or > 0 (got " + std::to_string(c.q_lora_rank) + ")");
  K3_TRY(positive("kv_lora_rank", c.kv_lora_rank));
  K3_TRY(positive("qk_nope_head_dim", c.qk_nope_head_dim));
  K3_TRY(positive("qk_rope_head_dim", c.qk_rope_head_dim));
  K3_TRY(positive("v_head_dim", c.v_head_dim));
  K3_TRY(refuse_unless(c.mla_use_nope, "mla_use_nope", "must be true: rotary MLA is not implemented"));

  const int L = c.num_hidden_layers;
  K3_TRY(validate_ffn_shape(c));
  if (c.first_k_dense_replace < L) {
    K3_TRY(refuse_unless(c.moe_layer_freq == 1, "moe_layer_freq",
                         "must be 1 (got " + std::to_string(c.moe_layer_freq) + "): every layer after "
                         "first_k_dense_replace is MoE"));
    K3_TRY(refuse_unless(c.moe_router_activation_func == "sigmoid", "moe_router_activation_func",
                         "must be \"sigmoid\" (got \"" + c.moe_router_activation_func + "\")"));
    K3_TRY(refuse_unless(c.moe_renormalize, "moe_renormalize",
                         "must be true: the router always renormalises the selected scores"));
    if (!(std::isfinite(c.routed_scaling_factor) && c.routed_scaling_factor > 0))
      return invalid_argument("routed_scaling_factor must be a finite number > 0");
    K3_TRY(refuse_unless(c.num_expert_group == 1, "num_expert_group",
                         "must be 1 (got " + std::to_string(c.num_expert_group) + "): grouped top-k is not supported"));
    K3_TRY(refuse_unless(c.topk_group == 1, "topk_group",
                         "must be 1 (got " + std::to_string(c.topk_group) + "): grouped top-k is not supported"));
  }
  K3_TRY(refuse_unless(c.num_nextn_predict_layers == 0, "num_nextn_predict_layers",
                       "must be 0 (got " + std::to_string(c.num_nextn_predict_layers) + "): MTP layers are not supported"));
  const auto token = [&](const std::string& field, int id) -> Status {
    if (id >= 0 && id < c.vocab_size) return Status::ok();
    return invalid_argument(field + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size) + ")");
  };
  if (c.bos_token_id != -1) K3_TRY(token("bos_token_id", c.bos_token_id));
  for (int id : c.eos_token_ids) K3_TRY(token("eos_token_id", id));
  return Status::ok();
}

std::string kimi_linear_config_to_json(const ModelConfig& c) {
  Json j = Json::object();
  j["architectures"] = Json::array({"KimiLinearForCausalLM"});
  j["model_type"] = "kimi_linear";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["hidden_act"] = c.hidden_act;
  j["rms_norm_eps"] = float_json(c.rms_norm_eps);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["model_max_length"] = c.max_position_embeddings;
  if (c.bos_token_id != -1) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  // Inference never pads; null keeps transformers' default (163839) from pointing past a small vocab.
  j["pad_token_id"] = nullptr;
  Json la = Json::object();
  la["num_heads"] = c.kda.num_heads;
  la["head_dim"] = c.kda.head_dim;
  la["short_conv_kernel_size"] = c.kda.short_conv_kernel_size;
  la["kda_layers"] = c.kda.kda_layers;
  la["full_attn_layers"] = c.kda.full_attn_layers;
  j["linear_attn_config"] = la;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? Json(c.q_lora_rank) : Json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["mla_use_nope"] = c.mla_use_nope;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_token"] = c.num_experts_per_token;
  j["num_shared_experts"] = c.num_shared_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["moe_renormalize"] = c.moe_renormalize;
  j["moe_router_activation_func"] = c.moe_router_activation_func;
  j["routed_scaling_factor"] = float_json(c.routed_scaling_factor);
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["use_grouped_topk"] = c.use_grouped_topk;
  j["num_expert_group"] = c.num_expert_group;
  j["topk_group"] = c.topk_group;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  return j.dump(2) + "\n";
}

}  // namespace k3
