#include "common/model/weights.h"

#include "common/io/safetensors.h"

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

void add_kda(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, P = c.kda_proj_dim(), D = c.kda.head_dim, H = c.kda.num_heads,
                W = c.kda.short_conv_kernel_size;
  for (const char* z : {"q", "k", "v"}) s.add(std::string(z) + "_proj.weight", {P, d});
  for (const char* z : {"q", "k", "v"}) s.add(std::string(z) + "_conv1d.weight", {P, 1, W}, true);
  s.add("f_a_proj.weight", {D, d});
  s.add("f_b_proj.weight", {P, D});
  s.add("A_log", {H}, true);
  s.add("dt_bias", {P}, true);
  s.add("b_proj.weight", {H, d});
  s.add("g_proj.weight", {P, d});
  s.add("o_norm.weight", {D});
  s.add("o_proj.weight", {d, P});
}

void add_mla(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, H = c.num_attention_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank,
                dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  s.add("q_a_proj.weight", {rq, d});
  s.add("q_a_layernorm.weight", {rq});
  s.add("q_b_proj.weight", {H * (dn + dr), rq});
  s.add("kv_a_proj_with_mqa.weight", {rkv + dr, d});
  s.add("kv_a_layernorm.weight", {rkv});
  s.add("kv_b_proj.weight", {H * (dn + dv), rkv});
  s.add("g_proj.weight", {H * dv, d});
  s.add("o_proj.weight", {d, H * dv});
}

void add_dense_ffn(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, f0 = c.intermediate_size;
  s.add("gate_proj.weight", {f0, d});
  s.add("up_proj.weight", {f0, d});
  s.add("down_proj.weight", {d, f0});
}

void add_moe(const ModelConfig& c, SpecList s) {
  const int64_t d = c.hidden_size, E = c.num_experts, lat = c.routed_expert_hidden_size,
                fe = c.moe_intermediate_size, fs = static_cast<int64_t>(c.num_shared_experts) * fe;
  s.add("gate.weight", {E, d});
  s.add("gate.e_score_correction_bias", {E}, true);
  s.add("routed_expert_down_proj.weight", {lat, d});
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = "experts." + std::to_string(e) + ".";
    s.add(x + "w1.weight", {fe, lat});
    s.add(x + "w3.weight", {fe, lat});
    s.add(x + "w2.weight", {lat, fe});
  }
  s.add("routed_expert_norm.weight", {lat});
  s.add("routed_expert_up_proj.weight", {d, lat});
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

}  // namespace

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
    layer.add("self_attention_res_proj.weight", {1, d});
    layer.add("self_attention_res_norm.weight", {d});
    layer.add("mlp_res_proj.weight", {1, d});
    layer.add("mlp_res_norm.weight", {d});
    if (cfg.layer_kind(l) == LayerKind::Kda) add_kda(cfg, {out, p + "self_attn."});
    else add_mla(cfg, {out, p + "self_attn."});
    if (cfg.is_dense_ffn(l)) add_dense_ffn(cfg, {out, p + "mlp."});
    else add_moe(cfg, {out, p + "mlp."});
  }
  if (layer_end == cfg.num_hidden_layers) {
    top.add("model.output_attn_res_proj.weight", {1, d});
    top.add("model.output_attn_res_norm.weight", {d});
    top.add("model.norm.weight", {d});
    top.add("lm_head.weight", {V, d});
  }
  return out;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("weight '" + name + "' not found in the weight store");
  return it->second;
}

Result<WeightStore> load_weights(const std::string& model_dir, const ModelConfig& cfg, int layer_begin,
                                 int layer_end) {
  if (layer_end < 0) layer_end = cfg.num_hidden_layers;
  K3_TRY(check_range(cfg, layer_begin, layer_end));
  K3_ASSIGN_OR_RETURN(SafetensorsDir files, open_safetensors_dir(model_dir));
  WeightStore store;
  for (const TensorSpec& spec : expected_tensors(cfg, layer_begin, layer_end)) {
    auto it = files.tensors.find(spec.name);
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
