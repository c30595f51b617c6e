#include "engine/kda_heads.h"

#include <cmath>
#include <vector>

namespace k3 {

ops::GateForm gate_form(const ModelConfig& cfg) {
  return cfg.kda.gate_form == KdaGateForm::Softplus ? ops::GateForm::Softplus : ops::GateForm::LowerBoundedSigmoid;
}

bool kda_takes_fused_decode(const Backend& be, int64_t heads, int64_t head_dim) {
  return !be.chunk_invariant() && be.supports("kda_decode", {heads, head_dim}).empty();
}

void run_kda_heads(Backend& be, const KdaHeadsStep& s) {
  const ModelConfig& cfg = s.cfg;
  const LayerWeights& lw = s.lw;
  const int64_t R = s.qkv.dim(0), H = s.heads, D = cfg.kda.head_dim, P = H * D;
  Tensor conv_cache = s.conv_cache, state = s.state;
  if (s.single_token_decode && kda_takes_fused_decode(be, H, D)) {
    be.kda_decode({.qkv = s.qkv, .conv_w = lw.conv_w, .conv_cache = conv_cache, .f = s.f, .a_log = lw.a_log,
                   .dt_bias = lw.dt_bias, .b = s.blog, .state = state, .slots = s.slots, .conv_slots = s.conv_slots,
                   .o = s.o, .heads = static_cast<int>(H), .g_min = cfg.kda.gate_lower_bound, .form = gate_form(cfg)});
    return;
  }
  // One row per item where the caller left the offsets out (a decode step: built only on this path).
  Tensor cu = s.cu_seqlens;
  if (cu.empty()) {
    K3_CHECK(s.single_token_decode, "run_kda_heads: cu_seqlens is required unless every item has one token");
    std::vector<int32_t> rows(static_cast<size_t>(R) + 1);
    for (int64_t i = 0; i <= R; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    cu = be.from_host(Tensor::from_i32({R + 1}, rows), DType::I32);
  }
  const DType ct = be.compute_dtype();
  Tensor conv = s.alloc({R, 3 * P}, ct);
  be.short_conv({.x = s.qkv, .w = lw.conv_w, .cache = conv_cache, .slots = s.conv_slots, .cu_seqlens = cu, .y = conv});
  Tensor q = s.alloc({R, P}, ct), k = s.alloc({R, P}, ct), v = s.alloc({R, P}, ct);
  be.copy_cols({.src = conv, .dst = q, .src_col = 0, .ncols = P});
  be.copy_cols({.src = conv, .dst = k, .src_col = P, .ncols = P});
  be.copy_cols({.src = conv, .dst = v, .src_col = 2 * P, .ncols = P});
  Tensor qh = q.reshape({R * H, D}), kh = k.reshape({R * H, D});
  be.l2norm({.x = qh, .y = qh, .eps = 1e-6f, .scale = 1.f / std::sqrt(static_cast<float>(D))});
  be.l2norm({.x = kh, .y = kh, .eps = 1e-6f, .scale = 1.f});
  Tensor g = s.alloc({R, H, D}, DType::F32);
  be.kda_gate({.f = s.f, .a_log = lw.a_log, .dt_bias = lw.dt_bias, .g = g, .heads = static_cast<int>(H),
               .g_min = cfg.kda.gate_lower_bound, .form = gate_form(cfg)});
  Tensor beta = s.alloc({R, H}, DType::F32);
  be.sigmoid(s.blog, beta);
  const bool ckpt = s.checkpoint_interval > 0;
  be.kda_chunk({.q = q.reshape({R, H, D}), .k = k.reshape({R, H, D}), .v = v.reshape({R, H, D}), .g = g, .beta = beta,
                .state = state, .slots = s.slots, .cu_seqlens = cu, .o = s.o, .chunk_size = kKdaChunkTokens,
                .checkpoints = ckpt ? state : Tensor(), .checkpoint_slots = s.checkpoint_slots,
                .checkpoint_interval = ckpt ? s.checkpoint_interval : 0,
                .bounded_gate = gate_form(cfg) == ops::GateForm::LowerBoundedSigmoid});
}

}  // namespace k3
