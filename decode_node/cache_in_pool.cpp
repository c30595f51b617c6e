#include "decode_node/cache_in_pool.h"

#include <string>

namespace k3::decode {

Result<std::shared_ptr<const CacheMemory>> cache_memory_in_region(const transfer::CacheLayout& layout,
                                                                  const transfer::RankPoolGeometry& geo,
                                                                  std::span<uint8_t> region, Device device) {
  if (!geo.draft_layer_ids.empty())
    return unsupported("cache in the transfer pool: draft (MTP) layers are not placed in the region yet");
  if (region.size() < geo.region_bytes())
    return invalid_argument("cache in the transfer pool: region of " + std::to_string(region.size()) + " bytes, geometry needs " +
                            std::to_string(geo.region_bytes()));
  if (!geo.kda_layer_ids.empty() &&
      (geo.kda_conv_bytes != layout.kda_conv_bytes() || geo.kda_state_bytes != layout.kda_state_bytes()))
    return invalid_argument("cache in the transfer pool: the region's KDA entries are not whole-head entries of the layout");
  if (!geo.mla_layer_ids.empty() && geo.mla_row_bytes != layout.mla_row_bytes)
    return invalid_argument("cache in the transfer pool: MLA row of " + std::to_string(geo.mla_row_bytes) +
                            " bytes, the layout's is " + std::to_string(layout.mla_row_bytes));
  auto mem = std::make_shared<CacheMemory>();
  mem->device = device;
  auto at = [&](uint64_t addr) { return static_cast<void*>(region.data() + (addr - geo.base)); };
  for (uint32_t l : geo.mla_layer_ids) {
    K3_ASSIGN_OR_RETURN(uint64_t a, geo.layer_pages_addr(l));
    mem->mla_kv[static_cast<int>(l)] = at(a);
  }
  if (geo.num_slots > 0)
    for (uint32_t l : geo.kda_layer_ids) {
      K3_ASSIGN_OR_RETURN(uint64_t conv, geo.kda_conv_addr(0, l));
      K3_ASSIGN_OR_RETURN(uint64_t state, geo.kda_state_addr(0, l));
      mem->kda_conv[static_cast<int>(l)] = at(conv);
      mem->kda_state[static_cast<int>(l)] = at(state);
    }
  return std::shared_ptr<const CacheMemory>(std::move(mem));
}

CacheOptions cache_options_for(const transfer::RankPoolGeometry& geo, std::shared_ptr<const CacheMemory> memory) {
  CacheOptions o;
  o.max_seqs = static_cast<int>(geo.num_slots);
  o.page_size = static_cast<int>(geo.page_size);
  o.num_pages = static_cast<int>(geo.num_pages);
  o.checkpoint_slots = 0;
  o.memory = std::move(memory);
  return o;
}

std::optional<std::vector<uint32_t>> CachePoolIds::take_pages(uint32_t n) {
  // A unified region's page ids are rows of its page views, not the transfer pool's 0..num_pages-1.
  K3_CHECK(pools_.region() == nullptr || !pools_.has_mla(),
           "CachePoolIds: the engine's pools must be the transfer's arrays (CacheOptions::memory), not a unified region");
  auto pages = pools_.alloc_pages(static_cast<int>(n));
  if (!pages) return std::nullopt;
  return std::vector<uint32_t>(pages->begin(), pages->end());
}

void CachePoolIds::give_pages(const std::vector<uint32_t>& ids) {
  for (uint32_t id : ids) pools_.release_page(static_cast<int32_t>(id));
}

std::optional<uint32_t> CachePoolIds::take_slot() {
  auto s = pools_.alloc_slot();
  if (!s) return std::nullopt;
  return static_cast<uint32_t>(*s);
}

void CachePoolIds::give_slot(uint32_t slot) { pools_.free_slot(static_cast<int>(slot)); }
uint32_t CachePoolIds::free_pages() const { return static_cast<uint32_t>(pools_.free_pages()); }
uint32_t CachePoolIds::free_slots() const { return static_cast<uint32_t>(pools_.free_slots()); }

}  // namespace k3::decode
