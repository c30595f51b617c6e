#include "transfer/plan_layout.h"

#include <algorithm>
#include <set>
#include <string>

namespace k3::transfer {

std::vector<EntryKind> kinds_of(LayerCache c) {
  switch (c) {
    case LayerCache::Kda: return {EntryKind::KdaConv, EntryKind::KdaState};
    case LayerCache::Mla: return {EntryKind::MlaKv};
    case LayerCache::Draft: return {EntryKind::DraftKv};
  }
  return {};
}

std::vector<uint32_t> PrefillLayout::stage_layers(const CacheLayout& model, uint32_t stage) const {
  std::vector<uint32_t> ids;
  if (stage >= partition.size()) return ids;
  uint32_t begin = 0;
  for (uint32_t s = 0; s < stage; ++s) begin += partition[s];
  for (uint32_t l = begin; l < begin + partition[stage] && l < model.layers.size(); ++l) ids.push_back(l);
  if (stage + 1 == partition.size())
    for (uint32_t l = model.num_main_layers(); l < model.layers.size(); ++l) ids.push_back(l);
  return ids;
}

Status PrefillLayout::validate(const CacheLayout& model) const {
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

uint32_t DecodeLayout::kda_heads_per_rank(const CacheLayout& m) const {
  return kda_head_sliced && group_size() > 0 ? m.kda_heads / group_size() : m.kda_heads;
}

uint64_t DecodeLayout::kda_conv_bytes_per_rank(const CacheLayout& m) const {
  return uint64_t(m.kda_conv_rows) * 3 * kda_heads_per_rank(m) * m.kda_conv_head_bytes;
}

uint64_t DecodeLayout::kda_state_bytes_per_rank(const CacheLayout& m) const {
  return uint64_t(kda_heads_per_rank(m)) * m.kda_state_head_bytes;
}

Status DecodeLayout::validate(const CacheLayout& model) const {
  if (ranks.empty()) return invalid_argument("decode layout: ranks is empty");
  if (std::set<uint32_t>(ranks.begin(), ranks.end()).size() != ranks.size())
    return invalid_argument("decode layout: ranks has duplicates");
  const bool any_kda = std::count(model.layers.begin(), model.layers.end(), LayerCache::Kda) > 0;
  if (any_kda && kda_head_sliced && model.kda_heads % group_size() != 0)
    return invalid_argument("decode layout: kda_heads " + std::to_string(model.kda_heads) +
                            " is not divisible by the group size " + std::to_string(group_size()));
  return Status::ok();
}

StageSource pack_stage_source(const CacheLayout& model, const PrefillLayout& prefill, uint32_t stage,
                              uint32_t num_tokens) {
  PackedImage img = model.pack(prefill.stage_layers(model, stage), num_tokens);
  return {.stage = stage, .num_tokens = num_tokens, .layers = std::move(img.layers), .total_bytes = img.total_bytes};
}

}  // namespace k3::transfer
