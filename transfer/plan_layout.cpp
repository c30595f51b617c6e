#include "transfer/plan_layout.h"

#include <algorithm>
#include <set>
#include <string>

namespace k3::transfer {

uint32_t TransferModelLayout::num_main_layers() const {
  uint32_t n = 0;
  while (n < layers.size() && layers[n] != LayerCache::Draft) ++n;
  return n;
}

Result<TransferModelLayout> TransferModelLayout::from_config(const ModelConfig& cfg, uint32_t kv_dtype_bytes,
                                                             uint32_t conv_dtype_bytes,
                                                             uint32_t state_dtype_bytes,
                                                             uint32_t num_draft_layers,
                                                             uint64_t draft_row_bytes) {
  if (cfg.num_hidden_layers <= 0) return invalid_argument("model config: num_hidden_layers must be > 0");
  // Kinds straight from the 1-based lists (not cfg.layer_kind(), which lives in k3_common).
  const std::set<int> kda(cfg.kda.kda_layers.begin(), cfg.kda.kda_layers.end());
  const std::set<int> mla(cfg.kda.full_attn_layers.begin(), cfg.kda.full_attn_layers.end());
  TransferModelLayout m;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const bool is_kda = kda.count(l + 1) > 0, is_mla = mla.count(l + 1) > 0;
    if (is_kda && is_mla)
      return invalid_argument("model config: layer " + std::to_string(l + 1) +
                              " is in both kda_layers and full_attn_layers");
    if (!is_kda && !is_mla)
      return invalid_argument("model config: layer " + std::to_string(l + 1) +
                              " is in neither kda_layers nor full_attn_layers");
    m.layers.push_back(is_kda ? LayerCache::Kda : LayerCache::Mla);
  }
  m.layers.insert(m.layers.end(), num_draft_layers, LayerCache::Draft);
  m.mla_row_bytes = uint64_t(cfg.kv_lora_rank + cfg.qk_rope_head_dim) * kv_dtype_bytes;
  m.draft_row_bytes = draft_row_bytes;
  m.kda_heads = uint32_t(std::max(cfg.kda.num_heads, 0));
  m.kda_conv_rows = uint32_t(std::max(cfg.kda.short_conv_kernel_size - 1, 0));
  m.kda_conv_head_bytes = uint64_t(std::max(cfg.kda.head_dim, 0)) * conv_dtype_bytes;
  m.kda_state_head_bytes = uint64_t(std::max(cfg.kda.head_dim, 0)) * cfg.kda.head_dim * state_dtype_bytes;
  K3_TRY(m.validate());
  return m;
}

Status TransferModelLayout::validate() const {
  if (layers.empty()) return invalid_argument("transfer model layout: no layers");
  const uint32_t main = num_main_layers();
  if (main == 0) return invalid_argument("transfer model layout: no main layers before the draft layers");
  bool any_kda = false, any_mla = false, any_draft = false;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (l >= main && layers[l] != LayerCache::Draft)
      return invalid_argument("transfer model layout: layer " + std::to_string(l) +
                              " is a main layer after a draft layer");
    any_kda |= layers[l] == LayerCache::Kda;
    any_mla |= layers[l] == LayerCache::Mla;
    any_draft |= layers[l] == LayerCache::Draft;
  }
  if (any_mla && mla_row_bytes == 0) return invalid_argument("transfer model layout: mla_row_bytes is 0");
  if (any_draft && draft_row_bytes == 0) return invalid_argument("transfer model layout: draft_row_bytes is 0");
  if (any_kda) {
    if (kda_heads == 0) return invalid_argument("transfer model layout: kda_heads is 0");
    if (kda_conv_head_bytes == 0) return invalid_argument("transfer model layout: kda_conv_head_bytes is 0");
    if (kda_state_head_bytes == 0) return invalid_argument("transfer model layout: kda_state_head_bytes is 0");
  }
  return Status::ok();
}

std::vector<EntryKind> kinds_of(LayerCache c) {
  switch (c) {
    case LayerCache::Kda: return {EntryKind::KdaConv, EntryKind::KdaState};
    case LayerCache::Mla: return {EntryKind::MlaKv};
    case LayerCache::Draft: return {EntryKind::DraftKv};
  }
  return {};
}

std::vector<uint32_t> PrefillLayout::stage_layers(const TransferModelLayout& model, uint32_t stage) const {
  std::vector<uint32_t> ids;
  if (stage >= partition.size()) return ids;
  uint32_t begin = 0;
  for (uint32_t s = 0; s < stage; ++s) begin += partition[s];
  for (uint32_t l = begin; l < begin + partition[stage] && l < model.layers.size(); ++l) ids.push_back(l);
  if (stage + 1 == partition.size())
    for (uint32_t l = model.num_main_layers(); l < model.layers.size(); ++l) ids.push_back(l);
  return ids;
}

Status PrefillLayout::validate(const TransferModelLayout& model) const {
  if (partition.empty()) return invalid_argument("prefill layout: partition is empty");
  uint64_t sum = 0;
  for (size_t s = 0; s < partition.size(); ++s) {
    if (partition[s] == 0) return invalid_argument("prefill layout: stage " + std::to_string(s) + " owns 0 layers");
    sum += partition[s];
  }
  if (sum != model.num_main_layers())
    return invalid_argument("prefill layout: partition sums to " + std::to_string(sum) + ", model has " +
                            std::to_string(model.num_main_layers()) + " main layers");
  return Status::ok();
}

uint32_t DecodeLayout::rows_on(uint32_t i, uint32_t num_tokens) const {
  const uint32_t n = group_size();
  if (n == 0 || num_tokens <= i) return 0;
  return (num_tokens - i + n - 1) / n;
}

uint32_t DecodeLayout::kda_heads_per_rank(const TransferModelLayout& m) const {
  return kda_head_sliced && group_size() > 0 ? m.kda_heads / group_size() : m.kda_heads;
}

uint64_t DecodeLayout::kda_conv_bytes_per_rank(const TransferModelLayout& m) const {
  return uint64_t(m.kda_conv_rows) * 3 * kda_heads_per_rank(m) * m.kda_conv_head_bytes;
}

uint64_t DecodeLayout::kda_state_bytes_per_rank(const TransferModelLayout& m) const {
  return uint64_t(kda_heads_per_rank(m)) * m.kda_state_head_bytes;
}

Status DecodeLayout::validate(const TransferModelLayout& model) const {
  if (ranks.empty()) return invalid_argument("decode layout: ranks is empty");
  if (std::set<uint32_t>(ranks.begin(), ranks.end()).size() != ranks.size())
    return invalid_argument("decode layout: ranks has duplicates");
  const bool any_kda = std::count(model.layers.begin(), model.layers.end(), LayerCache::Kda) > 0;
  if (any_kda && kda_head_sliced && model.kda_heads % group_size() != 0)
    return invalid_argument("decode layout: kda_heads " + std::to_string(model.kda_heads) +
                            " is not divisible by the group size " + std::to_string(group_size()));
  return Status::ok();
}

StageSource pack_stage_source(const TransferModelLayout& model, const PrefillLayout& prefill, uint32_t stage,
                              uint32_t num_tokens) {
  StageSource src;
  src.stage = stage;
  src.num_tokens = num_tokens;
  uint64_t off = 0;
  for (uint32_t l : prefill.stage_layers(model, stage)) {
    LayerSource ls;
    if (model.layers[l] == LayerCache::Kda) {
      ls.conv = off;
      off += model.kda_conv_bytes();
      ls.state = off;
      off += model.kda_state_bytes();
    } else {
      ls.rows = off;
      off += uint64_t(num_tokens) * model.row_bytes(model.layers[l]);
    }
    src.layers[l] = ls;
  }
  src.total_bytes = off;
  return src;
}

}  // namespace k3::transfer
