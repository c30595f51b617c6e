// Separate per-layer cache pools as before the unified region: host arrays a test owns, handed to the
// engine as another owner's memory (CacheOptions::memory), so nothing in them ever moves and page ids
// are 0..num_pages-1 (what the decode transfer's shared ids expect).
#pragma once
#include <memory>
#include <vector>

#include "engine/kv_cache.h"

namespace k3::test {

struct SeparatePools {
  std::vector<std::vector<float>> arrays;
  std::shared_ptr<CacheMemory> memory = std::make_shared<CacheMemory>();
  SeparatePools(const ModelConfig& cfg, const Backend& backend, const CacheOptions& o) {
    const CacheLayout c = cache_layout(cfg, backend).value();
    auto take = [&](uint64_t bytes) {
      arrays.emplace_back((bytes + sizeof(float) - 1) / sizeof(float), 0.f);
      return static_cast<void*>(arrays.back().data());
    };
    const uint64_t slots = uint64_t(o.max_seqs + o.checkpoint_slots);
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
      if (cfg.layer_kind(l) == LayerKind::Kda) {
        memory->kda_conv[l] = take(slots * c.kda_conv_bytes());
        memory->kda_state[l] = take(slots * c.kda_state_bytes());
      } else {
        memory->mla_kv[l] = take(uint64_t(o.num_pages) * o.page_size * c.mla_row_bytes);
      }
    }
  }
  // `o` with the pools in these arrays.
  static CacheOptions on(const CacheOptions& o, const SeparatePools& p) {
    CacheOptions r = o;
    r.memory = p.memory;
    return r;
  }
};

}  // namespace k3::test
