// The decode engine's cache placed in the rank's transfer region (DecodeRankOptions::cache_in_pool): the
// prefill stages' puts land in the very arrays the engine decodes from, so a transferred request lives in
// memory once. Two pieces:
//  - cache_memory_in_region: the engine's per-layer pool arrays at the addresses the transfer geometry
//    gives them (transfer/pool.h lays every layer's pages, conv entries and state entries out as one
//    array each, shaped as the engine's pools);
//  - CachePoolIds: the transfer pool takes its page ids and slots from the engine's CachePools, which
//    count references: pages and the slot a CLAIM took stay allocated until both the transfer (the
//    request's state machine) and the engine (its running sequence) let go, in either order.
#pragma once
#include <memory>
#include <span>

#include "engine/kv_cache.h"
#include "transfer/plan_layout.h"
#include "transfer/pool.h"

namespace k3::decode {

// Engine arrays for `layout` (the rank's cache layout: plain DP, every layer) inside `region` (byte 0 at
// geo.base). Errors name what does not match: draft layers (not placed yet), entry sizes, the region size.
Result<std::shared_ptr<const CacheMemory>> cache_memory_in_region(const transfer::CacheLayout& layout,
                                                                  const transfer::RankPoolGeometry& geo,
                                                                  std::span<uint8_t> region, Device device);

// The cache options whose pools are exactly the region of `geo` (same pages, page size and slots).
CacheOptions cache_options_for(const transfer::RankPoolGeometry& geo, std::shared_ptr<const CacheMemory> memory);

class CachePoolIds final : public transfer::PoolIds {
 public:
  explicit CachePoolIds(CachePools& pools) : pools_(pools) {}
  std::optional<std::vector<uint32_t>> take_pages(uint32_t n) override;
  void give_pages(const std::vector<uint32_t>& ids) override;
  std::optional<uint32_t> take_slot() override;
  void give_slot(uint32_t slot) override;
  uint32_t free_pages() const override;
  uint32_t free_slots() const override;

 private:
  CachePools& pools_;
};

}  // namespace k3::decode
