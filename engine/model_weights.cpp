#include "engine/model_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/model/weights_init.h"

namespace k3 {
namespace {

using Rows = std::pair<int64_t, int64_t>;  // [begin, end) along dim 0
constexpr Rows kAllRows{0, -1};

// Host-side preparation. Tensors used as stored go to the backend in their file dtype when the
// backend takes it directly (bf16 files on the CUDA backend upload without an F32 round trip);
// tensors that need arithmetic here (transposes, products) are prepared in F32. A synthetic store's
// uniform tensors are filled where they live instead (Backend::fill_uniform): a 98 GB model is
// never drawn on the host; the small host-prepared ones are drawn by the store.
class Uploader {
 public:
  // `total`: what the upload is expected to come to (upload_bytes), told to the store's observer.
  Uploader(Backend& b, const WeightStore& s, uint64_t total) : b_(b), s_(s), total_(total) {
    if (const auto& src = s.synthetic_source())
      for (TensorSpec& spec : expected_tensors(src->cfg)) specs_.emplace(spec.name, std::move(spec));
  }

  Tensor host(const std::string& name) const { return s_.get(name).to_f32(); }
  // The stored tensor when it is already in the compute dtype, else its F32 widening. BF16/F16 go
  // to an F32 backend as stored: its from_host widens them (in parallel on the CPU backend).
  Tensor native(const std::string& name) const {
    const Tensor& t = s_.get(name);
    const bool widens_itself = b_.compute_dtype() == DType::F32 && (t.dtype() == DType::BF16 || t.dtype() == DType::F16);
    return t.dtype() == b_.compute_dtype() || widens_itself ? t : t.to_f32();
  }
  Tensor up(const Tensor& host) { return uploaded(b_.from_host(host, b_.compute_dtype())); }
  Tensor up_f32(const Tensor& host_f32) { return uploaded(b_.from_host(host_f32, DType::F32)); }
  // The named tensor, or its rows `r` only.
  Tensor get(const std::string& name, Rows r = kAllRows) {
    if (auto t = stacked({name}, r)) return *t;
    return up(rows_of(native(name), r));
  }

  // The named tensors (same shape [rows, ...]), or the same rows `r` of each, concatenated along dim 0
  // as one backend tensor.
  Tensor rows(const std::vector<std::string>& names, Rows r = kAllRows) {
    if (auto t = stacked(names, r)) return *t;
    std::vector<Tensor> parts;
    for (const std::string& n : names) parts.push_back(rows_of(native(n), r));
    return up(cat_rows(std::move(parts)));
  }

  // Rows `r` of a host tensor (all of it for kAllRows), as a tensor of its own.
  static Tensor rows_of(const Tensor& t, Rows r) {
    if (r == kAllRows) return t;
    return t.slice_rows(r.first, r.second).clone();
  }

 private:
  // Synthetic uniform tensors (or rows `r` of each) drawn straight into one backend allocation; nullopt
  // when the store is not synthetic or a part is drawn on the host (constants, dt_bias).
  std::optional<Tensor> stacked(const std::vector<std::string>& names, Rows r) {
    const auto& src = s_.synthetic_source();
    if (!src) return std::nullopt;
    std::vector<UniformDraw> draws;
    for (const std::string& n : names) {
      auto spec = specs_.find(n);
      if (spec == specs_.end()) throw Error("weight '" + n + "' is not a tensor of the synthetic model");
      auto d = uniform_draw(src->cfg, spec->second, src->seed);
      if (!d || spec->second.f32_only) return std::nullopt;
      draws.push_back(*d);
    }
    Shape shape = specs_.at(names[0]).shape;
    const int64_t row_elems = shape_numel(shape) / std::max<int64_t>(shape[0], 1);
    const Rows rows = r == kAllRows ? Rows{0, shape[0]} : r;
    K3_CHECK(0 <= rows.first && rows.first <= rows.second && rows.second <= shape[0],
             "rows [" + std::to_string(rows.first) + ", " + std::to_string(rows.second) + ") of " + names[0] + " " +
                 shape_str(shape));
    const int64_t per = rows.second - rows.first, parts = static_cast<int64_t>(names.size());
    shape[0] = per * parts;
    Tensor out = b_.alloc(shape, b_.compute_dtype());
    for (int64_t k = 0; k < parts; ++k)
      b_.fill_uniform({.y = out.slice_rows(k * per, (k + 1) * per), .seed = draws[k].seed, .scale = draws[k].scale,
                       .round_to_bf16 = src->matrix_dtype == DType::BF16, .first = rows.first * row_elems});
    return uploaded(std::move(out));
  }

  // Counts a tensor now on the backend and tells the store's observer.
  Tensor uploaded(Tensor t) {
    done_ += t.nbytes();
    if (const UploadObserver& f = s_.upload_observer()) f(done_, total_);
    return t;
  }

  // Concatenates host tensors along dim 0 (F32 unless every part has the same dtype).
  static Tensor cat_rows(std::vector<Tensor> parts) {
    const DType dt = parts.at(0).dtype();
    for (Tensor& p : parts)
      if (p.dtype() != dt) {
        for (Tensor& q : parts) q = q.to_f32();
        break;
      }
    Shape out = parts[0].shape();
    out[0] *= static_cast<int64_t>(parts.size());
    Tensor t = Tensor::zeros(out, parts[0].dtype());
    size_t off = 0;
    for (const Tensor& p : parts) {
      std::memcpy(static_cast<uint8_t*>(t.data()) + off, p.data(), p.nbytes());
      off += p.nbytes();
    }
    return t;
  }

 public:
  // Host tensors of one shape concatenated along dim 0.
  static Tensor cat_host(std::vector<Tensor> parts, const Shape& per_part_shape) {
    for (Tensor& p : parts) p = p.reshape(per_part_shape);
    return cat_rows(std::move(parts));
  }

  // w ⊙ γ as an F32 [d] vector.
  Tensor query(const std::string& proj, const std::string& norm) {
    Tensor w = host(proj), g = host(norm);
    Tensor q = Tensor::zeros({g.numel()}, DType::F32);
    for (int64_t i = 0; i < g.numel(); ++i) q.f32()[i] = w.f32()[i] * g.f32()[i];
    return up_f32(q);
  }

 private:
  Backend& b_;
  const WeightStore& s_;
  uint64_t total_ = 0, done_ = 0;
  std::map<std::string, TensorSpec> specs_;  // synthetic stores: every tensor of the model
};

// A share of heads that divides every attention layer of [begin, end) evenly.
Status validate_share(const ModelConfig& cfg, int begin, int end, HeadShare s) {
  const std::string what = "upload_weights: head share " + std::to_string(s.index) + " of " + std::to_string(s.count);
  if (s.count < 1 || s.index < 0 || s.index >= s.count) return invalid_argument(what + " is not a share");
  for (int l = begin; l < end; ++l) {
    const bool kda = cfg.layer_kind(l) == LayerKind::Kda;
    const int64_t H = kda ? cfg.kda.num_heads : cfg.num_attention_heads;
    if (H % s.count != 0)
      return invalid_argument(what + ": layer " + std::to_string(l) + "'s " + std::to_string(H) + (kda ? " KDA" : " MLA") +
                              " heads do not split into " + std::to_string(s.count));
  }
  return Status::ok();
}

// The routed expert a tensor name belongs to ("...experts.<e>....": e), or -1.
int64_t expert_of(const std::string& name) {
  const std::string key = ".experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  return std::strtoll(name.c_str() + at + key.size(), nullptr, 10);
}

// The heads [h0, h1) of `share` among H.
Rows share_of(int64_t H, HeadShare share) {
  const int64_t per = H / share.count;
  return {share.index * per, (share.index + 1) * per};
}
Rows times(Rows r, int64_t k) { return {r.first * k, r.second * k}; }

void load_kda(Uploader& u, const ModelConfig& cfg, const std::string& p, HeadShare share, LayerWeights& lw) {
  const int64_t P = cfg.kda_proj_dim(), W = cfg.kda.short_conv_kernel_size, H = cfg.kda.num_heads, D = cfg.kda.head_dim;
  const Rows heads = share_of(H, share), channels = times(heads, D);
  lw.w_qkv = u.rows({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"}, channels);
  std::vector<Tensor> taps;
  for (const char* x : {"q", "k", "v"})
    taps.push_back(Uploader::rows_of(u.host(p + x + "_conv1d.weight").reshape({P, W}), channels));
  lw.conv_w = u.up(Uploader::cat_host(std::move(taps), {channels.second - channels.first, W}));
  lw.w_fa = u.get(p + "f_a_proj.weight");
  lw.w_fb = u.get(p + "f_b_proj.weight", channels);
  Tensor a_log = u.host(p + "A_log");
  lw.a_log = u.up_f32(Uploader::rows_of(a_log.reshape({a_log.numel()}), heads));
  lw.dt_bias = u.up_f32(Uploader::rows_of(u.host(p + "dt_bias").reshape({P}), channels));
  lw.w_b = u.get(p + "b_proj.weight", heads);
  if (cfg.kda.use_full_rank_gate) {
    lw.w_g = u.get(p + "g_proj.weight", channels);
  } else {
    lw.w_ga = u.get(p + "g_a_proj.weight");
    lw.w_gb = u.get(p + "g_b_proj.weight");
  }
  lw.o_norm = u.get(p + "o_norm.weight");
  lw.w_o = u.get(p + "o_proj.weight");
}

void load_mla(Uploader& u, const ModelConfig& cfg, const std::string& p, HeadShare share, LayerWeights& lw) {
  const int64_t H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim, r = cfg.kv_lora_rank;
  const Rows mine = share_of(H, share);
  if (cfg.uses_q_lora()) {
    lw.w_qa = u.get(p + "q_a_proj.weight");
    lw.qa_norm = u.get(p + "q_a_layernorm.weight");
    lw.w_qb = u.get(p + "q_b_proj.weight");
  } else {
    lw.w_q = u.get(p + "q_proj.weight");
  }
  lw.w_kva = u.get(p + "kv_a_proj_with_mqa.weight");
  lw.kva_norm = u.get(p + "kv_a_layernorm.weight");
  Tensor kvb = u.host(p + "kv_b_proj.weight");   // [H*(dn+dv), r]
  lw.w_kvb = u.get(p + "kv_b_proj.weight");
  Tensor uk_t = Tensor::zeros({H, r, dn}), uv = Tensor::zeros({mine.second - mine.first, dv, r});
  const float* src = kvb.f32();
  for (int64_t h = 0; h < H; ++h) {
    const float* head = src + h * (dn + dv) * r;
    for (int64_t i = 0; i < dn; ++i)
      for (int64_t j = 0; j < r; ++j) uk_t.f32()[(h * r + j) * dn + i] = head[i * r + j];
    if (mine.first <= h && h < mine.second)
      std::memcpy(uv.f32() + (h - mine.first) * dv * r, head + dn * r, dv * r * sizeof(float));
  }
  lw.w_uk_t = u.up(uk_t);
  lw.w_uv = u.up(uv);
  if (cfg.mla_use_output_gate) lw.w_g = u.get(p + "g_proj.weight", times(mine, dv));
  lw.w_o = u.get(p + "o_proj.weight");
}

void load_ffn(Uploader& u, const ModelConfig& cfg, int l, const std::string& p, ExpertRange experts, LayerWeights& lw) {
  if (cfg.is_dense_ffn(l)) {
    lw.dense_gate = u.get(p + "gate_proj.weight");
    lw.dense_up = u.get(p + "up_proj.weight");
    lw.dense_down = u.get(p + "down_proj.weight");
    return;
  }
  const int64_t f = cfg.moe_intermediate_size, dl = cfg.uses_latent_moe() ? cfg.routed_expert_hidden_size : cfg.hidden_size;
  const int64_t e0 = experts.begin, e1 = experts.end < 0 ? cfg.num_experts : experts.end, E = e1 - e0;
  lw.router = u.get(p + "gate.weight");  // compute dtype (the GEMM's operand); logits come out F32
  lw.router_bias = u.up_f32(u.host(p + "gate.e_score_correction_bias"));
  if (cfg.uses_latent_moe()) {
    lw.lat_down = u.get(p + "routed_expert_down_proj.weight");
    lw.lat_norm = u.get(p + "routed_expert_norm.weight");
    lw.lat_up = u.get(p + "routed_expert_up_proj.weight");
  }
  std::vector<std::string> w1, w3, w2;
  for (int64_t e = e0; e < e1; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    w1.push_back(ep + "w1.weight");
    w3.push_back(ep + "w3.weight");
    w2.push_back(ep + "w2.weight");
  }
  lw.w1 = u.rows(w1).reshape({E, f, dl});
  lw.w3 = u.rows(w3).reshape({E, f, dl});
  lw.w2 = u.rows(w2).reshape({E, dl, f});
  if (cfg.num_shared_experts > 0) {
    lw.shared_gate = u.get(p + "shared_experts.gate_proj.weight");
    lw.shared_up = u.get(p + "shared_experts.up_proj.weight");
    lw.shared_down = u.get(p + "shared_experts.down_proj.weight");
  }
}

}  // namespace

Result<std::unique_ptr<Model::Weights>> upload_weights(Backend& backend, const ModelConfig& cfg,
                                                       const WeightStore& store, int begin, int end,
                                                       ExpertRange experts, HeadShare heads) {
  const int64_t e_end = experts.end < 0 ? cfg.num_experts : experts.end;
  if (cfg.num_experts > 0 && (experts.begin < 0 || experts.begin >= e_end || e_end > cfg.num_experts))
    return invalid_argument("upload_weights: experts [" + std::to_string(experts.begin) + ", " +
                              std::to_string(e_end) + ") are not a non-empty range of the model's " +
                              std::to_string(cfg.num_experts));
  K3_TRY(validate_share(cfg, begin, end, heads));
  // Names were validated by load_weights; a miss here is a caller bug and throws with the name.
  Uploader u(backend, store, upload_bytes(cfg, begin, end, experts, backend.compute_dtype(), heads));
  auto w = std::make_unique<Model::Weights>();
  if (begin == 0) w->embed = u.get("model.embed_tokens.weight");
  if (end == cfg.num_hidden_layers) {
    w->final_norm = u.get("model.norm.weight");
    w->lm_head = u.get("lm_head.weight");
    if (cfg.uses_attn_res())
      w->out_query = u.query("model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight");
  }
  for (int l = begin; l < end; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.in_norm = u.get(p + "input_layernorm.weight");
    lw.post_norm = u.get(p + "post_attention_layernorm.weight");
    if (cfg.uses_attn_res()) {
      lw.att_query = u.query(p + "self_attention_res_proj.weight", p + "self_attention_res_norm.weight");
      lw.mlp_query = u.query(p + "mlp_res_proj.weight", p + "mlp_res_norm.weight");
    }
    if (cfg.layer_kind(l) == LayerKind::Kda) load_kda(u, cfg, p + "self_attn.", heads, lw);
    else load_mla(u, cfg, p + "self_attn.", heads, lw);
    load_ffn(u, cfg, l, p + (cfg.is_dense_ffn(l) ? std::string("mlp.") : moe_prefix(cfg)), experts, lw);
    w->layers.push_back(std::move(lw));
  }
  return w;
}

uint64_t upload_bytes(const ModelConfig& cfg, int begin, int end, ExpertRange experts, DType compute, HeadShare heads) {
  const int64_t e_end = experts.end < 0 ? cfg.num_experts : experts.end;
  uint64_t bytes = 0;
  for (const TensorSpec& spec : expected_tensors(cfg, begin, end)) {
    const int64_t e = expert_of(spec.name);
    if (e >= 0 && (e < experts.begin || e >= e_end)) continue;
    const int64_t share = heads.count > 1 && is_per_head_weight(cfg, spec.name) ? heads.count : 1;
    bytes += static_cast<uint64_t>(shape_numel(spec.shape) / share) * dtype_size(spec.f32_only ? DType::F32 : compute);
  }
  return bytes;
}

}  // namespace k3
