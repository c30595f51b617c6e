#include "common/model/weights.h"

#include <cstdlib>

#include "common/io/safetensors.h"
#include "common/model/weights_init.h"

namespace k3 {
namespace {

// Appends specs under one name prefix.
struct SpecList {
  std::vector<TensorSpec>& out;
  std::string prefix;
  void add(const std::string& name, Shape shape, bool f32_only = false) {
    out.push_back({prefix + name, std::move(shape), f32_only});
  }
};

// K3 files keep the gate parameters and conv taps in F32; Kimi Linear checkpoints may store them in
// the checkpoint dtype (they are widened to F32 at upload either way).
bool k3_f32(const ModelConfig& c) { return !c.is_kimi_linear(); }

void add_kda(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, P = c.kda_proj_dim(), D = c.kda.head_dim, H = c.kda.num_heads,
                W = c.kda.short_conv_kernel_size;
  const bool f32 = k3_f32(c);
  for (const char* z : {"q", "k", "v"}) s.add(std::string(z) + "_proj.weight", {P, d});
  for (const char* z : {"q", "k", "v"}) s.add(std::string(z) + "_conv1d.weight", {P, 1, W}, f32);
  s.add("f_a_proj.weight", {D, d});
  s.add("f_b_proj.weight", {P, D});
  // Kimi Linear stores A_log as [1, 1, H, 1] (broadcast over batch, time and channel).
  s.add("A_log", c.is_kimi_linear() ? Shape{1, 1, H, 1} : Shape{H}, f32);
  s.add("dt_bias", {P}, f32);
  s.add("b_proj.weight", {H, d});
  if (c.kda.use_full_rank_gate) {
    s.add("g_proj.weight", {P, d});
  } else {
    s.add("g_a_proj.weight", {D, d});
    s.add("g_b_proj.weight", {P, D});
  }
  s.add("o_norm.weight", {D});
  s.add("o_proj.weight", {d, P});
}

void add_mla(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, H = c.num_attention_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank,
                dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  if (c.uses_q_lora()) {
    s.add("q_a_proj.weight", {rq, d});
    s.add("q_a_layernorm.weight", {rq});
    s.add("q_b_proj.weight", {H * (dn + dr), rq});
  } else {
    s.add("q_proj.weight", {H * (dn + dr), d});
  }
  s.add("kv_a_proj_with_mqa.weight", {rkv + dr, d});
  s.add("kv_a_layernorm.weight", {rkv});
  s.add("kv_b_proj.weight", {H * (dn + dv), rkv});
  if (c.mla_use_output_gate) s.add("g_proj.weight", {H * dv, d});
  s.add("o_proj.weight", {d, H * dv});
}

void add_dense_ffn(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, f0 = c.intermediate_size;
  s.add("gate_proj.weight", {f0, d});
  s.add("up_proj.weight", {f0, d});
  s.add("down_proj.weight", {d, f0});
}

void add_moe(const ModelConfig& c, SpecList s) {
  // Routed experts run in the latent (K3) or at full width (Kimi Linear).
  const int64_t d = c.hidden_size, E = c.num_experts, lat = c.uses_latent_moe() ? c.routed_expert_hidden_size : d,
                fe = c.moe_intermediate_size, fs = static_cast<int64_t>(c.num_shared_experts) * fe;
  s.add("gate.weight", {E, d});
  s.add("gate.e_score_correction_bias", {E}, k3_f32(c));
  if (c.uses_latent_moe()) s.add("routed_expert_down_proj.weight", {lat, d});
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = "experts." + std::to_string(e) + ".";
    s.add(x + "w1.weight", {fe, lat});
    s.add(x + "w3.weight", {fe, lat});
    s.add(x + "w2.weight", {lat, fe});
  }
  if (c.uses_latent_moe()) {
    s.add("routed_expert_norm.weight", {lat});
    s.add("routed_expert_up_proj.weight", {d, lat});
  }
  if (fs > 0) {
    s.add("shared_experts.gate_proj.weight", {fs, d});
    s.add("shared_experts.up_proj.weight", {fs, d});
    s.add("shared_experts.down_proj.weight", {d, fs});
  }
}

Status check_range(const ModelConfig& cfg, int begin, int end) {
  if (begin < 0 || begin >= end || end > cfg.num_hidden_layers)
    return invalid_argument("layer range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is not a non-empty range inside [0, " + std::to_string(cfg.num_hidden_layers) + ")");
  return Status::ok();
}

// A_log may be stored longer than H_k (the released K3 file stores 128 entries; the first H_k are
// used, as in the SGLang and MLX ports), so the view handed out is narrowed to the expected shape.
bool is_a_log(const std::string& name) {
  static const std::string kSuffix = ".A_log";
  return name.size() >= kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

Status check_tensor(const TensorSpec& spec, const Tensor& t, Tensor& accepted) {
  if (spec.f32_only ? t.dtype() != DType::F32
                    : !(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16))
    return invalid_argument("weight '" + spec.name + "': expected dtype " + (spec.f32_only ? "F32" : "F32/BF16/F16") +
                            ", got " + dtype_name(t.dtype()));
  if (is_a_log(spec.name) && t.ndim() == 1 && t.dim(0) >= spec.shape[0]) {
    accepted = t.slice_rows(0, spec.shape[0]);
    return Status::ok();
  }
  if (t.shape() != spec.shape)
    return invalid_argument("weight '" + spec.name + "': expected shape " + shape_str(spec.shape) + ", got " +
                            shape_str(t.shape()));
  accepted = t;
  return Status::ok();
}

// transformers' save_pretrained writes a Kimi Linear dense layer's MLP under "block_sparse_moe." too
// (its rename of MoE tensors is undone for every "mlp."), while the released checkpoints use "mlp.":
// the stored name of an expected "....mlp.x" may be either.
std::string alternate_name(const ModelConfig& cfg, const std::string& name) {
  static const std::string kMlp = ".mlp.", kMoe = ".block_sparse_moe.";
  const size_t at = name.find(kMlp);
  if (!cfg.is_kimi_linear() || at == std::string::npos) return {};
  return name.substr(0, at) + kMoe + name.substr(at + kMlp.size());
}

}  // namespace

bool is_per_head_weight(const ModelConfig& cfg, const std::string& name) {
  const std::string layers = "model.layers.", attn = ".self_attn.";
  const size_t at = name.find(attn);
  if (name.rfind(layers, 0) != 0 || at == std::string::npos) return false;
  const std::string leaf = name.substr(at + attn.size());
  if (cfg.layer_kind(std::atoi(name.c_str() + layers.size())) != LayerKind::Kda) return leaf == "g_proj.weight";
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
                        "v_conv1d.weight", "f_b_proj.weight", "A_log", "dt_bias", "b_proj.weight", "g_proj.weight"})
    if (leaf == s) return true;
  return false;
}

std::string moe_prefix(const ModelConfig& cfg) { return cfg.is_kimi_linear() ? "block_sparse_moe." : "mlp."; }

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, int layer_begin, int layer_end) {
  if (layer_end < 0) layer_end = cfg.num_hidden_layers;
  const Status range = check_range(cfg, layer_begin, layer_end);
  if (!range.is_ok()) throw Error(range);
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  std::vector<TensorSpec> out;
  SpecList top{out, ""};
  if (layer_begin == 0) top.add("model.embed_tokens.weight", {V, d});
  for (int l = layer_begin; l < layer_end; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    SpecList layer{out, p};
    layer.add("input_layernorm.weight", {d});
    layer.add("post_attention_layernorm.weight", {d});
    if (cfg.uses_attn_res()) {
      layer.add("self_attention_res_proj.weight", {1, d});
      layer.add("self_attention_res_norm.weight", {d});
      layer.add("mlp_res_proj.weight", {1, d});
      layer.add("mlp_res_norm.weight", {d});
    }
    if (cfg.layer_kind(l) == LayerKind::Kda) add_kda(cfg, {out, p + "self_attn."});
    else add_mla(cfg, {out, p + "self_attn."});
    if (cfg.is_dense_ffn(l)) add_dense_ffn(cfg, {out, p + "mlp."});
    else add_moe(cfg, {out, p + moe_prefix(cfg)});
  }
  if (layer_end == cfg.num_hidden_layers && cfg.uses_attn_res()) {
    top.add("model.output_attn_res_proj.weight", {1, d});
    top.add("model.output_attn_res_norm.weight", {d});
  }
  if (layer_end == cfg.num_hidden_layers) {
    top.add("model.norm.weight", {d});
    top.add("lm_head.weight", {V, d});
  }
  return out;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  if (synthetic_) {
    auto spec = specs_.find(name);
    if (spec != specs_.end())
      return tensors_[name] = random_tensor(synthetic_->cfg, spec->second, synthetic_->seed, synthetic_->matrix_dtype);
  }
  throw Error("weight '" + name + "' not found in the weight store");
}

bool WeightStore::has(const std::string& name) const { return tensors_.count(name) != 0 || specs_.count(name) != 0; }

WeightStore WeightStore::synthetic(SyntheticSource src) {
  WeightStore store;
  for (TensorSpec& spec : expected_tensors(src.cfg)) store.specs_.emplace(spec.name, std::move(spec));
  store.synthetic_ = std::move(src);
  return store;
}

Result<WeightStore> load_weights(const std::string& model_dir, const ModelConfig& cfg, int layer_begin,
                                 int layer_end) {
  if (layer_end < 0) layer_end = cfg.num_hidden_layers;
  K3_TRY(check_range(cfg, layer_begin, layer_end));
  if (is_synthetic_model(model_dir)) {
    K3_ASSIGN_OR_RETURN(SyntheticModelName name, parse_synthetic_model(model_dir));
    return WeightStore::synthetic({.cfg = cfg, .seed = name.seed, .matrix_dtype = DType::BF16});
  }
  K3_ASSIGN_OR_RETURN(SafetensorsDir files, open_safetensors_dir(model_dir));
  WeightStore store;
  for (const TensorSpec& spec : expected_tensors(cfg, layer_begin, layer_end)) {
    auto it = files.tensors.find(spec.name);
    if (it == files.tensors.end()) {
      const std::string alt = alternate_name(cfg, spec.name);
      if (!alt.empty()) it = files.tensors.find(alt);
    }
    if (it == files.tensors.end())
      return not_found("weight '" + spec.name + "' is missing from '" + model_dir + "' (expected shape " +
                       shape_str(spec.shape) + ")");
    Tensor accepted;
    K3_TRY(check_tensor(spec, it->second, accepted));
    store.put(spec.name, std::move(accepted));
  }
  return store;
}

}  // namespace k3
