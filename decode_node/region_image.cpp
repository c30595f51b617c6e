#include "decode_node/region_image.h"

#include <cstring>

namespace k3::decode {

using transfer::LayerCache;

Result<std::vector<uint8_t>> packed_image_from_region(const transfer::TransferModelLayout& model,
                                                      const transfer::RankPoolGeometry& geo,
                                                      const transfer::RankAllocation& alloc,
                                                      std::span<const uint8_t> region, uint32_t num_tokens) {
  std::vector<uint8_t> out;
  auto copy = [&](uint64_t addr, uint64_t len, const char* what, uint32_t layer) -> Status {
    if (addr < geo.base || addr - geo.base + len > region.size())
      return Status(Code::OutOfRange, std::string(what) + " of layer " + std::to_string(layer) + " lies outside the region");
    const size_t at = out.size();
    out.resize(at + len);
    std::memcpy(out.data() + at, region.data() + (addr - geo.base), len);
    return Status::ok();
  };
  const auto& pages = alloc.pages.page_ids();
  const uint32_t ps = geo.page_size;
  if (ps == 0) return invalid_argument("region geometry: page_size is 0");
  for (uint32_t layer = 0; layer < model.num_main_layers(); ++layer) {
    if (model.layers[layer] == LayerCache::Mla) {
      if ((num_tokens + ps - 1) / ps > pages.size())
        return Status(Code::OutOfRange, "request has " + std::to_string(pages.size()) + " pages, too few for " +
                                            std::to_string(num_tokens) + " tokens");
      K3_ASSIGN_OR_RETURN(uint64_t base, geo.layer_pages_addr(layer));
      for (uint32_t p = 0; p < num_tokens; ++p) {
        const uint64_t row = base + (uint64_t{pages[p / ps]} * ps + p % ps) * model.mla_row_bytes;
        K3_TRY(copy(row, model.mla_row_bytes, "MLA row", layer));
      }
    } else {
      if (!alloc.slot.slot()) return invalid_argument("request holds no KDA slot but layer " + std::to_string(layer) + " is KDA");
      const uint32_t slot = *alloc.slot.slot();
      K3_ASSIGN_OR_RETURN(uint64_t conv, geo.kda_conv_addr(slot, layer));
      K3_TRY(copy(conv, geo.kda_conv_bytes, "KDA conv", layer));
      K3_ASSIGN_OR_RETURN(uint64_t state, geo.kda_state_addr(slot, layer));
      K3_TRY(copy(state, geo.kda_state_bytes, "KDA state", layer));
    }
  }
  return out;
}

}  // namespace k3::decode
