#include "decode_node/region_image.h"

#include <cstring>

namespace k3::decode {

Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo,
                                                      const transfer::RankAllocation& alloc,
                                                      std::span<const uint8_t> region, uint32_t num_tokens) {
  return packed_image_from_region(model, geo, RegionEntries{.pages = alloc.pages.page_ids(), .slot = alloc.slot.slot()},
                                  region, num_tokens);
}

Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo, RegionEntries entries,
                                                      std::span<const uint8_t> region, uint32_t num_tokens) {
  const uint32_t ps = geo.page_size;
  if (ps == 0) return invalid_argument("region geometry: page_size is 0");
  // The rank's KDA entries must be the given layout's sizes (whole heads, or the rank's layout when sliced).
  const bool any_kda = !model.layer_ids(LayerCache::Kda).empty();
  if (any_kda && (geo.kda_conv_bytes != model.kda_conv_bytes() || geo.kda_state_bytes != model.kda_state_bytes()))
    return invalid_argument("region geometry: KDA entries are not the layout's sizes (a head-sliced rank needs its own layout)");
  std::vector<uint32_t> main_layers;
  for (uint32_t l = 0; l < model.num_main_layers(); ++l) main_layers.push_back(l);
  const PackedImage img = model.pack(main_layers, num_tokens);
  std::vector<uint8_t> out(img.total_bytes);
  auto copy = [&](uint64_t addr, uint64_t len, uint64_t to, const char* what, uint32_t layer) -> Status {
    if (addr < geo.base || addr - geo.base + len > region.size())
      return Status(Code::OutOfRange, std::string(what) + " of layer " + std::to_string(layer) + " lies outside the region");
    std::memcpy(out.data() + to, region.data() + (addr - geo.base), len);
    return Status::ok();
  };
  const std::span<const uint32_t> pages = entries.pages;
  for (const auto& [layer, e] : img.layers) {
    if (model.layers[layer] == LayerCache::Mla) {
      if ((num_tokens + ps - 1) / ps > pages.size())
        return Status(Code::OutOfRange, "request has " + std::to_string(pages.size()) + " pages, too few for " +
                                            std::to_string(num_tokens) + " tokens");
      K3_ASSIGN_OR_RETURN(uint64_t base, geo.layer_pages_addr(layer));
      const uint64_t row = model.mla_row_bytes;
      for (uint32_t p = 0; p < num_tokens; ++p)
        K3_TRY(copy(base + CacheLayout::paged_row(pages, ps, p) * row, row, e.rows + p * row, "MLA row", layer));
    } else {
      if (!entries.slot) return invalid_argument("request holds no KDA slot but layer " + std::to_string(layer) + " is KDA");
      const uint32_t slot = *entries.slot;
      K3_ASSIGN_OR_RETURN(uint64_t conv, geo.kda_conv_addr(slot, layer));
      K3_TRY(copy(conv, model.kda_conv_bytes(), e.conv, "KDA conv", layer));
      K3_ASSIGN_OR_RETURN(uint64_t state, geo.kda_state_addr(slot, layer));
      K3_TRY(copy(state, model.kda_state_bytes(), e.state, "KDA state", layer));
    }
  }
  return out;
}

}  // namespace k3::decode
