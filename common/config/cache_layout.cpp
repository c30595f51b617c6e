#include "common/config/cache_layout.h"

#include <string>

namespace k3 {

Result<CacheLayout> CacheLayout::from_config(const ModelConfig& cfg, const CacheDtypes& dtypes,
                                             uint32_t num_draft_layers, uint64_t draft_row_bytes) {
  if (cfg.num_hidden_layers <= 0) return invalid_argument("model config: num_hidden_layers must be > 0");
  K3_TRY(validate_layer_pattern(cfg));
  CacheLayout m;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    m.layers.push_back(cfg.layer_kind(l) == LayerKind::Kda ? LayerCache::Kda : LayerCache::Mla);
  m.layers.insert(m.layers.end(), num_draft_layers, LayerCache::Draft);
  m.dtypes = dtypes;
  m.mla_row_width = static_cast<uint32_t>(cfg.mla_cache_width());
  m.kda_head_dim = static_cast<uint32_t>(cfg.kda.head_dim);
  m.mla_row_bytes = uint64_t(m.mla_row_width) * dtype_size(dtypes.kv);
  m.draft_row_bytes = draft_row_bytes;
  m.kda_heads = static_cast<uint32_t>(cfg.kda.num_heads);
  m.kda_conv_rows = static_cast<uint32_t>(cfg.kda.short_conv_kernel_size - 1);
  m.kda_conv_head_bytes = uint64_t(m.kda_head_dim) * dtype_size(dtypes.conv);
  m.kda_state_head_bytes = uint64_t(m.kda_head_dim) * m.kda_head_dim * dtype_size(dtypes.state);
  K3_TRY(m.validate());
  return m;
}

Status CacheLayout::validate() const {
  if (layers.empty()) return invalid_argument("cache layout: no layers");
  const uint32_t main = num_main_layers();
  if (main == 0) return invalid_argument("cache layout: no main layers before the draft layers");
  bool any_kda = false, any_mla = false, any_draft = false;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (l >= main && layers[l] != LayerCache::Draft)
      return invalid_argument("cache layout: layer " + std::to_string(l) + " is a main layer after a draft layer");
    any_kda |= layers[l] == LayerCache::Kda;
    any_mla |= layers[l] == LayerCache::Mla;
    any_draft |= layers[l] == LayerCache::Draft;
  }
  if (any_mla && mla_row_bytes == 0) return invalid_argument("cache layout: mla_row_bytes is 0");
  if (any_draft && draft_row_bytes == 0) return invalid_argument("cache layout: draft_row_bytes is 0");
  if (any_kda) {
    if (kda_heads == 0) return invalid_argument("cache layout: kda_heads is 0");
    if (kda_conv_head_bytes == 0) return invalid_argument("cache layout: kda_conv_head_bytes is 0");
    if (kda_state_head_bytes == 0) return invalid_argument("cache layout: kda_state_head_bytes is 0");
  }
  return Status::ok();
}

uint32_t CacheLayout::num_main_layers() const {
  uint32_t n = 0;
  while (n < layers.size() && layers[n] != LayerCache::Draft) ++n;
  return n;
}

std::vector<uint32_t> CacheLayout::layer_ids(LayerCache kind) const {
  std::vector<uint32_t> ids;
  for (uint32_t l = 0; l < layers.size(); ++l)
    if (layers[l] == kind) ids.push_back(l);
  return ids;
}

PackedImage CacheLayout::pack(const std::vector<uint32_t>& layer_ids, uint64_t num_tokens) const {
  PackedImage img;
  uint64_t off = 0;
  for (uint32_t l : layer_ids) {
    PackedEntry e;
    if (layers.at(l) == LayerCache::Kda) {
      e.conv = off;
      off += kda_conv_bytes();
      e.state = off;
      off += kda_state_bytes();
    } else {
      e.rows = off;
      off += num_tokens * row_bytes(layers[l]);
    }
    img.layers[l] = e;
  }
  img.total_bytes = off;
  return img;
}

PackedImage CacheLayout::pack_range(uint32_t begin, uint32_t end, uint64_t num_tokens) const {
  std::vector<uint32_t> ids;
  for (uint32_t l = begin; l < end; ++l) ids.push_back(l);
  return pack(ids, num_tokens);
}

}  // namespace k3
