#include "engine/rank_weights.h"

#include <cstring>
#include <utility>
#include <vector>

namespace k3 {
namespace {

using Range = std::pair<int64_t, int64_t>;  // [begin, end) along dim 0

// A new backend tensor of the dim-0 ranges of `t`, concatenated (a 1-D tensor counts elements). The copy
// goes through the host once at load; steps never reslice.
Tensor take_rows(Backend& be, const Tensor& t, const std::vector<Range>& ranges) {
  Tensor host = be.to_host(t);
  const int64_t rows = host.dim(0);
  const size_t row_bytes = host.nbytes() / static_cast<size_t>(rows);
  int64_t total = 0;
  for (auto [b, e] : ranges) {
    K3_CHECK(0 <= b && b <= e && e <= rows, "take_rows: range outside dim 0 of " + shape_str(host.shape()));
    total += e - b;
  }
  Shape shape = host.shape();
  shape[0] = total;
  Tensor out = Tensor::zeros(shape, host.dtype());
  auto* dst = static_cast<uint8_t*>(out.data());
  for (auto [b, e] : ranges) {
    std::memcpy(dst, static_cast<const uint8_t*>(host.data()) + b * row_bytes, (e - b) * row_bytes);
    dst += (e - b) * row_bytes;
  }
  return be.from_host(out, t.dtype());
}

void slice_kda(Backend& be, const ModelConfig& cfg, const RankLayout& g, LayerWeights& lw) {
  const int64_t H = cfg.kda.num_heads, D = cfg.kda.head_dim, P = H * D, Hl = H / g.dcp;
  const int64_t h0 = g.dcp_rank() * Hl, h1 = h0 + Hl;
  const std::vector<Range> heads{{h0, h1}}, channels{{h0 * D, h1 * D}};
  const std::vector<Range> qkv{{h0 * D, h1 * D}, {P + h0 * D, P + h1 * D}, {2 * P + h0 * D, 2 * P + h1 * D}};
  lw.w_qkv = take_rows(be, lw.w_qkv, qkv);
  lw.conv_w = take_rows(be, lw.conv_w, qkv);
  lw.w_fb = take_rows(be, lw.w_fb, channels);
  lw.a_log = take_rows(be, lw.a_log, heads);
  lw.dt_bias = take_rows(be, lw.dt_bias, channels);
  lw.w_b = take_rows(be, lw.w_b, heads);
  lw.w_g = take_rows(be, lw.w_g, channels);
}

void slice_mla(Backend& be, const ModelConfig& cfg, const RankLayout& g, LayerWeights& lw) {
  const int64_t Hm = cfg.num_attention_heads / g.dcp, dv = cfg.v_head_dim;
  const int64_t m0 = g.dcp_rank() * Hm, m1 = m0 + Hm;
  lw.w_uv = take_rows(be, lw.w_uv, {{m0, m1}});
  lw.w_g = take_rows(be, lw.w_g, {{m0 * dv, m1 * dv}});
}

}  // namespace

void slice_weights_for_rank(Backend& backend, const ModelConfig& cfg, const RankLayout& g, Model::Weights& w) {
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const int l = static_cast<int>(i);
    LayerWeights& lw = w.layers[i];
    if (g.dcp > 1) {
      if (cfg.layer_kind(l) == LayerKind::Kda) slice_kda(backend, cfg, g, lw);
      else slice_mla(backend, cfg, g, lw);
    }
  }
}

}  // namespace k3
