#include "decode_node/region_image.h"

#include <cstring>
#include <map>

#include "kernels/backend.h"

namespace k3::decode {

transfer::MemoryType region_memory_for(const Backend& backend) {
  return backend.kind() == BackendKind::Cuda ? transfer::MemoryType::Cuda : transfer::MemoryType::Host;
}

Result<RegionTables> region_tables(const transfer::CacheLayout& model, const transfer::RankPoolGeometry& geo,
                                   RegionEntries entries, std::span<uint8_t> region, transfer::MemoryType memory,
                                   uint32_t num_tokens) {
  const uint32_t ps = geo.page_size;
  if (ps == 0) return invalid_argument("region geometry: page_size is 0");
  // The rank's KDA entries must be the given layout's sizes (whole heads, or the rank's layout when sliced).
  const bool any_kda = !model.layer_ids(LayerCache::Kda).empty();
  if (any_kda && (geo.kda_conv_bytes != model.kda_conv_bytes() || geo.kda_state_bytes != model.kda_state_bytes()))
    return invalid_argument("region geometry: KDA entries are not the layout's sizes (a head-sliced rank needs its own layout)");
  if (!model.layer_ids(LayerCache::Mla).empty() && geo.mla_row_bytes != model.mla_row_bytes)
    return invalid_argument("region geometry: MLA rows of " + std::to_string(geo.mla_row_bytes) + " bytes, the layout's are " +
                            std::to_string(model.mla_row_bytes));
  auto at = [&](uint64_t addr, uint64_t len, const char* what, uint32_t layer) -> Result<uint8_t*> {
    if (addr < geo.base || addr - geo.base > region.size() || len > region.size() - (addr - geo.base))
      return Status(Code::OutOfRange, std::string(what) + " of layer " + std::to_string(layer) + " lies outside the region");
    return region.data() + (addr - geo.base);
  };
  std::vector<uint32_t> main_layers;
  for (uint32_t l = 0; l < model.num_main_layers(); ++l) main_layers.push_back(l);
  RegionTables out;
  out.image = model.pack(main_layers, num_tokens);
  const PackedImage& img = out.image;
  CacheTables& t = out.tables;
  t.device = memory == transfer::MemoryType::Cuda ? Device::Cuda : Device::Cpu;
  t.table_rows = static_cast<int64_t>(geo.num_pages) * ps;
  std::map<int, uint8_t*> mla;
  std::map<int, std::pair<uint8_t*, uint8_t*>> kda;
  const std::span<const uint32_t> pages = entries.pages;
  for (const auto& [layer, e] : img.layers) {
    if (model.layers[layer] == LayerCache::Mla) {
      if ((num_tokens + ps - 1) / ps > pages.size())
        return Status(Code::OutOfRange, "request has " + std::to_string(pages.size()) + " pages, too few for " +
                                            std::to_string(num_tokens) + " tokens");
      K3_ASSIGN_OR_RETURN(uint64_t base, geo.layer_pages_addr(layer));
      K3_ASSIGN_OR_RETURN(mla[static_cast<int>(layer)],
                          at(base, static_cast<uint64_t>(t.table_rows) * model.mla_row_bytes, "MLA pages", layer));
    } else {
      if (!entries.slot) return invalid_argument("request holds no KDA slot but layer " + std::to_string(layer) + " is KDA");
      K3_ASSIGN_OR_RETURN(uint64_t conv, geo.kda_conv_addr(*entries.slot, layer));
      K3_ASSIGN_OR_RETURN(uint64_t state, geo.kda_state_addr(*entries.slot, layer));
      K3_ASSIGN_OR_RETURN(uint8_t * c, at(conv, model.kda_conv_bytes(), "KDA conv", layer));
      K3_ASSIGN_OR_RETURN(uint8_t * s, at(state, model.kda_state_bytes(), "KDA state", layer));
      kda[static_cast<int>(layer)] = {c, s};
    }
  }
  if (!mla.empty()) {
    for (uint32_t p = 0; p < num_tokens; ++p) {
      const uint64_t row = CacheLayout::paged_row(pages, ps, p);
      if (row >= static_cast<uint64_t>(t.table_rows))
        return Status(Code::OutOfRange, "MLA row of token " + std::to_string(p) + " lies outside the region's " +
                                            std::to_string(geo.num_pages) + " pages");
      t.rows.push_back(static_cast<int32_t>(row));
    }
  }
  t.mla_table = [mla](int layer) { return mla.at(layer); };
  t.kda_entries = [kda](int layer) { return kda.at(layer); };
  return out;
}

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
  // Read only: the tables' pointers are not written through here.
  const std::span<uint8_t> bytes{const_cast<uint8_t*>(region.data()), region.size()};
  K3_ASSIGN_OR_RETURN(RegionTables rt, region_tables(model, geo, entries, bytes, transfer::MemoryType::Host, num_tokens));
  const PackedImage& img = rt.image;
  std::vector<uint8_t> out(img.total_bytes);
  const uint64_t row = model.mla_row_bytes;
  for (const auto& [layer, e] : img.layers) {
    if (model.layers[layer] == LayerCache::Mla) {
      const uint8_t* table = rt.tables.mla_table(static_cast<int>(layer));
      for (uint32_t p = 0; p < num_tokens; ++p)
        std::memcpy(out.data() + e.rows + p * row, table + static_cast<uint64_t>(rt.tables.rows[p]) * row, row);
    } else {
      const auto [conv, state] = rt.tables.kda_entries(static_cast<int>(layer));
      std::memcpy(out.data() + e.conv, conv, model.kda_conv_bytes());
      std::memcpy(out.data() + e.state, state, model.kda_state_bytes());
    }
  }
  return out;
}

}  // namespace k3::decode
