// Reads one request's caches out of a decode rank's transfer region (pool.h layout: MLA rows in the
// request's pages, KDA conv + state in its slot) into the packed cache image of its main layers
// (CacheLayout::pack, the image engine/cache_io.h imports into CachePools).
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
#include "transfer/plan_layout.h"
#include "transfer/pool.h"

namespace k3::decode {

// Where one request's caches are in a region: its page table and its KDA slot (none without KDA layers).
struct RegionEntries {
  std::span<const uint32_t> pages;
  std::optional<uint32_t> slot;
};

// `region` is the rank's whole registered region (byte 0 at geo.base). Errors name what is out of bounds.
Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo, RegionEntries entries,
                                                      std::span<const uint8_t> region, uint32_t num_tokens);
// The same for an allocation the caller's own pool holds.
Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo,
                                                      const transfer::RankAllocation& alloc,
                                                      std::span<const uint8_t> region, uint32_t num_tokens);

}  // namespace k3::decode
