#include "engine/kda_heads.h"

#include <cmath>
#include <vector>

namespace k3 {

ops::GateForm gate_form(const ModelConfig& cfg) {
  return cfg.kda.gate_form == KdaGateForm::Softplus ? ops::GateForm::Softplus : ops::GateForm::LowerBoundedSigmoid;
}

bool kda_takes_fused_decode(const Backend& be, int64_t heads, int64_t head_dim) {
  return (!be.chunk_invariant() || be.kda_decode_matches_steps()) && be.supports("kda_decode", {heads, head_dim}).empty();
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
  const ops::KdaParams all{.q = q.reshape({R, H, D}), .k = k.reshape({R, H, D}), .v = v.reshape({R, H, D}), .g = g,
                           .beta = beta, .state = state, .slots = s.slots, .cu_seqlens = cu, .o = s.o,
                           .chunk_size = kKdaChunkTokens, .checkpoints = ckpt ? state : Tensor(),
                           .checkpoint_slots = s.checkpoint_slots,
                           .checkpoint_interval = ckpt ? static_cast<int>(s.checkpoint_interval) : 0,
                           .bounded_gate = gate_form(cfg) == ops::GateForm::LowerBoundedSigmoid};
  if (!be.chunk_invariant()) {
    be.kda_chunk(all);
    return;
  }
  // Chunk-invariant: whole aligned blocks chunked, the rest by the recurrence (kda_heads.h).
  if (s.single_token_decode) {
    be.kda_recurrent(all);
    return;
  }
  const int64_t n = s.slots.numel();
  K3_CHECK(static_cast<int64_t>(s.positions.size()) == n && static_cast<int64_t>(s.lengths.size()) == n,
           "run_kda_heads: a chunk-invariant backend needs every item's position and length");
  const KdaAlignedRows parts = kda_aligned_rows(s.positions, s.lengths);
  auto with_rows = [&](const std::vector<int32_t>& rows, bool checkpoints) {
    ops::KdaParams p = all;
    // A host tensor: the backends take index tables from either side, and CUDA reads these on the host
    // (to check them, and for the chunked form's chunk table) before staging them with its other indices.
    p.seq_rows = Tensor::from_i32({n, 2}, rows);
    if (!checkpoints) {
      p.checkpoints = Tensor();
      p.checkpoint_slots = Tensor();
      p.checkpoint_interval = 0;
    }
    return p;
  };
  // Checkpoints fall at multiples of 64 from each item's first row, and go with the whole blocks, whose
  // ranges start there when the item starts a block: the caller asks checkpoints only of such items
  // (Model::kda_layer checks it).
  if (parts.any_head) be.kda_recurrent(with_rows(parts.head, false));
  if (parts.any_blocks) be.kda_chunk(with_rows(parts.blocks, ckpt));
  if (parts.any_tail) be.kda_recurrent(with_rows(parts.tail, false));
}

KdaAlignedRows kda_aligned_rows(std::span<const int64_t> positions, std::span<const int64_t> lengths) {
  K3_CHECK(positions.size() == lengths.size(), "kda_aligned_rows: one position per length");
  constexpr int64_t C = kKdaChunkTokens;
  KdaAlignedRows r;
  int64_t row = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i], T = lengths[i];
    K3_CHECK(p >= 0 && T >= 0, "kda_aligned_rows: negative position or length");
    const int64_t first = (p + C - 1) / C * C, last = (p + T) / C * C;   // whole blocks [first, last)
    const int64_t head = last > first ? first - p : T, blocks = last > first ? last - first : 0;
    auto put = [&](std::vector<int32_t>& v, int64_t b, int64_t e) {
      v.push_back(static_cast<int32_t>(b));
      v.push_back(static_cast<int32_t>(e));
    };
    put(r.head, row, row + head);
    put(r.blocks, row + head, row + head + blocks);
    put(r.tail, row + head + blocks, row + T);
    r.any_head |= head > 0;
    r.any_blocks |= blocks > 0;
    r.any_tail |= T - head - blocks > 0;
    row += T;
  }
  return r;
}

}  // namespace k3
