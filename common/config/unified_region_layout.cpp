#include "common/config/unified_region_layout.h"

#include <numeric>
#include <string>

namespace k3 {

Result<UnifiedRegionLayout> UnifiedRegionLayout::make(const CacheLayout& cache, uint32_t begin, uint32_t end,
                                                      uint32_t page_size, uint64_t region_bytes) {
  if (begin >= end || end > cache.layers.size())
    return invalid_argument("unified region: layer range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is outside the cache layout's " + std::to_string(cache.layers.size()) + " layers");
  if (page_size == 0) return invalid_argument("unified region: page_size must be > 0");
  UnifiedRegionLayout u;
  u.page_size = page_size;
  u.state_bytes = cache.kda_state_bytes();
  u.conv_bytes = cache.kda_conv_bytes();
  u.page_bytes = uint64_t(page_size) * cache.mla_row_bytes;
  std::vector<uint32_t> kda;
  for (uint32_t l = begin; l < end; ++l) {
    switch (cache.layers[l]) {
      case LayerCache::Kda: kda.push_back(l); break;
      case LayerCache::Mla:
        u.page_offset[l] = u.page_block_bytes;
        u.page_block_bytes += u.page_bytes;
        break;
      case LayerCache::Draft:
        return invalid_argument("unified region: layer " + std::to_string(l) + " is a draft layer (not placed)");
    }
  }
  if (!kda.empty() && (u.state_bytes == 0 || u.conv_bytes == 0))
    return invalid_argument("unified region: KDA layers with a zero-sized state or conv entry");
  if (u.has_mla() && u.page_bytes == 0) return invalid_argument("unified region: MLA layers with mla_row_bytes = 0");
  // States first, then conv windows: the states (the large entries) start on the block's edge.
  uint64_t off = 0;
  for (uint32_t l : kda) u.state_offset[l] = off, off += u.state_bytes;
  for (uint32_t l : kda) u.conv_offset[l] = off, off += u.conv_bytes;
  if (!kda.empty()) {
    const uint64_t unit = std::lcm(u.state_bytes, u.conv_bytes);
    u.slot_block_bytes = (off + unit - 1) / unit * unit;
  }
  u.region_bytes = u.has_mla() ? region_bytes / u.page_bytes * u.page_bytes : region_bytes;
  if (u.has_kda() && u.region_bytes < u.slot_block_bytes)
    return invalid_argument("unified region: region_bytes (" + std::to_string(region_bytes) + ") holds no KDA slot of " +
                            std::to_string(u.slot_block_bytes) + " bytes");
  if (u.has_mla() && u.region_bytes < u.page_block_bytes)
    return invalid_argument("unified region: region_bytes (" + std::to_string(region_bytes) + ") holds no MLA page of " +
                            std::to_string(u.page_block_bytes) + " bytes");
  if (!u.has_kda() && !u.has_mla()) return invalid_argument("unified region: the layer range has no cache");
  return u;
}

uint64_t UnifiedRegionLayout::slot_padding_bytes() const {
  return slot_block_bytes - state_offset.size() * (state_bytes + conv_bytes);
}

}  // namespace k3
