// Byte offsets of one unified cache region (docs/PREFIX_CACHE.md, "Unified cache region"): the memory of
// a range of layers' KDA slots and MLA pages in one allocation. A slot block holds one slot of every KDA
// layer of the range (each layer's state, then each layer's conv window); a page block holds one page of
// every MLA layer. Slot blocks are taken from byte 0 upwards and page blocks from the top downwards
// (engine/unified_pool.h keeps the two ends).
//
// The kernels index a cache array as rows of one entry ([slots, H, V, K] states, [slots, W-1, 3P] conv
// windows, [pages, page_size, row] pages). So that they can run on the region unchanged, each layer gets
// one array view per cache starting at its offset inside block 0, and a block's entries must land on whole
// rows of those views: the slot block is a multiple of both the state and the conv entry size, and the
// region a multiple of the one-layer page size. A block at byte offset b then is state row b / state
// bytes, conv row b / conv bytes, page b / page bytes in every layer's view (the same numbers for all
// layers of a kind). The price is the padding of a slot block up to that multiple (reported by
// slot_padding_bytes).
//
// Sizes come from CacheLayout (cache_layout.h), the one definition of entry sizes. Pure arithmetic.
#pragma once
#include <cstdint>
#include <map>

#include "common/config/cache_layout.h"
#include "common/core/status.h"

namespace k3 {

struct UnifiedRegionLayout {
  uint64_t region_bytes = 0;       // rounded down to a whole number of one-layer pages
  uint64_t slot_block_bytes = 0;   // one slot of every KDA layer, padded (see above)
  uint64_t page_block_bytes = 0;   // one page of every MLA layer
  uint64_t state_bytes = 0;        // one layer's state entry
  uint64_t conv_bytes = 0;         // one layer's conv entry
  uint64_t page_bytes = 0;         // one layer's page: page_size rows
  uint32_t page_size = 0;
  // Per global layer id: where its entry sits inside a block.
  std::map<uint32_t, uint64_t> state_offset, conv_offset;   // KDA layers, inside a slot block
  std::map<uint32_t, uint64_t> page_offset;                 // MLA layers, inside a page block

  // The layers [begin, end) of `cache` (main layers only: Kda or Mla) in `region_bytes`. Errors name the
  // field: a draft layer in the range, a page size of 0, a region that holds no block of a kind it needs.
  static Result<UnifiedRegionLayout> make(const CacheLayout& cache, uint32_t begin, uint32_t end, uint32_t page_size,
                                          uint64_t region_bytes);

  bool has_kda() const { return !state_offset.empty(); }
  bool has_mla() const { return !page_offset.empty(); }
  uint64_t slot_padding_bytes() const;    // bytes of a slot block no entry uses

  // Row counts of the per-layer views (rows from the entry's offset in block 0 to the region's end).
  int64_t state_rows(uint32_t layer) const { return int64_t((region_bytes - state_offset.at(layer)) / state_bytes); }
  int64_t conv_rows(uint32_t layer) const { return int64_t((region_bytes - conv_offset.at(layer)) / conv_bytes); }
  int64_t page_rows(uint32_t layer) const { return int64_t((region_bytes - page_offset.at(layer)) / page_bytes); }
  // The view row of the block at `block_offset` (a multiple of the block size from its end's edge).
  int32_t state_row(uint64_t block_offset) const { return static_cast<int32_t>(block_offset / state_bytes); }
  int32_t conv_row(uint64_t block_offset) const { return static_cast<int32_t>(block_offset / conv_bytes); }
  int32_t page_id(uint64_t block_offset) const { return static_cast<int32_t>(block_offset / page_bytes); }
};

}  // namespace k3
