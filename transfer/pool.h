// Decode-side pool accounting for one rank's registered region (no memory is touched: this hands out
// page ids and slot indices and turns them into addresses). The group leader may account for every rank
// of its group, since it is only arithmetic over the ranks' published bases.
//
// Decision: ONE page-id space shared by all MLA and draft layers (vLLM-style). Allocating page
// p reserves page p in every MLA/draft layer's page array; a request has one page table per rank, used by
// every layer. KDA: one slot per request per rank holding all KDA layers' conv + state.
//
// Region layout (offsets from `base`), innermost last; row and entry sizes are the CacheLayout's
// (common/config/cache_layout.h), KDA entries sliced per rank by the DecodeLayout:
//   [mla layers  (ascending id)] [num_pages] [page_size] [mla_row_bytes]
//   [draft layers(ascending id)] [num_pages] [page_size] [draft_row_bytes]
//   [kda layers  (ascending id)] { conv [num_slots] [conv_bytes_per_rank] ; state [num_slots] [state_bytes_per_rank] }
// Every layer's pages, conv entries and state entries are each one contiguous array indexed by page id or
// slot: the decode engine's cache tensors have exactly these shapes, so a decode rank can place its
// engine cache in this region (PoolIds below) and decode from the bytes the transfer wrote.
//
// Handles free exactly once by construction: PageHandle / SlotHandle are move-only, free on destruction
// or release(), and are empty afterwards (a moved-from handle owns nothing). The pool must outlive its
// handles; the pool is neither copyable nor movable. All methods are thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/core/lowest_free_ids.h"
#include "common/core/status.h"
#include "common/protocol/messages.h"
#include "transfer/plan_layout.h"

namespace k3::transfer {

struct RankPoolGeometry {
  uint32_t rank = 0;                  // global decode rank
  uint32_t region_id = 0;
  uint64_t base = 0;                  // address of the region's byte 0 (as published at registration)
  uint32_t page_size = 0;             // tokens per page
  uint32_t num_pages = 0;
  uint32_t num_slots = 0;
  std::vector<uint32_t> mla_layer_ids;
  std::vector<uint32_t> draft_layer_ids;
  std::vector<uint32_t> kda_layer_ids;
  uint64_t mla_row_bytes = 0;
  uint64_t draft_row_bytes = 0;
  uint64_t kda_conv_bytes = 0;        // per layer on this rank (sliced or replicated)
  uint64_t kda_state_bytes = 0;

  // Geometry for rank index `rank_index` of `decode` (model kinds/sizes; decode slicing).
  static Result<RankPoolGeometry> for_rank(const CacheLayout& model, const DecodeLayout& decode,
                                           uint32_t rank_index, uint32_t region_id, uint64_t base,
                                           uint32_t page_size, uint32_t num_pages, uint32_t num_slots);
  Status validate() const;

  uint64_t page_bytes() const;        // one page id across all MLA + draft layers
  uint64_t slot_bytes() const;        // one slot across all KDA layers
  uint64_t region_bytes() const;      // total
  // Row 0 of page 0 of a MLA/draft layer's page array, and that array's length.
  Result<uint64_t> layer_pages_addr(uint32_t layer_id) const;
  uint64_t layer_pages_length(uint32_t layer_id) const;
  Result<uint64_t> kda_conv_addr(uint32_t slot, uint32_t layer_id) const;
  Result<uint64_t> kda_state_addr(uint32_t slot, uint32_t layer_id) const;
};

class RankPool;

// Owns page ids of one rank's pool; frees them once (destruction or release()).
class PageHandle {
 public:
  PageHandle() = default;
  PageHandle(PageHandle&& o) noexcept;
  PageHandle& operator=(PageHandle&& o) noexcept;
  PageHandle(const PageHandle&) = delete;
  PageHandle& operator=(const PageHandle&) = delete;
  ~PageHandle() { release(); }
  const std::vector<uint32_t>& page_ids() const { return ids_; }
  bool empty() const { return ids_.empty(); }
  void release();
 private:
  friend class RankPool;
  PageHandle(RankPool* pool, std::vector<uint32_t> ids) : pool_(pool), ids_(std::move(ids)) {}
  RankPool* pool_ = nullptr;
  std::vector<uint32_t> ids_;
};

// Owns one KDA slot of one rank's pool; frees it once.
class SlotHandle {
 public:
  SlotHandle() = default;
  SlotHandle(SlotHandle&& o) noexcept;
  SlotHandle& operator=(SlotHandle&& o) noexcept;
  SlotHandle(const SlotHandle&) = delete;
  SlotHandle& operator=(const SlotHandle&) = delete;
  ~SlotHandle() { release(); }
  std::optional<uint32_t> slot() const { return slot_; }
  bool empty() const { return !slot_; }
  void release();
 private:
  friend class RankPool;
  SlotHandle(RankPool* pool, uint32_t slot) : pool_(pool), slot_(slot) {}
  RankPool* pool_ = nullptr;
  std::optional<uint32_t> slot_;
};

struct PoolStats {
  uint64_t page_allocs = 0, page_frees = 0;   // pages, not calls
  uint64_t slot_allocs = 0, slot_frees = 0;
};

// Where a pool's page ids and slots come from when another owner shares the region: the decode rank whose
// engine cache lives in it (decode_node/cache_in_pool.h). The owner counts references, so an id the
// transfer took stays allocated while either side still holds it. Not thread-safe itself: the pool
// calls it under its own lock.
class PoolIds {
 public:
  virtual ~PoolIds() = default;
  virtual std::optional<std::vector<uint32_t>> take_pages(uint32_t n) = 0;  // all or nothing
  virtual void give_pages(const std::vector<uint32_t>& ids) = 0;
  virtual std::optional<uint32_t> take_slot() = 0;
  virtual void give_slot(uint32_t slot) = 0;
  virtual uint32_t free_pages() const = 0;
  virtual uint32_t free_slots() const = 0;
};

class RankPool {
 public:
  static Result<std::unique_ptr<RankPool>> create(RankPoolGeometry geometry);
  // From now on ids come from (and return to) `ids`, whose id space must be this geometry's (num_pages
  // pages, num_slots slots). Only while the pool hands out nothing (InvalidArgument otherwise).
  Status share_ids(std::shared_ptr<PoolIds> ids);
  RankPool(const RankPool&) = delete;
  RankPool& operator=(const RankPool&) = delete;

  const RankPoolGeometry& geometry() const { return geo_; }

  // All-or-nothing: ResourceExhausted (pool untouched) when fewer than `n` pages are free. n = 0 gives
  // an empty handle.
  Result<PageHandle> allocate_pages(uint32_t n);
  // ResourceExhausted when no slot is free, or the pool has no KDA layers (Unsupported then).
  Result<SlotHandle> allocate_slot();

  uint32_t free_pages() const;
  uint32_t free_slots() const;
  // Bytes of free pages (page_bytes each) + free slots (slot_bytes each). Equals capacity_bytes() when
  // nothing is allocated: the leak tests compare against the starting value.
  uint64_t free_bytes() const;
  uint64_t capacity_bytes() const;
  PoolStats stats() const;

 private:
  explicit RankPool(RankPoolGeometry g);
  friend class PageHandle;
  friend class SlotHandle;
  void free_pages(const std::vector<uint32_t>& ids);
  void free_slot(uint32_t slot);

  RankPoolGeometry geo_;
  mutable std::mutex mu_;
  LowestFreeIds<uint32_t> free_page_ids_;   // lowest first: a request's pages ascending, adjacent where free
  LowestFreeIds<uint32_t> free_slot_ids_;
  std::vector<uint8_t> page_in_use_, slot_in_use_;  // integrity: a double free is a bug -> K3_CHECK
  PoolStats stats_;
  std::shared_ptr<PoolIds> shared_;  // set: ids come from there and the free lists above are unused
};

// What a request holds on one rank.
struct RankAllocation {
  uint32_t rank = 0;
  uint32_t region_id = 0;   // the region it lives in (the rank's own, or one of its alternates)
  PageHandle pages;
  SlotHandle slot;          // empty when the model has no KDA layers
};

// ADDRS entries + page table of one rank's allocation: one MlaKv/DraftKv entry per MLA/draft layer (the
// layer's page array) and one KdaConv + KdaState entry per KDA layer (the slot's regions).
void append_addrs(const RankPoolGeometry& geo, const RankAllocation& alloc, protocol::Addrs& out);

}  // namespace k3::transfer
