// The model's weights on the backend, reshaped once at load for the ops that read them:
// q/k/v projections and conv taps fused (3P), experts stacked [E, ...], MLA's W^UK transposed and
// W^UV split per head for absorbed decode, AttnRes queries premultiplied (w ⊙ γ, F32).
#pragma once
#include <vector>

#include "engine/model.h"

namespace k3 {

struct LayerWeights {
  Tensor in_norm, post_norm;          // [d]
  Tensor att_query, mlp_query;        // [d] F32, w ⊙ γ (AttnRes only)
  // KDA
  Tensor w_qkv;                       // [3P, d]
  Tensor conv_w;                      // [3P, W]
  Tensor w_fa, w_fb;                  // [D, d], [P, D]
  Tensor a_log, dt_bias;              // [H] F32, [P] F32
  Tensor w_b;                         // [H, d]
  Tensor w_g;                         // [P, d] (KDA full-rank gate) or [H*dv, d] (gated MLA); else empty
  Tensor w_ga, w_gb;                  // KDA low-rank output gate: [D, d], [P, D]
  Tensor o_norm;                      // [D]
  Tensor w_o;                         // [d, P] or [d, H*dv]
  // MLA
  Tensor w_qa, qa_norm, w_qb;         // [r_q, d], [r_q], [H*dqk, r_q]
  Tensor w_q;                         // [H*dqk, d] when there is no query bottleneck
  Tensor w_kva, kva_norm, w_kvb;      // [r_kv+dr, d], [r_kv], [H*(dn+dv), r_kv]
  Tensor w_uk_t;                      // [H, r_kv, dn]
  Tensor w_uv;                        // [H, dv, r_kv]
  // FFN
  Tensor dense_gate, dense_up, dense_down;
  Tensor router, router_bias;         // [E, d] compute dtype, [E] F32
  Tensor lat_down, lat_norm, lat_up;  // [dl, d], [dl], [d, dl] (LatentMoE only)
  Tensor w1, w3, w2;                  // [E, f, dl], [E, f, dl], [E, dl, f]; dl = d without the latent
  Tensor shared_gate, shared_up, shared_down;
};

struct Model::Weights {
  Tensor embed;                       // [V, d]
  Tensor final_norm;                  // [d]
  Tensor lm_head;                     // [V, d]
  Tensor out_query;                   // [d] F32 (AttnRes only)
  std::vector<LayerWeights> layers;   // index l - begin
};

// The routed experts [begin, end) a process keeps (an EP rank: its share; end < 0: all of them).
struct ExpertRange {
  int64_t begin = 0, end = -1;
};

// The attention heads a process computes: share `index` of `count` equal shares of every layer's heads
// (a DCP rank's), all of them when count is 1.
struct HeadShare {
  int64_t index = 0, count = 1;
};

// Builds the backend-side weights for layers [begin, end), of the routed experts only `experts`: an EP
// rank reads and uploads its own experts and never holds the others (on K3 they are nearly all the
// weights, far more than one GPU holds), and w1 / w3 / w2 are then [experts, ...] in expert order.
// With a share of the heads, the per-head attention weights are that share's rows only, read and
// uploaded alone as well (a synthetic store draws just those rows):
//   KDA layer:  the heads' rows of w_qkv and conv_w (in each of the q, k and v thirds), w_fb, a_log,
//               dt_bias, w_b and the full-rank w_g; w_fa, o_norm, the low-rank gate and w_o stay whole
//               (a DCP group runs the output side on its token rows over all heads, after a gather).
//   MLA layer:  the heads' w_uv and w_g rows; the query side, the latent rows and w_o stay whole.
// The store's upload observer (if any) hears of each weight as it goes up (upload_bytes' total).
Result<std::unique_ptr<Model::Weights>> upload_weights(Backend& backend, const ModelConfig& cfg,
                                                       const WeightStore& store, int begin, int end,
                                                       ExpertRange experts = {}, HeadShare heads = {});

// About the bytes upload_weights puts on a backend keeping `compute` for these layers, experts and heads:
// every tensor of the range in `compute` (F32 where the model keeps it F32), each once.
uint64_t upload_bytes(const ModelConfig& cfg, int begin, int end, ExpertRange experts, DType compute,
                      HeadShare heads = {});

}  // namespace k3
