// The named model presets (k3-tiny for CPU tests, k3-tiny-93 with the real layer count, k3-small for
// one GPU, k3 with the real dimensions for planning; kimi-linear-tiny and kimi-linear-48b for the
// Hugging Face Kimi Linear family), each validated before it is returned.
#include <string>
#include <vector>

#include "common/config/config.h"

namespace k3 {

namespace {

// Fields shared by every preset: the K3 choices that are not sizes (docs/MODEL.md §1, §9).
ModelConfig k3_family_defaults() {
  ModelConfig c;
  c.model_type = "kimi_k3";
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = false;
  c.kda.short_conv_kernel_size = 4;
  c.kda.gate_lower_bound = -5.f;
  c.kda.use_full_rank_gate = true;
  c.mla_use_nope = true;
  c.mla_use_output_gate = true;
  c.latent_moe_use_norm = true;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.moe_router_activation_func = "sigmoid";
  c.moe_renormalize = true;
  c.routed_scaling_factor = 1.f;
  c.use_grouped_topk = true;
  c.num_expert_group = 1;
  c.topk_group = 1;
  c.hidden_act = "situ";
  c.activation_situ_beta = 4.f;
  c.activation_situ_linear_beta = 25.f;
  c.num_nextn_predict_layers = 0;
  return c;
}

ModelConfig tiny_preset(int layers, int block) {
  ModelConfig c = k3_family_defaults();
  c.hidden_size = 64;
  c.num_hidden_layers = layers;
  c.attn_res_block_size = block;
  c.vocab_size = 512;  // placeholder: k3-genweights replaces it with the generated tokenizer's size
  c.max_position_embeddings = 4096;
  c.kda.num_heads = 4;
  c.kda.head_dim = 16;
  c.num_attention_heads = c.num_key_value_heads = 4;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 32;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 128;
  fill_k3_layer_pattern(c);
  return c;
}

// One H200: real KDA/MLA head shapes and the real 93-layer pattern at d = 2048. About 8.3 B
// parameters (16.6 GB in bf16), which leaves most of the 141 GB for KV pages and KDA states:
// MLA latent KV 24 layers x 576 x 2 B = 27.6 KB per token, KDA state 69 layers x 16 x 128^2 x 4 B
// = 72 MB per request. 256 requests at 8k context (58.8 GB of pages + 18.5 GB of state) plus the
// weights ran on one H200 in `k3-bench engine` (docs/PERF.md), with ~40 GB to spare.
ModelConfig small_preset() {
  ModelConfig c = k3_family_defaults();
  c.hidden_size = 2048;
  c.num_hidden_layers = 93;
  c.attn_res_block_size = 12;
  c.vocab_size = 163840;
  c.max_position_embeddings = 1048576;
  c.kda.num_heads = 16;
  c.kda.head_dim = 128;
  c.num_attention_heads = c.num_key_value_heads = 16;
  c.q_lora_rank = 512;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.num_experts = 32;
  c.num_experts_per_token = 4;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 1024;
  c.moe_intermediate_size = 512;
  c.intermediate_size = 8192;
  fill_k3_layer_pattern(c);
  return c;
}

// The released K3 text config's dimensions (docs/MODEL.md §1, §8.5).
ModelConfig k3_preset() {
  ModelConfig c = k3_family_defaults();
  c.hidden_size = 7168;
  c.num_hidden_layers = 93;
  c.attn_res_block_size = 12;
  c.vocab_size = 163840;
  c.max_position_embeddings = 1048576;
  c.kda.num_heads = 96;
  c.kda.head_dim = 128;
  c.num_attention_heads = c.num_key_value_heads = 96;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.num_experts = 896;
  c.num_experts_per_token = 16;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 3584;
  c.moe_intermediate_size = 3072;
  c.intermediate_size = 33792;
  fill_k3_layer_pattern(c);
  return c;
}

// Kimi Linear (model_type kimi_linear): the family's fixed variants come from its parser, so a preset is
// built the way a config.json would be read (docs/MODELS.md).
ModelConfig kimi_linear_family_defaults() {
  ModelConfig c;
  c.model_type = "kimi_linear";
  c.kda.gate_form = KdaGateForm::Softplus;
  c.kda.use_full_rank_gate = false;
  c.kda.short_conv_kernel_size = 4;
  c.mla_use_output_gate = false;
  c.mla_use_nope = true;
  c.attn_res_block_size = 0;
  c.routed_expert_hidden_size = 0;
  c.latent_moe_use_norm = false;
  c.hidden_act = "silu";
  c.rms_norm_eps = 1e-5f;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.moe_router_activation_func = "sigmoid";
  c.moe_renormalize = true;
  c.routed_scaling_factor = 2.446f;
  c.use_grouped_topk = true;
  c.num_expert_group = 1;
  c.topk_group = 1;
  c.q_lora_rank = 0;
  return c;
}

// CPU tests: 8 layers (KDA x3, MLA) x 2, one dense layer, no query bottleneck as in the release.
ModelConfig kimi_linear_tiny_preset() {
  ModelConfig c = kimi_linear_family_defaults();
  c.hidden_size = 64;
  c.num_hidden_layers = 8;
  c.vocab_size = 512;  // placeholder: k3-genweights replaces it with the generated tokenizer's size
  c.max_position_embeddings = 4096;
  c.kda.num_heads = 4;
  c.kda.head_dim = 16;
  c.num_attention_heads = c.num_key_value_heads = 4;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 32;
  c.intermediate_size = 128;
  fill_k3_layer_pattern(c);
  return c;
}

// The dimensions of the released Kimi-Linear-48B-A3B (27 layers: MLA at 4, 8, ..., 24 and 27; about
// 49 B parameters, 98 GB in bf16).
ModelConfig kimi_linear_48b_preset() {
  ModelConfig c = kimi_linear_family_defaults();
  c.hidden_size = 2304;
  c.num_hidden_layers = 27;
  c.vocab_size = 163840;
  c.max_position_embeddings = 1048576;
  c.bos_token_id = 163584;
  c.eos_token_ids = {163586};
  c.kda.num_heads = 32;
  c.kda.head_dim = 128;
  c.num_attention_heads = c.num_key_value_heads = 32;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.num_experts = 256;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 1024;
  c.intermediate_size = 9216;
  fill_k3_layer_pattern(c);
  return c;
}

}  // namespace

ModelConfig with_k3_head_shapes(ModelConfig c) {
  c.hidden_size = 256;
  c.kda.head_dim = 128;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.routed_expert_hidden_size = 128;
  c.moe_intermediate_size = 128;
  c.intermediate_size = 512;
  return c;
}

std::vector<std::string> preset_names() {
  return {"k3-tiny", "k3-tiny-h8", "k3-tiny-93", "k3-small", "k3", "kimi-linear-tiny", "kimi-linear-48b"};
}

Result<ModelConfig> preset_config(const std::string& name) {
  ModelConfig c;
  if (name == "k3-tiny") c = tiny_preset(8, 4);
  else if (name == "k3-tiny-h8") {
    // k3-tiny with 8 KDA and 8 MLA heads: the smallest model a DCP8 decode group can split evenly.
    c = tiny_preset(8, 4);
    c.kda.num_heads = c.num_attention_heads = c.num_key_value_heads = 8;
  } else if (name == "k3-tiny-93") c = tiny_preset(93, 12);
  else if (name == "k3-small") c = small_preset();
  else if (name == "k3") c = k3_preset();
  else if (name == "kimi-linear-tiny") c = kimi_linear_tiny_preset();
  else if (name == "kimi-linear-48b") c = kimi_linear_48b_preset();
  else
    return not_found("unknown preset '" + name +
                     "' (known: k3-tiny, k3-tiny-h8, k3-tiny-93, k3-small, k3, kimi-linear-tiny, kimi-linear-48b)");
  K3_TRY(validate(c));
  return c;
}

}  // namespace k3

