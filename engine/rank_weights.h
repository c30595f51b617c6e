// One rank's weights: the full weights cut down to what the rank computes (engine/rank_layout.h).
//   DCP, KDA layer:  the rank's heads of w_qkv / conv_w (q, k and v thirds), w_fb, a_log, dt_bias, w_b, w_g;
//                    w_fa, o_norm and w_o stay whole (the output projection runs on the rank's token rows
//                    over all heads, after the heads are gathered).
//   DCP, MLA layer:  the rank's heads of w_uv and w_g (the query side and the latent rows are replicated).
//   EP:              the rank's routed experts of w1, w3, w2 (router, latent bridges and shared experts
//                    replicated): taken at the upload (upload_weights' ExpertRange), never held whole.
#pragma once
#include "engine/model_weights.h"
#include "engine/rank_layout.h"

namespace k3 {

// Cuts the DCP head slices of `w` (its attention uploaded whole by upload_weights) in place.
void slice_weights_for_rank(Backend& backend, const ModelConfig& cfg, const RankLayout& g, Model::Weights& w);

}  // namespace k3
