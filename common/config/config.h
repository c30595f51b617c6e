// The model config: the published K3 config's field names (docs/MODEL.md §1, §8), loaded from JSON and
// validated at the boundary. Every validation error names the field and the rule it broke.
//
// Two model families share this struct and the same layer code: "kimi_k3" and Hugging Face Kimi Linear
// ("kimi_linear", docs/MODELS.md). What differs between them is held as variant fields below (the KDA
// gate form, AttnRes or a plain residual, latent or full-width experts, SiTU or SiLU, the MLA output
// gate and q bottleneck); each family's parser sets them from its own config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3 {

enum class LayerKind { Kda, Mla };

// The KDA log-decay per channel (docs/MODEL.md §2.2):
//   LowerBoundedSigmoid (K3):  g = g_min · σ(e^{A_log} · (f + dt_bias))
//   Softplus (Kimi Linear):    g = −e^{A_log} · softplus(f + dt_bias)
enum class KdaGateForm { LowerBoundedSigmoid, Softplus };

struct KdaConfig {            // linear_attn_config
  int num_heads = 0;          // H_k
  int head_dim = 0;           // D
  int short_conv_kernel_size = 4;
  float gate_lower_bound = -5.f;      // LowerBoundedSigmoid only
  KdaGateForm gate_form = KdaGateForm::LowerBoundedSigmoid;
  bool use_full_rank_gate = true;     // output gate g_proj [P, d]; false: g_a_proj [D, d] then g_b_proj [P, D]
  std::vector<int> kda_layers;        // 1-based
  std::vector<int> full_attn_layers;  // 1-based
};

struct ModelConfig {
  std::string model_type = "kimi_k3";
  int hidden_size = 0;            // d
  int num_hidden_layers = 0;      // L
  int vocab_size = 0;
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // "eos_token_id": int or list

  KdaConfig kda;

  // MLA
  int num_attention_heads = 0;    // H
  int num_key_value_heads = 0;
  int q_lora_rank = 0;            // 0: no query bottleneck (q_proj [H*dqk, d]), Kimi Linear's null
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool mla_use_nope = true;
  bool mla_use_output_gate = true;

  // MoE
  int num_experts = 0;
  int num_experts_per_token = 0;
  int num_shared_experts = 0;
  int moe_intermediate_size = 0;        // f_e
  int routed_expert_hidden_size = 0;    // d_lat; 0: routed experts run at full width d (no latent)
  bool latent_moe_use_norm = true;
  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;
  int intermediate_size = 0;            // f_0 (dense layers)
  std::string moe_router_activation_func = "sigmoid";
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.f;
  bool use_grouped_topk = true;
  int num_expert_group = 1;
  int topk_group = 1;

  std::string hidden_act = "situ";      // "situ" (K3) or "silu" (Kimi Linear)
  float activation_situ_beta = 4.f;
  float activation_situ_linear_beta = 25.f;
  int attn_res_block_size = 0;          // S; 0: plain residual stream (Kimi Linear)
  int num_nextn_predict_layers = 0;

  // Derived helpers (valid after validate()).
  LayerKind layer_kind(int layer) const;   // 0-based
  bool is_dense_ffn(int layer) const { return layer < first_k_dense_replace; }
  int kda_proj_dim() const { return kda.num_heads * kda.head_dim; }          // P
  int mla_qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int mla_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }    // 576 for K3
  int num_kda_layers() const;
  int num_mla_layers() const;
  bool is_kimi_linear() const { return model_type == "kimi_linear"; }
  bool uses_attn_res() const { return attn_res_block_size > 0; }
  bool uses_latent_moe() const { return routed_expert_hidden_size > 0; }
  bool uses_q_lora() const { return q_lora_rank > 0; }
  bool uses_silu() const { return hidden_act == "silu"; }
  // AttnRes: does layer l start a new block (append P to the bank before its attention)? Never
  // with a plain residual, whose bank stays empty.
  bool starts_block(int layer) const { return uses_attn_res() && layer % attn_res_block_size == 0; }
  int num_blocks() const {
    return uses_attn_res() ? (num_hidden_layers + attn_res_block_size - 1) / attn_res_block_size : 0;
  }
};

// The K3 layer rule for our presets: layer l is MLA iff (l+1) % 4 == 0 or l == L-1.
void fill_k3_layer_pattern(ModelConfig& cfg);

// kda_layers and full_attn_layers are 1-based, disjoint, and together cover 1..L exactly once (part of
// validate(); alone for callers that need only the layer kinds).
Status validate_layer_pattern(const ModelConfig& cfg);

// The FFN shape every family shares: first_k_dense_replace in [0, L], the dense width when a layer is
// dense, the expert counts and width when a layer is MoE (part of validate() and of each family's checks).
Status validate_ffn_shape(const ModelConfig& cfg);

// Checks every rule; the message names the field (e.g. "linear_attn_config.head_dim") and the rule.
Status validate(const ModelConfig& cfg);

// JSON text <-> config. Accepts a top-level object or one wrapped in "text_config".
// Unknown fields are errors (named), so a typo never silently falls back to a default.
Result<ModelConfig> parse_model_config(const std::string& json_text);
std::string model_config_to_json(const ModelConfig& cfg);
Result<ModelConfig> load_model_config(const std::string& path);

// Presets: "k3-tiny", "k3-tiny-h8" (k3-tiny with 8 KDA and MLA heads, for DCP8), "k3-tiny-93", "k3-small",
// "k3", "kimi-linear-tiny", "kimi-linear-48b". vocab_size of the tiny presets is set by the caller from the
// tokenizer it generates (preset value is a placeholder until then).
Result<ModelConfig> preset_config(const std::string& name);
// K3's head sizes at small width (KDA D = 128, MLA latent 512 + rope 64, d_n = d_v = 128, hidden 256),
// keeping `c`'s head counts, layers and experts: the shapes the GPU's fused decode kernels take, for tests
// and benches of a tiny model on the GPU.
ModelConfig with_k3_head_shapes(ModelConfig c);
std::vector<std::string> preset_names();

}  // namespace k3
