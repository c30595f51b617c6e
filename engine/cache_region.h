// One unified cache region on a backend (docs/PREFIX_CACHE.md, "Unified cache region"): a single
// allocation of the backend's memory (host on the CPU, device memory on CUDA) holding the KDA slots and
// MLA pages of a range of layers, laid out by UnifiedRegionLayout and kept by UnifiedPool (slots from
// the low end, pages from the high end, the boundary following demand). Compaction copies slot blocks
// with the backend's own copy, so the same code serves both devices.
//
// The per-layer views are what the kernels take: a block's row in them comes from its current offset
// (state_row, conv_row, page_id), read when a step's index tensors are built. Handles stay valid across
// moves; rows do not. Writers outside the step (a transfer landing a request's cache) hold a Pin for the
// write, so the block cannot move under them.
//
// CachePools (engine/kv_cache.h) keeps its pools in one of these unless another owner provides the memory.
// Tested on the CPU backend (tests/engine/test_cache_region.cpp, test_cache_pools_region.cpp), kernels
// and the whole engine included.
#pragma once
#include <cstdint>
#include <map>
#include <optional>

#include "common/config/unified_region_layout.h"
#include "common/core/tensor.h"
#include "engine/unified_pool.h"
#include "kernels/backend.h"

namespace k3 {

class CacheRegion {
 public:
  using Handle = UnifiedPool::Handle;
  // Element dtypes and shapes from `cache` (its from_config element counts). Throws k3::Error naming a
  // bad field.
  CacheRegion(Backend& backend, const CacheLayout& cache, uint32_t layer_begin, uint32_t layer_end, uint32_t page_size,
              uint64_t region_bytes);
  CacheRegion(const CacheRegion&) = delete;
  CacheRegion& operator=(const CacheRegion&) = delete;

  const UnifiedRegionLayout& layout() const { return layout_; }
  // The whole region as bytes: what a transfer registers, once.
  const Tensor& bytes() const { return region_; }

  // A layer's views: [state_rows, H, V, K] F32, [conv_rows, W-1, 3P], [page_rows, page_size, row].
  Tensor& state(uint32_t layer) { return at(states_, layer, "KDA state"); }
  Tensor& conv(uint32_t layer) { return at(convs_, layer, "KDA conv"); }
  Tensor& pages(uint32_t layer) { return at(pages_, layer, "MLA page"); }

  std::optional<Handle> alloc_slot() { return pool_.alloc(UnifiedPool::Kind::Slot); }
  std::optional<Handle> alloc_page() { return pool_.alloc(UnifiedPool::Kind::Page); }
  void free(Handle h) { pool_.free(h); }

  // Rows of a live block in the views, as of now (a later allocation may move a slot).
  int32_t state_row(Handle slot) const { return layout_.state_row(pool_.offset(slot)); }
  int32_t conv_row(Handle slot) const { return layout_.conv_row(pool_.offset(slot)); }
  int32_t page_id(Handle page) const { return layout_.page_id(pool_.offset(page)); }

  // Pins a block for a write from outside the step; rows read through it stay valid while it lives.
  class Pin {
   public:
    Pin(CacheRegion& region, Handle h) : region_(region), pin_(region.pool_, h) {}
    int32_t state_row() const { return region_.layout_.state_row(pin_.offset()); }
    int32_t conv_row() const { return region_.layout_.conv_row(pin_.offset()); }
    int32_t page_id() const { return region_.layout_.page_id(pin_.offset()); }

   private:
    CacheRegion& region_;
    UnifiedPool::Pin pin_;
  };

  UnifiedPool::Fragmentation fragmentation() const { return pool_.fragmentation(); }
  uint64_t free_bytes() const { return pool_.free_bytes(); }
  uint64_t room(UnifiedPool::Kind kind) const { return pool_.room(kind); }   // blocks alloc could take now
  uint64_t moves() const { return pool_.moves(); }
  int compact() { return pool_.compact(); }

 private:
  static Tensor& at(std::map<uint32_t, Tensor>& views, uint32_t layer, const char* what);
  void move(uint64_t from, uint64_t to, uint64_t bytes);

  Backend& backend_;
  UnifiedRegionLayout layout_;
  Tensor region_;                        // U8 [region_bytes] on the backend's device
  std::map<uint32_t, Tensor> states_, convs_, pages_;
  UnifiedPool pool_;                     // last: its mover copies inside region_
};

}  // namespace k3
