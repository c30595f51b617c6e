// Reads one request's caches out of a decode rank's transfer region (pool.h layout: MLA rows in the
// request's pages, KDA conv + state in its slot), in either of two forms that share one account of where
// the bytes are (region_tables):
//  - the packed cache image of its main layers (CacheLayout::pack, what engine/cache_io.h's import_caches
//    takes), copied out of a host region;
//  - the region's own tables (engine/cache_io.h's CacheTables), which import_caches_from reads in place:
//    on a GPU rank the region is device memory and the import is gathers on the device.
// `model` is the rank's own cache layout and `num_tokens` its own MLA rows: for plain DP the model's
// layout and the prompt length; for rank i of a head-sliced DCP group of N the layout of
// rank_cache_config (engine/rank_layout.h: H/N KDA heads) and the rows p < T with p % N == i (the
// transfer plan writes local row p / N there).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "engine/cache_io.h"
#include "transfer/plan_layout.h"
#include "transfer/pool.h"
#include "transfer/ucx_context.h"

namespace k3::decode {

// Where a decode rank's transfer regions live: device memory on a GPU backend (the prefill stages' puts
// land where the rank's caches are), host memory otherwise.
transfer::MemoryType region_memory_for(const Backend& backend);

// Where one request's caches are in a region: its page table and its KDA slot (none without KDA layers).
struct RegionEntries {
  std::span<const uint32_t> pages;
  std::optional<uint32_t> slot;
};

// The request's bytes as tables in `region` (the rank's whole registered region, byte 0 at geo.base, in
// `memory`), every address checked against the region; `image` lays the same bytes out as a packed image
// (its size is what a rank reports it imported). Errors name what is out of bounds.
struct RegionTables {
  CacheTables tables;
  PackedImage image;
};
Result<RegionTables> region_tables(const transfer::CacheLayout& model, const transfer::RankPoolGeometry& geo,
                                   RegionEntries entries, std::span<uint8_t> region, transfer::MemoryType memory,
                                   uint32_t num_tokens);

// The packed image, from a host region.
Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo, RegionEntries entries,
                                                      std::span<const uint8_t> region, uint32_t num_tokens);
// The same for an allocation the caller's own pool holds.
Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo,
                                                      const transfer::RankAllocation& alloc,
                                                      std::span<const uint8_t> region, uint32_t num_tokens);

}  // namespace k3::decode
