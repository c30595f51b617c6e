// Reads one request's caches out of a decode rank's transfer region (pool.h layout: MLA rows in the
// request's pages, KDA conv + state in its slot) into the packed cache image of its main layers
// (CacheLayout::pack, the image engine/cache_io.h imports into CachePools).
// Plain DP only: the rank holds every token of every MLA layer and whole KDA heads (a group of one).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "transfer/plan_layout.h"
#include "transfer/pool.h"

namespace k3::decode {

// `region` is the rank's whole registered region (byte 0 at geo.base). Errors name what is out of bounds.
Result<std::vector<uint8_t>> packed_image_from_region(const transfer::CacheLayout& model,
                                                      const transfer::RankPoolGeometry& geo,
                                                      const transfer::RankAllocation& alloc,
                                                      std::span<const uint8_t> region, uint32_t num_tokens);

}  // namespace k3::decode
